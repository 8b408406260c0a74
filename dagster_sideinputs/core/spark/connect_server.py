"""A local Spark Connect server with Delta Lake loaded, started once, that runs attach to.

Every run that builds its own Spark session starts a JVM and loads Delta's jars (15-40 s
on a laptop). A run attached to a Spark Connect server (``SparkResource(remote=...)``)
opens a session in a JVM that is already up::

    python -m dagster_sideinputs.core.spark.connect_server                # until Ctrl-C
    python -m dagster_sideinputs.core.spark.connect_server --export DSI_SPARK_REMOTE -- dg dev

The second form runs a command while the server is up, with the server's URL in the
variable ``--export`` names, and stops the server when the command ends (``make dev``).
The server runs delta-spark (``--packages``, the SQL extension and catalog); the bridge's
session settings are set by each client (runtime SQL settings).
"""

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyspark

from dagster_sideinputs.core.spark.connect import CONNECT_DEFAULT_PORT
from dagster_sideinputs.core.spark.java_runtime import check_java
from dagster_sideinputs.core.spark.session import build_spark_session, default_shuffle_partitions
from dagster_sideinputs.delta.spark.setup import (
    CATALOG_KEY,
    DELTA_CATALOG,
    DELTA_SQL_EXTENSION,
    EXTENSIONS_KEY,
    delta_package,
)
from dagster_sideinputs.errors import SparkStartupError

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
STARTED = "Spark Connect server started"
"""What the server logs once it accepts sessions."""


def server_command(
    port: int,
    *,
    host: str = "127.0.0.1",
    master: str = "local[*]",
    driver_memory: str = "2g",
    packages: Sequence[str] = (),
    confs: Mapping[str, str] | None = None,
) -> list[str]:
    """The ``spark-submit`` command line of a Connect server with Delta (and ``packages``).

    A local master gets what an embedded session of it gets: two shuffle partitions per
    core, and as many for Delta's state reconstruction (50 tasks by default, which made
    every first read of a small table seconds slower).
    """
    settings = {
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.memory": driver_memory,
        "spark.ui.showConsoleProgress": "false",
        EXTENSIONS_KEY: DELTA_SQL_EXTENSION,
        CATALOG_KEY: DELTA_CATALOG,
    }
    partitions = default_shuffle_partitions(master)
    if partitions is not None:
        settings["spark.sql.shuffle.partitions"] = str(partitions)
        settings["spark.databricks.delta.snapshotPartitions"] = str(partitions)
    settings.update(confs or {})
    command = [str(Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit")]
    command += ["--class", SERVER_CLASS, "--master", master]
    command += ["--packages", ",".join([delta_package(), *packages])]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, "spark-internal"]


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=2):
        return True
    return False


_MODULE = "dagster_sideinputs.core.spark.connect_server"  # also when run with -m (__main__)


class LocalConnectServer:
    """A Spark Connect server in a child process (its own process group), with Delta.

    Args:
        log: the server's output (spark-submit's and the JVM's).
        port, host, master, driver_memory, packages, confs: see :func:`server_command`.
    """

    def __init__(
        self,
        log: Path,
        *,
        port: int = CONNECT_DEFAULT_PORT,
        host: str = "127.0.0.1",
        master: str = "local[*]",
        driver_memory: str = "2g",
        packages: Sequence[str] = (),
        confs: Mapping[str, str] | None = None,
    ) -> None:
        self.log = log
        self.host = host
        self.port = port
        self.command = server_command(
            port,
            host=host,
            master=master,
            driver_memory=driver_memory,
            packages=packages,
            confs=confs,
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    def start(self, timeout_s: float = 300.0) -> "LocalConnectServer":
        """Start the server and wait until it accepts sessions."""
        if _listening(self.host, self.port):
            raise SparkStartupError(
                f"Something already listens on {self.host}:{self.port}, where the Spark "
                "Connect server would start.",
                fix=f"attach to it if it is a Connect server (remote={self.url!r}), stop "
                "it, or pick another port (--port)",
            )
        check_java()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        # The server's Python workers (UDFs, row functions) run this interpreter.
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        with self.log.open("wb") as out:
            # A session of its own: Ctrl-C reaches the command run beside it, and the
            # server is stopped after the command ends.
            self.process = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise SparkStartupError(
                    f"The Spark Connect server exited with status {self.process.returncode} "
                    f"while starting; the end of its log ({self.log}):\n{tail}",
                    fix="read the log's first error (Java, a package Maven cannot serve, the port)",
                )
            if STARTED in self.log.read_text(errors="replace") and _listening(self.host, self.port):
                return self
            time.sleep(0.5)
        self.stop()
        raise SparkStartupError(
            f"The Spark Connect server did not accept sessions within {timeout_s:.0f} s "
            f"(log: {self.log}).",
            fix="read its log; a first start resolves Delta's jar into the Ivy cache "
            "(`make jars` does it ahead)",
        )

    def warm_up(self) -> float:
        """Write, read and drop a small Delta table through a Connect session; its seconds.

        A fresh server compiles and loads the classes of Delta's reads and writes on its
        first use (40 s on a loaded two-core machine, then 2 s): paid here, not by the
        first run. The client is a child Python process: a process that already runs a
        classic Spark session cannot open a Connect one (``SESSION_ALREADY_EXIST``).
        """
        started = time.perf_counter()
        code = f"from {_MODULE} import write_and_read_a_table; write_and_read_a_table({self.url!r})"
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"the warm-up client on {self.url} failed:\n{done.stderr[-4000:]}")
        return time.perf_counter() - started

    def stop(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after 30 s)."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> "LocalConnectServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_and_read_a_table(url: str) -> None:
    """Through a Connect session on ``url``: write, append to and read a small Delta table
    in a temporary folder (:meth:`LocalConnectServer.warm_up`'s client)."""
    with tempfile.TemporaryDirectory(prefix="dsi-connect-warm-up-") as folder:
        spark = build_spark_session(remote=url, delta=True)
        try:
            table = f"{folder}/table"
            spark.range(10).write.format("delta").save(table)
            spark.range(10).write.format("delta").mode("append").save(table)
            spark.read.format("delta").load(table).groupBy().count().collect()
        finally:
            spark.stop()


def _warm_up(server: LocalConnectServer) -> None:
    try:
        print(f"Spark Connect server warmed up in {server.warm_up():.0f} s", flush=True)
    except Exception as exc:  # the server's first run pays it instead
        print(f"Spark Connect server warm-up failed: {exc}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; its exit status is the command's (or 0 after Ctrl-C)."""
    parser = argparse.ArgumentParser(
        prog="python -m dagster_sideinputs.core.spark.connect_server",
        description="Start a local Spark Connect server with Delta Lake; optionally run a "
        "command while it is up (after --), with its URL in an environment variable.",
    )
    parser.add_argument("--port", type=int, default=CONNECT_DEFAULT_PORT)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--packages", default="", help="more Maven packages, comma-separated")
    parser.add_argument("--log", default="connect-server.log", help="the server's log file")
    parser.add_argument(
        "--export", metavar="NAME", help="set NAME to the server's URL for the command"
    )
    parser.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="do not warm the server up (a small Delta round trip, beside the command)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- command [args...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    server = LocalConnectServer(
        Path(args.log),
        port=args.port,
        host=args.host,
        master=args.master,
        driver_memory=args.driver_memory,
        packages=[p for p in args.packages.split(",") if p],
    )
    # A SIGTERM ends this process as Ctrl-C does: through the stop of the server.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    print(f"Starting a Spark Connect server with Delta on {server.url} (log: {args.log})...")
    started = time.perf_counter()
    try:
        with server:
            print(f"Spark Connect server up in {time.perf_counter() - started:.0f} s: {server.url}")
            if not command:
                while server.process is not None and server.process.poll() is None:
                    time.sleep(1)
                return 1  # it stopped by itself
            if args.warm_up:
                threading.Thread(target=_warm_up, args=(server,), daemon=True).start()
            env = dict(os.environ)
            if args.export:
                env[args.export] = server.url
            child = subprocess.Popen(command, env=env)
            try:
                return child.wait()
            except KeyboardInterrupt:  # Ctrl-C reached the command too: let it finish
                return child.wait()
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())

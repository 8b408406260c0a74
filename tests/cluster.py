"""Real Spark deployments on the loopback interface, started from the installed pyspark.

- :class:`StandaloneCluster`: a standalone master and workers, each its own process
  (``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), so
  executors are other processes than the driver, as on a real cluster.
- :class:`ConnectServer`: a Spark Connect server (``SparkConnectServer``); its clients
  run no JVM at all.
- :func:`run_demo`: the example pipeline (``python -m assets.demo``) end to end through
  Dagster, in a subprocess: the test session already holds a classic SparkContext, and
  a process can hold only one.
- :func:`assert_same_pipeline_outputs`: the output tables of two runs of the demo on the
  same input are the same.

Every process is started in its own process group and the whole group (executors and
Python workers included) is terminated on exit.

Run as a script, ``python -m tests.cluster probe --master URL`` (or ``--remote URL``)
prints, as JSON, which processes the tasks of a small job ran in.
"""

import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
REPO = Path(__file__).resolve().parents[1]
OUTPUT_TABLES = (
    "enriched_transactions",
    "suspicious_transactions",
    "late_transactions",
    "unmatched_transactions",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


KEPT = ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS", "DSI_JVM_ARCHIVE")


def spark_env(**extra: str) -> dict[str, str]:
    """This environment without Spark / project settings, plus loopback Spark settings.

    ``PYSPARK_PYTHON`` is this interpreter, so executors' Python workers run the same
    packages as the driver. ``SPARK_SUBMIT_OPTS``, ``SPARK_DAEMON_JAVA_OPTS`` and
    ``DSI_JVM_ARCHIVE`` stay: under pytest they hold the JVM options and the class
    archive of every JVM a test starts (tests/conftest.py); a benchmark's environment has
    none of them.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if key in KEPT or not key.startswith(("SPARK_", "PYSPARK_", "DSI_"))
    }
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    env.update(extra)
    return env


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def get_json(url: str, *, timeout_s: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


class _Process:
    """A long-running process in its own process group, output to a log file."""

    def __init__(self, name: str, args: Sequence[str], *, env: Mapping[str, str], log: Path):
        self.name = name
        self.log = log
        with open(log, "wb") as out:
            self.popen = subprocess.Popen(
                list(args),
                env=dict(env),
                cwd=log.parent,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def check_running(self) -> None:
        if self.popen.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with code {self.popen.returncode}:\n{tail(self.log)}"
            )

    def stop(self, *, grace_s: float = 20.0) -> None:
        """Terminate the whole process group; kill it when it does not end in time."""
        terminate_group(self.popen, grace_s=grace_s)


def terminate_group(popen: subprocess.Popen, *, grace_s: float = 20.0) -> None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, sig)
        try:
            popen.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; make sure no member of its group (an executor) lingers.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        return


def wait_until(
    condition: Any, *, timeout_s: float, what: str, processes: Sequence[_Process]
) -> Any:
    """Poll ``condition()`` until it returns a truthy value; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        for process in processes:
            process.check_running()
        try:
            value = condition()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last_error, value = exc, None
        if value:
            return value
        time.sleep(1.0)
    logs = "\n".join(f"--- {p.name} ({p.log}):\n{tail(p.log, 15)}" for p in processes)
    raise TimeoutError(f"{what} not within {timeout_s:.0f}s (last error: {last_error})\n{logs}")


class _Service:
    """Started by ``with``, stopped on exit (also when starting fails half-way)."""

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *_: object) -> None:
        self.stop()


class StandaloneCluster(_Service):
    """A Spark standalone master and ``workers`` workers on 127.0.0.1, as separate processes.

    Args:
        work: a folder for logs and the workers' work directories (executors run there).
        workers: number of worker processes.
        cores: cores each worker offers.
        memory: memory each worker offers to executors.
        startup_timeout_s: how long to wait for the master and all workers to be ALIVE.

    Examples:
        >>> with StandaloneCluster(tmp_path) as cluster:  # doctest: +SKIP
        ...     print(cluster.master_url)
        spark://127.0.0.1:40123
    """

    def __init__(
        self,
        work: Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "2g",
        startup_timeout_s: float = 240.0,
    ) -> None:
        self.work = work
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self.webui_port = free_port()
        self.master: _Process | None = None
        self.worker_processes: list[_Process] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    def worker_dir(self, index: int) -> Path:
        return self.work / f"worker-{index}"

    def _env(self) -> dict[str, str]:
        return spark_env(
            SPARK_LOG_DIR=str(self.work / "logs"),
            SPARK_WORKER_DIR=str(self.work / "workers"),
            # The master's REST submission server would take the fixed port 6066.
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        )

    def start(self) -> "StandaloneCluster":
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        self.master = _Process(
            "master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.webui_port),
            ],
            env=self._env(),
            log=self.work / "logs" / "master.out",
        )
        wait_until(
            lambda: self.state().get("status") == "ALIVE",
            timeout_s=self.startup_timeout_s,
            what=f"the master at {self.web_url} to be ALIVE",
            processes=[self.master],
        )
        for index in range(self.workers):
            self.worker_dir(index).mkdir(parents=True, exist_ok=True)
            self.worker_processes.append(
                _Process(
                    f"worker-{index}",
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--webui-port",
                        str(free_port()),
                        "--work-dir",
                        str(self.worker_dir(index)),
                        self.master_url,
                    ],
                    env=self._env(),
                    log=self.work / "logs" / f"worker-{index}.out",
                )
            )
        wait_until(
            lambda: self.state().get("aliveworkers") == self.workers,
            timeout_s=self.startup_timeout_s,
            what=f"{self.workers} ALIVE workers at {self.web_url}",
            processes=[self.master, *self.worker_processes],
        )
        return self

    def stop(self) -> None:
        # Workers first: they end their executors; the master last.
        for process in [*self.worker_processes, *([self.master] if self.master else [])]:
            process.stop()

    # --- what the cluster reports ------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The master's JSON status: workers, active and completed applications."""
        return get_json(f"{self.web_url}/json/")

    def worker_states(self) -> list[dict[str, Any]]:
        """Each worker's JSON status, with its running and finished executors."""
        return [get_json(f"{w['webuiaddress']}/json/") for w in self.state()["workers"]]

    def applications(self, name: str) -> list[dict[str, Any]]:
        """Active and completed applications called ``name``."""
        state = self.state()
        return [a for a in state["activeapps"] + state["completedapps"] if a["name"] == name]


class ConnectServer(_Service):
    """A Spark Connect server on 127.0.0.1 (its own JVM, running ``master``).

    Args:
        work: a folder for its log and warehouse.
        master: the master the server's Spark runs on (``local[2]``, ``spark://...``).
        startup_timeout_s: how long to wait for it to accept connections.
        packages: Maven coordinates the server loads (``--packages``), e.g. Delta's jar.
        confs: more ``--conf`` settings, e.g. Delta's SQL extension and catalog.
    """

    def __init__(
        self,
        work: Path,
        *,
        master: str = "local[2]",
        startup_timeout_s: float = 240.0,
        packages: Sequence[str] = (),
        confs: Mapping[str, str] | None = None,
    ) -> None:
        self.work = work
        self.master = master
        self.packages = list(packages)
        self.extra_confs = dict(confs or {})
        self.port = free_port()
        self.startup_timeout_s = startup_timeout_s
        self.process: _Process | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self) -> "ConnectServer":
        self.work.mkdir(parents=True, exist_ok=True)
        confs = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.sql.warehouse.dir": str(self.work / "warehouse"),
            "spark.driver.memory": "2g",
            **self.extra_confs,
        }
        args = [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            self.master,
        ]
        if self.packages:
            args += ["--packages", ",".join(self.packages)]
        for key, value in confs.items():
            args += ["--conf", f"{key}={value}"]
        args.append("spark-internal")
        self.process = _Process(
            "connect-server", args, env=spark_env(), log=self.work / "connect-server.out"
        )
        wait_until(
            self._accepting,
            timeout_s=self.startup_timeout_s,
            what=f"the Spark Connect server at {self.url}",
            processes=[self.process],
        )
        return self

    def _accepting(self) -> bool:
        assert self.process is not None
        if "Spark Connect server started" not in self.process.log.read_text(errors="replace"):
            return False
        with socket.create_connection(("127.0.0.1", self.port), timeout=5):
            return True

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


_DELTA_CLIENT = """
import json, sys
from dagster_sideinputs.core.spark.session import build_spark_session
from dagster_sideinputs.delta.spark.setup import is_delta_configured

url, path, delta = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
report = {}
try:
    spark = build_spark_session(remote=url, delta=delta)
except Exception as exc:
    report.update(error=type(exc).__name__, message=str(exc))
else:
    report.update(session=type(spark).__module__, delta=is_delta_configured(spark))
    if report["delta"]:
        spark.range(3).withColumnRenamed("id", "k").write.format("delta").save(path)
        spark.sql(
            f"MERGE INTO delta.`{path}` t USING (SELECT 1L AS k UNION ALL SELECT 7L) s "
            "ON t.k = s.k WHEN NOT MATCHED THEN INSERT *"
        )
        report["rows"] = sorted(r.k for r in spark.read.format("delta").load(path).collect())
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
        report["history"] = [(r.version, r.operation) for r in history]
    spark.stop()
print("REPORT " + json.dumps(report))
"""


def run_delta_client(url: str, path: Path, *, delta: object) -> dict:
    """A Connect client (subprocess) building its session with ``delta``; its report.

    With Delta it writes, MERGEs and reads a table at ``path`` through SQL / DataFrames.
    """
    proc = subprocess.run(
        [sys.executable, "-c", _DELTA_CLIENT, url, str(path), json.dumps(delta)],
        capture_output=True,
        text=True,
        env=spark_env(),
        timeout=600,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT "))


# --- the example pipeline in a subprocess ---------------------------------------------------


@dataclass(frozen=True)
class DemoRun:
    """A finished run of ``python -m assets.demo``: ``log`` holds what it printed,
    ``errors`` its error output, and Spark's, py4j's and Dagster's logs are in
    ``lake.parent / "demo.log"`` (the demo's own file)."""

    lake: Path
    log: Path
    errors: Path
    seconds: float


def run_subprocess(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    log: Path,
    timeout_s: float,
    errors: Path | None = None,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess:
    """Run a command in its own process group; kill the group if it outlives the timeout.

    Its output goes to ``log``, and so does its error output unless ``errors`` is given.
    """
    with contextlib.ExitStack() as files:
        out = files.enter_context(open(log, "wb"))
        err = files.enter_context(open(errors, "wb")) if errors else subprocess.STDOUT
        popen = subprocess.Popen(
            list(args),
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

        def what_it_printed(lines: int) -> str:
            return tail(log, lines) + (f"\nstderr:\n{tail(errors, lines)}" if errors else "")

        try:
            popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            terminate_group(popen)
            raise AssertionError(
                f"{' '.join(args)} did not finish within {timeout_s:.0f}s:\n{what_it_printed(40)}"
            ) from None
        finally:
            # Python workers or a JVM left behind by the driver process.
            terminate_group(popen, grace_s=5.0)
    if popen.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited with code {popen.returncode}:\n{what_it_printed(60)}"
        )
    return subprocess.CompletedProcess(list(args), popen.returncode)


def run_demo(
    work: Path,
    *,
    seed: int,
    hour: str,
    timeout_seconds: float,
    master: str = "local[*]",
    remote: str | None = None,
    deadline_s: float = 1500.0,
    extra_args: Sequence[str] = (),
) -> DemoRun:
    """The example pipeline end to end through Dagster, in a subprocess, on fresh tables.

    Laid out as ``make demo`` lays out the repository (``data/lake``, ``.dagster_home``),
    in ``work``, its working folder: so it prints what ``make demo`` prints.

    Args:
        work: folder for the lake, the Dagster instance and the log.
        seed / hour: pin the generated input (``--seed`` / ``--hour`` of the demo).
        timeout_seconds: how long transactions wait for a missing profile.
        master: ``DSI_SPARK_MASTER``; remote: ``DSI_SPARK_REMOTE`` (Spark Connect).
    """
    work.mkdir(parents=True, exist_ok=True)
    lake = work / "data" / "lake"
    env = spark_env(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        DSI_LAKE_ROOT=str(lake),
        DAGSTER_HOME=str(work / ".dagster_home"),
        DSI_SPARK_UI="false",
        DSI_SPARK_MASTER=master,
        DSI_SPARK_REMOTE=remote or "",
    )
    args = [
        sys.executable,
        "-m",
        "assets.demo",
        "--seed",
        str(seed),
        "--hour",
        hour,
        "--timeout-seconds",
        str(timeout_seconds),
        *extra_args,
    ]
    log, errors = work / "demo.out", work / "demo.err"
    started = time.monotonic()
    run_subprocess(args, env=env, log=log, errors=errors, timeout_s=deadline_s, cwd=work)
    return DemoRun(lake, log, errors, time.monotonic() - started)


# The input every demo run of the test session processes: a fixed seed, and the hour the
# session started in (the demo generates transactions and FX rates around it).
DEMO_SEED = 20_240_501
DEMO_HOUR = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0).isoformat()
DEMO_TIMEOUT_S = 10.0  # the demo waits this long on purpose (its step 5)

_reference: dict[str, Future[DemoRun]] = {}


def local_reference(tmp_path_factory: Any) -> Future[DemoRun]:
    """The demo on ``local[*]`` with the session's input, started once per test session.

    Runs in the background (the caller runs its own variant meanwhile); later callers
    get the same run: the Kafka demo's reference, and the run whose output test_docs
    compares with the sample of docs/getting-started.md.
    """
    if "local" not in _reference:
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-reference")
        _reference["local"] = pool.submit(
            run_demo,
            tmp_path_factory.mktemp("local-reference"),
            master="local[*]",
            seed=DEMO_SEED,
            hour=DEMO_HOUR,
            timeout_seconds=DEMO_TIMEOUT_S,
        )
        pool.shutdown(wait=False)
    return _reference["local"]


# --- comparing two runs ---------------------------------------------------------------------


def table_rows(lake: Path, name: str, *, version: int | None = None) -> list[dict[str, Any]]:
    """A Delta table's rows as dicts, sorted by ``tx_id`` (or by all values)."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(lake / name), version=version).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: r["tx_id"] if "tx_id" in r else repr(list(r.values())))


def _describe_difference(name: str, expected: list[dict], actual: list[dict]) -> str:
    by_id_expected = {r["tx_id"]: r for r in expected}
    by_id_actual = {r["tx_id"]: r for r in actual}
    missing = sorted(set(by_id_expected) - set(by_id_actual))
    extra = sorted(set(by_id_actual) - set(by_id_expected))
    changed = [
        (tx, by_id_expected[tx], by_id_actual[tx])
        for tx in sorted(set(by_id_expected) & set(by_id_actual))
        if by_id_expected[tx] != by_id_actual[tx]
    ]
    return (
        f"{name}: {len(expected)} rows expected, {len(actual)} found; missing tx_ids "
        f"{missing[:5]}, unexpected {extra[:5]}, {len(changed)} changed, e.g. {changed[:1]}"
    )


def _profile_arrivals(lake: Path) -> list[set[int]]:
    """The customers with a profile at each version of ``customer_profiles``."""
    from deltalake import DeltaTable

    latest = DeltaTable(str(lake / "customer_profiles")).version()
    return [
        {r["customer_id"] for r in table_rows(lake, "customer_profiles", version=v)}
        for v in range(latest + 1)
    ]


def pipeline_invariants(lake: Path, *, inputs: Path | None = None) -> dict[str, Any]:
    """Facts of one demo run that hold however long its steps took; fails when one breaks.

    Every transaction ends up exactly once in ``enriched_transactions`` or in
    ``late_transactions`` (none is lost, duplicated or left waiting in the buffer), and
    every unmatched one was replayed into ``enriched_transactions``. ``inputs``: the lake
    holding the ``transactions`` table, when the run read them from elsewhere (Kafka).
    """
    transactions = table_rows(inputs or lake, "transactions")
    enriched = table_rows(lake, "enriched_transactions")
    late = table_rows(lake, "late_transactions")
    unmatched = table_rows(lake, "unmatched_transactions")
    all_ids = [r["tx_id"] for r in transactions]
    enriched_ids = [r["tx_id"] for r in enriched]
    late_ids = [r["tx_id"] for r in late]
    assert len(set(all_ids)) == len(all_ids), "the input holds duplicate tx_ids"
    assert len(set(enriched_ids)) == len(enriched_ids), "a transaction was enriched twice"
    assert not set(enriched_ids) & set(late_ids), "a transaction is both late and enriched"
    assert sorted(enriched_ids + late_ids) == sorted(all_ids), (
        f"{len(all_ids)} transactions, but {len(enriched_ids)} enriched + {len(late_ids)} late"
    )
    unmatched_ids = {r["tx_id"] for r in unmatched}
    assert unmatched_ids <= set(enriched_ids), "an unmatched transaction was not replayed"
    by_id = {r["tx_id"]: r for r in transactions}
    for row in unmatched:
        original = by_id[row["tx_id"]]
        assert {k: row[k] for k in original} == original, f"unmatched row changed: {row}"
    return {"transactions": len(all_ids), "unmatched": len(unmatched_ids)}


def assert_demo_matches_local_run(
    work: Path, tmp_path_factory: Any, *, master: str = "local[*]", remote: str | None = None
) -> DemoRun:
    """Run the demo on a deployment with the session's input; its outputs equal the
    ``local[*]`` reference run's."""
    reference = local_reference(tmp_path_factory)
    run = run_demo(
        work,
        master=master,
        remote=remote,
        seed=DEMO_SEED,
        hour=DEMO_HOUR,
        timeout_seconds=DEMO_TIMEOUT_S,
    )
    assert_same_pipeline_outputs(reference.result().lake, run.lake)
    return run


def assert_same_pipeline_outputs(
    expected: Path, actual: Path, *, actual_has_inputs: bool = True
) -> None:
    """The demo's output tables in two lakes are the same, up to timing.

    ``transactions`` (the input), ``enriched_transactions``, ``suspicious_transactions``
    and ``late_transactions`` must be equal row for row. ``unmatched_transactions``
    legitimately depends on wall-clock time: a transaction of a customer whose profile
    arrives in step 4 goes there only if it waited longer than the timeout first, which
    depends on how long the steps took. So it must be equal for the customers whose
    profile arrived only in step 6 (they always time out), and otherwise only satisfy
    :func:`pipeline_invariants` (each unmatched row was replayed into the enriched table,
    which is compared exactly). ``actual_has_inputs=False``: the actual run read the
    same transactions from elsewhere (Kafka), checked against the expected run's table.
    """
    pipeline_invariants(expected)
    pipeline_invariants(actual, inputs=None if actual_has_inputs else expected)
    compared = ("transactions",) if actual_has_inputs else ()

    def actual_rows(name: str) -> list[dict[str, Any]]:
        # Records read from Kafka carry their coordinates (kafka_topic, kafka_offset...)
        # into the routes' tables (the function's outputs keep the columns it selects);
        # the records themselves must be the same.
        rows = table_rows(actual, name)
        if actual_has_inputs:
            return rows
        if name in OUTPUT_TABLES[2:]:
            assert all("kafka_offset" in r for r in rows), f"{name}: no Kafka coordinates"
        return [{k: v for k, v in r.items() if not k.startswith("kafka_")} for r in rows]

    for name in (*compared, *OUTPUT_TABLES[:3]):
        want, got = table_rows(expected, name), actual_rows(name)
        assert got == want, _describe_difference(name, want, got)
    arrivals = _profile_arrivals(expected)
    assert arrivals == _profile_arrivals(actual), "customer_profiles differ between the runs"
    last_minute = arrivals[-1] - arrivals[-2]
    want = [r for r in table_rows(expected, OUTPUT_TABLES[3]) if r["customer_id"] in last_minute]
    got = [r for r in actual_rows(OUTPUT_TABLES[3]) if r["customer_id"] in last_minute]
    assert want, "no transaction waited for a profile of the last step: the demo changed?"
    assert got == want, _describe_difference("unmatched_transactions (step-6 customers)", want, got)


# --- which processes run the tasks ----------------------------------------------------------


def _probe(master: str | None, remote: str | None) -> dict[str, Any]:
    """Run a small job and report the processes its tasks ran in (this is the driver)."""
    import psutil

    import dagster_sideinputs as dsi

    spark = dsi.build_spark_session(
        master=master or "local[*]",
        remote=remote,
        app_name="dsi-cluster-probe",
        ui_enabled=False,
        configs=None
        if remote
        else {
            # Wait for every executor, so that the tasks spread over all of them.
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        },
    )

    def where(rows: Any) -> Any:
        import os
        import time

        import pandas as pd
        import psutil

        for frame in rows:
            time.sleep(0.5)  # keep each task long enough for both executors to get some
            me = psutil.Process()
            # The end of a JVM's command line names its main class and arguments.
            chain = [(p.pid, " ".join(p.cmdline())[-400:]) for p in me.parents()]
            yield pd.DataFrame(
                {"pid": [os.getpid()] * len(frame), "cwd": [os.getcwd()] * len(frame)}
                | {"ancestors": [json.dumps(chain)] * len(frame)}
            )

    # mapInPandas works over Spark Connect too (RDDs do not).
    tasks = (
        spark.range(0, 8, 1, 8)
        .mapInPandas(where, "pid long, cwd string, ancestors string")
        .distinct()
        .collect()
    )
    children = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):  # gone, or a zombie
            children.append(" ".join(child.cmdline())[:200])
    from dagster_sideinputs.core.spark.session import FOLLOW_CORES, fit_shuffle_partitions

    follows = spark.conf.get(FOLLOW_CORES, None)
    report = {
        "shuffle": {
            "follows": follows,
            "fitted": fit_shuffle_partitions(spark),
            "partitions": spark.conf.get("spark.sql.shuffle.partitions"),
            "cores": None if remote else spark.sparkContext.defaultParallelism,
        },
        "session": type(spark).__module__,
        "driver_pid": os.getpid(),
        "driver_children": children,
        "tasks": [
            {"pid": t["pid"], "cwd": t["cwd"], "ancestors": json.loads(t["ancestors"])}
            for t in tasks
        ],
    }
    spark.stop()
    return report


def run_probe(
    work: Path, *, master: str | None = None, remote: str | None = None
) -> dict[str, Any]:
    """:func:`_probe` in a subprocess (a driver of its own); its JSON report."""
    work.mkdir(parents=True, exist_ok=True)
    target = ["--remote", remote] if remote else ["--master", master or "local[*]"]
    log = work / "probe.log"
    out = work / "probe.json"
    args = [sys.executable, "-m", "tests.cluster", "probe", *target, "--out", str(out)]
    run_subprocess(args, env=spark_env(), log=log, timeout_s=600)
    return json.loads(out.read_text())


def run_operator_client(
    work: Path, *, master: str | None = None, remote: str | None = None
) -> dict[str, Any]:
    """``tests/operator_client.py`` against a deployment, in a subprocess; its JSON report."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / "report.json"
    target = ["--remote", remote] if remote else ["--master", master or "local[*]"]
    args = [sys.executable, "-m", "tests.operator_client", *target]
    args += ["--work", str(work), "--out", str(out)]
    run_subprocess(args, env=spark_env(), log=work / "client.log", timeout_s=900)
    return json.loads(out.read_text())


def check(report: dict[str, Any], name: str) -> Any:
    """The value of a check of :func:`run_operator_client` that must have worked."""
    outcome = report[name]
    assert outcome["ok"], f"{name} failed:\n{outcome['traceback']}"
    return outcome["value"]


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Where do the tasks of a small job run?")
    parser.add_argument("command", choices=["probe"])
    parser.add_argument("--master")
    parser.add_argument("--remote")
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    Path(options.out).write_text(json.dumps(_probe(options.master, options.remote), indent=2))

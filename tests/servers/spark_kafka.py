"""Spark's Kafka connector (``spark-sql-kafka-0-10``) in a SparkSession of its own.

The connector's jars come through ``spark.jars.packages`` (:data:`SPARK_KAFKA_PACKAGES`),
which a SparkContext reads only when it starts; the test session's shared context is
already running without them. :class:`SparkKafkaSession` therefore runs a second
session in a subprocess (``python -m tests.servers.spark_kafka serve``) and sends it
requests as JSON lines on stdin; answers come back on stdout, marked, because the JVM
writes to the same stream.

Requests: ``read`` (a batch ``spark.read.format("kafka")`` with the given options,
collected), ``write`` (a batch write through the connector, i.e. the Java producer)
and ``topic_id`` (the topic id from the Java ``Admin`` client inside the Spark JVM).
"""

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Spark 4.1.x's connector; 4.1.1 is the newest 4.1 release whose jar and
# spark-token-provider-kafka-0-10 dependency Maven Central serves here. It pulls
# kafka-clients 3.9.1 and commons-pool2 2.12.1.
SPARK_KAFKA_VERSION = "4.1.1"
SPARK_KAFKA_PACKAGES: Sequence[str] = (
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_KAFKA_VERSION}",
)
# The connector also depends on jars pyspark ships (same versions); the two Hadoop
# client jars are 30+ MB that every executor would fetch again for nothing.
SPARK_KAFKA_EXCLUDES: Sequence[str] = (
    "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.hadoop:hadoop-client-api",
)

REPO = Path(__file__).resolve().parents[2]
_MARK = "@@spark-kafka@@ "


@dataclass(frozen=True)
class KafkaRow:
    """One record as the connector returns it (key and value decoded as UTF-8)."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: str | None


class SparkKafkaError(Exception):
    """A request the Spark session answered with an error.

    Attributes:
        type: The Python exception class (``Py4JJavaError``, ``IllegalArgumentException``).
        java_class: The Java exception class, when the error came from the JVM.
        condition: Spark's error condition (``KAFKA_DATA_LOSS.COULD_NOT_READ_OFFSET_RANGE``).
        message: The message without the stack trace.
    """

    def __init__(self, error: Mapping[str, Any]):
        self.type = str(error.get("type"))
        self.java_class = error.get("java_class")
        self.condition = error.get("condition")
        self.message = str(error.get("message"))
        super().__init__(f"{self.type} [{self.condition or self.java_class}]: {self.message}")


def exact_range_options(
    bootstrap_servers: str,
    topic: str,
    start: Mapping[int, int],
    end: Mapping[int, int],
    **extra: str,
) -> dict[str, str]:
    """Reader options for the records ``start[p] <= offset < end[p]`` of each partition.

    ``assign`` names exactly the plan's partitions, so partitions added later are not
    read (with ``subscribe`` the offsets must name every partition the topic has now).
    """
    partitions = sorted(start)
    if sorted(end) != partitions:
        raise ValueError(f"start names partitions {partitions}, end names {sorted(end)}")

    def offsets(by_partition: Mapping[int, int]) -> str:
        return json.dumps({topic: {str(p): int(by_partition[p]) for p in partitions}})

    return {
        "kafka.bootstrap.servers": bootstrap_servers,
        "assign": json.dumps({topic: partitions}),
        "startingOffsets": offsets(start),
        "endingOffsets": offsets(end),
        **extra,
    }


class SparkKafkaSession:
    """A SparkSession with the Kafka connector, in a subprocess.

    Args:
        workdir: Where the subprocess writes its log (``spark-kafka.log``).
        packages: Maven coordinates for ``spark.jars.packages``.
        excludes: ``spark.jars.excludes``.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        packages: Sequence[str] = SPARK_KAFKA_PACKAGES,
        excludes: Sequence[str] = SPARK_KAFKA_EXCLUDES,
    ) -> None:
        self.workdir = workdir
        self.packages = list(packages)
        self.excludes = list(excludes)
        self.jars: list[str] = []
        self.startup_s = 0.0
        self._popen: subprocess.Popen | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()

    @property
    def log_path(self) -> Path:
        return self.workdir / "spark-kafka.log"

    def start(self, *, timeout_s: float = 600.0) -> "SparkKafkaSession":
        """Start the subprocess; returns once its session is up (jars resolved)."""
        from tests.cluster import spark_env
        from tests.servers.kafka import _die_with_parent

        self.workdir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        args = [sys.executable, "-m", "tests.servers.spark_kafka", "serve"]
        args += ["--packages", ",".join(self.packages), "--excludes", ",".join(self.excludes)]
        with open(self.log_path, "wb") as log:
            self._popen = subprocess.Popen(
                args,
                cwd=REPO,
                env=spark_env(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1"),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        threading.Thread(target=self._pump, daemon=True).start()
        ready = self._answer(timeout_s)
        self.jars = list(ready["jars"])
        self.startup_s = time.monotonic() - started
        return self

    def _pump(self) -> None:
        assert self._popen is not None
        assert self._popen.stdout is not None
        for line in self._popen.stdout:
            if line.startswith(_MARK):
                self._lines.put(line[len(_MARK) :])
        self._lines.put(None)  # the process closed its stdout: it has exited

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"Spark Kafka session: no answer in {timeout_s}s") from None
        if line is None:
            raise RuntimeError(f"Spark Kafka session exited:\n{self._log_tail()}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise SparkKafkaError(answer["error"])
        return answer

    def _log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def request(self, payload: Mapping[str, Any], *, timeout_s: float = 300.0) -> dict[str, Any]:
        if self._popen is None or self._popen.stdin is None:
            raise RuntimeError("SparkKafkaSession is not started")
        self._popen.stdin.write(json.dumps(payload) + "\n")
        self._popen.stdin.flush()
        return self._answer(timeout_s)

    def read(self, options: Mapping[str, str], *, timeout_s: float = 300.0) -> list[KafkaRow]:
        """``spark.read.format("kafka").options(**options).load()``, collected, sorted by
        partition and offset."""
        answer = self.request({"op": "read", "options": dict(options)}, timeout_s=timeout_s)
        return [KafkaRow(*row) for row in answer["rows"]]

    def write(self, topic: str, bootstrap_servers: str, records: Sequence[tuple[str, str]]) -> None:
        """Write ``(key, value)`` records with the connector's batch sink (Java producer)."""
        payload = {
            "op": "write",
            "options": {"kafka.bootstrap.servers": bootstrap_servers, "topic": topic},
            "rows": [list(r) for r in records],
        }
        self.request(payload)

    def topic_id(self, topic: str, bootstrap_servers: str) -> str:
        """The topic id as the Java ``Admin`` client in the Spark JVM reports it."""
        payload = {"op": "topic_id", "topic": topic, "bootstrap_servers": bootstrap_servers}
        return str(self.request(payload)["topic_id"])

    def stop(self) -> None:
        if self._popen is None:
            return
        from tests.servers.kafka import stop_process_group

        with contextlib.suppress(OSError):
            if self._popen.stdin is not None:
                self._popen.stdin.close()  # the server ends its loop and stops Spark
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=30)
        stop_process_group(self._popen)  # whatever is left of the group (the JVM)
        self._popen = None

    def __enter__(self) -> "SparkKafkaSession":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


# -- the subprocess ------------------------------------------------------------------


_answers = sys.stdout


def _send(answer: Mapping[str, Any]) -> None:
    _answers.write(_MARK + json.dumps(answer) + "\n")
    _answers.flush()


def _describe(exc: BaseException) -> dict[str, Any]:
    """Class, Spark error condition and message (no stack trace) of an exception."""
    error: dict[str, Any] = {"type": type(exc).__name__}
    condition = None
    get_condition = getattr(exc, "getCondition", None)
    if callable(get_condition):
        with contextlib.suppress(Exception):
            condition = get_condition()
    java = getattr(exc, "java_exception", None)
    if java is not None:
        error["java_class"] = java.getClass().getName()
        cause = java
        while cause is not None and condition is None:  # the first SparkThrowable in the chain
            with contextlib.suppress(Exception):
                condition = cause.getCondition()
            cause = cause.getCause()
        text = str(java.getMessage())
    else:
        text = str(getattr(exc, "_desc", None) or exc)
    error["condition"] = condition
    error["message"] = "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("at ")
    ).strip()
    return error


def _serve(packages: str, excludes: str) -> None:
    global _answers
    # Answers get the pipe to themselves: the JVM this process starts inherits fd 1,
    # and a long answer could otherwise be interleaved with what the JVM prints.
    _answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("dagster-sideinputs-kafka")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.jars.packages", packages)
    )
    if excludes:
        builder = builder.config("spark.jars.excludes", excludes)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _send({"jars": spark.sparkContext.getConf().get("spark.jars", "").split(",")})
    for line in sys.stdin:
        request = json.loads(line)
        try:
            _send(_handle(spark, request))
        except Exception as exc:
            _send({"error": _describe(exc)})
    spark.stop()


def _handle(spark: Any, request: Mapping[str, Any]) -> dict[str, Any]:
    op = request["op"]
    if op == "read":
        frame = spark.read.format("kafka").options(**request["options"]).load()
        rows = frame.selectExpr(
            "topic", "partition", "offset", "CAST(key AS STRING)", "CAST(value AS STRING)"
        ).collect()
        return {"rows": sorted([list(r) for r in rows], key=lambda r: (r[0], r[1], r[2]))}
    if op == "write":
        frame = spark.createDataFrame(request["rows"], "key string, value string")
        frame.write.format("kafka").options(**request["options"]).save()
        return {"written": len(request["rows"])}
    if op == "topic_id":
        jvm = spark.sparkContext._jvm
        props = jvm.java.util.Properties()
        props.put("bootstrap.servers", request["bootstrap_servers"])
        admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
        try:
            names = jvm.java.util.Collections.singletonList(request["topic"])
            described = admin.describeTopics(names).allTopicNames().get()
            return {"topic_id": described.get(request["topic"]).topicId().toString()}
        finally:
            admin.close()
    raise ValueError(f"unknown op {op!r}")


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.servers.spark_kafka")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="answer JSON-line requests on stdin")
    serve.add_argument("--packages", default=",".join(SPARK_KAFKA_PACKAGES))
    serve.add_argument("--excludes", default=",".join(SPARK_KAFKA_EXCLUDES))
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    _serve(args.packages, args.excludes)


if __name__ == "__main__":
    main()

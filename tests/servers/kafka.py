"""A real single-node Kafka broker on 127.0.0.1, for tests and benchmarks.

The broker runs in KRaft mode (one process is both broker and controller) from Kafka's
own jars, which :func:`ensure_kafka_libs` fetches from Maven Central with ``mvn`` into a
per-user cache the first time they are needed (``make kafka-jars`` does it ahead of
time). Each :class:`KafkaBroker` formats fresh storage in its own folder with a random
cluster id, listens on free ports, and is killed with its process group on
:meth:`KafkaBroker.stop` - and by the kernel if the test process itself dies.

Clients are confluent-kafka (librdkafka). Keyed records are placed with
``partitioner=murmur2_random``, the Java client's default partitioner (see
``tests/servers/partitioner.py``).

Run as a script: ``python -m tests.servers.kafka fetch-jars`` fetches the jars;
``python -m tests.servers.kafka bench-produce --records N`` starts a broker and
measures :meth:`KafkaBroker.produce_json`.
"""

import argparse
import base64
import contextlib
import ctypes
import fcntl
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic, OffsetSpec

from dagster_sideinputs.core.sources.kafka.admin import leadership_in_flux

KAFKA_VERSION = "4.1.1"
SCALA_BINARY = "2.13"
# Kafka 4 logs through SLF4J 1.7 and ships log4j2 without the binding between them;
# the distribution adds it, so we do too (otherwise the broker logs nothing at all).
LOG4J_SLF4J = "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

# Broker settings for tests. Everything a test may rely on is here, explicitly.
BROKER_DEFAULTS: Mapping[str, str] = {
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # Small segments and a quick retention check, so a test that sets a short
    # ``retention.ms`` on its topic sees old segments (and their offsets) go in seconds.
    # 1 MiB is the smallest segment size Kafka 4 accepts.
    "log.segment.bytes": str(1024 * 1024),
    "log.retention.check.interval.ms": "500",
    "log.initial.task.delay.ms": "0",
    "log.segment.delete.delay.ms": "0",
    # Two cores are shared by every test process: few threads, a small cleaner buffer.
    "num.network.threads": "2",
    "num.io.threads": "2",
    "background.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
}

# The JIT's second tier (C2) roughly doubles the CPU a broker start takes (6.1 s of CPU
# against 3.6 s measured, 12.8 s against 5.5 s to ready on a loaded 2-core machine);
# the test loads are too small for the faster code it produces to pay that back. One GC
# thread, as the tests' Spark drivers have (tests/conftest.py).
JVM_OPTIONS: Sequence[str] = (
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
)

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
"""


class KafkaSetupError(RuntimeError):
    """The broker could not be fetched, formatted or started; the message says why."""


def cache_root() -> Path:
    """Where fetched jars are kept: ``$XDG_CACHE_HOME`` or ``~/.cache``, per project."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "dagster-sideinputs"


def ensure_kafka_libs(version: str = KAFKA_VERSION, *, root: Path | None = None) -> Path:
    """The folder of Kafka's broker jars, fetched with Maven on first use.

    Idempotent and safe to call from concurrent processes: a file lock serializes the
    fetch, jars land in a staging folder first, and a ``COMPLETE`` marker is written
    only once the folder is whole.

    Returns:
        ``<cache>/kafka-<version>/libs``, for ``java -cp '<libs>/*'``.
    """
    home = (root or cache_root()) / f"kafka-{version}"
    libs, complete = home / "libs", home / "COMPLETE"
    if complete.exists():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if complete.exists():  # another process fetched them while we waited
            return libs
        _fetch_jars(version, home, libs)
        complete.write_text("\n".join(sorted(p.name for p in libs.iterdir())) + "\n")
    return libs


def _fetch_jars(version: str, home: Path, libs: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaSetupError(
            "Fetching Kafka's jars needs Maven (`mvn`), which is not on PATH: install it "
            "(Debian/Ubuntu: `apt-get install -y maven`, macOS: `brew install maven`)."
        )
    staging = Path(tempfile.mkdtemp(prefix="fetch-", dir=home))
    try:
        (staging / "pom.xml").write_text(_pom(version))
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(staging / "pom.xml"),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging / 'libs'}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        main_jar = staging / "libs" / f"kafka_{SCALA_BINARY}-{version}.jar"
        if proc.returncode != 0 or not main_jar.exists():
            raise KafkaSetupError(
                f"`{' '.join(cmd)}` failed (exit {proc.returncode}) fetching Kafka {version}:\n"
                f"{(proc.stdout + proc.stderr)[-4000:]}\n"
                "Check that Maven Central is reachable, or pick a KAFKA_VERSION it serves."
            )
        if libs.exists():  # a fetch that died before writing COMPLETE
            shutil.rmtree(libs)
        os.rename(staging / "libs", libs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _pom(version: str) -> str:
    group, artifact, log4j_version = LOG4J_SLF4J.split(":")
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.dagster-sideinputs</groupId>
  <artifactId>kafka-broker-libs</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{SCALA_BINARY}</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{log4j_version}</version>
    </dependency>
  </dependencies>
</project>
"""


def find_java() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        raise KafkaSetupError("The Kafka broker needs Java 17+: set JAVA_HOME or put java on PATH.")
    return java


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def random_cluster_id() -> str:
    """A cluster id as Kafka writes one: 16 random bytes, URL-safe base64, no padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the process that started it dies.

    Fixture teardown stops the broker on any test outcome; this covers the test
    process being killed outright, so no JVM outlives it.
    """
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def stop_process_group(popen: subprocess.Popen, *, grace_s: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL it when it has not exited in time."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, sig)
        try:
            popen.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def uuid_text(value: Any) -> str:
    """A Kafka ``Uuid`` as Java's ``Uuid.toString()`` writes it (URL-safe base64).

    confluent-kafka's ``str()`` uses the standard alphabet (``+``, ``/``), so the same
    topic id would not compare equal to what the Java clients (Spark's) report.
    """
    bits = (value.get_most_significant_bits() << 64) | (
        value.get_least_significant_bits() & 0xFFFFFFFFFFFFFFFF
    )
    raw = (bits & ((1 << 128) - 1)).to_bytes(16, "big")
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _results(futures: Mapping[Any, Any], timeout_s: float) -> dict[Any, Any]:
    # confluent-kafka resolves each future by looking its key up in the very dict it
    # returned, so that dict must not be changed (e.g. popitem) before all are done.
    return {key: future.result(timeout=timeout_s) for key, future in futures.items()}


class KafkaBroker:
    """One Kafka broker + controller process on 127.0.0.1.

    Args:
        workdir: Folder for the config, data (``data/``) and log (``broker.log``); a new
            temporary folder (removed on :meth:`stop`) when None.
        config: Broker settings on top of :data:`BROKER_DEFAULTS`.
        heap: JVM heap size (``-Xmx``).
        libs: Folder of Kafka jars; :func:`ensure_kafka_libs` when None.

    Examples:
        >>> with KafkaBroker() as broker:  # doctest: +SKIP
        ...     broker.create_topic("payments", partitions=4)
        ...     broker.produce_json("payments", [{"id": 1}], key="id")
    """

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        config: Mapping[str, str] | None = None,
        heap: str = "768m",
        jvm_options: Sequence[str] = JVM_OPTIONS,
        libs: Path | None = None,
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="dsi-kafka-"))
        self.config = {**BROKER_DEFAULTS, **(config or {})}
        self.heap = heap
        self.jvm_options = list(jvm_options)
        self.libs = libs
        self.port = 0
        self.controller_port = 0
        self.cluster_id = ""
        self.startup_s = 0.0
        self._popen: subprocess.Popen | None = None
        self._admin: AdminClient | None = None
        self._names = itertools.count()

    # -- lifecycle -------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>``, for ``bootstrap.servers`` / ``kafka.bootstrap.servers``."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    def start(self, *, timeout_s: float = 60.0, attempts: int = 3) -> "KafkaBroker":
        """Format fresh storage and start the broker; returns once it serves metadata.

        A free port can be taken by another process between our probe and the broker's
        bind, so a start that fails is retried on new ports.
        """
        libs = self.libs or ensure_kafka_libs()
        classpath = f"{libs}/*"
        started = time.monotonic()
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(classpath, timeout_s)
                break
            except KafkaSetupError:
                self.stop(keep_workdir=True)
                if attempt == attempts:
                    raise
        self.startup_s = time.monotonic() - started
        return self

    def _start_once(self, classpath: str, timeout_s: float) -> None:
        java = find_java()
        self.port, self.controller_port = free_port(), free_port()
        self.cluster_id = random_cluster_id()
        data = self.workdir / "data"
        shutil.rmtree(data, ignore_errors=True)
        properties = self.workdir / "server.properties"
        properties.write_text(self._server_properties(data))
        log4j = self.workdir / "log4j2.properties"
        log4j.write_text(_LOG4J2.format(log=self.log_path))
        jvm = [java, f"-Xmx{self.heap}", *self.jvm_options, "-cp", classpath]
        jvm.append(f"-Dlog4j2.configurationFile={log4j}")
        fmt = subprocess.run(
            [
                *jvm,
                "kafka.tools.StorageTool",
                "format",
                "-t",
                self.cluster_id,
                "-c",
                str(properties),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if fmt.returncode != 0:
            raise KafkaSetupError(f"Formatting Kafka storage failed:\n{fmt.stdout}{fmt.stderr}")
        with open(self.workdir / "broker.out", "wb") as out:
            self._popen = subprocess.Popen(
                [*jvm, "kafka.Kafka", str(properties)],
                cwd=self.workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._wait_ready(timeout_s)

    def _server_properties(self, data: Path) -> str:
        listeners = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(data),
        }
        return "".join(f"{k}={v}\n" for k, v in {**listeners, **self.config}.items())

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        # Poll the port first: librdkafka logs every refused connection to stderr.
        while not self._accepting():
            self._check_alive()
            if time.monotonic() > deadline:
                raise KafkaSetupError(f"Kafka did not open port {self.port} in {timeout_s}s")
            time.sleep(0.05)
        while True:
            self._check_alive()
            with contextlib.suppress(KafkaException):
                if self.admin().list_topics(timeout=2).brokers:
                    return
            if time.monotonic() > deadline:
                raise KafkaSetupError(
                    f"Kafka served no metadata in {timeout_s}s:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def _accepting(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def _check_alive(self) -> None:
        if self._popen is not None and self._popen.poll() is not None:
            raise KafkaSetupError(
                f"Kafka exited with code {self._popen.returncode}:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the broker's stdout and log, for error messages."""
        parts = []
        for path in (self.workdir / "broker.out", self.log_path):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self, *, keep_workdir: bool = False) -> None:
        """Kill the broker (its whole process group) and remove its temporary folder."""
        self._admin = None
        if self._popen is not None:
            stop_process_group(self._popen)
            self._popen = None
        if self._own_workdir and not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- clients ---------------------------------------------------------------------

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, **overrides}

    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.client_config())
        return self._admin

    def producer(self, **config: Any) -> Producer:
        """A producer that places keyed records as the Java client does (murmur2)."""
        return Producer(self.client_config(**{"partitioner": "murmur2_random", **config}))

    def consumer(self, **config: Any) -> Consumer:
        defaults = {"group.id": f"dsi-test-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
        return Consumer(self.client_config(**{**defaults, **config}))

    # -- admin -----------------------------------------------------------------------

    def unique_topic(self, prefix: str = "topic") -> str:
        """A topic name no other test of this broker uses."""
        return f"{prefix}-{next(self._names)}-{uuid.uuid4().hex[:6]}"

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        *,
        config: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> str:
        """Create a topic and wait until its partitions have a leader; returns its name."""
        topic = NewTopic(name, partitions, 1, config=dict(config or {}))
        _results(self.admin().create_topics([topic], operation_timeout=timeout_s), timeout_s)
        self._wait_for(lambda: self.partition_count(name) == partitions, timeout_s, name)
        return name

    def delete_topic(self, name: str, *, timeout_s: float = 30.0) -> None:
        """Delete a topic and wait until the broker no longer lists it."""
        _results(self.admin().delete_topics([name], operation_timeout=timeout_s), timeout_s)
        self._wait_for(lambda: name not in self.topics(), timeout_s, name)

    def recreate_topic(self, name: str, partitions: int = 1, *, timeout_s: float = 30.0) -> str:
        """Delete a topic and create one of the same name (a new topic id, offsets from 0).

        Creating right after deleting can fail while the deletion is still applied, so
        the creation is retried until the deadline.
        """
        self.delete_topic(name, timeout_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.create_topic(name, partitions, timeout_s=timeout_s)
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def create_partitions(self, name: str, total: int, *, timeout_s: float = 30.0) -> None:
        """Grow a topic to ``total`` partitions (Kafka cannot shrink one)."""
        request = [NewPartitions(name, total)]
        _results(self.admin().create_partitions(request, operation_timeout=timeout_s), timeout_s)
        self._wait_for(lambda: self.partition_count(name) == total, timeout_s, name)

    def delete_records(
        self, name: str, before: Mapping[int, int], *, timeout_s: float = 30.0
    ) -> dict[int, int]:
        """Delete every record below ``before[partition]``, as retention would.

        Returns:
            The new earliest offset (log start offset) of each partition.
        """
        request = [TopicPartition(name, p, offset) for p, offset in before.items()]
        done = _results(
            self.admin().delete_records(request, operation_timeout=timeout_s), timeout_s
        )
        return {tp.partition: result.low_watermark for tp, result in done.items()}

    def topics(self) -> set[str]:
        return {t for t in self.admin().list_topics(timeout=10).topics if not t.startswith("__")}

    def partition_count(self, name: str) -> int:
        """Partitions of a topic that have a leader (0 when the topic does not exist)."""
        metadata = self.admin().list_topics(topic=name, timeout=10).topics.get(name)
        if metadata is None or metadata.error is not None:
            return 0
        return sum(1 for p in metadata.partitions.values() if p.leader >= 0 and p.error is None)

    def topic_id(self, name: str) -> str:
        """The topic's id (a UUID, base64 as Kafka prints it); it changes on recreation."""
        described = _results(self.admin().describe_topics(TopicCollection([name])), 30.0)
        return uuid_text(described[name].topic_id)

    def start_offsets(self, name: str) -> dict[int, int]:
        """Earliest offset still stored, per partition (moves up with retention)."""
        return self._list_offsets(name, OffsetSpec.earliest())

    def end_offsets(self, name: str) -> dict[int, int]:
        """Offset the next record will get, per partition (the high watermark)."""
        return self._list_offsets(name, OffsetSpec.latest())

    def _list_offsets(
        self, name: str, spec: OffsetSpec, *, timeout_s: float = 30.0
    ) -> dict[int, int]:
        # Right after a topic is created, grown or recreated, the metadata can name a
        # leader (or leader epoch) that does not serve the partition yet: retry those.
        deadline = time.monotonic() + timeout_s
        while True:
            request = {TopicPartition(name, p): spec for p in range(self.partition_count(name))}
            try:
                done = _results(self.admin().list_offsets(request, request_timeout=30), 30.0)
            except KafkaException as exc:
                if not leadership_in_flux(exc.args[0]) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            return {tp.partition: result.offset for tp, result in done.items()}

    def _wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kafka topic {what!r}: condition not met in {timeout_s}s")
            time.sleep(0.05)

    # -- produce / consume -----------------------------------------------------------

    def produce(
        self,
        topic: str,
        records: Iterable[tuple[bytes | str | None, bytes | str]],
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        timeout_s: float = 600.0,
        **producer_config: Any,
    ) -> int:
        """Produce ``(key, value)`` records and wait until the broker has them all.

        Keyed records go where the Java client would put them (murmur2), unless
        ``partition`` pins them all to one partition. ``timestamp_ms`` sets every
        record's create time (default: now). Strings are sent as UTF-8. This is
        the fast path for bulk loads: values already encoded cost the producer about
        3 us a record, :meth:`produce_json` about twice that.

        Returns:
            The number of records produced.

        Raises:
            KafkaException: when any record was not delivered.
        """
        failures: list[str] = []

        def failed(err: Any, _msg: Any) -> None:
            failures.append(str(err))

        config = {
            "linger.ms": 20,
            "batch.size": 1024 * 1024,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 512 * 1024,
            "compression.type": "lz4",
            # A Python callback per delivered record costs more than producing it:
            # only failures are reported.
            "delivery.report.only.error": True,
            "on_delivery": failed,
            **producer_config,
        }
        producer = self.producer(**config)
        send = producer.produce
        pinned: dict[str, Any] = {} if partition is None else {"partition": partition}
        if timestamp_ms is not None:
            pinned["timestamp"] = timestamp_ms
        count = 0
        for key, value in records:
            while True:
                try:
                    send(topic, value, key, **pinned)
                    break
                except BufferError:  # the local queue is full: let the broker catch up
                    producer.poll(0.05)
            count += 1
        left = producer.flush(timeout_s)
        if left or failures:
            raise KafkaException(
                f"Producing {count} records to {topic!r}: {len(failures)} failed "
                f"(first: {failures[:1]}), {left} still undelivered after {timeout_s}s."
            )
        return count

    def produce_json(
        self,
        topic: str,
        records: Iterable[Mapping[str, Any]],
        *,
        key: str | Callable[[Mapping[str, Any]], Any] | None = None,
        partition: int | None = None,
        **options: Any,
    ) -> int:
        """Produce records as JSON values; ``key`` names the field (or a function) whose
        string form is the Kafka key (None: no key)."""
        dumps = json.JSONEncoder(separators=(",", ":")).encode
        if key is None:
            pairs: Iterator[tuple[Any, bytes | str]] = ((None, dumps(r)) for r in records)
        elif callable(key):
            pairs = ((str(key(r)), dumps(r)) for r in records)
        else:
            pairs = ((str(r[key]), dumps(r)) for r in records)
        return self.produce(topic, pairs, partition=partition, **options)

    def consume(self, topic: str, *, timeout_s: float = 30.0) -> list[tuple[int, int, Any, Any]]:
        """Every record stored now, as ``(partition, offset, key, value)`` sorted by position.

        Reads each partition from its earliest to its end offset taken at the call.
        """
        ends = self.end_offsets(topic)
        starts = self.start_offsets(topic)
        wanted = {p: end for p, end in ends.items() if end > starts[p]}
        out: list[tuple[int, int, Any, Any]] = []
        if not wanted:
            return out
        consumer = self.consumer()
        try:
            consumer.assign([TopicPartition(topic, p, starts[p]) for p in wanted])
            deadline = time.monotonic() + timeout_s
            while wanted:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"consuming {topic!r}: still waiting for {wanted}")
                for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                    if msg.error() is not None:
                        raise KafkaException(msg.error())
                    p, offset = msg.partition(), msg.offset()
                    if p is None or offset is None:
                        continue  # (not a record: an event of the client)
                    if p in wanted and offset < wanted[p]:
                        out.append((p, offset, msg.key(), msg.value()))
                        if offset + 1 >= wanted[p]:
                            del wanted[p]
        finally:
            consumer.close()
        return sorted(out, key=lambda r: (r[0], r[1]))


def _bench_produce(records: int, partitions: int, *, mode: str) -> dict[str, Any]:
    """Produce ``records`` small payment-like records keyed by customer; time it."""
    with KafkaBroker() as broker:
        topic = broker.create_topic("bench", partitions)
        started = time.monotonic()
        if mode == "json":
            rows = (
                {"id": i, "customer": f"c{i % 10_000}", "amount": i % 997, "ts": 1_700_000_000 + i}
                for i in range(records)
            )
            broker.produce_json(topic, rows, key="customer")
        else:  # values formatted directly: what a bulk loader of a known schema can do
            template = '{"id":%d,"customer":"%s","amount":%d,"ts":%d}'
            pairs = (
                (f"c{i % 10_000}", template % (i, f"c{i % 10_000}", i % 997, 1_700_000_000 + i))
                for i in range(records)
            )
            broker.produce(topic, pairs)
        elapsed = time.monotonic() - started
        ends = broker.end_offsets(topic)
        return {
            "kafka": KAFKA_VERSION,
            "mode": mode,
            "broker_startup_s": round(broker.startup_s, 2),
            "records": sum(ends.values()),
            "seconds": round(elapsed, 2),
            "records_per_s": round(records / elapsed),
            "log_bytes": sum(f.stat().st_size for f in (broker.workdir / "data").rglob("*.log")),
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.servers.kafka")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch-jars", help="fetch Kafka's broker jars into the cache")
    bench = commands.add_parser("bench-produce", help="measure produce_json on a fresh broker")
    bench.add_argument("--records", type=int, default=1_000_000)
    bench.add_argument("--partitions", type=int, default=8)
    bench.add_argument("--mode", choices=("json", "template"), default="json")
    args = parser.parse_args(argv)
    if args.command == "fetch-jars":
        print(ensure_kafka_libs())
    else:
        print(json.dumps(_bench_produce(args.records, args.partitions, mode=args.mode)))


if __name__ == "__main__":
    main()

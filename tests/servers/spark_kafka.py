"""Spark's Kafka connector (``spark-sql-kafka-0-10``) as the tests' shared session has it.

The shared session loads the connector with the optional packages
(tests/core/test_packages.py checks its jars are there), so :class:`SparkKafka` reads,
writes and asks the Java ``Admin`` client in that JVM. Errors come back as
:class:`SparkKafkaError`: the exception class, Spark's error condition and the message
without the stack trace. (It used to start a second session in a subprocess, from when the
shared one had no connector: a JVM that started in ~12 s and then idled to the end of the run.)
"""

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class KafkaRow:
    """One record as the connector returns it (key and value decoded as UTF-8)."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: str | None


class SparkKafkaError(Exception):
    """What the connector or the JVM's Kafka client raised, described.

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


class SparkKafka:
    """Batch reads and writes through the connector, and topic ids from the JVM's ``Admin``
    client, in ``spark`` (which must have the connector loaded).

    Raises:
        SparkKafkaError: what the connector or the client raised, described.
    """

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def read(self, options: Mapping[str, str]) -> list[KafkaRow]:
        """``spark.read.format("kafka").options(**options).load()``, collected, sorted by
        partition and offset."""
        with _described():
            frame = self.spark.read.format("kafka").options(**options).load()
            rows = frame.selectExpr(
                "topic", "partition", "offset", "CAST(key AS STRING)", "CAST(value AS STRING)"
            ).collect()
        return sorted(
            (KafkaRow(*row) for row in rows), key=lambda r: (r.topic, r.partition, r.offset)
        )

    def write(self, topic: str, bootstrap_servers: str, records: Sequence[tuple[str, str]]) -> None:
        """Write ``(key, value)`` records with the connector's batch sink (Java producer)."""
        options = {"kafka.bootstrap.servers": bootstrap_servers, "topic": topic}
        with _described():
            frame = self.spark.createDataFrame(
                [list(r) for r in records], "key string, value string"
            )
            frame.write.format("kafka").options(**options).save()

    def topic_id(self, topic: str, bootstrap_servers: str) -> str:
        """The topic id as the Java ``Admin`` client in the Spark JVM reports it."""
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        with _described():
            props = jvm.java.util.Properties()
            props.put("bootstrap.servers", bootstrap_servers)
            admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
            try:
                names = jvm.java.util.Collections.singletonList(topic)
                described = admin.describeTopics(names).allTopicNames().get()
                return str(described.get(topic).topicId().toString())
            finally:
                admin.close()


@contextlib.contextmanager
def _described():
    try:
        yield
    except SparkKafkaError:
        raise
    except Exception as exc:
        raise SparkKafkaError(_describe(exc)) from exc


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

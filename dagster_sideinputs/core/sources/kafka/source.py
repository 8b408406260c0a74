"""A Kafka main input as a main-input source: exact offset ranges, read by Spark's connector.

Planning and checking the ranges is :mod:`~dagster_sideinputs.core.sources.kafka.offsets`;
decoding the records, :mod:`~dagster_sideinputs.core.sources.kafka.decode`. Reading
(:meth:`KafkaSource.read`) is one batch ``spark.read.format("kafka")`` with ``assign``
and JSON ``startingOffsets`` / ``endingOffsets``: the connector returns exactly
``[start, end)`` of each partition, and ``failOnDataLoss`` stays on.
"""

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.sources.kafka.admin import KafkaMetadata
from dagster_sideinputs.core.sources.kafka.declaration import (
    PARTITION,
    SPARK_KAFKA_PACKAGE,
    KafkaInput,
)
from dagster_sideinputs.core.sources.kafka.decode import decode, empty_kafka_frame, record_schema
from dagster_sideinputs.core.sources.kafka.keyed import (
    ALIGNED,
    BUCKET,
    bucket_of,
    checked_bucket,
    partitioned_read,
)
from dagster_sideinputs.core.sources.kafka.offsets import check_pinned, keep_position, plan_ranges
from dagster_sideinputs.core.sources.main_source import (
    Caching,
    SourceSlice,
    StartFrom,
    no_version_position,
)
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.state.plan import MainRange, OffsetRange
from dagster_sideinputs.delta.engine import AppTransaction, DataFile, WriteResult
from dagster_sideinputs.errors import KafkaSourceError


class PartitionedRead(NamedTuple):
    """A pre-keyed topic's records as read: ``in_place`` when each Kafka partition is
    its own Spark partition and every record's partition was checked against its key
    as it was read (otherwise the records are read with a shuffle, unchecked)."""

    frame: DataFrame
    in_place: bool
    note: str


class KafkaSource:
    """Kafka topics as a main input; a slice is an offset range per partition."""

    def __init__(self, spec: OperatorSpec) -> None:
        kafka = spec.main.kafka_input
        assert kafka is not None
        self.spec = spec
        self.kafka: KafkaInput = kafka
        self.label = f"Kafka main input {spec.main.asset!r} ({kafka.describe()})"
        self._metadata: KafkaMetadata | None = None
        self._compacted: dict[str, bool] = {}  # topic: whether its log is compacted
        self._miscounted: set[str] = set()  # topics whose offsets numbered other records

    @property
    def metadata(self) -> KafkaMetadata:
        if self._metadata is None:
            self._metadata = KafkaMetadata(self.kafka, self.label)
        return self._metadata

    def next_range(self, previous: MainRange | None) -> SourceSlice:
        """The offsets after ``previous``'s, checked against the brokers."""
        keyed = self.spec.main.pre_keyed
        return SourceSlice(plan_ranges(self.kafka, self.metadata, self.label, previous, keyed))

    def files(self, main: MainRange) -> SourceSlice:
        """The pinned slice of a replayed batch, after checking the brokers still hold it."""
        if main.kind == "kafka" and main.records:
            check_pinned(self.metadata, self.label, main)
        return SourceSlice(main)

    # --- reading ----------------------------------------------------------------------------

    def reader_options(self, ranges: Sequence[OffsetRange]) -> dict[str, str]:
        """Spark connector options reading exactly ``ranges`` (secrets included: never log)."""
        kafka = self.kafka
        assign: dict[str, list[int]] = {}
        starts: dict[str, dict[str, int]] = {}
        ends: dict[str, dict[str, int]] = {}
        for r in ranges:
            assign.setdefault(r.topic, []).append(r.partition)
            starts.setdefault(r.topic, {})[str(r.partition)] = r.start
            ends.setdefault(r.topic, {})[str(r.partition)] = r.end
        options = {f"kafka.{name}": value for name, value in kafka.client_options.items()}
        options.update(dict(kafka.reader_options))
        options.update(
            {
                "assign": json.dumps(assign, sort_keys=True),
                "startingOffsets": json.dumps(starts, sort_keys=True),
                "endingOffsets": json.dumps(ends, sort_keys=True),
                "failOnDataLoss": "true",
                "includeHeaders": "false",
                "kafkaConsumer.pollTimeoutMs": str(int(kafka.poll_timeout.total_seconds() * 1000)),
            }
        )
        return options

    def read(self, spark: SparkSession, piece: SourceSlice) -> DataFrame:
        ranges = [r for r in piece.range.offsets if r.size]
        raw = self._load(spark, ranges) if ranges else empty_kafka_frame(spark)
        return decode(self.kafka, self.label, spark, raw)

    def read_partitioned(self, spark: SparkSession, piece: SourceSlice) -> PartitionedRead:
        """A pre-keyed topic's records with their bucket, Kafka partition ``p`` read as
        Spark partition ``p`` when the session allows (see
        :mod:`~dagster_sideinputs.core.sources.kafka.keyed`), each record's partition then
        checked against its key as it is read."""
        ranges = {r.partition: r for r in piece.range.offsets}
        count = len(ranges)
        if count and sorted(ranges) == list(range(count)):
            reads = []
            for p in range(count):
                r = ranges[p]
                raw = (
                    self._load(spark, [r])
                    if r.size
                    else empty_kafka_frame(spark, one_partition=True)
                )
                reads.append(raw.withColumn(BUCKET, checked_bucket(p, count)))
            partitioned = partitioned_read(spark, reads, count)
            if partitioned is not None:
                note = (
                    f"pre-keyed Kafka: {count} partition(s) read in place, hash-partitioned by "
                    "Kafka's partitioner (no shuffle of the main records)"
                )
                keep = (BUCKET, ALIGNED)
                frame = decode(self.kafka, self.label, spark, partitioned, keep=keep)
                return PartitionedRead(frame, True, note)
        raw = self.read(spark, piece)
        frame = raw.withColumn(
            BUCKET, bucket_of(F.col(PARTITION), count) if count else F.lit(None).cast("int")
        ).withColumn(ALIGNED, F.lit(None).cast("int"))
        note = "pre-keyed Kafka: the partitioned read is not available here; read with a shuffle"
        return PartitionedRead(frame, False, note)

    def _load(self, spark: SparkSession, ranges: Sequence[OffsetRange]) -> DataFrame:
        reader = spark.read.format("kafka").options(**self.reader_options(ranges))
        try:
            return reader.load()
        except AnalysisException as exc:
            if "DATA_SOURCE_NOT_FOUND" in str(exc) or "Failed to find data source" in str(exc):
                raise missing_connector(self.label) from None
            raise

    def statistics(self, piece: SourceSlice) -> Sequence[DataFile] | None:
        if all(r.size == 0 for r in piece.range.offsets):
            return ()  # no offset to read: no record
        return None  # Kafka keeps no per-record statistics

    def caching(self) -> Caching:
        return "several_jobs"

    def record_count(self, piece: SourceSlice) -> int | None:
        """The offsets of the slice, unless a topic's log is compacted (asked once per
        topic) or an earlier slice of it held fewer records than offsets
        (:meth:`record_count_missed`): its offsets then number more records than it
        holds, and a batch counting by them would always count twice (docs/DECISIONS.md,
        "Counting routes")."""
        topics = {r.topic for r in piece.range.offsets if r.size}
        unknown = topics - self._compacted.keys()
        if unknown:
            compacted = self.metadata.compacted(unknown)
            self._compacted.update({t: t in compacted for t in unknown})
        if any(self._compacted[t] or t in self._miscounted for t in topics):
            return None
        return sum(r.size for r in piece.range.offsets)

    def record_count_missed(self, piece: SourceSlice) -> None:
        """A slice held fewer records than offsets: a topic written by transactional
        producers (each commit marker takes an offset) cannot be told from its
        configuration, so its later slices in this run are counted by a job first (with
        the records cached) rather than read again after the write job."""
        self._miscounted.update(r.topic for r in piece.range.offsets if r.size)

    def record_read(self, main: MainRange, txn: AppTransaction) -> WriteResult | None:
        return None  # the position lives in the plans

    def record_reset(self, main_from: StartFrom, txn: AppTransaction) -> None:
        return None  # the position lives in the plans

    def schema(self) -> T.StructType | None:
        """The main records' columns when known without Spark (None for Avro values)."""
        return record_schema(self.kafka)

    # --- lag ---------------------------------------------------------------------------------

    def reset_to(self, main_from: StartFrom) -> MainRange:
        no_version_position("a Kafka topic", self.spec.main.asset, main_from)
        if main_from == "latest":
            # Every partition's position at its log end, under the topics' current ids.
            now = self.next_range(None).range
            ends = tuple(
                replace(r, start=r.log_end or r.end, end=r.log_end or r.end) for r in now.offsets
            )
            return replace(now, offsets=ends, lost=(), anchor=False)
        return MainRange("kafka")  # no position: every partition from its earliest offset

    def keep(self, kept: MainRange) -> tuple[MainRange, list[str]]:
        if kept.kind != "kafka":
            return kept, []
        return keep_position(self.metadata, self.label, kept)

    def invalid_fix(self, declare_route: str) -> str:
        # A record in a topic cannot be changed; only routed.
        return (
            f"{declare_route}; a Kafka record cannot be corrected in place, and producing a "
            "corrected record does not remove the bad one, whose offsets the next batch reads "
            "again"
        )

    def tidy(self) -> None:
        return None

    def lag(self, position: MainRange) -> list[dict[str, Any]]:
        """Per partition read so far: the committed end offset, the log end now, the lag."""
        tps = [(r.topic, r.partition) for r in position.offsets]
        latest = self.metadata.offsets(tps, "latest")
        return [
            {
                "topic": r.topic,
                "partition": r.partition,
                "committed": r.end,
                "log_end": latest[(r.topic, r.partition)],
                "lag": max(0, latest[(r.topic, r.partition)] - r.end),
            }
            for r in position.offsets
        ]


def missing_connector(label: str) -> KafkaSourceError:
    """The error for a session without Spark's Kafka connector."""
    return KafkaSourceError(
        f"{label}: this Spark session cannot read Kafka: Spark's Kafka connector is not "
        "loaded. Nothing was written.",
        fix='start the session with the connector: dsi.SparkResource(packages=["kafka"]) or '
        'dsi.build_spark_session(packages=["kafka"]) (spark.jars.packages='
        f'"{SPARK_KAFKA_PACKAGE}"); over Spark Connect, start the server with --packages',
    )

"""A Kafka main input: exact offset ranges, planned on the driver, read by Spark's connector.

Planning (:meth:`KafkaSource.next_range`) asks the brokers (no Spark) for every
partition's earliest and end offsets and every topic's id, and pins, per partition,
``[start, end)``: ``start`` is where the previous batch ended, ``end`` the log end
(capped by ``max_records_per_batch``). What the plan pins is checked against the
brokers first, so nothing is ever skipped silently:

- offsets removed by retention before they were read (``start`` below the earliest
  offset) are an error naming the topic, partition and offsets, or, with
  ``on_data_loss="skip"``, skipped and recorded in the plan (counted in the metrics);
- a topic deleted and created again (another topic id), a partition that disappeared,
  a log end that moved back: errors naming the topic, the partition and the position;
- partitions and topics that appear are read from their earliest offset.

Reading (:meth:`KafkaSource.read`) is one batch ``spark.read.format("kafka")`` with
``assign`` and JSON ``startingOffsets`` / ``endingOffsets``: the connector returns exactly
``[start, end)`` of each partition, and ``failOnDataLoss`` stays on. A replay checks
the pinned ranges against the brokers first: the connector itself would not notice a
recreated topic (it ignores topic ids), and would wait ``pollTimeoutMs`` for offsets
past the log end.
"""

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.columns import CORRUPT
from dagster_sideinputs.core.kafka_admin import KafkaMetadata
from dagster_sideinputs.core.kafka_input import (
    KEY,
    METADATA_COLUMNS,
    OFFSET,
    PARTITION,
    SPARK_AVRO_PACKAGE,
    SPARK_KAFKA_PACKAGE,
    TIMESTAMP,
    TOPIC,
    VALUE,
    KafkaInput,
)
from dagster_sideinputs.core.plan import MainRange, OffsetRange
from dagster_sideinputs.core.sources import SourceSlice
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.delta.engine import AppTransaction, WriteResult
from dagster_sideinputs.errors import (
    DeclarationError,
    KafkaOffsetsLostError,
    KafkaSourceError,
    OperatorStateError,
    preview,
)

TOMBSTONE = "null value (a tombstone)"
_PARSED = "_dsi_kafka_value"
_RESET = "`operator.reset(main_from='beginning')` or `reset(main_from='latest')`"


def _position(ranges: Sequence[OffsetRange], topic: str) -> str:
    shown = [f"[{r.partition}] at {r.end}" for r in ranges if r.topic == topic]
    return f"{topic} " + ", ".join(shown[:6]) + (" ..." if len(shown) > 6 else "")


def share_out(ranges: list[OffsetRange], limit: int) -> list[OffsetRange]:
    """Cap the ranges at ``limit`` offsets in all, shared by backlog.

    Every partition gets ``floor(limit * backlog / total)``, and what rounding leaves goes
    to the largest remainders (ties: topic, partition), so a backlog is drained evenly
    and the split is a pure function of the offsets.
    """
    total = sum(r.size for r in ranges)
    if total <= limit:
        return ranges
    shares = {i: limit * r.size // total for i, r in enumerate(ranges)}
    left = limit - sum(shares.values())
    order = sorted(
        (i for i, r in enumerate(ranges) if r.size > shares[i]),
        key=lambda i: (-((limit * ranges[i].size) % total), ranges[i].topic, ranges[i].partition),
    )
    for i in order[:left]:
        shares[i] += 1
    return [
        OffsetRange(r.topic, r.partition, r.start, r.start + shares[i], r.log_end)
        for i, r in enumerate(ranges)
    ]


class KafkaSource:
    """Kafka topics as a main input; a slice is an offset range per partition."""

    def __init__(self, spec: OperatorSpec) -> None:
        kafka = spec.main.kafka_input
        assert kafka is not None
        self.spec = spec
        self.kafka: KafkaInput = kafka
        self.label = f"Kafka main input {spec.main.asset!r} ({kafka.describe()})"
        self._metadata: KafkaMetadata | None = None

    @property
    def metadata(self) -> KafkaMetadata:
        if self._metadata is None:
            self._metadata = KafkaMetadata(self.kafka, self.label)
        return self._metadata

    # --- planning --------------------------------------------------------------------------

    def next_range(self, previous: MainRange | None) -> SourceSlice:
        kafka, meta = self.kafka, self.metadata
        last = previous if previous is not None and previous.kind == "kafka" else None
        known = {(r.topic, r.partition): r.end for r in last.offsets} if last else {}
        known_ids = dict(last.topic_ids) if last else {}
        read_topics = sorted({topic for topic, _ in known})
        topics = meta.topics()
        described = meta.describe([*topics, *read_topics])
        self._check_identity(last, described, read_topics, known_ids, pending=False)
        partitions = [
            (topic, p)
            for topic in sorted(set(topics) | set(read_topics))
            if topic in described
            for p in described[topic].partitions
        ]
        earliest = meta.offsets(partitions, "earliest")
        latest = meta.offsets(partitions, "latest")
        ranges: list[OffsetRange] = []
        lost: list[OffsetRange] = []
        gone: list[str] = []
        behind: list[str] = []
        for tp in partitions:
            low, high = earliest[tp], latest[tp]
            if tp in known:
                start = known[tp]
            elif previous is None:  # the operator's first batch
                start = low if kafka.starting_offsets == "earliest" else high
            else:  # a partition or topic that appeared: everything it holds is new
                start = low
            if start < low:
                if kafka.on_data_loss == "fail":
                    gone.append(
                        f"{tp[0]}[{tp[1]}] offsets {start}..{low} (the log now starts at {low})"
                    )
                    continue
                lost.append(OffsetRange(tp[0], tp[1], start, low))
                start = low
            if start > high:
                behind.append(f"{tp[0]}[{tp[1]}] read up to {start}, log ends at {high}")
                continue
            ranges.append(OffsetRange(tp[0], tp[1], start, high, high))
        if gone:
            raise KafkaOffsetsLostError(
                f"{self.label}: {len(gone)} partition(s) lost records the operator had not "
                f"read yet (deleted by retention or by hand): {preview(gone, 5)}. Nothing was "
                "written.",
                fix="keep records longer than the operator can fall behind (retention.ms); to "
                'go on without them, declare MainInput.kafka(..., on_data_loss="skip") (the '
                f"skipped offsets are counted in the metrics), or start over with {_RESET}",
            )
        if behind:
            raise OperatorStateError(
                f"{self.label}: partition log(s) end before the operator's position: "
                f"{preview(behind, 5)}. The log was truncated (an unclean leader election) "
                "or replaced; reading on would skip or repeat records. Nothing was written.",
                fix=f"check the topic; to go on from what the log holds now, {_RESET}",
            )
        if kafka.max_records_per_batch is not None:
            ranges = share_out(ranges, kafka.max_records_per_batch)
        ids = {t: described[t].topic_id for t in {t for t, _ in partitions}}
        keyed = self.spec.main.pre_keyed
        if keyed is not None:
            from dagster_sideinputs.core.kafka_keyed import check_partition_count

            check_partition_count(ranges, keyed, self.label)
        anchor = previous is None and kafka.starting_offsets == "latest" and bool(ranges)
        main = MainRange(
            "kafka", offsets=tuple(ranges), topic_ids=ids, lost=tuple(lost), anchor=anchor
        )
        return SourceSlice(main)

    def _check_identity(
        self,
        last: MainRange | None,
        described: Mapping[str, Any],
        topics: Sequence[str],
        known_ids: Mapping[str, str],
        *,
        pending: bool,
    ) -> None:
        """The topics read so far still exist, with the same ids and partitions."""
        if last is None:
            return
        when = "while a batch of it was pending" if pending else "after the operator read it"
        for topic in topics:
            info = described.get(topic)
            if info is None:
                raise OperatorStateError(
                    f"{self.label}: topic {topic!r} is gone {when} (position "
                    f"{_position(last.offsets, topic)}). Records would be waited for forever "
                    "or skipped. Nothing was written.",
                    fix=f"restore the topic; if it was removed on purpose, {_RESET}",
                )
            known = known_ids.get(topic)
            if known and info.topic_id != known:
                raise OperatorStateError(
                    f"{self.label}: topic {topic!r} was deleted and created again {when} "
                    f"(topic id {known} -> {info.topic_id}). The operator's position "
                    f"({_position(last.offsets, topic)}) refers to the old topic: reading on "
                    "would skip the new topic's first records. Nothing was written.",
                    fix="read the new topic from its beginning with "
                    "`operator.reset(main_from='beginning')` (outputs keep the old topic's "
                    "records), or from now on with `reset(main_from='latest')`",
                )
            missing = sorted(
                r.partition
                for r in last.offsets
                if r.topic == topic and r.partition not in info.partitions
            )
            if missing:
                raise OperatorStateError(
                    f"{self.label}: topic {topic!r} has partitions {list(info.partitions)} "
                    f"now, but the operator read partition(s) {missing} (position "
                    f"{_position([r for r in last.offsets if r.partition in missing], topic)}): "
                    f"the partition count shrank {when}. Nothing was written.",
                    fix=f"restore the partitions; if the topic was rebuilt on purpose, {_RESET}",
                )

    # --- a pinned slice ----------------------------------------------------------------

    def files(self, main: MainRange) -> SourceSlice:
        """The pinned slice of a replayed batch, after checking the brokers still hold it."""
        if main.kind != "kafka" or not main.records:
            return SourceSlice(main)
        wanted = [r for r in main.offsets if r.size]
        topics = sorted({r.topic for r in wanted})
        described = self.metadata.describe(topics)
        self._check_identity(main, described, topics, main.topic_ids, pending=True)
        earliest = self.metadata.offsets([(r.topic, r.partition) for r in wanted], "earliest")
        latest = self.metadata.offsets([(r.topic, r.partition) for r in wanted], "latest")
        gone = [
            f"{r} (the log now holds {earliest[(r.topic, r.partition)]}.."
            f"{latest[(r.topic, r.partition)]})"
            for r in wanted
            if r.start < earliest[(r.topic, r.partition)] or r.end > latest[(r.topic, r.partition)]
        ]
        if gone:
            raise KafkaOffsetsLostError(
                f"{self.label}: an interrupted batch pinned offsets that the brokers no longer "
                f"hold: {preview(gone, 5)}. Some of its outputs are committed, so it can only be "
                "finished by reading exactly those records. Nothing more was written.",
                fix="restore the records if you can; otherwise acknowledge the loss and start "
                f"over with {_RESET} (the committed outputs keep what they have)",
            )
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
        if not ranges:
            return self.decode(spark, _empty_kafka_frame(spark))
        return self.decode(spark, self._load(spark, ranges))

    def read_partitioned(self, spark: SparkSession, piece: SourceSlice) -> tuple[DataFrame, str]:
        """A pre-keyed topic's records with their bucket, Kafka partition ``p`` read as
        Spark partition ``p`` when the session allows (see
        :mod:`~dagster_sideinputs.core.kafka_keyed`); a note says how it was read."""
        from dagster_sideinputs.core.kafka_keyed import (
            ALIGNED,
            BUCKET,
            bucket_of,
            buckets,
            partitioned_read,
        )

        ranges = {r.partition: r for r in piece.range.offsets}
        count = len(ranges)
        values = buckets(count) if count else ()
        if count and sorted(ranges) == list(range(count)):
            reads = []
            for p in range(count):
                r = ranges[p]
                raw = (
                    self._load(spark, [r])
                    if r.size
                    else _empty_kafka_frame(spark, one_partition=True)
                )
                reads.append(raw.withColumn(BUCKET, F.lit(values[p])))
            partitioned = partitioned_read(spark, reads, count)
            if partitioned is not None:
                note = (
                    f"pre-keyed Kafka: {count} partition(s) read in place, hash-partitioned by "
                    "Kafka's partitioner (no shuffle of the main records)"
                )
                return self.decode(spark, partitioned, keep=(BUCKET, ALIGNED)), note
        raw = self.read(spark, piece)
        frame = raw.withColumn(
            BUCKET, bucket_of(F.col(PARTITION), count) if count else F.lit(None).cast("int")
        ).withColumn(ALIGNED, F.lit(None).cast("int"))
        return (
            frame,
            "pre-keyed Kafka: the partitioned read is not available here; read with a shuffle",
        )

    def _load(self, spark: SparkSession, ranges: Sequence[OffsetRange]) -> DataFrame:
        reader = spark.read.format("kafka").options(**self.reader_options(ranges))
        try:
            return reader.load()
        except AnalysisException as exc:
            if "DATA_SOURCE_NOT_FOUND" in str(exc) or "Failed to find data source" in str(exc):
                raise missing_connector(self.label) from None
            raise

    def decode(self, spark: SparkSession, raw: DataFrame, *, keep: Sequence[str] = ()) -> DataFrame:
        """The connector's rows as main records: value columns, coordinates, corrupt text
        (and the ``keep`` columns as they are)."""
        kafka = self.kafka
        key = F.col("key") if kafka.key_format == "bytes" else F.col("key").cast("string")
        where = F.concat(
            F.col("topic"), F.lit("["), F.col("partition").cast("string"), F.lit("]@"),
            F.col("offset").cast("string"), F.lit(": "),
        )  # fmt: skip
        coordinates = [
            key.alias(KEY),
            F.col("topic").alias(TOPIC),
            F.col("partition").alias(PARTITION),
            F.col("offset").alias(OFFSET),
            F.col("timestamp").alias(TIMESTAMP),
        ]
        kept = [F.col(c) for c in keep]
        if kafka.value_format in ("string", "bytes"):
            value = (
                F.col("value").cast("string") if kafka.value_format == "string" else F.col("value")
            )
            return raw.select(value.alias(VALUE), *coordinates, *kept)
        parsed, corrupt, schema = self._parsed(spark, where)
        frame = raw.select(parsed.alias(_PARSED), corrupt.alias(CORRUPT), *coordinates, *kept)
        collisions = sorted(set(schema.fieldNames()) & set(METADATA_COLUMNS))
        if collisions:
            raise DeclarationError(
                f"{self.label}: value field(s) {collisions} have the names of the Kafka "
                "coordinate columns the operator adds.",
                fix="rename the field(s) in the value schema",
            )
        values = [F.col(_PARSED).getField(f.name).alias(f.name) for f in schema.fields]
        return frame.select(*values, *[F.col(c) for c in METADATA_COLUMNS], F.col(CORRUPT), *kept)

    def _parsed(self, spark: SparkSession, where: Column) -> tuple[Column, Column, T.StructType]:
        kafka = self.kafka
        if kafka.value_format == "json":
            schema = kafka.decoded_schema()
            with_corrupt = T.StructType([*schema.fields, T.StructField(CORRUPT, T.StringType())])
            options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
            parsed = F.from_json(F.col("value").cast("string"), with_corrupt, options)
            corrupt = (
                F.when(F.col("value").isNull(), F.concat(where, F.lit(TOMBSTONE)))
                .when(
                    parsed.getField(CORRUPT).isNotNull(),
                    F.concat(where, parsed.getField(CORRUPT)),
                )
                .otherwise(F.lit(None).cast("string"))
            )
            return parsed, corrupt, schema
        parsed = _from_avro(self.label, kafka.avro_schema or "")
        decoded = _avro_struct(spark, parsed, self.label)
        if isinstance(decoded, T.StructType):
            schema = decoded
        else:  # a non-record Avro schema: one column
            parsed = F.struct(parsed.alias(VALUE))
            schema = T.StructType([T.StructField(VALUE, decoded)])
        corrupt = (
            F.when(F.col("value").isNull(), F.concat(where, F.lit(TOMBSTONE)))
            .when(
                parsed.isNull(),
                F.concat(
                    where,
                    F.lit("not decodable with the Avro schema: 0x"),
                    F.hex(F.substring(F.col("value"), 1, 32)),
                ),
            )
            .otherwise(F.lit(None).cast("string"))
        )
        return parsed, corrupt, schema

    def record_read(self, main: MainRange, txn: AppTransaction) -> WriteResult | None:
        return None  # the position lives in the plans

    def schema(self) -> T.StructType | None:
        """The main records' columns when known without Spark (None: an Avro value, whose
        columns Spark derives from the Avro schema)."""
        kafka = self.kafka
        if kafka.value_format == "avro":
            return None
        if kafka.value_format == "json":
            values = list(kafka.decoded_schema().fields)
        else:
            kind = T.StringType() if kafka.value_format == "string" else T.BinaryType()
            values = [T.StructField(VALUE, kind)]
        key = T.StringType() if kafka.key_format == "string" else T.BinaryType()
        coordinates = [
            T.StructField(KEY, key),
            T.StructField(TOPIC, T.StringType()),
            T.StructField(PARTITION, T.IntegerType()),
            T.StructField(OFFSET, T.LongType()),
            T.StructField(TIMESTAMP, T.TimestampType()),
        ]
        return T.StructType([*values, *coordinates])

    # --- lag ---------------------------------------------------------------------------------

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
    return KafkaSourceError(
        f"{label}: this Spark session cannot read Kafka: Spark's Kafka connector is not "
        "loaded. Nothing was written.",
        fix=f'start the session with spark.jars.packages="{SPARK_KAFKA_PACKAGE}", e.g. '
        f'dsi.SparkResource(packages=["{SPARK_KAFKA_PACKAGE}"]) or '
        f'build_spark_session(packages=["{SPARK_KAFKA_PACKAGE}"]); over Spark Connect, '
        "start the server with --packages",
    )


def _empty_kafka_frame(spark: SparkSession, *, one_partition: bool = False) -> DataFrame:
    """No records, in the connector's schema (in exactly one Spark partition if asked:
    a partitioned read needs one per Kafka partition, empty or not)."""
    if not one_partition:
        return spark.createDataFrame(
            [],
            "key binary, value binary, topic string, partition int, offset long, "
            "timestamp timestamp, timestampType int",
        )
    return spark.range(0, 0, 1, numPartitions=1).select(
        F.lit(None).cast("binary").alias("key"),
        F.lit(None).cast("binary").alias("value"),
        F.lit(None).cast("string").alias("topic"),
        F.lit(None).cast("int").alias("partition"),
        F.lit(None).cast("long").alias("offset"),
        F.lit(None).cast("timestamp").alias("timestamp"),
        F.lit(None).cast("int").alias("timestampType"),
    )


def _from_avro(label: str, schema: str) -> Column:
    from pyspark.sql.avro.functions import from_avro

    try:
        return from_avro(F.col("value"), schema, {"mode": "PERMISSIVE"})
    except Exception as exc:  # the JVM class is missing: py4j says 'JavaPackage' ...
        raise missing_avro(label, exc) from exc


def _avro_struct(spark: SparkSession, parsed: Column, label: str) -> T.DataType:
    """The Spark type of the decoded Avro values (Spark parses the schema; no job runs)."""
    try:
        probe = spark.createDataFrame([], "value binary").select(parsed.alias("v"))
        return probe.schema["v"].dataType
    except AnalysisException as exc:
        raise DeclarationError(
            f"{label}: Spark cannot use the declared Avro schema: {str(exc).splitlines()[0]}",
            fix="pass the writer's schema as JSON text in avro_schema=",
        ) from exc
    except Exception as exc:
        raise missing_avro(label, exc) from exc


def missing_avro(label: str, exc: BaseException) -> KafkaSourceError:
    return KafkaSourceError(
        f"{label}: Avro values need Spark's avro module, which this session lacks "
        f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}).",
        fix=f'add "{SPARK_AVRO_PACKAGE}" to spark.jars.packages',
    )

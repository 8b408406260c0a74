"""Kafka records as main records: the connector's rows decoded into value columns and
coordinates, with a corrupt-record text for values that cannot be decoded.

Values are string, bytes, JSON (``from_json``, permissive) or Avro (``from_avro`` of
Spark's avro module, permissive); a null value (a tombstone) is a corrupt record.
"""

from collections.abc import Sequence

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.columns import CORRUPT
from dagster_sideinputs.core.kafka_input import (
    KEY,
    METADATA_COLUMNS,
    OFFSET,
    PARTITION,
    SPARK_AVRO_PACKAGE,
    TIMESTAMP,
    TOPIC,
    VALUE,
    KafkaInput,
)
from dagster_sideinputs.errors import DeclarationError, KafkaSourceError

TOMBSTONE = "null value (a tombstone)"
_PARSED = "_dsi_kafka_value"


def decode(
    kafka: KafkaInput, label: str, spark: SparkSession, raw: DataFrame, *, keep: Sequence[str] = ()
) -> DataFrame:
    """The connector's rows as main records: value columns, coordinates, corrupt text
    (and the ``keep`` columns as they are)."""
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
        value = F.col("value").cast("string") if kafka.value_format == "string" else F.col("value")
        return raw.select(value.alias(VALUE), *coordinates, *kept)
    parsed, corrupt, schema = _parsed(kafka, label, spark, where)
    frame = raw.select(parsed.alias(_PARSED), corrupt.alias(CORRUPT), *coordinates, *kept)
    collisions = sorted(set(schema.fieldNames()) & set(METADATA_COLUMNS))
    if collisions:
        raise DeclarationError(
            f"{label}: value field(s) {collisions} have the names of the Kafka "
            "coordinate columns the operator adds.",
            fix="rename the field(s) in the value schema",
        )
    values = [F.col(_PARSED).getField(f.name).alias(f.name) for f in schema.fields]
    return frame.select(*values, *[F.col(c) for c in METADATA_COLUMNS], F.col(CORRUPT), *kept)


def _parsed(
    kafka: KafkaInput, label: str, spark: SparkSession, where: Column
) -> tuple[Column, Column, T.StructType]:
    """The decoded value (a struct), its corrupt text, and the struct's type."""
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
    parsed = _from_avro(label, kafka.avro_schema or "")
    decoded = _avro_struct(spark, parsed, label)
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


def record_schema(kafka: KafkaInput) -> T.StructType | None:
    """The main records' columns when known without Spark (None: an Avro value, whose
    columns Spark derives from the Avro schema)."""
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


def empty_kafka_frame(spark: SparkSession, *, one_partition: bool = False) -> DataFrame:
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
    # Local: pyspark.sql.avro is only needed (and only usable) for Avro values.
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
    """The error for a session without Spark's avro module."""
    return KafkaSourceError(
        f"{label}: Avro values need Spark's avro module, which this session lacks "
        f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}).",
        fix=f'add "{SPARK_AVRO_PACKAGE}" to spark.jars.packages',
    )

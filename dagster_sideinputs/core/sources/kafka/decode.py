"""Kafka records as main records: the connector's rows decoded into value columns and
coordinates, with a corrupt-record text for values that cannot be decoded.

Values are string, bytes, JSON (``from_json``, permissive) or Avro (``from_avro`` of
Spark's avro module, permissive). A decode that yields nothing is not a record
(:mod:`~dagster_sideinputs.core.decoded`): a null value (a tombstone), in every format;
a ``string`` value that is not UTF-8; a JSON or Avro value that is empty, blank, not of
the schema (Spark cannot decode it, or converts a field it holds to null), or holds no
field of the schema. Each gets a corrupt text naming its topic, partition and offset.
"""

from collections.abc import Callable, Sequence

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.columns import CORRUPT
from dagster_sideinputs.core.decoded import (
    BLANK,
    EMPTY,
    KEY_NOT_UTF8,
    NOT_UTF8,
    TOMBSTONE,
    hex_prefix,
    no_field,
    no_field_text,
)
from dagster_sideinputs.core.sources.kafka.declaration import (
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

_PARSED = "_dsi_kafka_value"


def decode(
    kafka: KafkaInput, label: str, spark: SparkSession, raw: DataFrame, *, keep: Sequence[str] = ()
) -> DataFrame:
    """The connector's rows as main records: value columns, coordinates, corrupt text
    (and the ``keep`` columns as they are)."""
    where = F.concat(
        F.col("topic"), F.lit("["), F.col("partition").cast("string"), F.lit("]@"),
        F.col("offset").cast("string"), F.lit(": "),
    )  # fmt: skip
    key = F.col("key")
    bad_key = F.lit(None).cast("string")  # a null key is a key (Kafka's default)
    if kafka.key_format == "string":  # text, so UTF-8 (the route shows U+FFFD for the rest)
        bad_key = F.when(
            ~F.is_valid_utf8(key.cast("string")),
            F.concat(where, F.lit(KEY_NOT_UTF8), hex_prefix(key)),
        )
        key = F.make_valid_utf8(key.cast("string"))
    coordinates = [
        key.alias(KEY),
        F.col("topic").alias(TOPIC),
        F.col("partition").alias(PARTITION),
        F.col("offset").alias(OFFSET),
        F.col("timestamp").alias(TIMESTAMP),
    ]
    kept = [F.col(c) for c in keep]
    if kafka.value_format in ("string", "bytes"):
        text = F.col("value").cast("string")
        corrupt = F.when(F.col("value").isNull(), F.concat(where, F.lit(TOMBSTONE)))
        if kafka.value_format == "string":  # Spark's strings (and Delta's) are UTF-8
            corrupt = corrupt.when(
                ~F.is_valid_utf8(text),
                F.concat(where, F.lit(NOT_UTF8), hex_prefix(F.col("value"))),
            )
        # Its bad bytes become U+FFFD in the (invalid) record: the exact bytes stay at the
        # offset the reason names (strings that are not UTF-8 break Delta's statistics).
        value = F.make_valid_utf8(text) if kafka.value_format == "string" else F.col("value")
        return raw.select(
            value.alias(VALUE),
            *coordinates,
            F.coalesce(corrupt.otherwise(F.lit(None).cast("string")), bad_key).alias(CORRUPT),
            *kept,
        )
    parsed, corrupt_of, schema = _parsed(kafka, label, spark, where)
    # Decoded once, in a projection of its own: the corrupt text reads the decoded column,
    # which Spark then keeps apart instead of decoding each value once per reference (a
    # JSON value was parsed three times, in a projection Spark does not compile: the
    # decode cost ~6 s per 1M records on top of the read).
    frame = raw.select("*", parsed.alias(_PARSED)).select(
        F.col(_PARSED),
        F.coalesce(corrupt_of(F.col(_PARSED)), bad_key).alias(CORRUPT),
        *coordinates,
        *kept,
    )
    collisions = sorted(set(schema.fieldNames()) & set(METADATA_COLUMNS))
    if collisions:
        raise DeclarationError(
            f"{label}: value field(s) {collisions} have the names of the Kafka "
            "coordinate columns the operator adds.",
            fix="rename the field(s) in the value schema",
        )
    fields = [F.col(_PARSED).getField(f.name) for f in schema.fields]
    # A value of none of the schema's fields ({} or other names) is no record either.
    where_read = F.concat(
        F.col(TOPIC), F.lit("["), F.col(PARTITION).cast("string"), F.lit("]@"),
        F.col(OFFSET).cast("string"), F.lit(": "),
    )  # fmt: skip
    nothing = F.when(
        no_field(fields), F.concat(where_read, F.lit(no_field_text(schema.fieldNames())))
    )
    return frame.select(
        *[c.alias(f.name) for c, f in zip(fields, schema.fields, strict=True)],
        *[F.col(c) for c in METADATA_COLUMNS],
        F.coalesce(F.col(CORRUPT), nothing).alias(CORRUPT),
        *kept,
    )


def _parsed(
    kafka: KafkaInput, label: str, spark: SparkSession, where: Column
) -> tuple[Column, Callable[[Column], Column], T.StructType]:
    """The decoded value (a struct), its corrupt text given the decoded column, and the
    struct's type."""
    if kafka.value_format == "json":
        schema = kafka.decoded_schema()
        with_corrupt = T.StructType([*schema.fields, T.StructField(CORRUPT, T.StringType())])
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
        text = F.col("value").cast("string")
        parsed = F.from_json(text, with_corrupt, options)

        def json_corrupt(parsed: Column) -> Column:
            # A blank value never parses into a record (Spark gives null, or a corrupt
            # record for \v and \f), so the pattern runs only where the parse failed: it
            # converts the value to a Java string, 0.4 s per 1M records when run on all.
            parsed_whole = parsed.isNotNull() & parsed.getField(CORRUPT).isNull()
            return (
                F.when(F.col("value").isNull(), F.concat(where, F.lit(TOMBSTONE)))
                .when(F.length(F.col("value")) == 0, F.concat(where, F.lit(EMPTY)))
                .when(~parsed_whole & text.rlike(r"^\s*$"), F.concat(where, F.lit(BLANK)))
                .when(
                    ~F.is_valid_utf8(text),
                    F.concat(where, F.lit(NOT_UTF8), hex_prefix(F.col("value"))),
                )
                .when(
                    parsed.getField(CORRUPT).isNotNull(),
                    F.concat(where, parsed.getField(CORRUPT)),
                )
                .when(  # Spark parsed nothing, and said nothing: still not a record
                    parsed.isNull(),
                    F.concat(where, F.lit("no JSON object: "), F.substring(text, 1, 100)),
                )
                .otherwise(F.lit(None).cast("string"))
            )

        return parsed, json_corrupt, schema
    decoded_value = _from_avro(label, kafka.avro_schema or "")
    decoded = _avro_struct(spark, decoded_value, label)

    # What Spark's permissive from_avro gives for bytes it cannot decode: null for a
    # non-record schema (checked before the value is wrapped in a struct, which is never
    # null), a record of nulls for a record schema.
    def avro_corrupt(parsed: Column) -> Column:
        value = parsed if isinstance(decoded, T.StructType) else parsed.getField(VALUE)
        failed = value.isNull()
        if isinstance(decoded, T.StructType):
            failed = failed | no_field([value.getField(f.name) for f in decoded.fields])
        return (
            F.when(F.col("value").isNull(), F.concat(where, F.lit(TOMBSTONE)))
            .when(F.length(F.col("value")) == 0, F.concat(where, F.lit(EMPTY)))
            .when(
                failed,
                F.concat(
                    where,
                    F.lit("not decodable with the Avro schema (truncated, or not Avro): 0x"),
                    hex_prefix(F.col("value")),
                ),
            )
            .otherwise(F.lit(None).cast("string"))
        )

    if isinstance(decoded, T.StructType):
        return decoded_value, avro_corrupt, decoded
    # A non-record Avro schema: one column.
    parsed = F.struct(decoded_value.alias(VALUE))
    return parsed, avro_corrupt, T.StructType([T.StructField(VALUE, decoded)])


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

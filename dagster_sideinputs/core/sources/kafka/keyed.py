"""Pre-keyed Kafka topics: a topic partitioned by key is a keyed stream (seed 003).

A topic whose producers used Kafka's default partitioner on the record key holds every
key in exactly one partition: ``toPositive(murmur2(key bytes)) % partitions``. Declared
``MainInput.kafka(..., key=..., pre_keyed=KeyGroups(max_key_groups))``, such a topic is
joined with keyed side inputs without shuffling its records:

- each Kafka partition ``p`` is read as Spark partition ``p`` (one connector read per
  partition, in order), and Spark is told that the records are hash-partitioned by a
  *bucket* column whose value ``bucket(p)`` Spark's own hash sends to partition ``p``
  (``pmod(hash(bucket(p)), partitions) == p``);
- the side rows get ``bucket(murmur2(side key bytes) % partitions)``: Kafka's partitioner
  applied to the side keys, so Spark shuffles only the side, to the same partitions;
- the join matches on the key and the bucket.

The promise is verified, not assumed. Before anything is written, every new record's
partition must be the one Kafka's partitioner gives its key (checked on the connector's
rows as each partition is read: :func:`checked_bucket`), its key column's string form
must be its Kafka key (the side is partitioned by that form), and the topic must have
at most ``max_key_groups`` partitions. Each Spark task also checks that it reads the
Kafka partition it should (``spark_partition_id``), so a read that does not line up
fails instead of joining wrongly. A session that cannot build the partitioned read
(Spark Connect has no JVM in the client) reads with a shuffle and says so.

Kafka's murmur2 runs in Spark as an Arrow UDF (:func:`murmur2_partition`), vectorized
over the keys straight from the Arrow buffers (:func:`murmur2_arrow`). ``bench/kafka.py``
compares it with a pure Spark SQL expression (a higher-order ``aggregate`` over 4-byte
blocks) and a pandas UDF, and Spark's own ``hash`` as the floor (docs/performance.md).
"""

from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.columns import KAFKA_BUCKET, KAFKA_TASK, PRE_KEYED_MARK, quoted
from dagster_sideinputs.core.declarations import KeyGroups
from dagster_sideinputs.core.sources.kafka.declaration import KEY, PARTITION, TOPIC
from dagster_sideinputs.core.state.plan import MainRange, OffsetRange
from dagster_sideinputs.errors import PreKeyedViolationError

BUCKET = KAFKA_BUCKET
ALIGNED = KAFKA_TASK
_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF

# --- Kafka's murmur2 -------------------------------------------------------------------


def murmur2_arrow(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Kafka's murmur2 (unsigned, as uint64) of every value of a binary or string Arrow
    array (a string hashes as its UTF-8 bytes, as Kafka's string serializer writes it).

    Vectorized over the keys straight from the Arrow buffers: one numpy pass per 4-byte
    block of the longest key, no Python object per key. Null keys give a value callers
    mask.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if pa.types.is_string(keys.type):
        keys = keys.view(pa.binary())
    elif pa.types.is_large_string(keys.type):
        keys = keys.view(pa.large_binary())
    count = len(keys)
    if count == 0:
        return np.zeros(0, np.uint64)
    wide = pa.types.is_large_binary(keys.type)
    _, offsets_buffer, data_buffer = keys.buffers()
    raw = np.frombuffer(offsets_buffer, np.int64 if wide else np.int32)
    offsets: np.ndarray[Any, np.dtype[np.int64]] = raw[
        keys.offset : keys.offset + count + 1
    ].astype(np.int64)
    data = (
        np.frombuffer(data_buffer, np.uint8).astype(np.uint64)
        if data_buffer is not None and data_buffer.size
        else np.zeros(1, np.uint64)
    )
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    m, mask = np.uint64(_M), np.uint64(_MASK)
    h = (np.uint64(_SEED) ^ lengths.astype(np.uint64)) & mask
    for block in range(int(lengths.max()) // 4):
        has = np.nonzero(lengths >= 4 * (block + 1))[0]
        at = starts[has] + 4 * block
        k = data[at] | (data[at + 1] << 8) | (data[at + 2] << 16) | (data[at + 3] << 24)
        k = (k * m) & mask
        k ^= k >> np.uint64(24)
        k = (k * m) & mask
        h[has] = ((h[has] * m) & mask) ^ k
    rest = lengths % 4
    body = starts + (lengths // 4) * 4
    for extra, shift in ((2, 16), (1, 8)):  # Java's switch falls through 3 -> 2 -> 1
        has = np.nonzero(rest > extra)[0]
        h[has] ^= data[body[has] + extra] << np.uint64(shift)
    has = np.nonzero(rest >= 1)[0]
    h[has] = ((h[has] ^ data[body[has]]) * m) & mask
    h ^= h >> np.uint64(13)
    h = (h * m) & mask
    h ^= h >> np.uint64(15)
    return h


def kafka_partitions(keys: pa.Array | pa.ChunkedArray, partitions: int) -> pa.Array:
    """The partition Kafka's default partitioner gives each key (null for null keys)."""
    hashed = murmur2_arrow(keys)
    values = ((hashed & np.uint64(0x7FFFFFFF)) % np.uint64(partitions)).astype(np.int32)
    nulls = keys.is_null()
    if isinstance(nulls, pa.ChunkedArray):
        nulls = nulls.combine_chunks()
    return pa.array(values, pa.int32(), mask=nulls.to_numpy(zero_copy_only=False))


def murmur2_partition(key_bytes: Column, partitions: int) -> Column:
    """Spark expression: ``toPositive(murmur2(key)) % partitions`` of a binary or string
    column (an Arrow UDF, see the module docstring); null for a null key."""
    return _partition_udf(int(partitions))(key_bytes)


@cache
def _partition_udf(partitions: int, in_place: bool = False) -> Any:
    def kafka_partition(keys: pa.Array) -> pa.Array:
        return kafka_partitions(keys, partitions)

    udf: Any = F.arrow_udf  # its overloads do not cover a plain function and a DDL type
    made = udf(kafka_partition, "int")
    # Spark moves no nondeterministic expression: a check written above a join stays
    # there, where a Python UDF cannot cost the join the partitioning of its input.
    return made.asNondeterministic() if in_place else made


def key_bytes(column: str, data_type: T.DataType) -> Column:
    """What Kafka hashes for a key: a binary as is, a string as UTF-8, anything else as
    its string form (how a string serializer writes ``str(key)``)."""
    if isinstance(data_type, T.BinaryType | T.StringType):
        return F.col(quoted(column))
    return F.col(quoted(column)).cast("string")


# --- buckets Spark understands ----------------------------------------------------------


def _fmix(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    return h ^ (h >> 16)


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an ``int`` (Murmur3 x86_32, ``hashInt``), as a signed int."""
    k = (value & _MASK) * 0xCC9E2D51 & _MASK
    k = ((k << 15) | (k >> 17)) & _MASK
    k = (k * 0x1B873593) & _MASK
    h = (seed & _MASK) ^ k
    h = ((h << 13) | (h >> 19)) & _MASK
    h = (h * 5 + 0xE6546B64) & _MASK
    h = _fmix(h ^ 4)
    return h - (1 << 32) if h & 0x80000000 else h


@cache
def buckets(partitions: int) -> tuple[int, ...]:
    """For each partition ``p``, the smallest int ``v >= 0`` with
    ``pmod(hash(v), partitions) == p``: a value Spark's hash partitioning sends to ``p``."""
    found: dict[int, int] = {}
    value = 0
    while len(found) < partitions:
        found.setdefault(spark_hash_int(value) % partitions, value)
        value += 1
    return tuple(found[p] for p in range(partitions))


def bucket_of(partition: Column, partitions: int) -> Column:
    """Spark expression: the bucket of a Kafka partition number."""
    return F.element_at(F.array(*[F.lit(v) for v in buckets(partitions)]), partition + 1)


# --- the promise, checked ------------------------------------------------------------------


def partition_count(main: MainRange) -> int:
    """The partitions of the (one) topic of a pre-keyed input, as the plan saw them."""
    return len({r.partition for r in main.offsets})


def check_partition_count(ranges: Sequence[OffsetRange], keyed: KeyGroups, label: str) -> None:
    """A pre-keyed topic has at most ``max_key_groups`` partitions (one key group each)."""
    count = len({r.partition for r in ranges})
    if count > keyed.max_key_groups:
        topics = sorted({r.topic for r in ranges})
        raise PreKeyedViolationError(
            f"{label} is declared pre-keyed with max_key_groups={keyed.max_key_groups}, but "
            f"topic {topics[0] if topics else '?'} has {count} partitions: every partition is "
            "a key group, and there can be no more of them than key groups. Nothing was "
            "written.",
            fix=f"declare KeyGroups(max_key_groups={count}) or more, or drop pre_keyed=",
        )


def misplaced_key(
    key: Column, partition: Column, topic: Column, partitions: int, *, in_place: bool = False
) -> tuple[Column, Column]:
    """(condition, message) of a record whose non-null Kafka key (``key``: its bytes or
    its string) Kafka's default partitioner puts in another partition than ``partition``
    (``in_place``: evaluated where it is written, never pushed below a join)."""
    expected = _partition_udf(int(partitions), in_place)(key)
    message = F.concat(
        F.lit(f"{PRE_KEYED_MARK}: the record of key "),
        F.coalesce(key.cast("string"), F.lit("null")),
        F.lit(" is in partition "),
        topic,
        F.lit("["),
        partition.cast("string"),
        F.lit("] but Kafka's default partitioner puts it in partition "),
        F.coalesce(expected.cast("string"), F.lit("none (a null key)")),
        F.lit(f" of {partitions}"),
    )
    return F.coalesce(partition != expected, F.lit(True)), message


def violation(
    key: str,
    key_type: T.DataType,
    partitions: int,
    *,
    in_place: bool = False,
    partitions_checked: bool = False,
) -> tuple[Column, Column]:
    """(condition, message) of a record breaking the pre-keyed promise (``in_place``:
    evaluated where it is written, never pushed below a join; ``partitions_checked``:
    the read already checked each record's partition against its key, see
    :func:`checked_bucket`, and only the key column and the task are checked here)."""
    wrong_partition, wrong_partition_message = (
        (F.lit(False), F.lit(None).cast("string"))
        if partitions_checked
        else misplaced_key(
            F.col(KEY), F.col(PARTITION), F.col(TOPIC), partitions, in_place=in_place
        )
    )
    key_text = F.col(quoted(key)).cast("string")
    wrong_key = (
        F.lit(False)
        if key == KEY
        else ~F.col(KEY).eqNullSafe(
            F.col(quoted(key)) if isinstance(key_type, T.BinaryType) else key_text
        )
    )
    misplaced = F.col(ALIGNED).isNotNull() & (F.col(ALIGNED) != F.col(PARTITION))
    message = (
        F.when(
            misplaced,
            F.concat(
                F.lit(f"{PRE_KEYED_MARK}: Spark task "),
                F.col(ALIGNED).cast("string"),
                F.lit(" read a record of Kafka partition "),
                F.col(PARTITION).cast("string"),
                F.lit(" (the partitioned read is out of line; report it)"),
            ),
        )
        .when(
            wrong_key,
            F.concat(
                F.lit(f"{PRE_KEYED_MARK}: the record at "),
                F.col(TOPIC),
                F.lit("["),
                F.col(PARTITION).cast("string"),
                F.lit("] has Kafka key "),
                F.coalesce(F.col(KEY).cast("string"), F.lit("null")),
                F.lit(f" but {key} = "),
                F.coalesce(key_text, F.lit("null")),
                F.lit(": the key column must be the string form of the Kafka key"),
            ),
        )
        .otherwise(wrong_partition_message)
    )
    return wrong_partition | wrong_key | misplaced, message


def checked_bucket(partition: int, partitions: int) -> Column:
    """Over the connector's rows of Kafka partition ``partition``: its bucket, or an error
    for a record whose Kafka key the default partitioner puts elsewhere.

    Checked as the records are read, on the connector's narrow rows, where the Python
    UDF costs least and no join is above it yet; a null key is not checked here (it is
    invalid, or its key column must match it: :func:`violation`)."""
    lie, message = misplaced_key(F.col("key"), F.col("partition"), F.col("topic"), partitions)
    bucket = F.lit(buckets(partitions)[partition])
    return F.when(F.col("key").isNotNull() & lie, F.raise_error(message)).otherwise(bucket)


# --- reading partition by partition ---------------------------------------------------------


def partitioned_read(
    spark: SparkSession, reads: Sequence[DataFrame], partitions: int
) -> DataFrame | None:
    """``reads[p]`` (Kafka partition ``p``, one Spark partition each, with its bucket
    column) as one DataFrame Spark knows is hash-partitioned by bucket into
    ``partitions``; None when the session cannot build it (no JVM in this process,
    or the reads do not come out one partition each)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None or len(reads) != partitions:
        return None
    union = reads[0]
    for frame in reads[1:]:
        union = union.unionAll(frame)
    try:
        return _logical_rdd(spark, union, partitions)
    except Exception:  # a Spark build whose internals differ: read with a shuffle instead
        return None


def _logical_rdd(spark: SparkSession, union: DataFrame, partitions: int) -> DataFrame | None:
    jvm: Any = getattr(spark, "_jvm")  # noqa: B009 (private: no Connect)
    jdf = union._jdf
    execution = jdf.queryExecution()
    rdd = execution.toRdd()
    if rdd.getNumPartitions() != partitions:
        return None
    output = execution.analyzed().output()
    attributes = [output.apply(i) for i in range(output.size())]
    bucket = [a for a in attributes if a.name() == BUCKET]
    if len(bucket) != 1:
        return None
    scala = jvm.scala.jdk.javaapi.CollectionConverters
    expressions = scala.asScala(jvm.java.util.List.of(bucket[0])).toList()
    partitioning = jvm.org.apache.spark.sql.catalyst.plans.physical.HashPartitioning(
        expressions, partitions
    )
    nothing = scala.asScala(jvm.java.util.ArrayList()).toList()
    none = jvm.scala.Option.empty()
    session = jdf.sparkSession()
    plan = jvm.org.apache.spark.sql.execution.LogicalRDD(
        output, rdd, partitioning, nothing, False, none, session, none, none
    )
    frame = DataFrame(jvm.org.apache.spark.sql.classic.Dataset.ofRows(session, plan), spark)
    # Evaluated right on the scan: the Spark partition each record was read in.
    return frame.withColumn(ALIGNED, F.spark_partition_id())

"""Read stage: the batch's new main records and the buffered records it releases.

New records get the operator's bookkeeping columns (namespace window, key group, first
seen, batch, fingerprint); buffered records already carry them, and get fresh
namespaces and key groups when the declaration changed since they were buffered. A
pre-keyed main input is read as a bucketed table, so keyed joins do not shuffle it.
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.batch.buffer import fingerprint, read_slots
from dagster_sideinputs.core.batch.buffer_schema import carried
from dagster_sideinputs.core.batch.context import Batch, StageContext
from dagster_sideinputs.core.batch.invalid_records import invalid_condition
from dagster_sideinputs.core.columns import (
    BATCH,
    CORRUPT,
    FINGERPRINT,
    FIRST_SEEN,
    KAFKA_BUCKET,
    KAFKA_TASK,
    KEY_GROUP,
    NS_END,
    NS_START,
    ORIGIN,
    PREFIX,
)
from dagster_sideinputs.core.keyed import (
    bucketed_scan,
    bucketing_obstacle,
    check_pre_keyed,
    drop_bucketed_scan,
    key_group,
)
from dagster_sideinputs.core.sideinputs.windows import (
    assign_global,
    assign_windows,
    check_time_column,
    global_namespace,
    in_window,
)
from dagster_sideinputs.core.sources.kafka.keyed import (
    bucket_of,
    key_bytes,
    murmur2_partition,
    partition_count,
)
from dagster_sideinputs.core.sources.kafka.source import KafkaSource, PartitionedRead
from dagster_sideinputs.core.sources.main_source import SourceSlice
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.state.plan import BatchPlan
from dagster_sideinputs.delta.store.files import join_uri
from dagster_sideinputs.errors import (
    DeclarationError,
    did_you_mean,
)

DEFAULT_KEY_GROUPS = 128
# Columns a read adds for the batch's own use (never part of the main records).
INTERNAL = (KAFKA_BUCKET, KAFKA_TASK)


def read(context: StageContext, batch: Batch) -> Batch:
    spec, plan = context.spec, batch.plan
    piece = batch.source or context.source.files(plan.main)
    notes: list[str] = []
    kafka_keyed = spec.main.keyed_by_partition
    partitions_checked = False
    if kafka_keyed:
        raw, partitions_checked, note = _kafka_pre_keyed_read(context, piece)
        notes.append(note)
    else:
        raw = context.source.read(context.spark, piece)
    if spec.main.pre_keyed is not None and piece.files:
        raw, note = _pre_keyed_scan(context, raw, piece)
        notes.append(note)
    caching, decoded = context.source.caching(), None
    if caching == "before_jobs" and CORRUPT in raw.columns:
        # JSON / CSV records parse only the columns a Spark job reads, so whether a record
        # is corrupt would depend on the job: the job counting routes might see a valid
        # record that the job writing an output sees corrupt, and the record would reach
        # neither. Parsed once, whole, each record is corrupt or not for the whole batch.
        raw = context.persist(raw)
    elif caching == "several_jobs":
        decoded = raw  # cached by the stage that knows a second job will read it
    main_columns = tuple(c for c in raw.columns if c not in (CORRUPT, *INTERNAL))
    main_schema = T.StructType([raw.schema[c] for c in main_columns])
    check_main_schema(spec, main_schema)
    new = with_bookkeeping(spec, raw, plan, main_columns)
    buffered, state = read_slots(spec, context.spark, plan)
    if buffered is not None:  # in the main input's schema now (core/batch/buffer_schema.py)
        buffered = carried(spec, buffered, main_schema, plan.buffer_renames)
        if plan.buffer_rewrite:  # the key's type may have changed: its hash with it
            buffered = buffered.withColumn(KEY_GROUP, _key_group(spec))
    if buffered is not None and plan.reroute:
        buffered = _rebuilt(spec, buffered, main_columns, plan)
        notes.append("declaration changed: buffered records routed again under the new one")
    if buffered is not None and kafka_keyed:
        buffered = _with_kafka_bucket(spec, buffered, plan)
    records = new if buffered is None else new.unionByName(buffered, allowMissingColumns=True)
    return batch.but(
        source=piece,
        records=records,
        main_columns=main_columns,
        buffer=state,
        decoded=decoded,
        partitions_checked=partitions_checked,
    ).noted(*notes)


def _kafka_pre_keyed_read(context: StageContext, piece: SourceSlice) -> PartitionedRead:
    source = context.source
    assert isinstance(source, KafkaSource)
    read = source.read_partitioned(context.spark, piece)
    if read.in_place:
        # The partitioned read hash-partitions by bucket only, while joins match on key
        # and bucket: let Spark reuse a partitioning on some of the join keys for the
        # other side (it then shuffles the side only) for this batch.
        conf = context.spark.conf
        setting = "spark.sql.requireAllClusterKeysForCoPartition"
        before = conf.get(setting, None)
        conf.set(setting, "false")
        context.on_cleanup(lambda: conf.set(setting, before) if before else conf.unset(setting))
    return read


def _with_kafka_bucket(spec: OperatorSpec, buffered: DataFrame, plan: BatchPlan) -> DataFrame:
    """Buffered records of a pre-keyed topic get the bucket of their key under the
    topic's current partition count (the side rows are bucketed the same way)."""
    count, key = partition_count(plan.main), spec.main.key
    assert key is not None
    if not count:
        return buffered.withColumn(KAFKA_BUCKET, F.lit(None).cast("int"))
    partition = murmur2_partition(key_bytes(key, buffered.schema[key].dataType), count)
    return buffered.withColumn(KAFKA_BUCKET, bucket_of(partition, count))


def check_main_schema(spec: OperatorSpec, schema: T.StructType) -> None:
    """The declared key and event-time columns exist with usable types, and no column
    collides with the operator's own."""
    main, names = spec.main, schema.fieldNames()
    where = f"Main input {main.asset!r}"
    reserved = [n for n in names if n.startswith(PREFIX) and n != CORRUPT]
    if reserved:
        raise DeclarationError(
            f"{where} has column(s) {reserved} starting with {PREFIX!r}, which the operator "
            "reserves for its own bookkeeping.",
            fix="rename the column(s) upstream",
        )
    if main.key is not None and main.key not in names:
        raise DeclarationError(
            f"{where} has no key column {main.key!r} (columns: {names})."
            + did_you_mean(main.key, names),
            fix="fix MainInput(key=...) or the main input's schema",
        )
    if main.key is not None and isinstance(schema[main.key].dataType, T.MapType):
        raise DeclarationError(
            f"{where}: key column {main.key!r} is a map, which cannot be hashed or joined.",
            fix="key the input by a string, number, date or timestamp column",
        )
    if spec.window is not None and spec.window.time_column is not None:
        check_time_column(schema, spec.window.time_column, where=where)
    elif main.event_time is not None:
        check_time_column(schema, main.event_time, where=where)
    if spec.window is not None and "window" in names:
        raise DeclarationError(
            f"{where} has a column named 'window', which the operator uses for the main "
            "window of each released record.",
            fix="rename that column upstream",
        )


def with_bookkeeping(
    spec: OperatorSpec, raw: DataFrame, plan: BatchPlan, main_columns: tuple[str, ...]
) -> DataFrame:
    """New records with their namespace, key group, first-seen time, batch and fingerprint."""
    columns: dict[str, Column] = {}
    if spec.window is None:  # the global namespace, in the same projection
        frame, columns = raw, global_namespace()
    else:
        frame = _namespaced(spec, raw, plan)
    # One projection (each withColumn is a plan analysis on the driver).
    return frame.withColumns(
        {
            **columns,
            KEY_GROUP: _key_group(spec),
            FIRST_SEEN: F.lit(plan.now).cast("timestamp"),
            BATCH: F.lit(plan.batch_id).cast("long"),
            FINGERPRINT: fingerprint(raw.schema, main_columns),
            ORIGIN: F.lit("new"),
        }
    )


def _namespaced(spec: OperatorSpec, frame: DataFrame, plan: BatchPlan) -> DataFrame:
    if spec.window is None:
        return assign_global(frame)
    assert spec.window.time_column is not None
    # An invalid record goes to the invalid tag once, not once per sliding window.
    single = invalid_condition(spec, frame.schema, plan)
    return assign_windows(frame, spec.window, spec.window.time_column, single=single)


def _key_group(spec: OperatorSpec):
    keyed = spec.main.pre_keyed
    groups = keyed.max_key_groups if keyed else DEFAULT_KEY_GROUPS
    key = spec.main.key
    return key_group(key, groups) if key else F.lit(None).cast("int")


def _rebuilt(
    spec: OperatorSpec, buffered: DataFrame, main_columns: tuple[str, ...], plan: BatchPlan
) -> DataFrame:
    """Buffered records under a changed declaration: key groups computed again, and
    namespaces too, unless a row's window is still a window of the current declaration
    containing its event time (a sliding window's row then stays one row, not one per
    window again). First-seen time, batch and fingerprint stay, so limits and order are
    unchanged. A sliding window changed with rows buffered is refused before the batch
    (``identity``): its rows are (record, window) pairs."""
    missing = [c for c in main_columns if c not in buffered.columns]
    for column in missing:  # columns the main input gained since the record was buffered
        buffered = buffered.withColumn(column, F.lit(None))
    buffered = buffered.withColumn(KEY_GROUP, _key_group(spec))
    window = spec.window
    if window is None:
        return assign_global(buffered)
    assert window.time_column is not None
    if window.time_column not in buffered.columns:  # null event time: invalid, not dropped
        buffered = buffered.withColumn(window.time_column, F.lit(None).cast("timestamp"))
    kept = in_window(window, window.time_column)
    moved = _namespaced(spec, buffered.filter(~kept).drop(NS_START, NS_END), plan)
    return buffered.filter(kept).unionByName(moved)


def _pre_keyed_scan(
    context: StageContext, raw: DataFrame, piece: SourceSlice
) -> tuple[DataFrame, str]:
    """The batch's new files of a pre-keyed Delta main input, read as buckets when they are
    local, once every file is checked to hold one key group (from the Delta log). That
    every row sits in its key's group is checked with the routes
    (:func:`~dagster_sideinputs.core.batch.route_rules.with_key_group_check`)."""
    spec = context.spec
    keyed = spec.main.pre_keyed
    snapshot = piece.snapshot
    assert keyed is not None
    assert spec.main.key is not None
    assert snapshot is not None
    splits = check_pre_keyed(piece.files, keyed, key=spec.main.key, table=spec.main.asset)
    partition_columns = set(snapshot.partition_columns)
    if partition_columns - {keyed.column}:
        return raw, "pre-keyed: partition columns besides the key group; read with a shuffle"
    obstacle = bucketing_obstacle(snapshot, piece.files)
    if obstacle is not None:
        return raw, f"pre-keyed: {obstacle}; read with a shuffle"
    scan = bucketed_scan(
        context.spark,
        splits,
        snapshot=snapshot,
        key=spec.main.key,
        groups=keyed,
        scratch_dir=join_uri(spec.state_uri, "prekeyed"),
        label=spec.operator_id,
    )
    frame, table = scan
    context.on_cleanup(lambda: drop_bucketed_scan(context.spark, table))
    return frame, "pre-keyed: main files read as buckets (no shuffle)"

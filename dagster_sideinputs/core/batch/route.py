"""Route stage: where each record of a batch goes, decided and checked before any write.

The side views in play are joined to the records (at the plan's pinned versions), then
every record gets one route: ``released`` (to the function), ``buffered`` (its namespace
is not ready), ``key_wait`` (waiting for the side row of its key), ``late``,
``unmatched``, ``overflow`` or ``invalid``. One Spark job counts the routes (or, when
every record is plainly released, the new files' Delta statistics do, or else the job
writing the outputs: :mod:`~dagster_sideinputs.core.batch.route_counts`); the counts are
the batch's metrics, and they decide, before anything commits, whether invalid records or
the buffer's limits stop the batch. The rules live in
:mod:`~dagster_sideinputs.core.batch.route_rules` and
:mod:`~dagster_sideinputs.core.batch.invalid_records`.
"""

from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.batch.buffer import Counts, enforce_limits
from dagster_sideinputs.core.batch.context import Batch, StageContext, Views, explain
from dagster_sideinputs.core.batch.invalid_records import check_invalid
from dagster_sideinputs.core.batch.one_per_key import (
    DRIVER_CHECK_ROWS,
    check_one_row_per_key,
    count_keys_early,
)
from dagster_sideinputs.core.batch.route_counts import count_routes, observe_routes
from dagster_sideinputs.core.batch.route_rules import (
    lookup,
    with_key_group_check,
    with_pre_keyed_check,
    with_routes,
)
from dagster_sideinputs.core.columns import CORRUPT, NS_ID, NS_START, ORIGIN, REASON, ROUTE
from dagster_sideinputs.core.keyed import (
    bucketed_scan,
    bucketing_obstacle,
    drop_bucketed_scan,
    hashable_on_driver,
    key_groups_hold,
    key_groups_hold_on_driver,
    side_splits,
)
from dagster_sideinputs.core.sideinputs.joins import Bucketing, JoinSpec, apply_join, build_join
from dagster_sideinputs.core.sideinputs.side_data import SideData
from dagster_sideinputs.core.sideinputs.temporal import main_time_column
from dagster_sideinputs.core.sideinputs.views import empty_namespaces
from dagster_sideinputs.core.sideinputs.windows import (
    GLOBAL,
    as_utc,
    namespace_id_column,
)
from dagster_sideinputs.core.sources.kafka.keyed import partition_count
from dagster_sideinputs.core.spark_errors import translated
from dagster_sideinputs.core.spec import BoundSide, OperatorSpec
from dagster_sideinputs.core.state.plan import BatchPlan, side_windows
from dagster_sideinputs.delta.engine import DataFile, TableSnapshot
from dagster_sideinputs.delta.store.files import join_uri


def route(context: StageContext, batch: Batch) -> Batch:
    spec, plan = context.spec, batch.plan
    assert batch.records is not None
    # Without a window every record's namespace is the global one (buffered records too:
    # they are read back under the current declaration, ``read._rebuilt``).
    ns_id = F.lit(GLOBAL) if spec.window is None else namespace_id_column(F.col(NS_START))
    records = batch.records.withColumn(NS_ID, ns_id)
    views = build_views(context, plan, records)
    # The maps' keys read and counted on the driver while the rest is planned below.
    early = count_keys_early(context, plan, views)
    for name, join in views.joins.items():
        records = apply_join(records, join, name)
    key = spec.main.key
    float_key = key is not None and batch.records.schema[key].dataType.typeName() in (
        "float",
        "double",
    )
    source = batch.source if released_unless_invalid(spec, plan, views) else None
    counts = files = None
    if source is not None:
        files = context.source.statistics(source)
        # No statistics give a float key's NaNs, nor the newest event time, nor check a
        # pre-keyed topic's promise.
        if not float_key and spec.main.event_time is None and not spec.main.keyed_by_partition:
            counts = counts_from_statistics(spec, plan, files)
    plain = counts is not None and plainly_released(spec, plan, batch.records)
    if plain:
        no_reason = F.lit(None).cast("string")
        routed = records.withColumns({ROUTE: F.lit("released"), REASON: no_reason})
    else:
        routed = with_routes(spec, records, plan, views.joins, views.empty)
    classified = with_key_group_check(spec, routed)
    # A check in the route (a pre-keyed input's key groups) runs only where a job reads it.
    plain = plain and classified is routed
    notes: list[str] = list(views.notes)
    if spec.options.cache == "always":
        # Otherwise every write recomputes the records from the batch's pinned inputs,
        # which measured cheaper than building Spark's cache, even for shuffle joins.
        classified = context.persist(classified)
        notes.append("classified records cached (cache='always')")
    observed = None
    if counts is None and source is not None and "invalid" not in spec.routes:
        # No table takes invalid records: counted by the job writing the outputs.
        expected = context.source.record_count(source) if files is None else record_total(files)
        if expected:
            classified = with_pre_keyed_check(
                spec,
                classified,
                plan,
                in_place=True,
                partitions_checked=batch.partitions_checked,
            )
            classified, observed = observe_routes(
                classified, expected, plan.now, time_column=spec.main.event_time
            )
            counts = observed.provisional
    if observed is None:  # a job counts, and others write
        context.share(batch.decoded)
    if counts != {}:  # a batch without records joins nothing: no duplicate can matter
        notes.extend(check_one_row_per_key(context, plan, views, first=True, early=early))
    if counts is None:
        checked = with_pre_keyed_check(
            spec, classified, plan, partitions_checked=batch.partitions_checked
        )
        counts = translated(context, lambda: count_routes(spec, checked), views=views)
    elif observed is None:
        notes.append("every record released: routes counted from file statistics")
    if observed is None:
        check_invalid(spec, context.source, classified, counts)
    limited, counts = enforce_limits(
        spec, plan, classified, counts, batch.buffer, lambda frame: count_routes(spec, frame)
    )
    if limited is not classified:
        context.on_cleanup(limited.unpersist)
        classified, plain = limited, False
        if observed is not None:  # recounted by a job of their own
            observed = None
            check_invalid(spec, context.source, classified, counts)
    if observed is not None:
        notes.append("every record released unless invalid: routes counted by the write job")
    # Planned now, while the batch's settings and temporary tables are in place.
    physical_plan = explain(classified) if context.explain else None
    return batch.but(
        views=views,
        classified=classified,
        all_released=plain,
        counts=counts,
        observed=observed,
        physical_plan=physical_plan,
    ).noted(*notes)


# --- views --------------------------------------------------------------------------------


def build_views(context: StageContext, plan: BatchPlan, records: DataFrame) -> Views:
    """The side data and joins of the batch's ``records`` (with their namespace id)."""
    spec = context.spec
    data: dict[str, SideData] = {}
    joins: dict[str, JoinSpec] = {}
    empty: dict[str, Column] = {}
    notes: list[str] = []
    for bound in spec.sides:
        version = plan.side_versions.get(bound.name)
        snapshot = (
            None
            if version is None
            else spec.engine.snapshot(bound.uri, version=version, name=bound.side.asset)
        )
        scan = None
        if snapshot is not None and co_partitioned(spec, bound, records):
            scan, note = _key_group_scan(context, bound, snapshot, records)
            notes.append(note)
        data[bound.name] = SideData(bound, snapshot, context.spark, spec.engine, scan)
        if snapshot is None:
            continue
        windows = side_windows(bound, plan)
        if windows == []:
            continue  # no released record reads this windowed side input
        mapping = {ns: p.side_namespaces[bound.name] for ns, p in plan.namespaces.items()}
        main_side_ns = (
            lookup(mapping, F.col(NS_ID)) if bound.side.window is not None else F.lit(GLOBAL)
        )
        join = build_join(
            data[bound.name],
            records,
            windows=windows,
            main_side_ns=main_side_ns,
            bucketing=_bucketing(spec, plan),
            event_time=main_time_column(spec),
            as_of=plan.as_of.get(bound.name),
            # Ready side data is checked before any job reads it (one_per_key).
            check_first=spec.window is None and GLOBAL in plan.ready_namespaces,
        )
        if join is not None:
            joins[bound.name] = join
        if bound.side.on_empty == "unmatched":
            empties = empty_namespaces(data[bound.name], windows)
            if empties:
                empty[bound.name] = main_side_ns.isin(empties)
    return Views(data, joins, empty, tuple(notes))


def co_partitioned(spec: OperatorSpec, bound: BoundSide, main: DataFrame) -> bool:
    """Whether a side input could join a pre-keyed Delta main input without a shuffle: a
    keyed, non-broadcast, non-windowed view joined on the main key itself."""
    side, key, keyed = bound.side, spec.main.key, spec.main.pre_keyed
    if keyed is None or key is None or spec.main.keyed_by_partition or side.key is None:
        return False
    joined_on = side.key if side.key_translator is None else side.key_translator
    return (
        joined_on == key
        and side.view in ("map", "multimap")
        and side.window is None
        and side.as_of is None
        and side.distribution in (None, "keyed")
        and key in main.columns
    )


def _key_group_scan(
    context: StageContext, bound: BoundSide, snapshot: TableSnapshot, main: DataFrame
) -> tuple[DataFrame | None, str]:
    """A side table partitioned by the main input's key groups, read as buckets (None
    when it is not, its key has another type than the main key, whose hash then differs,
    or its rows do not sit in their keys' groups), and a note saying so."""
    spec, label = context.spec, f"side input {bound.name!r}"
    keyed, key = spec.main.pre_keyed, bound.side.key
    assert keyed is not None
    assert key is not None
    splits = side_splits(snapshot, keyed)
    if splits is None:
        return None, f"{label}: not partitioned by {keyed.column!r} alone; joined with a shuffle"
    obstacle = bucketing_obstacle(snapshot, snapshot.files)
    if obstacle is not None:
        return None, f"{label}: {obstacle}; joined with a shuffle"
    if key not in snapshot.schema.fieldNames():
        return None, f"{label}: no key column {key!r}"  # the join reports it
    side_type, main_type = snapshot.schema[key].dataType, main.schema[key].dataType
    if side_type != main_type:
        return None, (
            f"{label}: key {key!r} is {side_type.simpleString()}, the main input's "
            f"{main_type.simpleString()}; joined with a shuffle"
        )
    checked = (bound.uri, snapshot.version, snapshot.table_id, keyed, key)
    holds = context.key_groups_checked.get(checked)
    if holds is None:
        holds = translated(context, lambda: _side_in_groups(context, bound, snapshot, key))
        context.key_groups_checked[checked] = holds
    if not holds:
        return None, (
            f"{label}: partitioned by {keyed.column!r}, but not every row sits in its key's "
            f"group (pmod(hash({key}), {keyed.max_key_groups})); joined with a shuffle"
        )
    scan = bucketed_scan(
        context.spark,
        splits,
        snapshot=snapshot,
        key=key,
        groups=keyed,
        scratch_dir=join_uri(spec.state_uri, "prekeyed"),
        label=f"{spec.operator_id}_{bound.name}",
    )
    frame, table = scan
    context.on_cleanup(lambda: drop_bucketed_scan(context.spark, table))
    return frame, f"{label}: read as key-group buckets (no shuffle)"


def _side_in_groups(
    context: StageContext, bound: BoundSide, snapshot: TableSnapshot, key: str
) -> bool:
    """Whether each row of a side table with a key sits in its key's group. On the driver
    when the table is small (:data:`DRIVER_CHECK_ROWS`), its key one Spark hashes as an
    integer and the engine reads the two columns itself (the bridge: 200k profiles in
    ~20 ms, where the Spark job took 0.10-0.15 s); else a Spark job checks them."""
    engine, keyed = context.spec.engine, context.spec.main.pre_keyed
    assert keyed is not None
    kind, rows = snapshot.schema[key].dataType, snapshot.num_records
    group_kind = snapshot.schema[keyed.column].dataType
    if (
        hashable_on_driver(kind)
        and isinstance(group_kind, T.IntegralType)
        and rows is not None
        and rows <= DRIVER_CHECK_ROWS
    ):
        columns = [key, keyed.column]
        table = engine.read_on_driver(snapshot, columns=columns, name=bound.side.asset)
        if table is not None:
            return key_groups_hold_on_driver(table, key=key, kind=kind, groups=keyed)
    frame = engine.read_snapshot(context.spark, snapshot, name=bound.side.asset)
    return key_groups_hold(frame, key=key, groups=keyed)


def _bucketing(spec: OperatorSpec, plan: BatchPlan) -> Bucketing | None:
    """How main records of a pre-keyed Kafka topic are bucketed (None: not such a topic)."""
    if not (spec.main.keyed_by_partition and spec.main.key):
        return None
    count = partition_count(plan.main)
    return Bucketing(count, spec.main.key) if count else None


# --- counts -------------------------------------------------------------------------------


def released_unless_invalid(spec: OperatorSpec, plan: BatchPlan, views: Views) -> bool:
    """Every record of the batch is released unless it is invalid: one ready global
    namespace, no buffered records read, no per-key routing, no side input routing
    records unmatched (an empty one declaring ``on_empty="unmatched"``) or holding them
    back (an as-of map's horizon)."""
    joins = views.joins
    return (
        not views.empty
        and not plan.read_slots
        and spec.window is None
        and GLOBAL in plan.ready_namespaces
        and all(bound.side.missing == "null" for bound in spec.sides if bound.name in joins)
        and not any(bound.side.as_of is not None for bound in spec.sides)
    )


def plainly_released(spec: OperatorSpec, plan: BatchPlan, records: DataFrame) -> bool:
    """Whether a batch whose counts came from statistics (:func:`counts_from_statistics`:
    no null key, no float key, no event time, :func:`released_unless_invalid`) releases
    every record without a rule to evaluate: no decoder marks records corrupt and no late
    namespace routes records to a late table. Its records then take the route
    ``released`` as a literal, not :func:`with_routes`' expression (one DataFrame call
    instead of ~170 py4j calls building it; with the map's duplicate-key frame built only
    when needed, the frames bench's route stage went from 0.21 to 0.10 s)."""
    late_routed = spec.options.routes.late is not None and bool(plan.late_namespaces)
    return CORRUPT not in records.columns and not late_routed


def record_total(files: Sequence[DataFile]) -> int | None:
    """The records of a slice's files by their statistics (None: some file has none, or
    deletion vectors hide some of its rows)."""
    if any(f.num_records is None or f.deletion_vector for f in files):
        return None
    return sum(f.num_records or 0 for f in files)


def counts_from_statistics(
    spec: OperatorSpec, plan: BatchPlan, files: Sequence[DataFile] | None
) -> Counts | None:
    """The counts of a :func:`released_unless_invalid` batch with no event time to track,
    without a Spark job, when the statistics of its new files (a Delta input's log,
    landed parquet footers) say no key is null (float keys, which could be NaN, always
    take the job), or the source knows the slice holds no record (no new file, only
    empty files, no Kafka offset). None when a job must count."""
    if files is None:
        return None
    total = 0
    for file in files:
        if file.num_records is None:
            return None
        if not file.num_records:
            continue  # an empty file holds no null key either
        key = spec.main.key
        if key is not None and file.null_count.get(key) != 0:
            return None  # unknown, or null keys: the job finds and describes them
        total += file.num_records
    if not total:
        return {}
    first_seen = as_utc(plan.now).replace(tzinfo=None)  # as Spark returns the timestamp
    released: dict[str, Any] = {ROUTE: "released", ORIGIN: "new", "n": total, "oldest": first_seen}
    return {("released", "new"): released}


__all__ = ["route"]

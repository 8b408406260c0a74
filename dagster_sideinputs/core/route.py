"""Route stage: where each record of a batch goes, decided and checked before any write.

The side views in play are joined to the records (at the plan's pinned versions), then
every record gets one route: ``released`` (to the function), ``buffered`` (its namespace
is not ready), ``key_wait`` (waiting for the side row of its key), ``late``,
``unmatched``, ``overflow`` or ``invalid``. One Spark job counts the routes (or, when
every record is plainly released, the new files' Delta statistics do); the counts are
the batch's metrics, and they decide, before any write, whether invalid records or the
buffer's limits stop the batch.
"""

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.buffer import BUFFER_ROUTES, Counts, enforce_limits
from dagster_sideinputs.core.columns import (
    CORRUPT,
    FIRST_SEEN,
    KEY_GROUP,
    NS_ID,
    NS_START,
    ORIGIN,
    PRE_KEYED_MARK,
    REASON,
    ROUTE,
    quoted,
)
from dagster_sideinputs.core.context import Batch, StageContext, Views
from dagster_sideinputs.core.metrics import human_duration
from dagster_sideinputs.core.plan import BatchPlan
from dagster_sideinputs.core.side_data import SideData
from dagster_sideinputs.core.spark_errors import translated
from dagster_sideinputs.core.spec import BoundSide, OperatorSpec
from dagster_sideinputs.core.temporal import main_time_column, waits_for_horizon
from dagster_sideinputs.core.views import JoinSpec, apply_join, build_join, empty_namespaces
from dagster_sideinputs.core.windows import (
    GLOBAL,
    WindowSpan,
    as_utc,
    map_to_side_window,
    namespace_id_column,
    shifted,
    time_range,
)
from dagster_sideinputs.delta.engine import DataFile
from dagster_sideinputs.errors import MainInputDataError, preview

ROUTES = ("released", "buffered", "key_wait", "late", "unmatched", "overflow", "invalid")


def route(context: StageContext, batch: Batch) -> Batch:
    spec, plan = context.spec, batch.plan
    assert batch.records is not None
    views = build_views(context, plan, batch.records)
    records = batch.records.withColumn(NS_ID, namespace_id_column(F.col(NS_START)))
    for name, join in views.joins.items():
        records = apply_join(records, join, name)
    classified = _with_routes(spec, records, plan, views.joins, views.empty)
    notes: list[str] = []
    if _should_cache(context, views):
        classified = context.persist(classified)
        notes.append("classified records cached (a side input is joined by shuffle)")
    files = batch.source.files if batch.source is not None else ()
    key = spec.main.key
    float_key = key is not None and batch.records.schema[key].dataType.typeName() in (
        "float",
        "double",
    )
    counts = None if float_key else counts_from_statistics(spec, plan, files, views.joins)
    if counts is None:
        counts = translated(context, lambda: count_routes(spec, classified), views=views)
    else:
        notes.append("every record released: routes counted from Delta statistics")
    check_invalid(spec, classified, counts)
    limited, counts = enforce_limits(
        spec, plan, classified, counts, batch.buffer, lambda frame: count_routes(spec, frame)
    )
    if limited is not classified:
        context.on_cleanup(limited.unpersist)
        classified = limited
    return batch.but(views=views, classified=classified, counts=counts).noted(*notes)


# --- views --------------------------------------------------------------------------------


def side_windows(bound: BoundSide, plan: BatchPlan) -> list[WindowSpan] | None:
    """The side windows that released records of this batch read (None: not windowed)."""
    window = bound.side.window
    if window is None:
        return None
    return sorted(
        {
            map_to_side_window(window, bound.side.window_mapping, p.start, p.end)
            for p in plan.namespaces.values()
            if p.ready and p.start is not None and p.end is not None
        }
    )


def lookup(mapping: Mapping[str, str], key: Column) -> Column:
    """``mapping[key]`` as a Spark expression over a small literal map."""
    if not mapping:
        return F.lit(None).cast("string")
    pairs: list[Column] = []
    for k, v in sorted(mapping.items()):
        pairs.extend([F.lit(k), F.lit(v)])
    return F.element_at(F.create_map(*pairs), key)


def build_views(context: StageContext, plan: BatchPlan, records: DataFrame) -> Views:
    spec = context.spec
    data: dict[str, SideData] = {}
    joins: dict[str, JoinSpec] = {}
    empty: dict[str, Column] = {}
    sample = records.withColumn(NS_ID, F.lit(GLOBAL))
    for bound in spec.sides:
        version = plan.side_versions.get(bound.name)
        snapshot = (
            None
            if version is None
            else spec.engine.snapshot(bound.uri, version=version, name=bound.side.asset)
        )
        data[bound.name] = SideData(bound, snapshot, context.spark, spec.engine)
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
            sample,
            windows=windows,
            main_side_ns=main_side_ns,
            event_time=main_time_column(spec),
            as_of=plan.as_of.get(bound.name),
        )
        if join is not None:
            joins[bound.name] = join
        if bound.side.on_empty == "unmatched":
            empties = empty_namespaces(data[bound.name], windows)
            if empties:
                empty[bound.name] = main_side_ns.isin(empties)
    return Views(data, joins, empty)


def _should_cache(context: StageContext, views: Views) -> bool:
    """Cache the classified records when a side input is joined by shuffle."""
    policy = context.spec.options.cache
    if policy != "auto":
        return policy == "always"
    threshold = _broadcast_threshold(context.spark)
    for name, join in views.joins.items():
        snapshot = views.data[name].snapshot
        size = sum(f.size for f in snapshot.files) if snapshot is not None else 0
        if not join.broadcast and (threshold < 0 or size > threshold):
            return True
    return False


def _broadcast_threshold(spark: SparkSession) -> int:
    """``spark.sql.autoBroadcastJoinThreshold`` in bytes (-1: never broadcast)."""
    text = str(spark.conf.get("spark.sql.autoBroadcastJoinThreshold", "10485760")).strip().lower()
    match = re.fullmatch(r"(-?\d+)\s*([kmgt]?)b?", text)
    if match is None:
        return 10 * 2**20
    unit = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[match.group(2)]
    return int(match.group(1)) * unit


# --- routes -------------------------------------------------------------------------------


def not_ready_reason(plan: BatchPlan, ns: str) -> str:
    waiting = []
    for side, side_ns in plan.namespaces[ns].side_namespaces.items():
        decision = plan.decisions.get(side, {}).get(side_ns)
        if decision is not None and not decision.ready:
            waiting.append(f"{side}: {decision.reason}")
    return "waiting for " + "; ".join(waiting) if waiting else "waiting"


def _with_routes(
    spec: OperatorSpec,
    df: DataFrame,
    plan: BatchPlan,
    joins: Mapping[str, JoinSpec],
    empty: Mapping[str, Column],
) -> DataFrame:
    invalid, reason = _invalid(spec, df, plan)
    route = F.when(_pre_keyed_lie(spec, df), F.raise_error(_pre_keyed_message(spec)))
    route = route.when(invalid, F.lit("invalid"))
    late = plan.late_namespaces
    if spec.options.late is not None and late:
        route = route.when((F.col(ORIGIN) == "new") & F.col(NS_ID).isin(late), F.lit("late"))
    route = route.when(~F.col(NS_ID).isin(plan.ready_namespaces), F.lit("buffered"))
    # Side inputs declaring on_empty="unmatched" whose namespace holds no rows.
    empty_reasons = [F.when(condition, F.lit(name)) for name, condition in empty.items()]
    for condition in empty.values():
        route = route.when(condition, F.lit("unmatched"))
    # As-of maps: records after the side data's horizon wait for it (or for its grace).
    horizon_reason: Column = F.lit(None).cast("string")
    time = main_time_column(spec)
    for bound in spec.sides:
        waiting = waits_for_horizon(bound, plan, F.col(quoted(time))) if time else None
        if waiting is not None:
            route = route.when(waiting[0], F.lit("key_wait"))
            horizon_reason = F.coalesce(horizon_reason, F.when(waiting[0], waiting[1]))
    missing_reasons = []
    for bound in spec.sides:
        join = joins.get(bound.name)
        if join is None or bound.side.missing == "null":
            continue
        unmatched = ~F.col(join.matched)
        missing_reasons.append(F.when(unmatched, F.lit(bound.name)))
        if bound.side.missing == "wait":
            assert bound.side.timeout is not None
            deadline = F.lit(shifted(plan.now, bound.side.timeout, back=True)).cast("timestamp")
            timed_out = F.col(FIRST_SEEN) <= deadline
            if bound.side.on_timeout == "unmatched":
                route = route.when(unmatched & timed_out, F.lit("unmatched"))
            route = route.when(unmatched & ~timed_out, F.lit("key_wait"))
        else:
            route = route.when(unmatched, F.lit("unmatched"))
    route = route.otherwise(F.lit("released"))
    not_ready = {ns: not_ready_reason(plan, ns) for ns, p in plan.namespaces.items() if not p.ready}
    missing = F.concat_ws(", ", *missing_reasons) if missing_reasons else F.lit("")
    emptied = F.concat_ws(", ", *empty_reasons) if empty_reasons else F.lit("")
    why = (
        F.when(F.col(ROUTE) == "invalid", reason)
        .when(F.col(ROUTE) == "buffered", lookup(not_ready, F.col(NS_ID)))
        .when((F.col(ROUTE) == "key_wait") & horizon_reason.isNotNull(), horizon_reason)
        .when(F.col(ROUTE) == "key_wait", F.concat(F.lit("waiting for the side row of: "), missing))
        .when(
            (F.col(ROUTE) == "unmatched") & (emptied != ""),
            F.concat(F.lit("the side namespace holds no rows in: "), emptied),
        )
        .when(F.col(ROUTE) == "unmatched", F.concat(F.lit("no side row in: "), missing))
    )
    return df.withColumn(ROUTE, route).withColumn(REASON, why)


def _pre_keyed_lie(spec: OperatorSpec, df: DataFrame) -> Column:
    """A row whose declared key group is not its key's (checked on every route)."""
    keyed = spec.main.pre_keyed
    if keyed is None or keyed.column not in df.columns:
        return F.lit(False)
    return F.col(quoted(keyed.column)) != F.col(KEY_GROUP)


def _pre_keyed_message(spec: OperatorSpec) -> Column:
    keyed, key = spec.main.pre_keyed, spec.main.key
    if keyed is None or key is None:
        return F.lit("")
    return F.concat(
        F.lit(f"{PRE_KEYED_MARK}: a row of key "),
        F.col(quoted(key)).cast("string"),
        F.lit(" is in key group "),
        F.col(quoted(keyed.column)).cast("string"),
        F.lit(" but hashes to "),
        F.col(KEY_GROUP).cast("string"),
    )


def _is_float(schema: T.StructType, name: str) -> bool:
    return schema[name].dataType.typeName() in ("float", "double")


def invalid_checks(
    spec: OperatorSpec, schema: T.StructType, plan: BatchPlan
) -> list[tuple[Column, str]]:
    """What makes a record invalid, as (condition, reason) pairs over its main columns.

    The read stage uses the same conditions to give an invalid record one row rather
    than one per sliding window, so both must come from here.
    """
    names = schema.fieldNames()
    checks: list[tuple[Column, str]] = []
    if CORRUPT in names:
        checks.append((F.col(CORRUPT).isNotNull(), "corrupt record"))
    key = spec.main.key
    if key is not None and key in names:
        checks.append((F.col(quoted(key)).isNull(), f"null key {key!r}"))
        if _is_float(schema, key):  # NaN equals no side key: invalid in frames and rows modes alike
            checks.append((F.isnan(F.col(quoted(key))), f"NaN key {key!r}"))
    event_time = spec.main.event_time
    if (
        spec.window is None
        and event_time is not None
        and event_time in names
        and any(b.side.as_of for b in spec.sides)
    ):
        checks.append((F.col(quoted(event_time)).isNull(), f"null event time {event_time!r}"))
    window = spec.window
    if window is not None and window.time_column in names:
        column = window.time_column
        time = F.col(quoted(column)).cast("timestamp")
        checks.append((time.isNull(), f"null event time {column!r}"))
        low, high = time_range(window)
        checks.append(
            (
                (time < F.lit(low).cast("timestamp")) | (time > F.lit(high).cast("timestamp")),
                f"event time {column!r} outside {low.isoformat()} .. {high.isoformat()}, where "
                f"its {human_duration(window.size)} windows would not fit in Spark's timestamps",
            )
        )
        tolerance = spec.options.future_tolerance
        if tolerance is not None:
            limit = shifted(plan.now, tolerance)
            checks.append(
                (
                    time > F.lit(limit).cast("timestamp"),
                    f"event time {column!r} after {limit.isoformat()} (more than "
                    f"{human_duration(tolerance)} ahead of the batch)",
                )
            )
    return checks


def invalid_condition(spec: OperatorSpec, schema: T.StructType, plan: BatchPlan) -> Column | None:
    """Whether a record is invalid (None: no record can be)."""
    checks = invalid_checks(spec, schema, plan)
    if not checks:
        return None
    invalid = checks[0][0]
    for condition, _ in checks[1:]:
        invalid = invalid | condition
    return invalid


def _invalid(spec: OperatorSpec, df: DataFrame, plan: BatchPlan) -> tuple[Column, Column]:
    checks = invalid_checks(spec, df.schema, plan)
    invalid = invalid_condition(spec, df.schema, plan)
    if invalid is None:
        return F.lit(False), F.lit(None).cast("string")
    reason = F.concat_ws("; ", *[F.when(c, F.lit(text)) for c, text in checks])
    if CORRUPT in df.columns:
        reason = F.when(
            F.col(CORRUPT).isNotNull(),
            F.concat(F.lit("corrupt record: "), F.substring(F.col(CORRUPT), 1, 200)),
        ).otherwise(reason)
    return invalid, reason


# --- counts -------------------------------------------------------------------------------


def count_routes(spec: OperatorSpec, classified: DataFrame) -> Counts:
    """Records per (route, origin), with the oldest first-seen and newest event time."""
    time_column = spec.window.time_column if spec.window else spec.main.event_time
    aggregates = [F.count(F.lit(1)).alias("n"), F.min(FIRST_SEEN).alias("oldest")]
    if time_column is not None and time_column in classified.columns:
        # Of valid new records only: an invalid time (year 1, say) must not move the
        # watermark, nor even reach Python, whose datetimes cannot hold every timestamp.
        time = F.col(quoted(time_column)).cast("timestamp")  # dates too
        valid_new = (F.col(ORIGIN) == "new") & (F.col(ROUTE) != "invalid")
        aggregates.append(F.max(F.when(valid_new, time)).alias("max_time"))
    rows = classified.groupBy(ROUTE, ORIGIN).agg(*aggregates).collect()
    return {(r[ROUTE], r[ORIGIN]): r.asDict() for r in rows}


def counts_from_statistics(
    spec: OperatorSpec, plan: BatchPlan, files: Sequence[DataFile], joins: Mapping[str, JoinSpec]
) -> Counts | None:
    """The counts without a Spark job, when the Delta statistics of the new files settle
    them: every record is released (one ready global namespace, no buffered records
    read, no per-key routing, no pre-keyed check, no event time to track) and no key is
    null (float keys, which could be NaN, always take the job). None when a job must count."""
    trivial = (
        plan.main.kind == "delta"
        and files
        and not plan.read_slots
        and spec.window is None
        and spec.main.event_time is None
        and spec.main.pre_keyed is None
        and GLOBAL in plan.ready_namespaces
        and all(bound.side.missing == "null" for bound in spec.sides if bound.name in joins)
    )
    if not trivial:
        return None
    total = 0
    for file in files:
        if file.num_records is None:
            return None
        key = spec.main.key
        if key is not None and file.null_count.get(key) != 0:
            return None  # unknown, or null keys: the job finds and describes them
        total += file.num_records
    if not total:
        return {}
    first_seen = as_utc(plan.now).replace(tzinfo=None)  # as Spark returns the timestamp
    released: dict[str, Any] = {ROUTE: "released", ORIGIN: "new", "n": total, "oldest": first_seen}
    return {("released", "new"): released}


def check_invalid(spec: OperatorSpec, classified: DataFrame, counts: Counts) -> None:
    invalid = sum(v["n"] for (route, _), v in counts.items() if route == "invalid")
    if invalid and spec.options.invalid is None:
        samples = [
            r[0]
            for r in classified.filter(F.col(ROUTE) == "invalid").select(REASON).limit(3).collect()
        ]
        raise MainInputDataError(
            f"{invalid} record(s) of main input {spec.main.asset!r} cannot be processed: "
            f"{preview(samples, 3)}. Nothing was written; buffered records are intact.",
            fix=_invalid_fix(spec),
        )


def _invalid_fix(spec: OperatorSpec) -> str:
    tag = 'declare invalid=dsi.OutputTag("...") to route such records to their own table'
    if spec.main.is_files:  # a landed file not read yet can still be corrected
        return f"fix the records at the source (the landed file), or {tag}"
    # Correcting a Delta main input in place is a non-append change, which is refused.
    return f"{tag} (a Delta main input is append-only: its records cannot be corrected in place)"


def max_event_time(counts: Counts) -> dt.datetime | None:
    """Latest event time of the batch's valid records (invalid ones must not move time)."""
    values = [
        as_utc(v["max_time"])
        for (route, _), v in counts.items()
        if route != "invalid" and v.get("max_time") is not None
    ]
    return max(values) if values else None


__all__ = ["BUFFER_ROUTES", "ROUTES", "route"]

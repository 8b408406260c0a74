"""Route rules: the Spark expression giving each record of a batch its route
(``released``, ``buffered``, ``key_wait``, ``late``, ``unmatched``, ``overflow`` or
``invalid``) and the reason in words, and the check of a pre-keyed main input's promise."""

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from dagster_sideinputs.core.batch.invalid_records import invalid_reason
from dagster_sideinputs.core.columns import (
    CORRUPT,
    FIRST_SEEN,
    NS_ID,
    ORIGIN,
    PRE_KEYED_MARK,
    REASON,
    ROUTE,
    quoted,
)
from dagster_sideinputs.core.keyed import key_group
from dagster_sideinputs.core.sideinputs.joins import JoinSpec
from dagster_sideinputs.core.sideinputs.temporal import main_time_column, waits_for_horizon
from dagster_sideinputs.core.sideinputs.windows import shifted
from dagster_sideinputs.core.sources.kafka.keyed import partition_count, violation
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.state.plan import BatchPlan

ROUTES = ("released", "buffered", "key_wait", "late", "unmatched", "overflow", "invalid")


def lookup(mapping: Mapping[str, str], key: Column) -> Column:
    """``mapping[key]`` as a Spark expression over a small literal map."""
    if not mapping:
        return F.lit(None).cast("string")
    pairs: list[Column] = []
    for k, v in sorted(mapping.items()):
        pairs.extend([F.lit(k), F.lit(v)])
    return F.element_at(F.create_map(*pairs), key)


def not_ready_reason(plan: BatchPlan, ns: str) -> str:
    """Why a namespace is not ready: the side inputs it waits for, with their reasons."""
    waiting = []
    for side, side_ns in plan.namespaces[ns].side_namespaces.items():
        decision = plan.decisions.get(side, {}).get(side_ns)
        if decision is not None and not decision.ready:
            waiting.append(f"{side}: {decision.reason}")
    return "waiting for " + "; ".join(waiting) if waiting else "waiting"


def with_routes(
    spec: OperatorSpec,
    df: DataFrame,
    plan: BatchPlan,
    joins: Mapping[str, JoinSpec],
    empty: Mapping[str, Column],
) -> DataFrame:
    """The records with their route and reason columns (``empty``: per side input, the
    records whose side namespace holds no rows, for ``on_empty="unmatched"``). A
    pre-keyed topic's promise is checked apart: :func:`with_pre_keyed_check`."""
    invalid, reason = invalid_reason(spec, df, plan)
    route = F.when(invalid, F.lit("invalid"))
    late = plan.late_namespaces
    if spec.options.routes.late is not None and late:
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
    why = (
        F.when(F.col(ROUTE) == "invalid", reason)
        .when(F.col(ROUTE) == "buffered", lookup(not_ready, F.col(NS_ID)))
        .when((F.col(ROUTE) == "key_wait") & horizon_reason.isNotNull(), horizon_reason)
        .when(F.col(ROUTE) == "key_wait", F.concat(F.lit("waiting for the side row of: "), missing))
    )
    if empty_reasons:
        # Only when some side input can be empty: comparing a literal "" with "" is the
        # trivially true predicate Spark warns about on every batch.
        emptied = F.concat_ws(", ", *empty_reasons)
        why = why.when(
            (F.col(ROUTE) == "unmatched") & (emptied != ""),
            F.concat(F.lit("the side namespace holds no rows in: "), emptied),
        )
    why = why.when(F.col(ROUTE) == "unmatched", F.concat(F.lit("no side row in: "), missing))
    return df.withColumn(ROUTE, route).withColumn(REASON, why)


def with_key_group_check(spec: OperatorSpec, classified: DataFrame) -> DataFrame:
    """Routed records (:func:`with_routes`) whose route raises for a new record of a
    pre-keyed Delta main input outside its key's group (its key-group column is not
    ``pmod(hash(key), max_key_groups)``; a null key is left out: it joins nothing wherever
    it sits, and has its own route).

    A Spark expression, so no partitioning is lost: whichever job reads the routes first
    evaluates it on every record (the job counting the routes, or the one staging the
    outputs), and a lie fails that job before anything commits. The Delta log's part
    of the promise (one key group per file) is checked when the batch is read."""
    keyed, key = spec.main.pre_keyed, spec.main.key
    if keyed is None or key is None or spec.main.keyed_by_partition:
        return classified
    declared = F.col(quoted(keyed.column))
    actual = key_group(key, keyed.max_key_groups)
    lie = (
        (F.col(ORIGIN) == "new")
        & F.col(quoted(key)).isNotNull()
        & (declared.isNull() | (declared != actual))
    )
    message = F.concat(
        F.lit(f"{PRE_KEYED_MARK}: its key-group column lies: key "),
        F.col(quoted(key)).cast("string"),
        F.lit(" in key group "),
        F.coalesce(declared.cast("string"), F.lit("null")),
        F.lit(" hashes to "),
        actual.cast("string"),
        F.lit(
            f" (KeyGroups(max_key_groups={keyed.max_key_groups}, column={keyed.column!r}): "
            f"write {keyed.column} = pmod(hash({key}), {keyed.max_key_groups}) at the source)"
        ),
    )
    return classified.withColumn(ROUTE, F.when(lie, F.raise_error(message)).otherwise(F.col(ROUTE)))


def with_pre_keyed_check(
    spec: OperatorSpec,
    classified: DataFrame,
    plan: BatchPlan,
    *,
    in_place: bool = False,
    partitions_checked: bool = False,
) -> DataFrame:
    """Routed records (:func:`with_routes`) whose route raises, for a new record of a
    pre-keyed Kafka topic that breaks the promise (as is for any other input).

    A topic read in place (``partitions_checked``) had each record's partition checked
    against its key as it was read (:func:`~dagster_sideinputs.core.sources.kafka.keyed.
    checked_bucket`); what is left here (the key column is the Kafka key, each task read
    its own partition) are Spark expressions, evaluated by whichever job reads the
    routes first. A topic read with a shuffle is checked here in full: by the job
    counting the routes, before anything is written; the writes read the records without
    it (the partition check is an Arrow UDF, Kafka's murmur2). ``in_place``: for a batch
    whose routes the write job counts (and checks), the UDF is marked nondeterministic,
    which Spark evaluates where it is written (above the joins) instead of pushing it
    below them with the filter of the released records; the first lie then fails the
    write job, before anything commits. A Delta main input's rows are checked by
    :func:`with_key_group_check`."""
    key = spec.main.key
    if not (spec.main.keyed_by_partition and key is not None):
        return classified
    count = partition_count(plan.main)
    if not count:
        return classified
    # New records only (buffered ones were checked when they arrived), and not the
    # invalid ones (a corrupt value or a null key has its own route).
    checked = (F.col(ORIGIN) == "new") & F.col(quoted(key)).isNotNull()
    if CORRUPT in classified.columns:
        checked = checked & F.col(CORRUPT).isNull()
    condition, message = violation(
        key,
        classified.schema[key].dataType,
        count,
        in_place=in_place,
        partitions_checked=partitions_checked,
    )
    lie = checked & condition
    return classified.withColumn(ROUTE, F.when(lie, F.raise_error(message)).otherwise(F.col(ROUTE)))

"""Routing: where each record of a batch goes, and the checks made before anything is written.

Routes: ``released`` (to the function), ``buffered`` (its namespace is not ready),
``key_wait`` (waiting for the side row of its key), ``late``, ``unmatched``,
``overflow`` and ``invalid``. One Spark job counts the routes (or, when every record
is plainly released, the new files' Delta statistics do); the counts are the batch's
metrics and decide, before any write, whether invalid records or the buffer's limits
stop the batch.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import Window as SparkWindow
from pyspark.sql import functions as F

from dagster_sideinputs.core.buffer import (
    BATCH,
    FINGERPRINT,
    FIRST_SEEN,
    KEY_GROUP,
    REASON,
    BufferState,
)
from dagster_sideinputs.core.ingest import CORRUPT, ORIGIN, PRE_KEYED_MARK
from dagster_sideinputs.core.plan import BatchPlan
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.views import JoinSpec
from dagster_sideinputs.core.windows import GLOBAL, NS_ID, NS_START, as_utc
from dagster_sideinputs.delta.log import AddedFile
from dagster_sideinputs.errors import BufferLimitExceededError, MainInputDataError, preview

ROUTE = "_dsi_route"
ROUTES = ("released", "buffered", "key_wait", "late", "unmatched", "overflow", "invalid")
BUFFER_ROUTES = ("buffered", "key_wait")
Counts = dict[tuple[str, str], dict[str, Any]]


def _null_count(file: Any, column: str) -> int | None:
    """Nulls of a column in one data file, from its Delta statistics (None: unknown)."""
    counts = (file.stats.get("nullCount") or {}) if isinstance(file, AddedFile) else file.null_count
    value = counts.get(column)
    return value if isinstance(value, int) else None


def lookup(mapping: Mapping[str, str], key: Column) -> Column:
    """``mapping[key]`` as a Spark expression over a small literal map."""
    if not mapping:
        return F.lit(None).cast("string")
    pairs: list[Column] = []
    for k, v in sorted(mapping.items()):
        pairs.extend([F.lit(k), F.lit(v)])
    return F.element_at(F.create_map(*pairs), key)


def not_ready_reason(plan: BatchPlan, ns: str) -> str:
    waiting = []
    for side, side_ns in plan.namespaces[ns].side_namespaces.items():
        decision = plan.decisions[side].get(side_ns)
        if decision is not None and not decision.ready:
            waiting.append(f"{side}: {decision.reason}")
    return "waiting for " + "; ".join(waiting) if waiting else "waiting"


class Router:
    """Gives every record of a batch its route and checks the result."""

    def __init__(self, spec: OperatorSpec) -> None:
        self.spec = spec

    def route(self, df: DataFrame, plan: BatchPlan, joins: Mapping[str, JoinSpec]) -> DataFrame:
        spec = self.spec
        invalid, reason = self._invalid(df, plan)
        route = F.when(self._pre_keyed_lie(df), F.raise_error(self._pre_keyed_message()))
        route = route.when(invalid, F.lit("invalid"))
        late = plan.late_namespaces
        if spec.routes.late is not None and late:
            route = route.when((F.col(ORIGIN) == "new") & F.col(NS_ID).isin(late), F.lit("late"))
        ready = F.col(NS_ID).isin(plan.ready_namespaces)
        route = route.when(~ready, F.lit("buffered"))
        missing_reasons = []
        for bound in spec.sides:
            join = joins.get(bound.name)
            if join is None or bound.side.missing == "null":
                continue
            unmatched = ~F.col(join.matched)
            missing_reasons.append(F.when(unmatched, F.lit(bound.name)))
            if bound.side.missing == "wait":
                assert bound.side.timeout is not None
                deadline = F.lit(plan.now - bound.side.timeout).cast("timestamp")
                timed_out = F.col(FIRST_SEEN) <= deadline
                if bound.side.on_timeout == "unmatched":
                    route = route.when(unmatched & timed_out, F.lit("unmatched"))
                route = route.when(unmatched & ~timed_out, F.lit("key_wait"))
            else:
                route = route.when(unmatched, F.lit("unmatched"))
        route = route.otherwise(F.lit("released"))
        not_ready = {
            ns: not_ready_reason(plan, ns) for ns, p in plan.namespaces.items() if not p.ready
        }
        missing = F.concat_ws(", ", *missing_reasons) if missing_reasons else F.lit("")
        why = (
            F.when(F.col(ROUTE) == "invalid", reason)
            .when(F.col(ROUTE) == "buffered", lookup(not_ready, F.col(NS_ID)))
            .when(
                F.col(ROUTE) == "key_wait",
                F.concat(F.lit("waiting for the side row of: "), missing),
            )
            .when(F.col(ROUTE) == "unmatched", F.concat(F.lit("no side row in: "), missing))
        )
        return df.withColumn(ROUTE, route).withColumn(REASON, why)

    def _pre_keyed_lie(self, df: DataFrame) -> Column:
        """A row whose declared key group is not its key's (checked on every route)."""
        keyed = self.spec.main.pre_keyed
        if keyed is None or keyed.column not in df.columns:
            return F.lit(False)
        return F.col(f"`{keyed.column}`") != F.col(KEY_GROUP)

    def _pre_keyed_message(self) -> Column:
        keyed = self.spec.main.pre_keyed
        key = self.spec.main.key
        if keyed is None or key is None:
            return F.lit("")
        return F.concat(
            F.lit(f"{PRE_KEYED_MARK}: a row of key "),
            F.col(f"`{key}`").cast("string"),
            F.lit(" is in key group "),
            F.col(f"`{keyed.column}`").cast("string"),
            F.lit(" but hashes to "),
            F.col(KEY_GROUP).cast("string"),
        )

    def _invalid(self, df: DataFrame, plan: BatchPlan) -> tuple[Column, Column]:
        spec = self.spec
        checks: list[tuple[Column, str]] = []
        if CORRUPT in df.columns:
            checks.append((F.col(CORRUPT).isNotNull(), "corrupt record"))
        if spec.main.key is not None:
            checks.append((F.col(f"`{spec.main.key}`").isNull(), f"null key {spec.main.key!r}"))
        if spec.window is not None:
            column = spec.window.time_column
            checks.append((F.col(NS_START).isNull(), f"null event time {column!r}"))
            if spec.future_tolerance is not None:
                limit = plan.now + spec.future_tolerance
                checks.append(
                    (
                        F.col(f"`{column}`") > F.lit(limit).cast("timestamp"),
                        f"event time {column!r} after {limit.isoformat()} (more than "
                        f"{spec.future_tolerance} ahead of the batch)",
                    )
                )
        if not checks:
            return F.lit(False), F.lit(None).cast("string")
        invalid = checks[0][0]
        for condition, _ in checks[1:]:
            invalid = invalid | condition
        reason = F.concat_ws("; ", *[F.when(c, F.lit(text)) for c, text in checks])
        if CORRUPT in df.columns:
            reason = F.when(
                F.col(CORRUPT).isNotNull(),
                F.concat(F.lit("corrupt record: "), F.substring(F.col(CORRUPT), 1, 200)),
            ).otherwise(reason)
        return invalid, reason

    def counts(self, classified: DataFrame) -> Counts:
        time_column = (
            self.spec.window.time_column if self.spec.window else self.spec.main.event_time
        )
        aggregates = [F.count(F.lit(1)).alias("n"), F.min(FIRST_SEEN).alias("oldest")]
        if time_column is not None and time_column in classified.columns:
            aggregates.append(
                F.max(F.when(F.col(ORIGIN) == "new", F.col(f"`{time_column}`"))).alias("max_time")
            )
        rows = classified.groupBy(ROUTE, ORIGIN).agg(*aggregates).collect()
        return {(r[ROUTE], r[ORIGIN]): r.asDict() for r in rows}

    def counts_from_statistics(
        self, plan: BatchPlan, files: Sequence[Any], joins: Mapping[str, JoinSpec]
    ) -> Counts | None:
        """The counts without a Spark job, when the Delta statistics of the new files
        settle them: every record is released (one ready global namespace, no buffered
        records read, no per-key routing, no pre-keyed check, no event time to track)
        and no key is null. None when a job must count."""
        spec = self.spec
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
            if spec.main.key is not None and _null_count(file, spec.main.key) != 0:
                return None  # unknown, or null keys: the job finds and describes them
            total += file.num_records
        if not total:
            return {}
        first_seen = as_utc(plan.now).replace(tzinfo=None)  # as Spark returns the timestamp
        return {
            ("released", "new"): {
                ROUTE: "released",
                ORIGIN: "new",
                "n": total,
                "oldest": first_seen,
            }
        }

    def check_invalid(self, classified: DataFrame, counts: Mapping[tuple[str, str], Any]) -> None:
        invalid = sum(v["n"] for (route, _), v in counts.items() if route == "invalid")
        if invalid and self.spec.routes.invalid is None:
            samples = [
                r[0]
                for r in classified.filter(F.col(ROUTE) == "invalid")
                .select(REASON)
                .limit(3)
                .collect()
            ]
            raise MainInputDataError(
                f"{invalid} record(s) of main input {self.spec.main.asset!r} cannot be processed: "
                f"{preview(samples, 3)}. Nothing was written; buffered records are intact.",
                fix='fix the records at the source, or declare invalid=dsi.OutputTag("...") '
                "to route such records to their own table",
            )

    def limits(
        self,
        plan: BatchPlan,
        classified: DataFrame,
        counts: Mapping[tuple[str, str], Any],
        state: BufferState,
    ) -> tuple[DataFrame, dict[tuple[str, str], Any]]:
        limits = self.spec.buffer
        incoming = sum(v["n"] for (route, _), v in counts.items() if route in BUFFER_ROUTES)
        unread = [s for s in state.slots() if s not in plan.read_slots]
        after = state.rows(unread) + incoming
        stamps = [
            v["oldest"]
            for (route, _), v in counts.items()
            if route in BUFFER_ROUTES and v["oldest"]
        ]
        unread_oldest = state.oldest(unread)
        if unread_oldest is not None:
            stamps.append(unread_oldest)
        oldest = min((as_utc(s) for s in stamps), default=None)
        too_many = limits.max_rows is not None and after > limits.max_rows
        too_old = (
            limits.max_age is not None
            and oldest is not None
            and oldest < as_utc(plan.now) - limits.max_age
        )
        if not (too_many or too_old):
            return classified, dict(counts)
        problem = (
            f"{after} rows (limit {limits.max_rows})"
            if too_many
            else f"a record first seen {oldest.isoformat() if oldest else '?'} "
            f"(max age {limits.max_age})"
        )
        if limits.on_exceed == "fail" or unread:
            raise BufferLimitExceededError(
                f"The buffer of operator {self.spec.operator_id!r} would hold {problem} after "
                f"batch {plan.batch_id}. Nothing was written; buffered records are intact.",
                fix="make the side inputs ready (see the readiness reasons in the run metrics), "
                "raise BufferLimits(max_rows=..., max_age=...), or use on_exceed='overflow' with "
                "an overflow tag",
            )
        excess = max(0, after - (limits.max_rows or after))
        order = SparkWindow.orderBy(F.col(FIRST_SEEN), F.col(BATCH), F.col(FINGERPRINT))
        waiting = F.col(ROUTE).isin(*BUFFER_ROUTES)
        rank = F.when(waiting, F.row_number().over(order.partitionBy(waiting)))
        cutoff = F.lit(plan.now - limits.max_age).cast("timestamp") if limits.max_age else None
        overflow = waiting & (rank <= F.lit(excess))
        if cutoff is not None:
            overflow = overflow | (waiting & (F.col(FIRST_SEEN) < cutoff))
        reclassified = (
            classified.withColumn(
                ROUTE, F.when(overflow, F.lit("overflow")).otherwise(F.col(ROUTE))
            )
            .withColumn(
                REASON, F.when(overflow, F.lit(f"buffer limit: {problem}")).otherwise(F.col(REASON))
            )
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        classified.unpersist()
        return reclassified, self.counts(reclassified)

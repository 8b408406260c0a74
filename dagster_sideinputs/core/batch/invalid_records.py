"""Invalid main records: what makes a record invalid (corrupt, a null or NaN key, an
event time that is missing, unrepresentable or too far ahead), and the batch's refusal
when such records have no ``invalid`` tag to go to."""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.batch.buffer import Counts
from dagster_sideinputs.core.columns import CORRUPT, REASON, ROUTE, quoted
from dagster_sideinputs.core.metrics import human_duration
from dagster_sideinputs.core.sideinputs.windows import shifted, time_range
from dagster_sideinputs.core.sources.main_source import MainSource
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.state.plan import BatchPlan
from dagster_sideinputs.errors import MainInputDataError, preview


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


def invalid_reason(spec: OperatorSpec, df: DataFrame, plan: BatchPlan) -> tuple[Column, Column]:
    """(whether a record is invalid, the reason in words)."""
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


def check_invalid(
    spec: OperatorSpec, source: MainSource, classified: DataFrame, counts: Counts
) -> None:
    invalid = sum(v["n"] for (route, _), v in counts.items() if route == "invalid")
    if invalid and spec.options.routes.invalid is None:
        samples = [
            r[0]
            for r in classified.filter(F.col(ROUTE) == "invalid").select(REASON).limit(3).collect()
        ]
        raise MainInputDataError(
            f"{invalid} record(s) of main input {spec.main.asset!r} cannot be processed: "
            f"{preview(samples, 3)}. Nothing was written; buffered records are intact.",
            fix=source.invalid_fix(
                'declare routes=dsi.Routes(invalid=dsi.OutputTag("...")) to route such records '
                "to their own table"
            ),
        )

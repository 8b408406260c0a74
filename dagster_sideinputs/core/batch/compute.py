"""Compute stage: the user function over the released records, and every output.

Frames mode calls ``fn(main, sides)`` once on the driver; it returns Spark DataFrames
(lazy: their jobs run when the write stage stages them). Row mode builds a
``mapInArrow`` over the released records (:mod:`~dagster_sideinputs.core.rows`). The
function runs only when the batch releases records, so every side input it reads is
ready. The operator's own routes (late, unmatched, overflow, invalid) are added to their
tags, and every output is checked against its table and its tag's schema before
anything is staged.
"""

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, cast

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from dagster_sideinputs.core.batch.context import Batch, StageContext, Views
from dagster_sideinputs.core.batch.one_per_key import check_one_row_per_key
from dagster_sideinputs.core.batch.row_inputs import broadcast_values, local_lookups
from dagster_sideinputs.core.batch.tagged_layout import TaggedLayout, TaggedResult
from dagster_sideinputs.core.callbacks import callable_name, prefixed
from dagster_sideinputs.core.columns import (
    LOOKUP_PREFIX,
    NS_END,
    NS_START,
    REASON,
    ROUTE,
    SIDE_NS,
    quoted,
)
from dagster_sideinputs.core.functions import FramesFunction, RowsFunction
from dagster_sideinputs.core.outputs import OutputTag, SideInputs, normalize_outputs
from dagster_sideinputs.core.rows import run_row_function
from dagster_sideinputs.core.sideinputs.lookups import Lookup
from dagster_sideinputs.core.sideinputs.temporal import check_side_instants, instant_column
from dagster_sideinputs.core.sideinputs.windows import GLOBAL, namespace_id
from dagster_sideinputs.core.spark_errors import NOTHING_WRITTEN, translate, translated
from dagster_sideinputs.core.state.plan import BatchPlan, side_windows
from dagster_sideinputs.delta.schema import same_type
from dagster_sideinputs.errors import (
    EmptySingletonError,
    FunctionError,
    SchemaMismatchError,
    SideInputError,
    SingletonCardinalityError,
    preview,
)


def compute(context: StageContext, batch: Batch) -> Batch:
    spec = context.spec
    assert batch.classified is not None
    released = sum(v["n"] for (r, _), v in batch.counts.items() if r == "released")
    outputs: dict[OutputTag, DataFrame] = {}
    lookups: dict[str, Lookup] = {}
    tagged: TaggedResult | None = None
    if released and spec.options.mode == "frames":
        outputs = _frames(context, batch)
    elif released:
        lookups = local_lookups(context, batch.views, batch.plan)
        outputs, tagged = _rows(context, batch, lookups)
    _check_side_instants(context, batch.plan, batch.views)
    if released:
        _check_singletons(context, batch.plan, batch.views)
        check_one_row_per_key(context, batch.plan, batch.views, skip=lookups)
    function_tags = frozenset(outputs)
    for route_name, tag in spec.routes.items():
        columns = [F.col(quoted(c)) for c in batch.main_columns]
        if route_name != "late":
            columns.append(F.col(REASON).alias("reason"))
        routed = batch.classified.filter(F.col(ROUTE) == route_name).select(*columns)
        if tag.schema is not None:  # a declared schema holds for routed records too
            routed = _conform(tag, routed, routed=True)
        outputs[tag] = (
            outputs[tag].unionByName(routed, allowMissingColumns=True) if tag in outputs else routed
        )
    for tag, frame in outputs.items():
        _check_column_names(tag, frame)
        spec.engine.validate_append(
            frame.schema, spec.table_uri(tag), schema_mode=spec.options.schema_mode, name=tag.name
        )
    return batch.but(outputs=outputs, function_tags=function_tags, tagged=tagged)


def function_input(
    context: StageContext, batch: Batch, *, lookups: Mapping[str, Lookup] | None = None
) -> DataFrame:
    """The released records as the function sees them: main columns, joined side inputs
    (one column each, named after the side input) and, when windowed, the ``window``."""
    assert batch.classified is not None
    released = batch.classified
    if not batch.all_released:
        released = released.filter(F.col(ROUTE) == "released")
    local = lookups or {}
    joins = batch.views.joins
    columns = [F.col(quoted(c)) for c in batch.main_columns]
    columns += [F.col(quoted(name)) for name in joins if name not in local]
    columns += [joins[name].main_keys[-1].alias(lookup.column) for name, lookup in local.items()]
    if context.spec.window is not None:
        window = F.struct(F.col(NS_START).alias("start"), F.col(NS_END).alias("end"))
        columns.append(window.alias("window"))
    return released.select(*columns)


def side_inputs(batch: Batch) -> SideInputs:
    """``sides[name]``: a singleton's value, or the view's rows as a DataFrame (for a
    windowed side input, the rows of every side window the batch's records read, with
    their window in ``_dsi_side_ns``; each record also carries its own window's view as
    a column named after the side input)."""
    getters: dict[str, Callable[[], Any]] = {}
    for name, data in batch.views.data.items():
        windows = side_windows(data.bound, batch.plan)
        if data.side.view == "singleton" and data.side.window is None:
            getters[name] = data.singleton_value
            continue

        def frame(data: Any = data, windows: Any = windows) -> DataFrame:
            rows = data.rows(windows)
            if data.side.window is None:
                rows = rows.drop(SIDE_NS)
            return F.broadcast(rows) if data.side.distribution == "broadcast" else rows

        getters[name] = frame
    return SideInputs(getters)


def _frames(context: StageContext, batch: Batch) -> dict[OutputTag, DataFrame]:
    spec = context.spec
    main = function_input(context, batch)
    try:
        result = cast(FramesFunction, spec.options.fn)(main, side_inputs(batch))
    except SideInputError:
        raise
    except PySparkException as exc:
        raise translate(context, exc, batch.views) from exc
    except Exception as exc:
        raise FunctionError(
            f"Operator {spec.operator_id!r}: the function {callable_name(spec.options.fn)} raised "
            f"{type(exc).__name__}: {exc}. {NOTHING_WRITTEN}",
            fix="fix the function, then rerun: the batch is replayed from its plan",
        ) from exc
    try:
        outputs = normalize_outputs(result, spec.declared)
    except SideInputError as error:  # what it returned: name the operator and function
        raise prefixed(
            error, f"Operator {spec.operator_id!r}, function {callable_name(spec.options.fn)}: "
        ) from None
    return {tag: _conform(tag, frame) for tag, frame in outputs.items()}


def _check_column_names(tag: OutputTag, frame: DataFrame) -> None:
    """Delta tells columns apart regardless of case: two that differ only by case (or a
    join's duplicated key column) cannot be stored."""
    seen: dict[str, str] = {}
    duplicates = []
    for name in frame.columns:
        if name.lower() in seen:
            duplicates.append(name)
        seen.setdefault(name.lower(), name)
    if duplicates:
        raise SchemaMismatchError(
            f"Output {tag.name!r} has several columns named {sorted(set(duplicates))} (Delta "
            f"compares column names regardless of case; columns: {frame.columns}). "
            f"{NOTHING_WRITTEN}",
            fix="drop or rename the duplicates in the function, e.g. "
            'main.join(other, on="key") rather than on main.key == other.key',
        )


def _conform(tag: OutputTag, frame: DataFrame, *, routed: bool = False) -> DataFrame:
    """Outputs of tags declaring a schema must have it (columns in any order); so must
    the records the operator routes to a tag with a schema (``routed``)."""
    if tag.schema is None:
        return frame
    found = {f.name: f.dataType for f in frame.schema.fields}
    problems = []
    for field in tag.schema.fields:
        if field.name not in found:
            problems.append(f"column {field.name!r} is missing")
        elif not same_type(found[field.name], field.dataType):
            problems.append(
                f"column {field.name!r} is {found[field.name].simpleString()}, declared "
                f"{field.dataType.simpleString()}"
            )
    extra = [name for name in found if name not in tag.schema.fieldNames()]
    problems += [f"column {name!r} is not declared" for name in extra]
    if problems:
        subject = (
            f"The records routed to {tag.name!r} (main columns and 'reason') do"
            if routed
            else f"The function's output {tag.name!r} does"
        )
        raise SchemaMismatchError(
            f"{subject} not have its declared schema: "
            + "; ".join(problems)
            + f". {NOTHING_WRITTEN}",
            fix="select and cast the output's columns to the OutputTag's schema, or change "
            "the declared schema",
        )
    return frame.select(*[F.col(quoted(name)) for name in tag.schema.fieldNames()])


def _rows(
    context: StageContext, batch: Batch, lookups: Mapping[str, Lookup]
) -> tuple[dict[OutputTag, DataFrame], TaggedResult]:
    spec = context.spec
    user_tags = [t for t in spec.all_tags if t not in spec.routes.values() or t.schema is not None]
    joined = [name for name in batch.views.joins if name not in lookups]
    released = function_input(context, batch, lookups=lookups)
    layout = TaggedLayout(user_tags)
    tagged = run_row_function(
        released,
        cast(RowsFunction, spec.options.fn),
        layout=layout,
        broadcast_values=translated(context, lambda: broadcast_values(batch.views)),
        joined_columns=joined,
        record_columns=[
            c for c in released.columns if c not in joined and not c.startswith(LOOKUP_PREFIX)
        ],
        lookups=lookups,
        side_labels={name: batch.views.data[name].bound.label for name in joined},
        who=f"Operator {spec.operator_id!r}, row function {callable_name(spec.options.fn)}: ",
        routes={tag.name: route for route, tag in spec.routes.items() if tag not in user_tags},
    )
    # No job of its own: the function runs while the first output is staged (the write
    # stage writes its outputs in one pass, or persists it when several writes read it).
    pure = frozenset(tag for tag in user_tags if tag not in spec.routes.values())
    return layout.split(tagged), TaggedResult(tagged, layout, pure)


def _check_side_instants(context: StageContext, plan: BatchPlan, views: Views) -> None:
    """No side row the batch consults lacks its instant: an as-of map's ``valid_from``
    (whatever the batch does with its records: a null start must not send one to
    ``unmatched`` either), a windowed side input's time (when released records read a
    side window). Checked before anything is staged, once per side version."""
    for name, data in views.data.items():
        if instant_column(data.bound) is None or side_windows(data.bound, plan) == []:
            continue
        checked = ("instants", name, data.version)
        if checked in context.unique_checked:
            continue
        translated(context, partial(check_side_instants, data))
        context.unique_checked.add(checked)


def _check_singletons(context: StageContext, plan: BatchPlan, views: Views) -> None:
    """Every declared singleton holds exactly one row in each side namespace released
    records read (or is empty with a ``default``): checked before anything is staged,
    whether or not the function reads it, once per side version and set of windows."""
    for name, data in views.data.items():
        side = data.side
        if side.view != "singleton" or data.snapshot is None:
            continue
        windows = side_windows(data.bound, plan)
        if windows == []:
            continue  # no released record reads it
        checked = ("singleton", name, data.version, tuple(windows) if windows else None)
        if checked in context.unique_checked:
            continue
        counts: dict[str, int] = translated(context, partial(data.window_counts, windows))
        wanted = [GLOBAL] if windows is None else [namespace_id(start) for start, _ in windows]
        several = [ns for ns in wanted if counts.get(ns, 0) > 1]
        if several:
            raise SingletonCardinalityError(
                f"{data.bound.label} is a singleton but holds more than one row in namespace(s) "
                f"{preview(several)} at version {data.version}. Nothing was written.",
                fix="make the side asset produce one row per namespace (window), or declare "
                "it SideInput.list(...) / SideInput.map(..., key=...)",
            )
        released_empty = side.default is None and side.on_empty == "release"
        empty = [ns for ns in wanted if counts.get(ns, 0) == 0] if released_empty else []
        if empty:
            raise EmptySingletonError(
                f"{data.bound.label} is ready for namespace(s) {preview(empty)} but holds no "
                f"row there (version {data.version}), and declares no default. Nothing was "
                "written.",
                fix="materialize a row, declare SideInput.singleton(..., default=<value>), or "
                "send such records to the unmatched tag with on_empty='unmatched'",
            )
        context.unique_checked.add(checked)

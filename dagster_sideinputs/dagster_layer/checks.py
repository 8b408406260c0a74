"""Asset checks of a side-input operator that run on their own.

``buffer_within_limits`` and ``side_inputs_ready`` look at the operator's state (its
buffer's Delta log, and the readiness its next micro-batch would find) without running
it: no Spark, no data read. They can be executed from the UI at any time, and a job
that materializes the operator's outputs runs them after the operator.
``records_accounted_for`` stays with the operator's runs: it checks what a run did.
"""

import datetime as dt
from collections.abc import Iterator

import dagster as dg

from dagster_sideinputs.core.declarations import asset_path
from dagster_sideinputs.core.metrics import human_duration
from dagster_sideinputs.core.operator import SideInputOperator
from dagster_sideinputs.core.sideinputs.windows import as_utc
from dagster_sideinputs.dagster_layer.declaration import (
    CHECK_BUFFER,
    CHECK_READY,
    SideInputAssets,
    declaration_of,
)
from dagster_sideinputs.dagster_layer.execution import (
    asset_graph_of,
    build_operator,
    readiness_markdown,
    storage_of,
)
from dagster_sideinputs.dagster_layer.readiness import DagsterReadiness
from dagster_sideinputs.errors import OperatorStateError, SideInputError, StorageError


def check_specs(decl: SideInputAssets) -> list[dg.AssetCheckSpec]:
    """The specs of the checks that run on their own, on the main output."""
    key = dg.AssetKey(list(asset_path(decl.main_output.name)))
    return [
        dg.AssetCheckSpec(
            CHECK_BUFFER,
            asset=key,
            description="The records waiting in the buffer stay within the operator's "
            "BufferLimits (rows and age). Reads the buffer's Delta log; runs on its own.",
        ),
        dg.AssetCheckSpec(
            CHECK_READY,
            asset=key,
            description="Every side input is ready for the records the next micro-batch "
            "would process (new main input and buffered records). Runs on its own.",
        ),
    ]


def unanswered(key: dg.AssetKey, check: str, error: SideInputError) -> dg.AssetCheckResult:
    """A check the operator's state cannot answer (the store refused or is down, the
    state unreadable): failed, with the error's text (what, where, the fix)."""
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=check,
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"error": type(error).__name__},
        description=str(error)[:1000],
    )


def buffer_check(op: SideInputOperator, key: dg.AssetKey) -> dg.AssetCheckResult:
    """``buffer_within_limits`` from the buffer's current state."""
    limits = op.spec.options.buffer
    try:
        buffer = op.buffer()
    except StorageError as exc:
        return unanswered(key, CHECK_BUFFER, exc)
    rows, oldest = buffer.rows(), buffer.oldest()
    age = (dt.datetime.now(dt.timezone.utc) - as_utc(oldest)) if oldest is not None else None
    too_many = limits.max_rows is not None and rows > limits.max_rows
    too_old = limits.max_age is not None and age is not None and age > limits.max_age
    problems = []
    if too_many:
        problems.append(f"{rows} buffered records, more than max_rows={limits.max_rows}")
    if too_old:
        problems.append(
            f"oldest buffered record waited {human_duration(age)}, longer than max_age="
            f"{human_duration(limits.max_age)}"
        )
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=CHECK_BUFFER,
        passed=not problems,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "buffered_rows": rows,
            "oldest_buffered_age_s": round(age.total_seconds(), 1) if age else 0.0,
            "max_rows": limits.max_rows if limits.max_rows is not None else -1,
            "max_age_s": limits.max_age.total_seconds() if limits.max_age else -1.0,
        },
        description="; ".join(problems)
        or f"{rows} buffered records"
        + (f", oldest waiting {human_duration(age)}" if age is not None else ""),
    )


def readiness_check(op: SideInputOperator, key: dg.AssetKey) -> dg.AssetCheckResult:
    """``side_inputs_ready``: the readiness the next micro-batch would find now.

    The operator is asked for its next plan (``peek``: Delta logs and the instance, no
    Spark); every readiness decision made for it counts, also when the plan is empty
    because everything waits.
    """
    readiness = op.spec.readiness
    assert isinstance(readiness, DagsterReadiness)
    note = ""
    try:
        try:
            plan = op.peek()
        except OperatorStateError as exc:
            # New records whose windows are not in the file statistics: the last plan's view.
            plan = op.last_plan()
            note = f" (from the last batch's plan; peeking failed: {exc})"
        buffered_rows = op.buffer().rows()
    except SideInputError as exc:
        return unanswered(key, CHECK_READY, exc)
    decisions = dict(readiness.decisions)
    if plan is not None:
        for side, per_ns in plan.decisions.items():
            decisions.setdefault(side, dict(per_ns))
    not_ready = {
        f"{side}/{ns}": d.reason
        for side, per_ns in sorted(decisions.items())
        for ns, d in sorted(per_ns.items())
        if not d.ready
    }
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=CHECK_READY,
        passed=not not_ready,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "not_ready": dg.MetadataValue.json(not_ready),
            "readiness": dg.MetadataValue.md(readiness_markdown(decisions)),
            "buffered_rows": buffered_rows,
        },
        description=(
            "; ".join(f"{k}: {v}" for k, v in not_ready.items())
            or "every side input is ready for the records the next micro-batch would process"
        )
        + note,
    )


def build_side_input_checks(
    assets_def: dg.AssetsDefinition, *, name: str | None = None
) -> dg.AssetChecksDefinition:
    """The operator's checks that run on their own: ``buffer_within_limits`` and
    ``side_inputs_ready``, on its main output.

    Put them in ``Definitions(asset_checks=[...])``. They read the operator's state
    (no Spark): execute them from the UI at any time; jobs that select the operator's
    outputs run them after the operator when it materialized its main output.

    Args:
        assets_def: what ``@dsi.side_input_assets`` returned.
        name: op name of the checks (default ``<operator>_checks``).
    """
    decl = declaration_of(assets_def)
    key = dg.AssetKey(list(asset_path(decl.main_output.name)))

    @dg.multi_asset_check(
        name=name or f"{decl.name}_checks",
        specs=check_specs(decl),
        can_subset=True,
        required_resource_keys={decl.io_manager_key},
        description=f"Checks of side-input operator {decl.name!r} computed from its state.",
    )
    def _checks(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        storage = storage_of(context.resources, decl)
        op = build_operator(decl, storage, context.instance, asset_graph_of(context.job_def))
        selected = {check_key.name for check_key in context.selected_asset_check_keys}
        if CHECK_BUFFER in selected:
            yield buffer_check(op, key)
        if CHECK_READY in selected:
            yield readiness_check(op, key)

    return _checks

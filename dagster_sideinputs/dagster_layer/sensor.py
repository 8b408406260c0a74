"""A sensor that runs a side-input operator when there is work for it.

It asks the operator what its next batch would be (``peek``: from the Delta logs and
the Dagster instance, no Spark), and requests a run when the main input has data
beyond what was processed, when buffered records' side inputs became ready, or when
an interrupted batch waits for its replay. The run key names exactly that work, and
the cursor remembers it, so the same data is never requested twice. Every skip says
why, headline first ("Up to date: ...", "Waiting for profile: ...", "Already requested:
...", "Run in progress: ..."): the UI shows a tick's skip reason in its tooltip, from the
start.
"""

import hashlib
import json

import dagster as dg

from dagster_sideinputs.core.operator import SideInputOperator
from dagster_sideinputs.core.spark_errors import lake_storage_errors
from dagster_sideinputs.core.state.plan import BatchPlan
from dagster_sideinputs.dagster_layer.declaration import declaration_of
from dagster_sideinputs.dagster_layer.execution import build_operator, storage_of
from dagster_sideinputs.dagster_layer.job import AssetJob, build_side_input_job
from dagster_sideinputs.errors import (
    KafkaOffsetsLostError,
    KafkaSourceError,
    OperatorStateError,
    StorageError,
)

_ACTIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def work_key(op: SideInputOperator, plan: BatchPlan) -> str:
    """A stable name for the work a plan describes."""
    with lake_storage_errors(op.spec, "reading the batch plans"):
        replay = op.state.last_planned() == plan.batch_id  # an interrupted batch
    digest = hashlib.sha1(
        json.dumps(
            {
                "main": plan.main.describe(),
                "files": [f["path"] for f in plan.main.files],
                "sides": plan.side_versions,
                "slots": plan.read_slots,
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()[:12]
    kind = "replay" if replay else "batch"
    return f"{op.operator_id}:{kind}:{plan.batch_id}:{digest}"


def describe_idle(op: SideInputOperator) -> str:
    """Why there is nothing to do, for the sensor's skip reason: a headline first (what
    the UI's tick list can show of it), then the details."""
    position = None
    committed = op.last_committed_batch()
    plan = op.last_plan()
    if plan is not None and plan.main.kind == "delta":
        position = f"main input processed up to version {plan.main.end_version}"
    elif plan is not None and plan.main.kind == "kafka" and plan.main.offsets:
        ends = ", ".join(f"{r.topic}[{r.partition}] {r.end}" for r in plan.main.offsets[:6])
        more = " ..." if len(plan.main.offsets) > 6 else ""
        position = f"Kafka main input read up to offsets {ends}{more}"
    buffered = op.buffer().rows()
    if buffered:
        waiting = (
            sorted(
                {
                    (side, d.reason)
                    for side, per_ns in plan.decisions.items()
                    for d in per_ns.values()
                    if not d.ready
                }
            )
            if plan is not None
            else []
        )
        sides = sorted({side for side, _ in waiting})
        headline = f"Waiting for {', '.join(sides)}" if sides else "Records buffered"
        details = [f"{buffered} record(s) buffered"]
        details += [f"{side}: {reason}" for side, reason in waiting[:3]]
        return f"{headline}: " + "; ".join([*details, *filter(None, [position])]) + "."
    if position is not None:
        return f"Up to date: {position}."
    if committed is None:
        return "No main input yet: nothing to process."
    return "Up to date: no new main input."


def build_side_input_sensor(
    assets_def: dg.AssetsDefinition,
    *,
    job: AssetJob | dg.JobDefinition | None = None,
    name: str | None = None,
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A sensor requesting a run of the operator's job whenever it has work.

    Args:
        assets_def: what ``@dsi.side_input_assets`` returned.
        job: the job to run (default: ``build_side_input_job(assets_def)``; pass the
            same job object you put in ``Definitions``).
        name: sensor name (default ``<operator>_sensor``).
        minimum_interval_seconds: evaluation interval.
        default_status: whether the sensor starts running when deployed.
    """
    decl = declaration_of(assets_def)
    target = job or build_side_input_job(assets_def)

    @dg.sensor(
        name=name or f"{decl.name}_sensor",
        job=target,
        minimum_interval_seconds=minimum_interval_seconds,
        required_resource_keys={decl.io_manager_key},
        default_status=default_status,
        description=f"Runs {target.name} when operator {decl.name!r} has new main input, "
        "or buffered records whose side inputs became ready.",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        active = context.instance.get_runs(
            filters=dg.RunsFilter(job_name=target.name, statuses=_ACTIVE), limit=1
        )
        if active:
            return dg.SkipReason(
                f"Run in progress: {active[0].run_id[:8]} of {target.name} will process "
                "what is available."
            )
        storage = storage_of(context.resources, decl)
        graph = context.repository_def.asset_graph if context.repository_def else None
        op = build_operator(decl, storage, context.instance, graph)
        try:
            return _evaluate(context, op)
        except StorageError as exc:
            # The store refused or could not be reached: no run could do better. The tick
            # skips with the error (store, operation, fix) and the next tick asks again.
            return dg.SkipReason(f"Store unreachable: cannot read the operator's state: {exc}")

    return _sensor


def _evaluate(
    context: dg.SensorEvaluationContext, op: SideInputOperator
) -> dg.RunRequest | dg.SkipReason:
    """One tick: a run request for the operator's next work, or why there is none."""
    try:
        plan = op.peek()
    except KafkaSourceError as exc:
        return dg.SkipReason(
            f"Kafka unreachable: cannot ask the brokers for new offsets: {exc.message}"
        )
    except (OperatorStateError, KafkaOffsetsLostError) as exc:
        if op.spec.main.kind == "kafka":
            # A run fails with the full error (topic, partition, offsets, fix); one per
            # distinct problem, so the sensor does not start a failing run every tick.
            digest = hashlib.sha1(exc.message.encode()).hexdigest()[:12]
            key = f"{op.operator_id}:kafka-error:{digest}"
            if key == context.cursor:
                return dg.SkipReason(f"Waiting for a fix: {exc.message[:300]}")
            context.update_cursor(key)
            return dg.RunRequest(run_key=key, tags={"dsi/reason": exc.message[:200]})
        key = f"{op.operator_id}:files:{op.last_committed_batch()}"
        if key == context.cursor:
            return dg.SkipReason("Already requested: a run for the new landed files.")
        context.update_cursor(key)
        return dg.RunRequest(run_key=key, tags={"dsi/reason": "new landed files"})
    if plan is None:
        return dg.SkipReason(describe_idle(op))
    key = work_key(op, plan)
    if key == context.cursor:
        return dg.SkipReason(
            f"Already requested: batch {plan.batch_id} ({plan.main.describe()}); waiting "
            "for new data or a change of readiness."
        )
    context.update_cursor(key)
    released = plan.read_slots
    reason = plan.main.describe() + (f"; releasing {', '.join(released[:5])}" if released else "")
    return dg.RunRequest(run_key=key, tags={"dsi/reason": reason[:200]})

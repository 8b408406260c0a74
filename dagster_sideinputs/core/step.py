"""One step of an operator run: replay the batch an interrupted run left (when some table
committed it), or plan the next batch, write its plan down and run it; and the plan such
a step would make now (:func:`peek`), written nowhere."""

import datetime as dt
import logging

from dagster_sideinputs.core import identity
from dagster_sideinputs.core.batch import run_batch
from dagster_sideinputs.core.context import StageContext
from dagster_sideinputs.core.metrics import BatchMetrics
from dagster_sideinputs.core.plan import BatchPlan
from dagster_sideinputs.core.planner import Planned, Planner
from dagster_sideinputs.core.recovery import Recovery
from dagster_sideinputs.core.sources.choice import source_for
from dagster_sideinputs.errors import OperatorStateError

log = logging.getLogger("dagster_sideinputs")


def step(
    context: StageContext, recovery: Recovery, now: dt.datetime, verdict: identity.Verdict
) -> tuple[BatchMetrics, BatchPlan] | None:
    """Run one batch (the interrupted one first): its metrics and plan; None: no work."""
    operator_id = context.spec.operator_id
    previous = recovery.previous()
    pending = recovery.settle_pending(verdict.routing)
    if pending is not None:
        log.info("%s: replaying interrupted batch %s", operator_id, pending.batch_id)
        return run_batch(context, pending, replayed=True), pending
    planned = Planner(context.spec, context.source, context.spark).plan(
        batch_id=recovery.next_batch_id(),
        now=now,
        previous=previous,
        routing=verdict.routing,
        reroute=verdict.reroute,
    )
    if planned is None:
        return None
    plan = planned.plan
    log.info(
        "%s: batch %s planned: main %s, side versions %s, releasing %s",
        operator_id,
        plan.batch_id,
        plan.main.describe(),
        dict(plan.side_versions),
        list(plan.read_slots) or "nothing from the buffer",
    )
    if not context.state.create_plan(plan):
        # Another process planned this batch between our check and our write.
        raise OperatorStateError(
            f"Operator {operator_id!r}: batch {plan.batch_id} was planned by another "
            "run at the same time; two runs must not process one operator at once.",
            fix="rerun (the other run's batch is then finished, or planned again); limit the "
            "job's concurrency",
        )
    return run_batch(context, plan, replayed=False, source=planned.source), plan


def peek(recovery: Recovery, now: dt.datetime) -> BatchPlan | None:
    """The plan the next step would make now, without writing it (None: no work).

    Uses no Spark unless windows of new records cannot be told from statistics. An
    incomplete batch that some table committed (to be replayed) is returned as is.
    """
    spec, state = recovery.spec, recovery.state
    pending = recovery.pending()
    batch_id = recovery.next_batch_id()
    if pending is not None:
        if isinstance(pending, BatchPlan) and recovery.committed_anywhere(
            pending.batch_id, pending.tables
        ):
            return pending
        # The next run sets the pending plan aside and plans its batch id again.
        batch_id = state.last_planned()  # type: ignore[assignment]
    verdict = identity.check(spec, state)
    planned: Planned | None = Planner(spec, source_for(spec), spark=None).plan(
        batch_id=batch_id,
        now=now,
        previous=recovery.previous(),
        routing=verdict.routing,
        reroute=verdict.reroute,
    )
    return None if planned is None else planned.plan

"""One step of an operator run, and the batch it runs: replay the batch an interrupted
run left (when some table committed it), or plan the next batch, write its plan down and
run it through its stages; and the plan such a step would make now (:func:`peek`),
written nowhere.

    plan -> read -> route -> compute -> write -> record

Each stage is a function of its own module taking the stage context and the
:class:`~dagster_sideinputs.core.batch.context.Batch` value and returning the next one;
stages never import each other (tests/test_structure.py):

- :mod:`~dagster_sideinputs.core.batch.read`: new main records and the buffered records the
  plan releases, with the operator's bookkeeping columns;
- :mod:`~dagster_sideinputs.core.batch.route`: side views joined, every record given a route
  (released, buffered, key_wait, late, unmatched, overflow, invalid), the routes
  counted and checked (invalid records, buffer limits) before anything is written;
- :mod:`~dagster_sideinputs.core.batch.compute`: the user function over the released records
  (frames or rows), plus the operator's own routes, every output validated;
- :mod:`~dagster_sideinputs.core.batch.write`: every output staged, then every table committed
  with the batch's application transaction;
- :mod:`~dagster_sideinputs.core.batch.record`: the batch's metrics and commit record;
- :mod:`~dagster_sideinputs.core.batch.planner` plans the batch first (:func:`step`).
"""

import datetime as dt
import logging
import time
from collections.abc import Callable
from functools import partial

from dagster_sideinputs.core.batch import compute, read, record, route, write
from dagster_sideinputs.core.batch.context import Batch, StageContext
from dagster_sideinputs.core.batch.planner import Planned, Planner
from dagster_sideinputs.core.metrics import BatchMetrics
from dagster_sideinputs.core.sources.choice import source_for
from dagster_sideinputs.core.sources.main_source import SourceSlice
from dagster_sideinputs.core.spark_errors import translated
from dagster_sideinputs.core.state import identity
from dagster_sideinputs.core.state.plan import BatchPlan
from dagster_sideinputs.core.state.recovery import Recovery
from dagster_sideinputs.errors import OperatorStateError

Stage = Callable[[StageContext, Batch], Batch]
STAGES: tuple[tuple[str, Stage], ...] = (
    ("read", read.read),
    ("route", route.route),
    ("compute", compute.compute),
    ("write", write.write),
)


def run_batch(
    context: StageContext,
    plan: BatchPlan,
    *,
    replayed: bool,
    source: SourceSlice | None = None,
) -> BatchMetrics:
    """Run one planned batch through the stages and record it."""
    started = time.perf_counter()
    batch = Batch(plan=plan, replayed=replayed, source=source)
    with context.batch_scope():
        for name, stage in STAGES:
            mark = time.perf_counter()
            # Stages translate the Spark errors they expect; any other one still reaches
            # the user as a SideInputError (the Spark error as its cause).
            batch = translated(
                context,
                partial(stage, context, batch),
                views=batch.views,
                what=f"running the {name} stage",
            )
            batch = batch.timed(name, time.perf_counter() - mark)
    batch = batch.timed("total", time.perf_counter() - started)
    return record.record(context, batch)


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

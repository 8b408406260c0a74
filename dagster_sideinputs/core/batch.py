"""One planned micro-batch, run as a short pipeline of named stages.

    plan -> read -> route -> compute -> write -> record

Each stage is a function of its own module taking the stage context and the
:class:`Batch` value and returning the next :class:`Batch`:

- :mod:`~dagster_sideinputs.core.read`: new main records and the buffered records the
  plan releases, with the operator's bookkeeping columns;
- :mod:`~dagster_sideinputs.core.route`: side views joined, every record given a route
  (released, buffered, key_wait, late, unmatched, overflow, invalid), the routes
  counted and checked (invalid records, buffer limits) before anything is written;
- :mod:`~dagster_sideinputs.core.compute`: the user function over the released records
  (frames or rows), plus the operator's own routes, every output validated;
- :mod:`~dagster_sideinputs.core.write`: every output staged, then every table committed
  with the batch's application transaction;
- :mod:`~dagster_sideinputs.core.record`: the batch's metrics and commit record.

Planning (:mod:`~dagster_sideinputs.core.planner`) happens before, in the operator.
"""

import time
from collections.abc import Callable
from functools import partial

from dagster_sideinputs.core import compute, read, record, route, write
from dagster_sideinputs.core.context import Batch, StageContext
from dagster_sideinputs.core.metrics import BatchMetrics
from dagster_sideinputs.core.plan import BatchPlan
from dagster_sideinputs.core.sources.main_source import SourceSlice
from dagster_sideinputs.core.spark_errors import translated

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

"""A map's promise of one side row per key, checked before anything is staged, once per
side version and set of windows (windowed singletons: the compute stage's own check).

A map whose join holds its rows as they are (``JoinSpec.checked_first``: the batch reads
ready side data) is checked by the route stage before any Spark job reads the join, so
that no job ever meets a duplicated key there; every other view is checked by the compute
stage when the batch releases records (its view also refuses a duplicated key inside
Spark, whichever job computes it).
"""

from collections.abc import Mapping
from functools import partial
from typing import Any

from dagster_sideinputs.core.batch.context import StageContext, Views
from dagster_sideinputs.core.sideinputs.joins import duplicate_error
from dagster_sideinputs.core.spark_errors import translated
from dagster_sideinputs.core.state.plan import BatchPlan, side_windows


def check_one_row_per_key(
    context: StageContext,
    plan: BatchPlan,
    views: Views,
    *,
    first: bool = False,
    skip: Mapping[str, Any] | None = None,
) -> None:
    """Refuse the batch (a DuplicateKeyError naming a few keys) when a joined map holds
    several rows for a key. ``first``: only the joins that must be checked before any job
    reads them; ``skip``: side inputs checked on the driver (row-mode lookups)."""
    for name, join in views.joins.items():
        data = views.data[name]
        if join.duplicates is None or data.side.view == "singleton":
            continue  # singletons: checked per window by the compute stage
        if (first and not join.checked_first) or (skip is not None and name in skip):
            continue  # checked later, or on the driver (a checked-first join already was)
        windows = side_windows(data.bound, plan)
        checked = (name, data.version, tuple(windows) if windows is not None else None)
        if checked in context.unique_checked:
            continue
        found: list[Any] = translated(context, partial(join.duplicates.take, 1), views=views)
        if found:
            raise duplicate_error(data.bound, join, data.version)
        context.unique_checked.add(checked)

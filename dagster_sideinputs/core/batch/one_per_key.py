"""A map's promise of one side row per key, checked before anything is staged, once per
side version and set of windows (windowed singletons: the compute stage's own check).

A map whose join holds its rows as they are (``JoinSpec.checked_first``: the batch reads
ready side data) is checked by the route stage before any Spark job reads the join, so
that no job ever meets a duplicated key there; every other view is checked by the compute
stage when the batch releases records (its view also refuses a duplicated key inside
Spark, whichever job computes it).

A small map's keys (:data:`DRIVER_CHECK_ROWS`, of key types Arrow groups as Spark does)
are counted on the driver, read by the engine itself where it can (the bridge's delta-rs:
no Spark job), else by a Spark job; a larger map's keys, or duplicates found on the
driver (to name them), by a count per key in Spark.
"""

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from dagster_sideinputs.core.batch.context import StageContext, Views
from dagster_sideinputs.core.sideinputs.joins import JoinSpec, duplicate_error
from dagster_sideinputs.core.sideinputs.side_data import SideData
from dagster_sideinputs.core.spark_errors import translated
from dagster_sideinputs.core.state.plan import BatchPlan, side_windows

# A checked-first map of at most this many rows (by its files' statistics) has its keys
# read to the driver and counted there: one Spark stage reading the key columns, where
# the count per key in Spark is two stages and a shuffle (200k profiles: 0.25-0.34 s
# against 0.55-0.67 s side by side; 0.06 s against 0.31 s in the frames bench's batch).
DRIVER_CHECK_ROWS = 1_000_000
# Key types Arrow groups as Spark does. Floating keys are not (Spark makes -0.0 and 0.0
# one key, and every NaN one), nor strings of a collation other than binary.
_DRIVER_KEY_TYPES = (
    T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType,
    T.DateType, T.TimestampType, T.TimestampNTZType, T.BinaryType,
)  # fmt: skip


def check_one_row_per_key(
    context: StageContext,
    plan: BatchPlan,
    views: Views,
    *,
    first: bool = False,
    skip: Mapping[str, Any] | None = None,
) -> list[str]:
    """Refuse the batch (a DuplicateKeyError naming a few keys) when a joined map holds
    several rows for a key. ``first``: only the joins that must be checked before any job
    reads them; ``skip``: side inputs checked on the driver (row-mode lookups). Returns
    notes on the maps whose keys were counted on the driver."""
    notes: list[str] = []
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
        keys = _driver_countable(data, join)
        if keys is not None:
            unique = translated(context, partial(_unique_on_driver, keys), views=views)
            if unique:
                notes.append(f"side input {name!r}: one row per key checked on the driver")
                context.unique_checked.add(checked)
                continue
            # Duplicates: the Spark check below finds them, to name them.
        duplicates = join.duplicates()
        found: list[Any] = translated(context, partial(duplicates.take, 1), views=views)
        if found:
            raise duplicate_error(data.bound, join, data.version)
        context.unique_checked.add(checked)
    return notes


def _driver_countable(data: SideData, join: JoinSpec) -> Callable[[], pa.Table] | None:
    """What reads a map's join keys (one row per side row) to the driver, when they are
    few enough (by its files' statistics) and of types Arrow groups as Spark does; None
    otherwise. The engine reads a table's key columns itself when it can (no Spark job,
    :meth:`SideData.on_driver`); else a Spark job reads them."""
    snapshot = data.snapshot
    if snapshot is None or not join.key_columns:
        return None
    rows = 0
    for file in snapshot.files:
        if file.num_records is None:
            return None
        rows += file.num_records
    if rows > DRIVER_CHECK_ROWS:
        return None

    def by_spark() -> pa.Table:
        return data.rows(None).select(*join.key_columns).toArrow()

    if join.key_names:
        kinds = [snapshot.schema[name].dataType for name in join.key_names]
        if not all(_grouped_as_by_spark(kind) for kind in kinds):
            return None
        names = join.key_names

        def by_engine() -> pa.Table:
            table = data.on_driver(names)
            return by_spark() if table is None else table

        return by_engine
    keys = data.rows(None).select(*join.key_columns)
    if not all(_grouped_as_by_spark(f.dataType) for f in keys.schema.fields):
        return None
    return keys.toArrow


def _grouped_as_by_spark(kind: T.DataType) -> bool:
    if isinstance(kind, T.StringType):
        return kind == T.StringType()  # a collation groups strings Arrow sets apart
    return isinstance(kind, _DRIVER_KEY_TYPES)


def _unique_on_driver(read: Callable[[], pa.Table]) -> bool:
    """Whether no key (nulls included: Spark groups them as one) holds several rows."""
    table = read()
    return table.group_by(table.column_names).aggregate([]).num_rows == table.num_rows

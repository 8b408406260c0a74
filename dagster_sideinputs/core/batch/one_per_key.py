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
driver (to name them), by a count per key in Spark. The engine's read and count start in
a thread as soon as the route has built its views (:func:`count_keys_early`), so they
overlap the rest of its planning; the check still waits for them before any job runs.
"""

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
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


Early = dict[str, "Future[bool | None]"]
"""Side input name -> whether the engine found its keys unique (None: it cannot read them)."""


def count_keys_early(context: StageContext, plan: BatchPlan, views: Views) -> Early:
    """Start counting, in a thread, the keys of each map :func:`check_one_row_per_key`
    (``first=True``) will check whose keys the engine reads on the driver (no Spark job):
    the read and the count then overlap the route's planning instead of following it.
    What the thread finds is only used, errors included, when the check asks for it."""
    reads = {}
    for name, join, data, _ in _maps_to_check(context, plan, views, first=True, skip=None):
        readers = _key_readers(data, join)
        if readers is not None and readers.engine is not None:
            reads[name] = readers.engine
    if not reads:
        return {}
    # A pool of the batch's own (a process-wide one would hang in a forked child whose
    # parent's threads it believes idle); its threads end with their counts.
    pool = ThreadPoolExecutor(max_workers=len(reads), thread_name_prefix="dsi-key-count")
    try:
        return {name: pool.submit(_engine_unique, read) for name, read in reads.items()}
    finally:
        pool.shutdown(wait=False)


def check_one_row_per_key(
    context: StageContext,
    plan: BatchPlan,
    views: Views,
    *,
    first: bool = False,
    skip: Mapping[str, Any] | None = None,
    early: Early | None = None,
) -> list[str]:
    """Refuse the batch (a DuplicateKeyError naming a few keys) when a joined map holds
    several rows for a key. ``first``: only the joins that must be checked before any job
    reads them; ``skip``: side inputs checked on the driver (row-mode lookups); ``early``:
    counts started by :func:`count_keys_early`. Returns notes on the maps whose keys were
    counted on the driver."""
    notes: list[str] = []
    for name, join, data, checked in _maps_to_check(context, plan, views, first, skip):
        readers = _key_readers(data, join)
        if readers is not None:
            counted = (early or {}).get(name)
            unique = translated(context, partial(_unique_on_driver, readers, counted), views=views)
            if unique:
                notes.append(f"side input {name!r}: one row per key checked on the driver")
                context.unique_checked.add(checked)
                continue
            # Duplicates: the Spark check below finds them, to name them.
        assert join.duplicates is not None
        duplicates = join.duplicates()
        found: list[Any] = translated(context, partial(duplicates.take, 1), views=views)
        if found:
            raise duplicate_error(data.bound, join, data.version)
        context.unique_checked.add(checked)
    return notes


def _maps_to_check(
    context: StageContext,
    plan: BatchPlan,
    views: Views,
    first: bool,
    skip: Mapping[str, Any] | None,
) -> Iterator[tuple[str, JoinSpec, SideData, tuple[Any, ...]]]:
    """The maps a check looks at: name, join, data and what marks them checked."""
    for name, join in views.joins.items():
        data = views.data[name]
        if join.duplicates is None or data.side.view == "singleton":
            continue  # singletons: checked per window by the compute stage
        if (first and not join.checked_first) or (skip is not None and name in skip):
            continue  # checked later, or on the driver (a checked-first join already was)
        windows = side_windows(data.bound, plan)
        checked = (name, data.version, tuple(windows) if windows is not None else None)
        if checked not in context.unique_checked:
            yield name, join, data, checked


@dataclass(frozen=True)
class _KeyReaders:
    """Two ways to read a map's join keys (one row per side row) to the driver."""

    engine: Callable[[], pa.Table | None] | None  # no Spark job; None: cannot
    spark: Callable[[], pa.Table]


def _key_readers(data: SideData, join: JoinSpec) -> _KeyReaders | None:
    """How a map's join keys are read to the driver, when they are few enough (by its
    files' statistics) and of types Arrow groups as Spark does; None otherwise. The engine
    reads a table's key columns itself when it can (:meth:`SideData.on_driver`); else a
    Spark job reads them."""
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
    if join.key_names:
        kinds = [snapshot.schema[name].dataType for name in join.key_names]
        if not all(_grouped_as_by_spark(kind) for kind in kinds):
            return None
        names = join.key_names
        return _KeyReaders(
            engine=lambda: data.on_driver(names),
            spark=lambda: data.rows(None).select(*join.key_columns).toArrow(),
        )
    keys = data.rows(None).select(*join.key_columns)
    if not all(_grouped_as_by_spark(f.dataType) for f in keys.schema.fields):
        return None
    return _KeyReaders(engine=None, spark=keys.toArrow)


def _grouped_as_by_spark(kind: T.DataType) -> bool:
    if isinstance(kind, T.StringType):
        return kind == T.StringType()  # a collation groups strings Arrow sets apart
    return isinstance(kind, _DRIVER_KEY_TYPES)


def _unique_on_driver(readers: _KeyReaders, counted: "Future[bool | None] | None") -> bool:
    """Whether no key holds several rows: from the early count when one was started, else
    read by the engine, else by Spark."""
    if counted is not None:
        found = counted.result()
        if found is not None:
            return found
    elif readers.engine is not None:
        found = _engine_unique(readers.engine)
        if found is not None:
            return found
    return _unique(readers.spark())


def _engine_unique(read: Callable[[], pa.Table | None]) -> bool | None:
    table = read()
    return None if table is None else _unique(table)


def _unique(table: pa.Table) -> bool:
    """Whether no key (nulls included: Spark groups them as one) holds several rows."""
    if table.num_columns == 1:  # a hash count: about half the time of a group-by
        distinct = pc.count_distinct(table.column(0), mode="all").as_py()
        return bool(distinct == table.num_rows)
    return table.group_by(table.column_names).aggregate([]).num_rows == table.num_rows

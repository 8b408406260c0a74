"""Row mode, driver side: the side values a row function sees, prepared once per batch.

- Broadcast keyed views (maps / multimaps read whole on every task, whose records do not
  wait for their key) become :class:`~dagster_sideinputs.core.sideinputs.lookups.LookupTable`\\ s,
  looked up in Python per record: cheaper than Spark joining them and converting a
  struct per record. Built once per side version.
- Windowed views handed per window (lists, maps and multimaps without a key relation)
  become a :class:`~dagster_sideinputs.core.sideinputs.lookups.LookupTable` by side window,
  looked up with the side window each record reads (the operator's window mapping): a
  record does not carry its window's rows, and each window's rows become records once
  per worker. Built once per side version and set of windows.
- Views handed whole (singletons, lists, maps without a key relation) become Python
  values shipped with the function.
"""

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.batch.context import StageContext, Views
from dagster_sideinputs.core.columns import LOOKUP_PREFIX, SIDE_NS, comparable, quoted
from dagster_sideinputs.core.records import Record, side_record_type
from dagster_sideinputs.core.sideinputs.lookups import Lookup, LookupTable
from dagster_sideinputs.core.sideinputs.side_data import SideData, value_columns
from dagster_sideinputs.core.sideinputs.windows import WindowSpan
from dagster_sideinputs.core.state.plan import BatchPlan, side_windows
from dagster_sideinputs.errors import DuplicateKeyError, preview


def local_lookups(context: StageContext, views: Views, plan: BatchPlan) -> dict[str, Lookup]:
    lookups: dict[str, Lookup] = {}
    for name, join in views.joins.items():
        data = views.data[name]
        side = data.side
        if side.distribution == "forwarded" or side.as_of is not None:
            continue
        per_window = side.window is not None and side.view != "singleton" and join.keys == [SIDE_NS]
        keyed = (
            join.broadcast
            and side.view in ("map", "multimap")
            and side.window is None
            and side.missing == "null"
        )
        if not (per_window or keyed):
            continue
        windows = side_windows(data.bound, plan) if per_window else None
        cache_key = (name, data.version, tuple(windows) if windows is not None else None)
        if cache_key not in context.lookup_tables:
            # Keep one version per side input: older ones are not read again.
            context.lookup_tables = {
                key: table for key, table in context.lookup_tables.items() if key[0] != name
            }
            context.lookup_tables[cache_key] = (
                window_table(data, windows or []) if per_window else lookup_table(data)
            )
        default: Any = [] if side.view in ("multimap", "list") else None
        if per_window:
            default = [] if side.view == "list" else {}
        lookups[name] = Lookup(f"{LOOKUP_PREFIX}{name}", context.lookup_tables[cache_key], default)
    return lookups


def broadcast_values(views: Views) -> dict[str, Any]:
    """Views not joined to records, as the Python values ``ctx.side_input(name)`` gives."""
    values: dict[str, Any] = {}
    for name, data in views.data.items():
        if name in views.joins:
            continue
        side = data.side
        if side.window is not None:
            continue  # joined per window; absent when no released record reads it
        kind = side_record_type(data.bound.label)
        if side.view == "singleton":
            row = data.singleton_value()
            values[name] = kind(row.asDict(recursive=True)) if hasattr(row, "asDict") else row
            continue
        rows = [kind(r.asDict(recursive=True)) for r in data.rows(None).drop(SIDE_NS).collect()]
        if side.view == "list":
            values[name] = rows
        elif side.view == "map":
            values[name] = {r[side.key]: r for r in rows}
        else:
            grouped: dict[Any, list[Record]] = {}
            for r in rows:
                grouped.setdefault(r[side.key], []).append(r)
            values[name] = grouped
    return values


def lookup_table(data: SideData) -> LookupTable:
    """A keyed side input as a :class:`LookupTable` (map: one row per key, a duplicate key
    is an error unless the side declares ``pick``; multimap: every row, in a stable order)."""
    side = data.side
    assert side.key is not None
    data.check_key_column()
    arrow = data.on_driver()  # the engine's own read (no Spark job), where it has one
    if arrow is None:
        arrow = data.rows(None).drop(SIDE_NS).toArrow()
    multimap = side.view == "multimap"
    if not multimap and pc.count_distinct(arrow[side.key], mode="all").as_py() == len(arrow):
        # One row per key: ship as is.
        return LookupTable(arrow, side.key, multimap=False, label=data.bound.label)
    rows = arrow.to_pylist()
    chosen = sorted(rows, key=repr) if multimap else _one_per_key(data, rows)
    return LookupTable(
        pa.Table.from_pylist(chosen, schema=arrow.schema),
        side.key,
        multimap=multimap,
        label=data.bound.label,
    )


def window_table(data: SideData, windows: Sequence[WindowSpan]) -> LookupTable:
    """A windowed view by side window (list: the window's rows; map: key -> row, a
    duplicate key in a window is an error unless the side declares ``pick``; multimap:
    key -> rows), rows in a stable order (sorted, as frames mode sorts them)."""
    side = data.side
    rows = data.rows(windows)
    names = value_columns(data.schema())
    if side.key is not None:
        data.check_key_column()
        rows = rows.filter(F.col(quoted(side.key)).isNotNull())  # as frames mode's map columns
    element = T.StructType([data.schema()[n] for n in names])
    if comparable(element):
        rows = rows.orderBy(SIDE_NS, *[F.col(quoted(n)).asc_nulls_first() for n in names])
        arrow = rows.select(SIDE_NS, *[quoted(n) for n in names]).toArrow()
    else:
        arrow = rows.select(SIDE_NS, *[quoted(n) for n in names]).toArrow()
        order = sorted(range(arrow.num_rows), key=lambda i: repr(arrow.slice(i, 1).to_pylist()))
        arrow = arrow.take(pa.array(order, pa.int64()))
    if side.view == "map":
        listed = arrow.to_pylist()
        by_window: dict[Any, list[dict[str, Any]]] = {}
        for row in listed:
            by_window.setdefault(row[SIDE_NS], []).append(row)
        chosen = [row for members in by_window.values() for row in _one_per_key(data, members)]
        if len(chosen) != len(listed):
            arrow = pa.Table.from_pylist(chosen, schema=arrow.schema)
    key = side.key if side.view in ("map", "multimap") else None
    return LookupTable(
        arrow, key, multimap=side.view == "multimap", label=data.bound.label, window=SIDE_NS
    )


def _one_per_key(data: SideData, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    side = data.side
    assert side.key is not None
    table: dict[Any, dict[str, Any]] = {}
    duplicates: list[Any] = []
    for row in rows:
        if row[side.key] in table:
            duplicates.append(row[side.key])
        table[row[side.key]] = row
    if duplicates and side.pick is None:
        raise DuplicateKeyError(
            f"{data.bound.label} is a map but holds several rows for key(s) "
            f"{preview(sorted(set(duplicates), key=repr))} at version {data.version}. "
            "Nothing was written.",
            fix="deduplicate the side asset, declare SideInput.multimap(...), or pick one "
            "row per key with SideInput.map(..., pick='<column, greatest wins>')",
        )
    if duplicates:
        pick = side.pick
        assert pick is not None
        table = {}
        for row in sorted(rows, key=lambda r: (r[pick] is not None, r[pick], repr(r))):
            table[row[side.key]] = row
    return list(table.values())

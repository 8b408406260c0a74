"""Row mode, driver side: the side values a row function sees, prepared once per batch.

- Broadcast keyed views (maps / multimaps read whole on every task, whose records do not
  wait for their key) become :class:`~dagster_sideinputs.core.rows.LookupTable`\\ s,
  looked up in Python per record: cheaper than Spark joining them and converting a
  struct per record. Built once per side version.
- Views handed whole (singletons, lists, maps without a key relation) become Python
  values shipped with the function.
"""

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dagster_sideinputs.core.columns import LOOKUP_PREFIX, SIDE_NS
from dagster_sideinputs.core.context import StageContext, Views
from dagster_sideinputs.core.rows import Lookup, LookupTable, Record, side_record_type
from dagster_sideinputs.core.side_data import SideData
from dagster_sideinputs.errors import DeclarationError, DuplicateKeyError, preview


def local_lookups(context: StageContext, views: Views) -> dict[str, Lookup]:
    lookups: dict[str, Lookup] = {}
    for name, join in views.joins.items():
        data = views.data[name]
        side = data.side
        eligible = (
            join.broadcast
            and side.view in ("map", "multimap")
            and side.window is None
            and side.distribution != "forwarded"
            and side.missing == "null"
        )
        if not eligible:
            continue
        cache_key = (name, data.version)
        if cache_key not in context.lookup_tables:
            # Keep one version per side input: older ones are not read again.
            context.lookup_tables = {
                key: table for key, table in context.lookup_tables.items() if key[0] != name
            }
            context.lookup_tables[cache_key] = lookup_table(data)
        default: list[Any] | None = [] if side.view == "multimap" else None
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
            raise DeclarationError(
                f"Row mode cannot hand {data.bound.label} to functions as a whole: it is "
                "windowed and not joined by key.",
                fix="use mode='frames', or give it a key relation to the main records",
            )
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

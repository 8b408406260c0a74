"""Row mode: Flink-style per-record functions, ``fn(record, ctx)``.

The released records (keyed side inputs joined by Spark, or looked up in Python when
broadcast) go through ``mapInArrow``: on each executor, records are handed to the
function one at a time as :class:`Record` dicts; the function yields main-output
records and emits side outputs with ``ctx.output(tag, record)``. Broadcast views
(singletons, lists, maps without a key relation) are computed on the driver once per
batch and shipped with the function, so ``ctx.side_input(name)`` is a local lookup.

Output schemas come from the tags (``OutputTag(name, schema=...)``). The tagged
records come back as one flat DataFrame (a tag column and the union of the tags'
fields, see :mod:`~dagster_sideinputs.core.batch.tagged_layout`), which the operator splits
into its outputs: written in one pass when they share their fields, else persisted first
when several writes read it, so the Python function runs once per record. Records and
their values: :mod:`~dagster_sideinputs.core.records`; side views looked up in Python:
:mod:`~dagster_sideinputs.core.sideinputs.lookups`.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Row
from pyspark.sql import types as T

from dagster_sideinputs.core.batch.tagged_layout import TaggedLayout
from dagster_sideinputs.core.callbacks import prefixed
from dagster_sideinputs.core.columns import ROW_ERROR_MARK
from dagster_sideinputs.core.functions import RowContext, RowsFunction
from dagster_sideinputs.core.outputs import OutputTag
from dagster_sideinputs.core.records import (
    Record,
    cyclic_gc_paused,
    python_values,
    record_values,
    side_record_type,
)
from dagster_sideinputs.core.sideinputs.lookups import Lookup
from dagster_sideinputs.core.spark_errors import encode
from dagster_sideinputs.errors import FunctionError, SideInputError


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _returned_a_record(value: Any, main: str) -> FunctionError:
    return FunctionError(
        f"The row function returned {_short(value)} ({type(value).__name__}) instead of yielding "
        f"records of output {main!r}. Nothing was written.",
        fix="use `yield record` (or return a list of records); emit side outputs with "
        "ctx.output(tag, record)",
    )


def _misfit(name: str, tag: OutputTag, items: list[Any], error: Exception) -> FunctionError:
    schema = tag.schema.simpleString() if tag.schema is not None else "?"
    return FunctionError(
        f"The row function emitted records to output {name!r} that do not fit its schema "
        f"{schema}: {type(error).__name__}: {error} (first record: {_short(items[0])}). "
        "Nothing was written.",
        fix="yield dicts (or Rows / tuples) whose values have the declared types; None "
        "for missing values",
    )


def _as_dict(record: Any, schema: T.StructType, name: str, main: bool) -> dict[str, Any]:
    if isinstance(record, Row):
        return record.asDict(recursive=True)
    if isinstance(record, dict):
        return record
    if isinstance(record, tuple | list):
        return dict(zip(schema.fieldNames(), record, strict=False))
    how = f"yielded to output {name!r}" if main else f"emitted to output {name!r}"
    raise FunctionError(
        f"The row function {how} a record that is not a dict, Row or tuple (row functions "
        f"must yield dicts, Rows or tuples); got {_short(record)} ({type(record).__name__}). "
        "Nothing was written.",
        fix="yield one dict per output record (a bare `yield` or `yield None` emits nothing valid)",
    )


def run_row_function(
    released: DataFrame,
    fn: RowsFunction,
    *,
    layout: TaggedLayout,
    broadcast_values: Mapping[str, Any],
    joined_columns: Sequence[str],
    record_columns: Sequence[str],
    lookups: Mapping[str, Lookup] | None = None,
    side_labels: Mapping[str, str] | None = None,
    who: str = "",
    routes: Mapping[str, str] | None = None,
) -> DataFrame:
    """Apply a row function to every released record; returns the tagged DataFrame
    (``layout.split`` gives the per-tag DataFrames).

    ``layout.tags[0]`` is the main output. ``joined_columns`` are side values Spark
    joined to each record; ``lookups`` are keyed side values looked up in Python (a dict
    shipped with the function) from a key column of the record. ``side_labels`` name the
    side inputs (by joined column) in errors; ``who`` (the operator and function) starts
    every error's message; ``routes``: the route tags the function may not emit to (no
    schema), by name, with their route.
    """
    tag_names = [tag.name for tag in layout.tags]
    declared = {tag.name: tag for tag in layout.tags}
    record_fields = list(record_columns)
    local = dict(lookups or {})
    joined = [*joined_columns, *local]
    # Columns travel by position: mapInArrow resolves its input by name and refuses some
    # legal column names (a backtick, for one).
    position = {name: index for index, name in enumerate(released.columns)}
    record_positions = [position[name] for name in record_fields]
    labels = side_labels or {}
    joined_positions = [
        (position[name], side_record_type(labels.get(name, f"side input {name!r}")))
        for name in joined_columns
    ]
    lookup_positions = [(lookup, position[lookup.column]) for lookup in local.values()]

    def run(batch: pa.RecordBatch, ctx: RowContext) -> list[pa.RecordBatch]:
        # Column-wise conversion (fast in Arrow), then one tuple per record. Every list
        # has one item per row of the batch, so the per-record zips skip `strict=`
        # (checking costs 0.28 us per record, measured; a quarter of this loop's time).
        fields = [record_values(batch.column(index)) for index in record_positions]
        sides = [record_values(batch.column(index), kind) for index, kind in joined_positions]
        for lookup, index in lookup_positions:
            table, default = lookup.table.resolve(), lookup.default
            sides.append([table.get(k, default) for k in python_values(batch.column(index))])
        main_out = ctx.emitted[tag_names[0]]
        for values, side_values in zip(  # noqa: B905
            zip(*fields) if fields else [()] * batch.num_rows,  # noqa: B905
            zip(*sides) if sides else [()] * batch.num_rows,  # noqa: B905
        ):
            ctx._values = side_values
            record = Record(zip(record_fields, values))  # noqa: B905
            try:
                produced = fn(record, ctx)
                if produced is not None:
                    if isinstance(produced, dict | Row | str | bytes):
                        raise _returned_a_record(produced, tag_names[0])
                    main_out.extend(produced)
            except SideInputError as error:
                raise RuntimeError(encode(prefixed(error, who))) from None
            except Exception as error:
                raise RuntimeError(
                    f"{ROW_ERROR_MARK}: {type(error).__name__}: {error} (on record "
                    f"{_short(record)})"
                ) from None
        out = []
        for index, (name, tag) in enumerate(declared.items()):
            items = ctx.emitted[name]
            if not items:
                continue
            assert tag.schema is not None
            try:
                records = [
                    item if type(item) is dict else _as_dict(item, tag.schema, name, index == 0)
                    for item in items
                ]
                out.append(layout.batch(index, records))
            except SideInputError as error:
                raise RuntimeError(encode(prefixed(error, who))) from None
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
                raise RuntimeError(
                    encode(prefixed(_misfit(name, tag, items, error), who))
                ) from None
            ctx.emitted[name] = []
        return out

    def process(batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        ctx = RowContext(declared, broadcast_values, joined, tag_names[0], routes)
        for batch in batches:
            # Records and side rows hold no cycles; with big lookup tables alive, the
            # collector's full passes cost about 15% of the Python time (measured).
            with cyclic_gc_paused():
                out = run(batch, ctx)
            yield from out

    positional = released.toDF(*[f"_dsi_in{index}" for index in range(len(released.columns))])
    return positional.mapInArrow(process, layout.schema)

"""Records as row functions see them: :class:`Record` and :class:`SideRecord` dicts, and
the conversion of Arrow columns to Python values (executor side, in the hot loop)."""

import contextlib
import datetime as dt
import gc
from collections.abc import Iterator
from typing import Any, ClassVar

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dagster_sideinputs.errors import MissingSideColumnError


class Record(dict):
    """One record: a dict that also allows attribute access (``record.amount``)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class SideRecord(Record):
    """A side input's row as row functions see it. Reading a column it does not have
    raises :class:`~dagster_sideinputs.errors.MissingSideColumnError` naming the side
    input (also an ``AttributeError`` and a ``KeyError``); ``row.get(name)`` gives None.
    One subclass per side input (:func:`side_record_type`) carries its name."""

    __slots__ = ()
    side_label: ClassVar[str] = "a side input"

    def __getattr__(self, name: str) -> Any:
        return self[name]  # a missing name goes through __missing__

    def __missing__(self, key: Any) -> Any:
        raise MissingSideColumnError(
            f"The row function reads column {key!r} of {self.side_label}, whose row has no "
            f"such column (columns: {list(self)}).",
            fix=f"restore column {key!r} in the side asset, or read the columns it has "
            "(row.get(name) gives None for a missing one)",
        )


_SIDE_RECORD_TYPES: dict[str, type[SideRecord]] = {}


def side_record_type(label: str) -> type[SideRecord]:
    """The :class:`SideRecord` subclass of one side input (built once per process)."""
    kind = _SIDE_RECORD_TYPES.get(label)
    if kind is None:
        kind = type("SideRecord", (SideRecord,), {"__slots__": (), "side_label": label})
        _SIDE_RECORD_TYPES[label] = kind
    return kind


def _wrap(value: Any, kind: type[Record] = Record) -> Any:
    """Structs as records (the outermost as ``kind``), at any depth."""
    if isinstance(value, dict):
        return kind({k: _wrap(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_wrap(v, kind) for v in value]
    return value


_UTC_NAMES = ("UTC", "+00:00", "Etc/UTC")


def python_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The values of an Arrow column as Python objects, like ``to_pylist()``.

    UTC timestamps (every Spark timestamp under the UTC session time zone) become
    ``datetime`` objects with ``timezone.utc`` in pandas' compiled loop: about ten times
    faster than Arrow's zone-aware conversion (0.47 against 4.7 us per value, measured).
    """
    kind = column.type
    if pa.types.is_timestamp(kind) and kind.tz in _UTC_NAMES:
        naive = pc.cast(column, pa.timestamp("us"), safe=False).to_numpy(zero_copy_only=False)
        stamps = pd.DatetimeIndex(naive).tz_localize(dt.timezone.utc).to_pydatetime().tolist()
        if column.null_count:
            return [None if v is pd.NaT else v for v in stamps]
        return stamps
    return column.to_pylist()


def record_values(column: pa.Array | pa.ChunkedArray, kind: type[Record] = Record) -> list[Any]:
    """The values of an Arrow column as row functions see them: :func:`python_values`,
    with structs as :class:`Record` (at any depth; the outermost as ``kind``)."""
    values = python_values(column)
    if pa.types.is_nested(column.type):
        return [_wrap(v, kind) for v in values]
    return values


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (reference counting still frees memory)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

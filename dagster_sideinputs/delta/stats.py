"""Delta file statistics from parquet footers.

Spark writes the data files; the driver then reads only their footers (a few KB
each) and turns the row-group statistics into the ``stats`` JSON of Delta add
actions: ``numRecords``, ``minValues``, ``maxValues`` and ``nullCount``. Readers use
them to skip files; the operator uses them to check pre-keyed inputs and to size its
buffer without running a Spark job.

Bounds must stay valid bounds after encoding, so timestamps are rounded outward to
milliseconds (the precision delta-spark reads), long strings keep only a 32-character
prefix as minimum and drop their maximum, and values JSON cannot hold exactly (NaN,
wide decimals) are left out.
"""

import datetime as dt
import decimal
import math
from collections.abc import Mapping
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import types as T

STRING_PREFIX_LENGTH = 32
_MAX_EXACT_DECIMAL_DIGITS = 15
_Missing = object()


def _floor_ms(value: dt.datetime) -> dt.datetime:
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _ceil_ms(value: dt.datetime) -> dt.datetime:
    floored = _floor_ms(value)
    return floored if floored == value else floored + dt.timedelta(milliseconds=1)


def _encode_timestamp(value: dt.datetime, *, upper: bool, utc: bool) -> str:
    rounded = _ceil_ms(value) if upper else _floor_ms(value)
    if utc:
        if rounded.tzinfo is not None:
            rounded = rounded.astimezone(dt.timezone.utc)
        return rounded.strftime("%Y-%m-%dT%H:%M:%S.") + f"{rounded.microsecond // 1000:03d}Z"
    return rounded.strftime("%Y-%m-%d %H:%M:%S.") + f"{rounded.microsecond // 1000:03d}"


def encode_bound(value: Any, data_type: T.DataType, *, upper: bool) -> Any:
    """A parquet min/max value as a Delta stats JSON value, or ``_Missing`` if unsafe."""
    if value is None:
        return _Missing
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
        if isinstance(value, int):  # pyarrow may hand back raw microseconds
            value = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=value)
        return _encode_timestamp(value, upper=upper, utc=isinstance(data_type, T.TimestampType))
    if isinstance(data_type, T.DateType):
        return value.isoformat() if isinstance(value, dt.date) else _Missing
    if isinstance(data_type, T.StringType):
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if len(value) <= STRING_PREFIX_LENGTH:
            return value
        return _Missing if upper else value[:STRING_PREFIX_LENGTH]
    if isinstance(data_type, T.DecimalType):
        if data_type.precision > _MAX_EXACT_DECIMAL_DIGITS:
            return _Missing
        return float(decimal.Decimal(value))
    if isinstance(data_type, T.FloatType | T.DoubleType):
        return float(value) if math.isfinite(value) else _Missing
    if isinstance(data_type, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        return int(value)
    if isinstance(data_type, T.BooleanType):
        return bool(value)
    return _Missing  # binary, arrays, maps: no min/max in Delta stats


def _leaf_type(schema: T.StructType, path: list[str]) -> T.DataType | None:
    """The Spark type of a parquet leaf column, if the path runs through structs only."""
    current: T.DataType = schema
    for name in path:
        if not isinstance(current, T.StructType) or name not in current.fieldNames():
            return None
        current = current[name].dataType
    return None if isinstance(current, T.StructType) else current


def _put(tree: dict, path: list[str], value: Any) -> None:
    for name in path[:-1]:
        tree = tree.setdefault(name, {})
    tree[path[-1]] = value


def _combine(current: Any, new: Any, *, upper: bool) -> Any:
    if current is _Missing or new is _Missing:
        return _Missing
    if current is None:
        return new
    return max(current, new) if upper else min(current, new)


def file_stats(metadata: pq.FileMetaData, schema: T.StructType) -> dict[str, Any]:
    """Delta ``stats`` for one parquet file, from its footer.

    Args:
        metadata: the parquet footer (``pyarrow.parquet.read_metadata``).
        schema: the Spark schema of the data columns in the file (no partition columns).

    Returns:
        A dict ready for ``json.dumps``: numRecords, minValues, maxValues, nullCount.
    """
    mins: dict[tuple[str, ...], Any] = {}
    maxs: dict[tuple[str, ...], Any] = {}
    nulls: dict[tuple[str, ...], Any] = {}
    types: dict[tuple[str, ...], T.DataType] = {}
    for row_group in range(metadata.num_row_groups):
        group = metadata.row_group(row_group)
        for index in range(group.num_columns):
            chunk = group.column(index)
            path = tuple(chunk.path_in_schema.split("."))
            data_type = types.get(path) or _leaf_type(schema, list(path))
            if data_type is None:
                continue
            types[path] = data_type
            stats = chunk.statistics
            if stats is None or not stats.has_min_max:
                low = high = _Missing
            else:
                low = encode_bound(stats.min, data_type, upper=False)
                high = encode_bound(stats.max, data_type, upper=True)
            mins[path] = _combine(mins.get(path), low, upper=False)
            maxs[path] = _combine(maxs.get(path), high, upper=True)
            null_count = stats.null_count if stats is not None and stats.has_null_count else None
            previous = nulls.get(path, 0)
            nulls[path] = (
                _Missing if null_count is None or previous is _Missing else previous + null_count
            )
    result: dict[str, Any] = {
        "numRecords": metadata.num_rows,
        "minValues": {},
        "maxValues": {},
        "nullCount": {},
    }
    for key, values in (("minValues", mins), ("maxValues", maxs), ("nullCount", nulls)):
        for path, value in values.items():
            if value is not _Missing and value is not None:
                _put(result[key], list(path), value)
    return result


NUM_INDEXED_COLUMNS = "delta.dataSkippingNumIndexedCols"
STATS_COLUMNS = "delta.dataSkippingStatsColumns"
DEFAULT_INDEXED_COLUMNS = 32


def _leaves(schema: T.StructType, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Leaf columns in schema order, depth-first; an array or a map is one leaf."""
    leaves: list[tuple[str, ...]] = []
    for f in schema.fields:
        path = (*prefix, f.name)
        if isinstance(f.dataType, T.StructType):
            leaves += _leaves(f.dataType, path)
        else:
            leaves.append(path)
    return leaves


def _column_path(name: str) -> tuple[str, ...]:
    """A column name of ``delta.dataSkippingStatsColumns`` as its path: dots separate
    nested fields, backticks quote a name (two backticks: one)."""
    parts, current, quoted, index = [], "", False, 0
    while index < len(name):
        char = name[index]
        if char == "`":
            if quoted and name[index + 1 : index + 2] == "`":
                current += "`"
                index += 1
            else:
                quoted = not quoted
        elif char == "." and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
        index += 1
    parts.append(current)
    return tuple(part.strip() for part in parts)


def indexed_columns(
    schema: T.StructType, configuration: Mapping[str, str | None]
) -> frozenset[tuple[str, ...]] | None:
    """The leaf columns whose statistics Delta's writer records in a table of this data
    schema (no partition columns) and configuration, lower-cased; None: every column.

    As delta-spark 4.4 does (checked against its writer by tests/delta/test_stats_columns.py):
    the columns ``delta.dataSkippingStatsColumns`` names (a struct: all its leaves), else
    the first ``delta.dataSkippingNumIndexedCols`` leaves (default 32, -1: all), counted
    depth-first with an array or a map as one leaf.
    """
    leaves = [tuple(part.lower() for part in leaf) for leaf in _leaves(schema)]
    named = (configuration.get(STATS_COLUMNS) or "").strip()
    if named:
        wanted = [_column_path(n.strip().lower()) for n in named.split(",") if n.strip()]
        return frozenset(leaf for leaf in leaves if any(leaf[: len(w)] == w for w in wanted))
    try:
        count = int(configuration.get(NUM_INDEXED_COLUMNS) or DEFAULT_INDEXED_COLUMNS)
    except ValueError:
        count = DEFAULT_INDEXED_COLUMNS
    return None if count < 0 or count >= len(leaves) else frozenset(leaves[:count])


def _kept(tree: Mapping[str, Any], keep: frozenset[tuple[str, ...]], path: tuple[str, ...]) -> dict:
    kept: dict[str, Any] = {}
    for name, value in tree.items():
        here = (*path, name.lower())
        if isinstance(value, Mapping):
            if inner := _kept(value, keep, here):
                kept[name] = inner
        elif here in keep:
            kept[name] = value
    return kept


def logged_stats(stats: Mapping[str, Any], indexed: frozenset[tuple[str, ...]] | None) -> dict:
    """``stats`` as the log gets them: only the ``indexed`` columns' (None: all), and
    ``numRecords``, as Delta's writer records them."""
    if indexed is None:
        return dict(stats)
    logged: dict[str, Any] = {"numRecords": stats["numRecords"]}
    for key in ("minValues", "maxValues", "nullCount"):
        if kept := _kept(stats.get(key) or {}, indexed, ()):
            logged[key] = kept
    return logged


def _parse_timestamp(value: Any, *, utc: bool) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        parsed = value
    elif isinstance(value, str):
        text = value.strip().replace(" ", "T")
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            parsed = dt.datetime.fromisoformat(text)
        except ValueError:
            return None
    else:
        return None
    if utc:
        return (
            parsed.replace(tzinfo=dt.timezone.utc)
            if parsed.tzinfo is None
            else parsed.astimezone(dt.timezone.utc)
        )
    return parsed.replace(tzinfo=None) if parsed.tzinfo is None else parsed


def decode_bound(value: Any, data_type: T.DataType) -> Any:
    """A Delta stats JSON value as a typed Python value (None when it cannot be read)."""
    if value is None:
        return None
    if isinstance(data_type, T.StructType):
        if not isinstance(value, dict):
            return None
        return {
            f.name: decode_bound(value.get(f.name), f.dataType)
            for f in data_type.fields
            if f.name in value
        }
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
        return _parse_timestamp(value, utc=isinstance(data_type, T.TimestampType))
    if isinstance(data_type, T.DateType):
        if isinstance(value, dt.date):
            return value
        try:
            return dt.date.fromisoformat(str(value)[:10])
        except ValueError:
            return None
    if isinstance(data_type, T.StringType):
        return value if isinstance(value, str) else None
    if isinstance(data_type, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        return int(value) if isinstance(value, int | float) else None
    if isinstance(data_type, T.FloatType | T.DoubleType | T.DecimalType):
        return float(value) if isinstance(value, int | float) else None
    if isinstance(data_type, T.BooleanType):
        return value if isinstance(value, bool) else None
    return None


def typed_stats(
    stats: Mapping[str, Any], schema: T.StructType
) -> tuple[int | None, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Delta ``stats`` JSON (already parsed) as ``(numRecords, min, max, nullCount)``,
    values typed by the table schema, as delta-rs gives them for live files."""
    records = stats.get("numRecords")
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    for raw, typed in ((stats.get("minValues") or {}, mins), (stats.get("maxValues") or {}, maxs)):
        for f in schema.fields:
            if f.name in raw:
                value = decode_bound(raw[f.name], f.dataType)
                if value is not None:
                    typed[f.name] = value
    nulls = dict(stats.get("nullCount") or {})
    return (records if isinstance(records, int) else None), mins, maxs, nulls

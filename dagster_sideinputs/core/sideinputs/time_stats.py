"""Event-time decisions from Delta file statistics, which are bounds, not values.

Delta statistics hold timestamps at millisecond precision: Delta's own writer truncates
them, ours rounds outward (min down, max up), another writer may keep microseconds. So,
for a timestamp column of one file:

- ``minValues`` is a lower bound of the file's least time (the least time is >= it);
- ``maxValues`` only says that the greatest time lies within a millisecond of it:
  after ``max - 1 ms``, before ``max + 1 ms``. A deletion vector may have deleted the
  row that gave ``max``: it is then an upper bound and no lower bound at all.

Dates are exact. Decisions that need no exact value (the windows a batch may touch,
which files may hold a side window's rows, when buffered records may be due) widen
the statistics to these bounds. Decisions that do (an as-of side input's horizon, a
side window's finality) take the exact greatest time from the rows of only the files
whose upper bound reaches the greatest lower bound (:func:`exact_max_time`): with
time-ordered appends, the newest file alone; one small Spark job, once per table
version (:func:`cached_max_time`).
"""

import datetime as dt
from collections.abc import Callable, Iterable, Sequence

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dagster_sideinputs.core.columns import quoted
from dagster_sideinputs.core.sideinputs.windows import as_utc, parse_stat_time
from dagster_sideinputs.delta.engine import DataFile, DeltaEngine, TableSnapshot

STAT_PRECISION = dt.timedelta(milliseconds=1)
"""The precision of timestamps in Delta statistics."""

_WITHIN = STAT_PRECISION - dt.timedelta(microseconds=1)


def _slack(raw: object) -> dt.timedelta:
    """How far a statistic may be from the value it stands for (0 for a date)."""
    return _WITHIN if isinstance(raw, dt.datetime | str) else dt.timedelta(0)


def has_times(file: DataFile, column: str) -> bool:
    """Whether a file may hold a non-null time in ``column`` (False: empty, or only nulls)."""
    if file.num_records == 0:
        return False
    nulls = file.null_count.get(column)
    return not (file.num_records is not None and nulls is not None and nulls >= file.num_records)


def min_time_bound(file: DataFile, column: str) -> dt.datetime | None:
    """A lower bound of the file's least time in ``column`` (None: unknown)."""
    return parse_stat_time(file.min_values.get(column))


def max_time_bounds(file: DataFile, column: str) -> tuple[dt.datetime | None, dt.datetime | None]:
    """(lower, upper) bounds of the file's greatest time in ``column``; None where unknown."""
    raw = file.max_values.get(column)
    value = parse_stat_time(raw)
    if value is None:
        return None, None
    slack = _slack(raw)
    lower = None if file.deletion_vector else value - slack
    return lower, value + slack


def time_span(files: Iterable[DataFile], column: str) -> tuple[dt.datetime, dt.datetime] | None:
    """Bounds ``(low, high)`` of every time in ``files`` (every time is in ``[low, high]``),
    from their statistics; None when some file's statistics do not tell (or no file
    holds a time)."""
    lows: list[dt.datetime] = []
    highs: list[dt.datetime] = []
    for file in files:
        if not has_times(file, column):
            continue
        low, (_, high) = min_time_bound(file, column), max_time_bounds(file, column)
        if low is None or high is None:
            return None
        lows.append(low)
        highs.append(high)
    return (min(lows), max(highs)) if lows else None


MaxReader = Callable[[Sequence[DataFile]], dt.datetime | None]
"""Reads the exact greatest time of the given files (one small Spark job)."""


def exact_max_time(
    files: Iterable[DataFile], column: str, read: MaxReader | None
) -> dt.datetime | None:
    """The greatest non-null time in ``column`` over ``files``, exact to the microsecond.

    Statistics narrow it to the files that may hold it: those whose upper bound reaches
    the greatest lower bound; ``read`` reads only those (all, when no file's statistics
    give a lower bound). Without ``read`` (planning without Spark, e.g. peeking), the
    greatest upper bound, or None when a file has no statistics.
    """
    candidates = [f for f in files if has_times(f, column)]
    if not candidates:
        return None
    bounds = [max_time_bounds(f, column) for f in candidates]
    lowers = [low for low, _ in bounds if low is not None]
    floor = max(lowers) if lowers else None
    uppers = [high for _, high in bounds]
    if None not in uppers and floor is not None and max(u for u in uppers if u) == floor:
        return floor  # exact statistics (dates)
    if read is None:
        return None if None in uppers else max(u for u in uppers if u is not None)
    needed = [
        f
        for f, (_, high) in zip(candidates, bounds, strict=True)
        if floor is None or high is None or high >= floor
    ]
    return read(needed)


def max_reader(
    engine: DeltaEngine,
    spark: SparkSession | None,
    snapshot: TableSnapshot,
    column: str,
    *,
    name: str,
) -> MaxReader | None:
    """Reads the greatest ``column`` of some files of ``snapshot`` (None without Spark)."""
    if spark is None:
        return None

    def read(files: Sequence[DataFile]) -> dt.datetime | None:
        frame = engine.read_snapshot(spark, snapshot, files=list(files), name=name)
        value = frame.agg(F.max(F.col(quoted(column)).cast("timestamp"))).collect()[0][0]
        return None if value is None else as_utc(value)

    return read


_CACHE: dict[tuple[str, str, int, int, str], dt.datetime | None] = {}
_CACHE_SIZE = 512


def cached_max_time(
    uri: str, snapshot: TableSnapshot, column: str, read: MaxReader | None
) -> dt.datetime | None:
    """:func:`exact_max_time` over a table version's files, read once per process for
    each (table, version, column): planning every batch must not rerun the job while
    the side table stays at one version."""
    files = hash(tuple(sorted(f.path for f in snapshot.files)))
    key = (uri, snapshot.table_id or "", snapshot.version, files, column)
    if key in _CACHE:  # peeking uses an exact value read earlier
        return _CACHE[key]
    value = exact_max_time(snapshot.files, column, read)
    if read is not None:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = value
    return value

"""Windows: the ``Window`` declaration, namespaces, and how main windows map to side windows.

A namespace is the scope of readiness and buffering. Non-windowed operators have
one, ``global``; windowed operators have one per main window, identified by its
start in ISO form (``2024-05-01T10:00:00Z``). Windows are half-open ``[start, end)``
and aligned to the epoch plus an offset, like Spark's ``window()``.

Records are assigned to windows with plain arithmetic on their event time rather than
Spark's ``window()``, which drops records whose time is null (sliding windows filter
them out): a record with a null time keeps one row with null window columns, and the
router sends it to ``invalid`` instead of losing it. So does a record whose windows
would not fit in the years 1-9999 (Python's and Spark's datetimes), and a record the
router will call invalid anyway is not given one row per sliding window.
"""

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TypeAlias

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.columns import NS_END, NS_START, quoted
from dagster_sideinputs.errors import DeclarationError, did_you_mean

GLOBAL = "global"
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
LAST_INSTANT = dt.timedelta(microseconds=1)
MIN_INSTANT = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
MAX_INSTANT = dt.datetime.max.replace(tzinfo=dt.timezone.utc)
# Durations beyond this are refused in window declarations: no window that long fits in
# the years 1-9999 that Python and Spark datetimes cover.
MAX_WINDOW = dt.timedelta(days=365 * 1000)
WindowSpan: TypeAlias = tuple[dt.datetime, dt.datetime]
WindowMapping: TypeAlias = Callable[[dt.datetime, dt.datetime], WindowSpan]
_TIME_TYPES = (T.TimestampType, T.TimestampNTZType, T.DateType)


@dataclass(frozen=True)
class Window:
    """Event-time windows over a timestamp column: tumbling or sliding.

    Windows are half-open ``[start, end)`` and aligned to the Unix epoch (plus
    ``offset``), like Spark's ``window()`` and Dagster's time partitions.

    Attributes:
        size: window length.
        slide: distance between window starts (``size`` for tumbling windows).
        time_column: the event-time column the windows are computed on.
        watermark: allowed lateness: a record is late when its window ended before
            (max event time seen) - watermark.
        offset: shift of window starts from the epoch.
        grace: a side input's windows: when one becomes final by the batch clock, even
            if no later side data comes: ``grace`` after its end. Records then go on
            with what the window holds.
        mapping: a side input's windows: maps a main window ``(start, end)`` to the side
            window to read; default: the side window containing the main window's last
            instant (of sliding side windows, the earliest-starting one, as Beam).

    The main input's windows take ``watermark``; a side input's take ``grace`` and
    ``mapping`` (each refused in the other role).
    """

    size: dt.timedelta
    slide: dt.timedelta
    time_column: str | None = None
    watermark: dt.timedelta | None = None
    offset: dt.timedelta = dt.timedelta(0)
    grace: dt.timedelta | None = None
    mapping: WindowMapping | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.size <= dt.timedelta(0) or self.slide <= dt.timedelta(0):
            raise DeclarationError(
                f"Window size and slide must be positive (size={self.size}, slide={self.slide}).",
                fix="e.g. Window.tumbling(timedelta(hours=1), time_column='ts')",
            )
        if self.slide > self.size:
            raise DeclarationError(
                f"Window slide {self.slide} is longer than its size {self.size}: records "
                "between windows would belong to none.",
                fix="use a slide <= size",
            )
        if (self.size % self.slide) != dt.timedelta(0):
            raise DeclarationError(
                f"Window size {self.size} is not a multiple of its slide {self.slide}.",
                fix="choose a slide that divides the size",
            )
        if self.watermark is not None and self.watermark < dt.timedelta(0):
            raise DeclarationError(f"Window watermark must be >= 0, got {self.watermark}.")
        for what, value in (("size", self.size), ("watermark", self.watermark)):
            if value is not None and value > MAX_WINDOW:
                raise DeclarationError(
                    f"Window {what} {value} is longer than {MAX_WINDOW.days // 365} years: "
                    "windows must fit within the timestamps Spark and Python represent "
                    "(years 1-9999).",
                    fix="use a shorter window; for no lateness limit at all, leave watermark=None",
                )
        if self.grace is not None and self.grace < dt.timedelta(0):
            raise DeclarationError(f"Window grace must be >= 0, got {self.grace}.")
        if self.mapping is not None and not callable(self.mapping):
            raise DeclarationError(
                "Window(mapping=) takes a function (start, end) -> (side_start, side_end), "
                f"got {type(self.mapping).__name__}.",
                fix="mapping=lambda start, end: (start - timedelta(hours=1), start), "
                "or drop it for the default mapping",
            )
        if abs(self.offset) > MAX_WINDOW:
            raise DeclarationError(
                f"Window offset {self.offset} is longer than {MAX_WINDOW.days // 365} years.",
                fix="use an offset shorter than the window's slide",
            )

    @classmethod
    def tumbling(
        cls,
        size: dt.timedelta,
        *,
        time_column: str | None = None,
        watermark: dt.timedelta | None = None,
        offset: dt.timedelta = dt.timedelta(0),
        grace: dt.timedelta | None = None,
        mapping: WindowMapping | None = None,
    ) -> "Window":
        """Consecutive, non-overlapping windows of ``size``."""
        return cls(size, size, time_column, watermark, offset, grace, mapping)

    @classmethod
    def sliding(
        cls,
        size: dt.timedelta,
        *,
        slide: dt.timedelta,
        time_column: str | None = None,
        watermark: dt.timedelta | None = None,
        offset: dt.timedelta = dt.timedelta(0),
        grace: dt.timedelta | None = None,
        mapping: WindowMapping | None = None,
    ) -> "Window":
        """Overlapping windows of ``size`` starting every ``slide``; a record is in several."""
        return cls(size, slide, time_column, watermark, offset, grace, mapping)

    @property
    def is_tumbling(self) -> bool:
        return self.size == self.slide

    def with_time_column(self, column: str) -> "Window":
        return replace(self, time_column=column)

    def __repr__(self) -> str:
        kind = (
            f"Window.tumbling({self.size!r}"
            if self.is_tumbling
            else f"Window.sliding({self.size!r}, slide={self.slide!r}"
        )
        extras = [f"time_column={self.time_column!r}"] if self.time_column else []
        if self.watermark is not None:
            extras.append(f"watermark={self.watermark!r}")
        if self.offset:
            extras.append(f"offset={self.offset!r}")
        if self.grace is not None:
            extras.append(f"grace={self.grace!r}")
        if self.mapping is not None:
            extras.append(f"mapping={getattr(self.mapping, '__name__', self.mapping)}")
        return kind + "".join(", " + e for e in extras) + ")"


def namespace_id(start: dt.datetime | None) -> str:
    """The id of the namespace of a window starting at ``start`` (``global`` for None)."""
    if start is None:
        return GLOBAL
    # The year is padded to four digits by hand: strftime("%Y") does not pad years before
    # 1000 on every platform (glibc writes "999"), Spark's "yyyy" does (namespace_id_column).
    utc = as_utc(start)
    return f"{utc.year:04d}-" + utc.strftime("%m-%dT%H:%M:%S.%fZ").replace(".000000Z", "Z")


def parse_namespace_id(ns: str) -> dt.datetime | None:
    if ns == GLOBAL:
        return None
    text = ns.rstrip("Z")
    fmt = "%Y-%m-%dT%H:%M:%S.%f" if "." in text else "%Y-%m-%dT%H:%M:%S"
    return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.timezone.utc)


def as_utc(value: dt.datetime | dt.date) -> dt.datetime:
    """Naive datetimes (as PySpark returns them, in the UTC session zone) become UTC; a
    date (a date-typed event time) is its midnight, UTC."""
    if not isinstance(value, dt.datetime):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc)
    return (
        value.replace(tzinfo=dt.timezone.utc)
        if value.tzinfo is None
        else value.astimezone(dt.timezone.utc)
    )


def utc_of(value: object) -> dt.datetime:
    """A datetime, a date or ISO-8601 text (a Delta statistic, a recorded time) as an
    aware UTC datetime (:func:`as_utc`); other text raises ``ValueError``."""
    if isinstance(value, dt.date):
        return as_utc(value)
    text = str(value).replace("Z", "+00:00").replace(" ", "T")
    return as_utc(dt.datetime.fromisoformat(text))


def parse_stat_time(value: object) -> dt.datetime | None:
    """A timestamp statistic or recorded time (typed, or ISO text); None when absent or
    not a time."""
    if value is None:
        return None
    try:
        return utc_of(value)
    except ValueError:
        return None


def shifted(instant: dt.datetime, delta: dt.timedelta, *, back: bool = False) -> dt.datetime:
    """``instant + delta`` (``- delta`` when ``back``), saturating at the first and last
    representable instants: a huge timeout or age limit means "never", not an
    OverflowError."""
    try:
        return as_utc(instant) - delta if back else as_utc(instant) + delta
    except OverflowError:
        return MIN_INSTANT if back == (delta > dt.timedelta(0)) else MAX_INSTANT


def time_range(window: Window) -> tuple[dt.datetime, dt.datetime]:
    """The event times whose windows fit in the years 1-9999 (Python's and Spark's
    datetimes): a main record outside cannot be given a window, and is invalid."""
    return MIN_INSTANT + window.size, MAX_INSTANT - window.size


def _micros(value: dt.timedelta) -> int:
    return value // dt.timedelta(microseconds=1)


def window_start_containing(window: Window, instant: dt.datetime) -> dt.datetime:
    """Start of the latest window of ``window`` that contains ``instant``."""
    steps = (as_utc(instant) - EPOCH - window.offset) // window.slide
    return EPOCH + window.offset + steps * window.slide


def is_window_start(window: Window, start: dt.datetime) -> bool:
    """Whether a window of ``window`` starts at ``start``."""
    return (as_utc(start) - EPOCH - window.offset) % window.slide == dt.timedelta(0)


def in_window(window: Window, time_column: str) -> Column:
    """Whether a row's namespace columns hold one of ``window``'s windows containing its
    event time (false for a null window or time)."""
    column = F.col(quoted(time_column)).cast("timestamp")
    start, end, at = (
        F.unix_micros(F.col(NS_START)),
        F.unix_micros(F.col(NS_END)),
        F.unix_micros(column),
    )
    slide, size, offset = _micros(window.slide), _micros(window.size), _micros(window.offset)
    fits = (
        (end - start == F.lit(size))
        & (F.pmod(start - F.lit(offset), F.lit(slide)) == 0)
        & (start <= at)
        & (at < end)
    )
    return F.coalesce(fits, F.lit(False))


def windows_containing(window: Window, instant: dt.datetime) -> list[WindowSpan]:
    """Every window of ``window`` containing ``instant`` (one when tumbling), oldest first."""
    last = window_start_containing(window, instant)
    count = window.size // window.slide
    starts = [last - i * window.slide for i in range(count - 1, -1, -1)]
    return [(start, start + window.size) for start in starts]


def default_side_window(
    side_window: Window, main_start: dt.datetime, main_end: dt.datetime
) -> WindowSpan:
    """Beam's default mapping: the side window containing the main window's last instant
    (``end - 1 µs``); with sliding side windows, the earliest-starting of those (Beam's
    ``default_window_mapping_fn`` takes the last window ``SlidingWindows.assign`` lists,
    which lists them latest-starting first).

    It covers the three cases of the side-input proposal: equal windows map one to
    one (sliding ones too); a smaller main window maps to a side window containing it;
    a larger main window maps to the last side window inside it. Of the sliding side
    windows containing the last instant, the earliest-starting one reaches least past
    the main window's end (equal windows: not at all).
    """
    last = window_start_containing(side_window, as_utc(main_end) - LAST_INSTANT)
    # Back over the overlapping windows, but never before year 1 (a side window longer
    # than the main one, near the first representable instant).
    back = min(side_window.size // side_window.slide - 1, (last - MIN_INSTANT) // side_window.slide)
    start = last - back * side_window.slide
    return start, shifted(start, side_window.size)


def check_time_column(schema: T.StructType, column: str, *, where: str) -> None:
    """A window's time column must exist and hold timestamps (or dates).

    Raises:
        DeclarationError: naming the column, its type, and the fix.
    """
    if column not in schema.fieldNames():
        raise DeclarationError(
            f"{where} is processed in windows on column {column!r}, which it does not have "
            f"(columns: {schema.fieldNames()}).{did_you_mean(column, schema.fieldNames())}",
            fix="fix time_column= / event_time= in the declaration, or the data's schema",
        )
    kind = schema[column].dataType
    if not isinstance(kind, _TIME_TYPES):
        raise DeclarationError(
            f"{where}: event-time column {column!r} is {kind.simpleString()}, not a timestamp.",
            fix=f'convert it upstream, e.g. F.to_timestamp("{column}"), or name a timestamp '
            "column in event_time= / time_column=",
        )


def assign_windows(
    df: DataFrame,
    window: Window,
    time_column: str,
    *,
    single: Column | None = None,
) -> DataFrame:
    """Add the namespace columns of each window a record belongs to.

    Sliding windows give a record several rows, one per window (as Beam processes an
    element once per window it is in). A null event time, or one outside
    :func:`time_range`, gives one row with null namespace columns (Spark's ``window()``
    would drop it). Records where ``single`` holds
    (records the router will call invalid) get one row, in their latest window, rather
    than one per sliding window.
    """
    column = F.col(quoted(time_column))
    if not isinstance(df.schema[time_column].dataType, T.TimestampType):
        column = column.cast("timestamp")
    low, high = time_range(window)
    raw = F.unix_micros(column)
    inside = (raw >= F.lit(_micros(low - EPOCH))) & (raw <= F.lit(_micros(high - EPOCH)))
    micros = F.when(inside, raw)
    slide, size, offset = _micros(window.slide), _micros(window.size), _micros(window.offset)
    last = micros - F.pmod(micros - F.lit(offset), F.lit(slide))
    count = size // slide
    if count == 1:
        start = last
        framed = df.withColumn(NS_START, F.timestamp_micros(start))
    else:
        starts = F.array(*[last - F.lit(i * slide) for i in range(count - 1, -1, -1)])
        one = micros.isNull() if single is None else micros.isNull() | single
        starts = F.when(one, F.array(last)).otherwise(starts)
        exploded = df.withColumn(NS_START, F.explode(starts))
        framed = exploded.withColumn(NS_START, F.timestamp_micros(F.col(NS_START)))
    return framed.withColumn(
        NS_END, F.timestamp_micros(F.unix_micros(F.col(NS_START)) + F.lit(size))
    )


def global_namespace() -> dict[str, Column]:
    """The namespace columns of a record in the global namespace (no window)."""
    return {NS_START: F.lit(None).cast("timestamp"), NS_END: F.lit(None).cast("timestamp")}


def assign_global(df: DataFrame) -> DataFrame:
    return df.withColumns(global_namespace())


def namespace_id_column(start: Column) -> Column:
    """Spark expression of :func:`namespace_id` (must agree with it exactly)."""
    whole = F.date_format(start, "yyyy-MM-dd'T'HH:mm:ss")
    micros = F.date_format(start, "SSSSSS")
    return F.when(start.isNull(), F.lit(GLOBAL)).otherwise(
        F.when(micros == "000000", F.concat(whole, F.lit("Z"))).otherwise(
            F.concat(whole, F.lit("."), micros, F.lit("Z"))
        )
    )


def windows_between(
    window: Window, first: dt.datetime, last: dt.datetime, limit: int
) -> list[WindowSpan] | None:
    """Every window overlapping ``[first, last]`` (clamped to the times that have windows,
    see :func:`time_range`), or None when there are more than ``limit``."""
    low, high = time_range(window)
    first, last = min(max(as_utc(first), low), high), min(max(as_utc(last), low), high)
    start = windows_containing(window, first)[0][0]
    end = window_start_containing(window, last)
    count = (end - start) // window.slide + 1
    if count > limit:
        return None
    return [
        (start + i * window.slide, start + i * window.slide + window.size) for i in range(count)
    ]


def describe(window: WindowSpan | None) -> str:
    if window is None:
        return GLOBAL
    return f"[{namespace_id(window[0])}, {namespace_id(window[1])})"


def distinct_sorted(items: Iterable[str]) -> list[str]:
    return sorted(set(items), key=lambda ns: (ns != GLOBAL, ns))

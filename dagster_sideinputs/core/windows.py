"""Namespaces: the global window and event-time windows, and how main windows map to side windows.

A namespace is the scope of readiness and buffering. Non-windowed operators have
one, ``global``; windowed operators have one per main window, identified by its
start in ISO form (``2024-05-01T10:00:00Z``). Windows are half-open ``[start, end)``
and aligned to the epoch plus an offset, like Spark's ``window()``.
"""

import datetime as dt
from collections.abc import Iterable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from dagster_sideinputs.core.declarations import SideInput, Window

GLOBAL = "global"
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
LAST_INSTANT = dt.timedelta(microseconds=1)

# Columns the operator adds to main records while they are in flight.
NS_START = "_dsi_ns_start"
NS_END = "_dsi_ns_end"
NS_ID = "_dsi_ns"


def namespace_id(start: dt.datetime | None) -> str:
    """The id of the namespace of a window starting at ``start`` (``global`` for None)."""
    if start is None:
        return GLOBAL
    return as_utc(start).strftime("%Y-%m-%dT%H:%M:%S.%fZ").replace(".000000Z", "Z")


def parse_namespace_id(ns: str) -> dt.datetime | None:
    if ns == GLOBAL:
        return None
    text = ns.rstrip("Z")
    fmt = "%Y-%m-%dT%H:%M:%S.%f" if "." in text else "%Y-%m-%dT%H:%M:%S"
    return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.timezone.utc)


def as_utc(value: dt.datetime) -> dt.datetime:
    """Naive datetimes (as PySpark returns them, in the UTC session zone) become UTC."""
    return (
        value.replace(tzinfo=dt.timezone.utc)
        if value.tzinfo is None
        else value.astimezone(dt.timezone.utc)
    )


def _duration(value: dt.timedelta) -> str:
    return f"{int(value / dt.timedelta(microseconds=1))} microseconds"


def window_start_containing(window: Window, instant: dt.datetime) -> dt.datetime:
    """Start of the latest window of ``window`` that contains ``instant``."""
    instant = as_utc(instant)
    steps = (instant - EPOCH - window.offset) // window.slide
    return EPOCH + window.offset + steps * window.slide


def windows_containing(
    window: Window, instant: dt.datetime
) -> list[tuple[dt.datetime, dt.datetime]]:
    """Every window of ``window`` containing ``instant`` (one when tumbling), oldest first."""
    last = window_start_containing(window, instant)
    count = window.size // window.slide
    starts = [last - i * window.slide for i in range(count - 1, -1, -1)]
    return [(start, start + window.size) for start in starts]


def default_side_window(
    side_window: Window, main_start: dt.datetime, main_end: dt.datetime
) -> tuple[dt.datetime, dt.datetime]:
    """Beam's default mapping: the side window containing the main window's last instant.

    It covers the three cases of the side-input proposal: equal windows map one to
    one; a smaller main window maps to the side window containing it; a larger main
    window maps to the last side window inside it.
    """
    start = window_start_containing(side_window, as_utc(main_end) - LAST_INSTANT)
    return start, start + side_window.size


def map_to_side_window(
    side: SideInput, main_start: dt.datetime, main_end: dt.datetime
) -> tuple[dt.datetime, dt.datetime]:
    """The side window a main window reads, by the side input's mapping."""
    assert side.window is not None
    if side.window_mapping is not None:
        start, end = side.window_mapping(as_utc(main_start), as_utc(main_end))
        return as_utc(start), as_utc(end)
    return default_side_window(side.window, main_start, main_end)


def assign_windows(df: DataFrame, window: Window, time_column: str) -> DataFrame:
    """Add the namespace columns of each window a record belongs to.

    Sliding windows give a record several rows, one per window (as Beam processes an
    element once per window it is in). A null event time gives null namespace columns.
    """
    spec = F.window(
        F.col(time_column),
        _duration(window.size),
        _duration(window.slide),
        _duration(window.offset),
    )
    return (
        df.withColumn("_dsi_window", spec)
        .withColumn(NS_START, F.col("_dsi_window.start"))
        .withColumn(NS_END, F.col("_dsi_window.end"))
        .drop("_dsi_window")
    )


def assign_global(df: DataFrame) -> DataFrame:
    return df.withColumn(NS_START, F.lit(None).cast("timestamp")).withColumn(
        NS_END, F.lit(None).cast("timestamp")
    )


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
) -> list[tuple[dt.datetime, dt.datetime]] | None:
    """Every window overlapping ``[first, last]``, or None when there are more than ``limit``."""
    start = windows_containing(window, first)[0][0]
    end = window_start_containing(window, last)
    count = (end - start) // window.slide + 1
    if count > limit:
        return None
    return [
        (start + i * window.slide, start + i * window.slide + window.size) for i in range(count)
    ]


def describe(window: tuple[dt.datetime, dt.datetime] | None) -> str:
    if window is None:
        return GLOBAL
    return f"[{namespace_id(window[0])}, {namespace_id(window[1])})"


def distinct_sorted(items: Iterable[str]) -> list[str]:
    return sorted(set(items), key=lambda ns: (ns != GLOBAL, ns))

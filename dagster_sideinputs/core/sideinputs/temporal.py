"""Temporal (as-of) side inputs: each main record sees, for its key, the side row valid
at its event time.

A side row of key k is valid over ``[valid_from, valid_to)``:

- ``AsOf.column("valid_from")``: from the side table's column; until the next
  ``valid_from`` of key k (or the row's ``valid_to`` column with
  ``AsOf.column(..., valid_to=...)``; a null ``valid_to``: open-ended). A null
  ``valid_from`` is refused (:func:`check_side_instants`), as is a windowed side
  input's null time: the operator does not guess when such a row holds.
- ``AsOf.history()``: from the side table's own Delta history: the rows of version v are
  valid from v's commit timestamp until the next version's (a data file is valid while
  it is live, so each file is read once, however many versions kept it).

Planning pins, per as-of side input (:class:`~dagster_sideinputs.core.state.plan.AsOfPlan`),
the side data's *horizon*, the time up to which it is known: the greatest
``valid_from`` for columns, the batch clock for history (a commit made later carries a
later timestamp); and, for history, the versions the batch reads with their
timestamps. A record whose event time is after the horizon waits (in its namespace's
key-wait slot) until the horizon passes it, or until the side input's ``grace`` after
its event time has passed by the batch clock; it then sees what is known. Everything a
decision depends on is pinned, so a replay joins exactly the same rows, and a late
record gets the row of its own time, not the newest.
"""

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import Window as SparkWindow
from pyspark.sql import functions as F

from dagster_sideinputs.core.columns import quoted
from dagster_sideinputs.core.metrics import human_duration
from dagster_sideinputs.core.sideinputs.side_data import SideData, value_columns
from dagster_sideinputs.core.sideinputs.time_stats import (
    cached_max_time,
    has_times,
    max_reader,
    min_time_bound,
)
from dagster_sideinputs.core.sideinputs.windows import EPOCH, as_utc, check_time_column
from dagster_sideinputs.core.spec import BoundSide, OperatorSpec
from dagster_sideinputs.core.state.plan import AsOfPlan, BatchPlan
from dagster_sideinputs.delta.engine import DataFile, DeltaEngine, TableSnapshot
from dagster_sideinputs.errors import (
    DeclarationError,
    DuplicateKeyError,
    SideInputDataError,
    preview,
)

VALID_FROM = "_dsi_valid_from"
VALID_TO = "_dsi_valid_to"


def as_of_sides(spec: OperatorSpec) -> list[BoundSide]:
    return [b for b in spec.sides if b.side.as_of is not None]


def main_time_column(spec: OperatorSpec) -> str | None:
    """The main records' event-time column (the window's, else ``MainInput.event_time``)."""
    if spec.window is not None:
        return spec.window.time_column
    return spec.main.event_time


# --- planning ---------------------------------------------------------------------------


def earliest_time(files: Iterable[DataFile], column: str | None) -> dt.datetime | None:
    """A lower bound of the earliest event time in ``files``, from their statistics (None
    when unknown): statistics are rounded down, never up (time_stats)."""
    if column is None:
        return None
    values = []
    for file in files:
        low = min_time_bound(file, column)
        if low is None:
            if not has_times(file, column):
                continue  # empty, or only null times (invalid records)
            return None
        values.append(low)
    return min(values) if values else None


def plan_as_of(
    bound: BoundSide,
    snapshot: TableSnapshot | None,
    *,
    engine: DeltaEngine,
    spark: SparkSession | None,
    now: dt.datetime,
    earliest: dt.datetime | None,
) -> AsOfPlan:
    """The horizon (and history versions) a batch pins for one as-of side input.

    Args:
        earliest: the earliest event time of the records the batch reads (None: unknown;
            then every version the log holds is read).
    """
    as_of = bound.side.as_of
    assert as_of is not None
    if snapshot is None:
        return AsOfPlan(None)
    if not as_of.is_history:
        return AsOfPlan(_column_horizon(bound, snapshot, engine=engine, spark=spark))
    history = _monotonic(engine.commit_timestamps(bound.uri, up_to=snapshot.version))
    if not history or history[-1][0] != snapshot.version:
        history.append((snapshot.version, as_utc(snapshot.commit_timestamp)))
        history = _monotonic(history)
    if history[0][0] > 0:
        # The log no longer holds the first versions: the oldest it holds stands for them
        # (records older than it see it rather than nothing).
        history[0] = (history[0][0], EPOCH)
    first = 0
    if earliest is not None:
        for index, (_, at) in enumerate(history):
            if at <= earliest:
                first = index
    horizon = max(as_utc(now), history[-1][1])
    return AsOfPlan(horizon, tuple(history[first:]))


def _monotonic(history: Sequence[tuple[int, dt.datetime]]) -> list[tuple[int, dt.datetime]]:
    """Commit timestamps made non-decreasing (writers' clocks may disagree), as Delta's
    own time travel by timestamp does."""
    result: list[tuple[int, dt.datetime]] = []
    for version, at in sorted(history):
        stamp = as_utc(at)
        if result and stamp < result[-1][1]:
            stamp = result[-1][1]
        result.append((version, stamp))
    return result


def _column_horizon(
    bound: BoundSide,
    snapshot: TableSnapshot,
    *,
    engine: DeltaEngine,
    spark: SparkSession | None,
) -> dt.datetime | None:
    """The greatest ``valid_from``, exact to the microsecond: statistics only say which
    files may hold it (they are rounded to milliseconds, see
    :mod:`~dagster_sideinputs.core.sideinputs.time_stats`); those files are read, once per version.
    Without Spark (peeking), the statistics' upper bound."""
    as_of = bound.side.as_of
    assert as_of is not None
    column = as_of.valid_from
    assert column is not None
    check_time_column(snapshot.schema, column, where=bound.label)
    read = max_reader(engine, spark, snapshot, column, name=bound.side.asset)
    return cached_max_time(bound.uri, snapshot, column, read)


# --- routing ------------------------------------------------------------------------------


def waits_for_horizon(
    bound: BoundSide, plan: BatchPlan, time: Column
) -> tuple[Column, Column] | None:
    """(the records of a batch that wait for this side input's horizon, why)."""
    entry = plan.as_of.get(bound.name)
    if entry is None:
        return None
    grace = bound.side.grace
    stamp = time.cast("timestamp")
    if entry.horizon is None:
        beyond = stamp.isNotNull()
        known = "no validity yet"
    else:
        beyond = stamp > F.lit(entry.horizon).cast("timestamp")
        known = f"known up to {entry.horizon.isoformat()}"
    if grace is not None:
        # Final `grace` after the record's time, by the batch clock.
        beyond = beyond & (stamp > F.lit(plan.now - grace).cast("timestamp"))
    reason = F.concat(
        F.lit(f"waiting for side input {bound.name!r} to reach "),
        F.date_format(stamp, "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"),
        F.lit(
            f" ({known}"
            + (f"; final {human_duration(grace)} after the record's time)" if grace else ")")
        ),
    )
    return beyond, reason


# --- side rows ----------------------------------------------------------------------------


def temporal_rows(data: SideData, entry: AsOfPlan | None) -> DataFrame:
    """The side rows with their validity columns :data:`VALID_FROM` / :data:`VALID_TO`
    (timestamps; a null ``VALID_TO`` is open-ended)."""
    as_of = data.side.as_of
    assert as_of is not None
    key = data.side.key
    assert key is not None
    if as_of.is_history:
        return _history_rows(data, entry)
    assert as_of.valid_from is not None
    schema = data.schema()
    check_time_column(schema, as_of.valid_from, where=data.bound.label)
    rows = data.rows(None)
    start = F.col(quoted(as_of.valid_from)).cast("timestamp")
    rows = rows.withColumn(VALID_FROM, start)
    if as_of.valid_to is not None:
        check_time_column(schema, as_of.valid_to, where=data.bound.label)
        return rows.withColumn(VALID_TO, F.col(quoted(as_of.valid_to)).cast("timestamp"))
    if data.side.pick is not None:
        rows = _picked(data, rows)
    # Until the key's next row starts; rows starting together leave an empty interval
    # to all but the last, which the duplicate check reports first.
    following = SparkWindow.partitionBy(F.col(quoted(key))).orderBy(F.col(VALID_FROM))
    return rows.withColumn(VALID_TO, F.lead(F.col(VALID_FROM)).over(following))


def _picked(data: SideData, rows: DataFrame) -> DataFrame:
    """One row per (key, valid_from): the greatest ``pick`` (ties broken by the row)."""
    side = data.side
    assert side.key is not None
    assert side.pick is not None
    names = value_columns(data.schema())
    if side.pick not in names:
        raise DeclarationError(
            f"{data.bound.label}: pick={side.pick!r} is not a column of the side table."
        )
    value = F.struct(*[F.col(quoted(n)) for n in names])
    order = F.struct(F.col(quoted(side.pick)), value)
    best = rows.groupBy(F.col(quoted(side.key)), F.col(VALID_FROM)).agg(
        F.max_by(value, order).alias("_dsi_row")
    )
    return best.select(*[F.col(f"_dsi_row.{quoted(n)}").alias(n) for n in names], VALID_FROM)


def _history_rows(data: SideData, entry: AsOfPlan | None) -> DataFrame:
    if entry is None or not entry.versions:
        raise DeclarationError(f"{data.bound.label}: the batch plan pins no history versions.")
    engine, bound = data.engine, data.bound
    snapshots = [
        engine.snapshot(bound.uri, version=version, name=bound.side.asset)
        for version, _ in entry.versions
    ]
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    chosen: dict[str, DataFile] = {}
    for index, snapshot in enumerate(snapshots):
        for file in snapshot.files:
            first.setdefault(file.path, index)
            last[file.path] = index
            chosen.setdefault(file.path, file)
    groups: dict[tuple[int, int], list[DataFile]] = {}
    for path, file in chosen.items():
        groups.setdefault((first[path], last[path]), []).append(file)
    times = [at for _, at in entry.versions]
    frames = []
    for (start, end), files in sorted(groups.items()):
        frame = engine.read_snapshot(
            data.spark, snapshots[start], files=files, name=bound.side.asset
        )
        until = times[end + 1] if end + 1 < len(times) else None
        frames.append(
            frame.withColumn(VALID_FROM, F.lit(times[start]).cast("timestamp")).withColumn(
                VALID_TO, F.lit(until).cast("timestamp")
            )
        )
    if not frames:
        schema = snapshots[-1].schema
        empty = data.spark.createDataFrame([], schema)
        return empty.withColumn(VALID_FROM, F.lit(None).cast("timestamp")).withColumn(
            VALID_TO, F.lit(None).cast("timestamp")
        )
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame, allowMissingColumns=True)
    return result


def overlaps(rows: DataFrame, key: str) -> DataFrame:
    """Keys with two rows valid at the same time (listed when a batch fails on them)."""
    order = SparkWindow.partitionBy(F.col(quoted(key))).orderBy(
        F.col(VALID_FROM).asc_nulls_first(), F.col(VALID_TO).asc_nulls_last()
    )
    following = F.lead(F.col(VALID_FROM)).over(order)
    following_exists = F.lead(F.lit(1)).over(order).isNotNull()
    clash = following_exists & (
        F.col(VALID_TO).isNull()
        | following.isNull()
        | (following < F.col(VALID_TO))
        | (following == F.col(VALID_FROM))
    )
    flagged = rows.select(F.col(quoted(key)), VALID_FROM, VALID_TO).withColumn("_dsi_clash", clash)
    return flagged.filter(F.col("_dsi_clash")).select(
        F.col(quoted(key)), F.col(VALID_FROM).alias("valid_from")
    )


def overlap_error(bound: BoundSide, found: Sequence[Any], version: int | None) -> DuplicateKeyError:
    shown = [tuple(row) for row in found]
    return DuplicateKeyError(
        f"{bound.label} is an as-of map but holds several rows valid at the same time for "
        f"(key, valid_from) {preview(shown)} at version {version}. Nothing was written.",
        fix="give each key one row per validity start (and non-overlapping valid_to), or "
        "pick one with SideInput.map(..., as_of=..., pick='<column, greatest wins>')",
    )


def _final_after(grace: dt.timedelta | None) -> str:
    return f"; final {human_duration(grace)} after the record's time)" if grace else ")"


# --- null instants ------------------------------------------------------------------------


def instant_column(bound: BoundSide) -> str | None:
    """The side column holding each row's instant: an as-of map's ``valid_from``, a
    windowed side input's time column (None: the side rows have no instant)."""
    side = bound.side
    if side.as_of is not None:
        return side.as_of.valid_from
    if side.window is not None:
        return side.window.time_column
    return None


def check_side_instants(data: SideData) -> None:
    """A side row without an instant (a null ``valid_from`` or window time) is refused:
    it would be valid at no time, or at every time (several rows of one key valid at
    once), or in no window; the operator does not guess. Statistics (null counts) spare
    the read when no file may hold a null; otherwise only the files that may are read.

    Raises:
        SideInputDataError: naming the side input, the column and some of the rows' keys.
    """
    column = instant_column(data.bound)
    snapshot = data.snapshot
    if column is None or snapshot is None:
        return
    check_time_column(snapshot.schema, column, where=data.bound.label)
    files = [
        f
        for f in snapshot.files
        if f.num_records != 0 and (f.null_count.get(column) is None or f.null_count[column] > 0)
    ]
    if not files:
        return
    side = data.side
    shown = F.col(quoted(side.key)) if side.key is not None else F.lit(None)
    frame = data.engine.read_snapshot(data.spark, snapshot, files=files, name=side.asset)
    found = frame.filter(F.col(quoted(column)).isNull()).select(shown).limit(6).collect()
    if not found:
        return
    keys = preview([row[0] for row in found]) if side.key is not None else ""
    what = f"for key(s) {keys} " if side.key is not None else ""
    kind = "valid_from" if side.as_of is not None else "time column"
    means = (
        "a row's validity needs a start: a null would make it valid at no time, or at "
        "every time alongside the key's other rows"
        if side.as_of is not None
        else "a row with no time falls in no side window"
    )
    since = (
        " (for 'since always', the earliest time, e.g. TIMESTAMP '0001-01-01 00:00:00')"
        if side.as_of is not None
        else ""
    )
    raise SideInputDataError(
        f"{data.bound.label}: its {kind} {column!r} is null {what}at version "
        f"{data.version}; {means}. Nothing was written.",
        fix=f"give those rows a {column!r}{since}, or delete them from side table "
        f"{side.asset!r} (DELETE ... WHERE {column} IS NULL)",
    )

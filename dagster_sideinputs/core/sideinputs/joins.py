"""Attaching side views to main records: :func:`build_join` decides how a view joins
(window, forward value, key, or an as-of validity range) and :func:`apply_join` left-joins
it; :func:`duplicate_error` reports a view holding several rows where it promises one.

An ``as_of`` map joins each record with the row of its key valid at its event time
(:mod:`~dagster_sideinputs.core.sideinputs.temporal`): an equi-join on the key with a range
condition on the validity columns. Views that promise one row per key (maps,
singletons) are checked before anything is written.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from dagster_sideinputs.core.columns import (
    KAFKA_BUCKET,
    SIDE_NS,
    forward_key,
    matched,
    quoted,
    side_key,
)
from dagster_sideinputs.core.sideinputs.join_keys import main_key
from dagster_sideinputs.core.sideinputs.side_data import SideData
from dagster_sideinputs.core.sideinputs.temporal import (
    VALID_FROM,
    VALID_TO,
    overlap_error,
    overlaps,
    temporal_rows,
)
from dagster_sideinputs.core.sideinputs.views import (
    MapView,
    has_join_relation,
    value_struct,
    view_of,
)
from dagster_sideinputs.core.sideinputs.windows import WindowSpan
from dagster_sideinputs.core.sources.kafka.keyed import bucket_of, key_bytes, murmur2_partition
from dagster_sideinputs.core.spec import BoundSide
from dagster_sideinputs.core.state.plan import AsOfPlan
from dagster_sideinputs.errors import (
    DeclarationError,
    DuplicateKeyError,
    SideInputError,
    SingletonCardinalityError,
    did_you_mean,
    preview,
)


@dataclass
class JoinSpec:
    """How one view attaches to main records.

    Attributes:
        view: DataFrame with the join key columns (``keys``) and the value column
            (named after the side input); one row per join key.
        main_keys: main-record expressions, in the order of ``keys``.
        keys: the view's join key column names.
        empty_value: the value column for records without a match.
        broadcast: hint the view for a broadcast join.
        matched: column name set to true on matched records (per-key waiting).
        duplicates: builds the DataFrame of the join keys holding several rows where the
            view promises one (a map, a singleton): the check of one row per key in
            Spark, and the keys listed when the batch fails on them. Built only when
            asked: most batches check their keys on the driver and never need it.
        valid: as-of maps: the view's validity columns (from, to) and the main records'
            event time; a row matches when ``from <= time < to`` (a null bound is open).
        checked_first: the view holds the side rows as they are (no aggregation), so
            ``duplicates`` must be checked empty before any Spark job reads the join.
        key_columns: a checked-first view's join keys, as expressions over the side
            rows (the check reads them on the driver when the table is small).
        key_names: the side table's columns those keys are, when each is one (not for a
            windowed view, whose window is computed): the engine may read them itself.
    """

    view: DataFrame
    main_keys: list[Column]
    keys: list[str]
    empty_value: Column | None
    broadcast: bool
    matched: str
    duplicates: Callable[[], DataFrame] | None = None
    valid: tuple[str, str, Column] | None = None
    checked_first: bool = False
    key_columns: tuple[Column, ...] = ()
    key_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Bucketing:
    """Main records of a pre-keyed Kafka topic: bucketed by Kafka's partitioner on
    ``main_key`` into ``partitions`` (see :mod:`~dagster_sideinputs.core.sources.kafka.keyed`)."""

    partitions: int
    main_key: str


def build_join(
    data: SideData,
    main: DataFrame,
    *,
    windows: Sequence[WindowSpan] | None,
    main_side_ns: Column,
    bucketing: Bucketing | None = None,
    event_time: str | None = None,
    as_of: AsOfPlan | None = None,
    check_first: bool = False,
) -> JoinSpec | None:
    """The join that attaches a view to main records, or None when the view is not joined
    (a non-windowed list, singleton, or map without a key relation: ``sides[name]``).

    Args:
        windows: the side windows released records read (windowed side inputs).
        main_side_ns: main-record expression of the side window it reads.
        event_time: the main records' event-time column (as-of maps).
        as_of: what the batch pinned for an as-of map.
        check_first: the caller checks one row per key before any job reads the join
            (the batch reads ready side data only): a map then joins its rows as they
            are, without aggregating them per key.
    """
    side, bound = data.side, data.bound
    view = view_of(side)
    forward = side.distribution == "forwarded"
    windowed = side.window is not None
    joins_by_key = view.keyed and has_join_relation(side, main.columns)
    if not (joins_by_key or forward or windowed or side.as_of is not None):
        return None
    if bound.name in main.columns:
        raise DeclarationError(
            f"{bound.label} would be joined as column {bound.name!r}, which main records "
            "already have.",
            fix="rename the side input in side_inputs={...}",
        )
    if side.as_of is not None:
        return _as_of_join(data, main, event_time, as_of)
    rows = data.rows(windows if windowed else None)
    schema = data.schema()
    keys: list[str] = []
    main_keys: list[Column] = []
    group: list[Column] = []
    if windowed:
        keys.append(SIDE_NS)
        main_keys.append(main_side_ns)
        group.append(F.col(SIDE_NS))
    names: list[str] = []
    if forward:
        column = side.forward_column
        assert column is not None
        for where, columns in (("side table", schema.fieldNames()), ("main input", main.columns)):
            if column not in columns:
                raise DeclarationError(
                    f"{bound.label} is forwarded on {column!r}, which the {where} lacks."
                    f"{did_you_mean(column, columns)}"
                )
        keys.append(forward_key(bound.name))
        main_keys.append(F.col(quoted(column)))
        group.append(F.col(quoted(column)).alias(forward_key(bound.name)))
        names.append(column)
    if joins_by_key:
        data.check_key_column()
        assert side.key is not None
        expr = main_key(bound, main, schema[side.key].dataType)
        keys.append(side_key(bound.name))
        main_keys.append(expr)
        group.append(F.col(quoted(side.key)).alias(side_key(bound.name)))
        names.append(side.key)
    plain = False
    duplicates: Callable[[], DataFrame] | None
    if windowed and view.keyed and not joins_by_key and not forward:
        aggregated, found, empty = view.aggregate_window(data, rows, group, keys)
        duplicates = None if found is None else _ready(found)
    elif check_first and isinstance(view, MapView) and side.pick is None:
        aggregated, duplicates = view.as_rows(data, rows, group, keys)
        empty, plain = None, True
    else:
        aggregated, found, empty = view.aggregate(data, rows, group, keys)
        duplicates = None if found is None else _ready(found)
    joined = aggregated.withColumn(matched(bound.name), F.lit(True))
    # Explicit broadcast, or a view without a key (per window / per forward value).
    broadcast = side.distribution == "broadcast" or (side.distribution is None and not joins_by_key)
    if joins_by_key and not broadcast and bucketing is not None:
        joined = _bucketed(bound, joined, main, bucketing, keys, main_keys)
    return JoinSpec(
        joined,
        main_keys,
        keys,
        empty,
        broadcast,
        matched(bound.name),
        duplicates,
        checked_first=plain,
        key_columns=tuple(group) if plain else (),
        key_names=tuple(names) if plain and not windowed else (),
    )


def _bucketed(
    bound: BoundSide,
    view: DataFrame,
    main: DataFrame,
    bucketing: Bucketing,
    keys: list[str],
    main_keys: list[Column],
) -> DataFrame:
    """Join a keyed view on the main records' Kafka bucket too, so that Spark shuffles the
    side rows to the main records' partitions instead of shuffling the main records.

    Only when the view is joined on the main key itself, of the same type: the side
    rows' bucket comes from the string form of their key, which is then the Kafka key of
    the main records they match.
    """
    side = bound.side
    column = side_key(bound.name)
    same_key = side.key == bucketing.main_key and side.key_translator in (None, side.key)
    if not same_key or KAFKA_BUCKET not in main.columns:
        return view
    if main.schema[bucketing.main_key].dataType != view.schema[column].dataType:
        return view
    name = f"_dsi_bucket_{bound.name}"
    partition = murmur2_partition(
        key_bytes(column, view.schema[column].dataType), bucketing.partitions
    )
    # First, so that the key stays the last join key (row mode's lookups read it there).
    keys.insert(0, name)
    main_keys.insert(0, F.col(KAFKA_BUCKET))
    return view.withColumn(name, bucket_of(partition, bucketing.partitions))


def _as_of_join(
    data: SideData, main: DataFrame, event_time: str | None, entry: AsOfPlan | None
) -> JoinSpec:
    """An as-of map: the rows of the record's key, joined where ``valid_from <= time <
    valid_to``; at most one row is valid at a time (overlaps are checked before writing)."""
    side, bound = data.side, data.bound
    if not has_join_relation(side, main.columns):
        raise DeclarationError(
            f"{bound.label} is an as-of map, which joins each record by key, but main records "
            f"have no column {side.key!r} and it declares no key_translator.",
            fix="pass key_translator=<main column or expression giving the side key>",
        )
    if event_time is None:
        raise DeclarationError(f"{bound.label} needs the main records' event time.")
    data.check_key_column()
    assert side.key is not None
    schema = data.schema()
    expr = main_key(bound, main, schema[side.key].dataType)
    rows = temporal_rows(data, entry)
    valid_from, valid_to = f"{VALID_FROM}_{bound.name}", f"{VALID_TO}_{bound.name}"
    view = rows.select(
        F.col(quoted(side.key)).alias(side_key(bound.name)),
        value_struct(schema).alias(bound.name),
        F.col(VALID_FROM).alias(valid_from),
        F.col(VALID_TO).alias(valid_to),
        F.lit(True).alias(matched(bound.name)),
    )
    as_of = side.as_of
    assert as_of is not None
    if as_of.is_history or as_of.valid_to is not None:
        duplicates: DataFrame | None = overlaps(rows, side.key)
    elif side.pick is None:
        # Validity ends where the key's next row starts: two rows starting together
        # leave the first an empty interval (no second pass over the rows needed).
        duplicates = rows.filter(F.col(VALID_TO) == F.col(VALID_FROM)).select(
            F.col(quoted(side.key)), F.col(VALID_FROM).alias("valid_from")
        )
    else:
        duplicates = None  # pick= kept one row per (key, valid_from)
    return JoinSpec(
        view,
        [expr],
        [side_key(bound.name)],
        None,
        side.distribution == "broadcast",
        matched(bound.name),
        None if duplicates is None else _ready(duplicates),
        (valid_from, valid_to, F.col(quoted(event_time)).cast("timestamp")),
    )


def _ready(frame: DataFrame) -> Callable[[], DataFrame]:
    """A DataFrame already built, as :attr:`JoinSpec.duplicates` holds it."""
    return lambda: frame


def apply_join(main: DataFrame, spec: JoinSpec, name: str) -> DataFrame:
    """Left-join a view to main records; unmatched records get the view's empty value."""
    aliases = [f"_dsi_mk_{name}_{i}" for i in range(len(spec.keys))]
    # One projection per step (each DataFrame call is a plan analysed on the driver).
    keyed = main.withColumns(dict(zip(aliases, spec.main_keys, strict=True)))
    view = F.broadcast(spec.view) if spec.broadcast else spec.view
    condition = [keyed[alias] == view[key] for alias, key in zip(aliases, spec.keys, strict=True)]
    dropped = [*aliases, *spec.keys]
    if spec.valid is not None:
        valid_from, valid_to, time = spec.valid
        alias = f"_dsi_mt_{name}"
        keyed = keyed.withColumn(alias, time)
        start, end, at = view[valid_from], view[valid_to], keyed[alias]
        # A null start is refused before anything is written (check_side_instants).
        condition.append((start <= at) & (end.isNull() | (at < end)))
        dropped += [alias, valid_from, valid_to]
    joined = keyed.join(view, condition, "left").drop(*dropped)
    filled = {spec.matched: F.coalesce(F.col(spec.matched), F.lit(False))}
    if spec.empty_value is not None:
        filled[name] = F.coalesce(F.col(quoted(name)), spec.empty_value)
    return joined.withColumns(filled)


def duplicate_error(bound: BoundSide, spec: JoinSpec, version: int | None) -> SideInputError:
    """The error for a map (or singleton) holding several rows where it promises one."""
    assert spec.duplicates is not None
    offenders = spec.duplicates().limit(6).collect()
    if bound.side.as_of is not None:
        return overlap_error(bound, offenders, version)
    shown = [tuple(row) if len(row) > 1 else row[0] for row in offenders]
    if bound.side.view == "singleton":
        return SingletonCardinalityError(
            f"{bound.label} is a singleton but holds more than one row for namespace(s) "
            f"{preview(shown)} at version {version}. Nothing was written.",
            fix="make the side asset produce one row per window, or declare it a list",
        )
    return DuplicateKeyError(
        f"{bound.label} is a map but holds several rows for key(s) {preview(shown)} "
        f"at version {version}. Nothing was written.",
        fix="deduplicate the side asset, declare SideInput.multimap(...), or pick one row "
        "per key with SideInput.map(..., pick='<column, greatest wins>')",
    )

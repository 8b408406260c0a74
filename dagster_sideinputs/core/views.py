"""Side input views: what a main record sees of a side input, one class per view kind.

- :class:`MapView` (key -> one row): joined to each main record as a struct column
  named after the side input (null when the key has no row).
- :class:`MultimapView` (key -> all rows): joined as an array column (empty when none).
- :class:`SingletonView` (one row): a Python value in ``sides[name]`` when there is one
  namespace, a struct column per window when the side input is windowed.
- :class:`ListView` (all rows): a DataFrame in ``sides[name]``, or an array column when
  ``forwarded`` (the rows sharing the record's ``forward_column`` value).

Windowed side inputs give each record the view of *its own* side window (Beam's
per-window side inputs), found with the operator's window mapping (custom ones
included): a singleton's row, a list's rows (a sorted array column), and for a map or
multimap without a key relation the window's whole map (a map column key -> row, or key
-> sorted rows). A ready window without rows gives the view's empty value.

An ``as_of`` map joins each record with the row of its key valid at its event time
(:mod:`~dagster_sideinputs.core.temporal`): an equi-join on the key with a range
condition on the validity columns.

Side rows are read at the batch's pinned version (:mod:`~dagster_sideinputs.core.side_data`)
and joined by :func:`build_join` / :func:`apply_join`. Views that promise one row per
key (maps, singletons) are checked before anything is written.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.columns import (
    DUPLICATE_MARK,
    SIDE_NS,
    forward_key,
    matched,
    quoted,
    side_key,
)
from dagster_sideinputs.core.plan import AsOfPlan
from dagster_sideinputs.core.side_data import SideData, value_columns
from dagster_sideinputs.core.side_inputs import SideInput
from dagster_sideinputs.core.spec import BoundSide
from dagster_sideinputs.core.temporal import (
    VALID_FROM,
    VALID_TO,
    overlap_error,
    overlaps,
    temporal_rows,
)
from dagster_sideinputs.core.windows import GLOBAL, WindowSpan, namespace_id
from dagster_sideinputs.errors import (
    DeclarationError,
    DuplicateKeyError,
    SideInputError,
    SingletonCardinalityError,
    did_you_mean,
    preview,
)

_NUMERIC = (
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.DecimalType,
    T.FloatType,
    T.DoubleType,
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
        duplicates: the join keys holding several rows where the view promises one (a
            map, a singleton); listed only when the batch fails on them.
        valid: as-of maps: the view's validity columns (from, to) and the main records'
            event time; a row matches when ``from <= time < to`` (a null bound is open).
    """

    view: DataFrame
    main_keys: list[Column]
    keys: list[str]
    empty_value: Column | None
    broadcast: bool
    matched: str
    duplicates: DataFrame | None = None
    valid: tuple[str, str, Column] | None = None


def _struct_of(schema: T.StructType) -> Column:
    return F.struct(*[F.col(quoted(name)) for name in value_columns(schema)])


def orderable(data_type: T.DataType) -> bool:
    """Whether Spark can sort values of this type (maps cannot be compared)."""
    if isinstance(data_type, T.MapType):
        return False
    if isinstance(data_type, T.StructType):
        return all(orderable(f.dataType) for f in data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return orderable(data_type.elementType)
    return True


def _element_type(schema: T.StructType) -> T.StructType:
    return T.StructType([f for f in schema.fields if not f.name.startswith("_dsi_")])


class View:
    """What one view kind does: how its rows aggregate per join key, and its empty value."""

    kind: ClassVar[str]
    keyed: ClassVar[bool] = False
    one_per_key: ClassVar[bool] = False

    def aggregate(
        self, data: SideData, rows: DataFrame, group: list[Column], keys: list[str]
    ) -> tuple[DataFrame, DataFrame | None, Column | None]:
        """(one row per join key with the value column, the duplicated keys, empty value)."""
        raise NotImplementedError

    def aggregate_window(
        self, data: SideData, rows: DataFrame, group: list[Column], keys: list[str]
    ) -> tuple[DataFrame, DataFrame | None, Column | None]:
        """A map / multimap without a key relation, per side window: the window's whole
        view as a map column (key -> row, or key -> sorted rows)."""
        side, name = data.side, data.bound.name
        assert side.key is not None
        data.check_key_column()
        entry = "_dsi_entry_key"
        # Spark maps cannot hold a null key; such rows cannot be looked up anyway.
        rows = rows.filter(F.col(quoted(side.key)).isNotNull())
        per_key, duplicates, _ = self.aggregate(
            data, rows, [*group, F.col(quoted(side.key)).alias(entry)], [*keys, entry]
        )
        pairs = F.collect_list(F.struct(F.col(entry), F.col(quoted(name))))
        element = _element_type(data.schema())
        if orderable(element):
            pairs = F.array_sort(pairs)  # a stable entry order, so replays write the same
        aggregated = per_key.groupBy(*[F.col(k) for k in keys]).agg(
            F.map_from_entries(pairs).alias(name)
        )
        key_type = data.schema()[side.key].dataType
        value_type: T.DataType = T.ArrayType(element) if self.kind == "multimap" else element
        empty = F.map_from_arrays(
            F.array().cast(T.ArrayType(key_type)), F.array().cast(T.ArrayType(value_type))
        )
        return aggregated, duplicates, empty

    def _unique(
        self, data: SideData, rows: DataFrame, group: list[Column], keys: list[str]
    ) -> tuple[DataFrame, DataFrame]:
        """One value per key, failing inside Spark (and listing the keys) on a duplicate."""
        value = _struct_of(data.schema())
        counted = rows.groupBy(*group).agg(
            F.first(value).alias("_dsi_value"), F.count(F.lit(1)).alias("_dsi_count")
        )
        guarded = F.when(
            F.col("_dsi_count") > 1, F.raise_error(F.lit(f"{DUPLICATE_MARK}:{data.bound.name}"))
        ).otherwise(F.col("_dsi_value"))
        aggregated = counted.select(*keys, guarded.alias(data.bound.name))
        return aggregated, counted.filter(F.col("_dsi_count") > 1).select(*keys)

    def _collected(
        self, data: SideData, rows: DataFrame, group: list[Column]
    ) -> tuple[DataFrame, DataFrame | None, Column | None]:
        element = _element_type(data.schema())
        collected = F.collect_list(_struct_of(data.schema()))
        if orderable(element):
            collected = F.array_sort(collected)  # a stable order, so replays agree
        aggregated = rows.groupBy(*group).agg(collected.alias(data.bound.name))
        return aggregated, None, F.array().cast(T.ArrayType(element))


class SingletonView(View):
    kind = "singleton"
    one_per_key = True

    def aggregate(
        self, data: SideData, rows: DataFrame, group: list[Column], keys: list[str]
    ) -> tuple[DataFrame, DataFrame | None, Column | None]:
        aggregated, duplicates = self._unique(data, rows, group, keys)
        return aggregated, duplicates, _default_struct(data.side.default, data.schema())


class ListView(View):
    kind = "list"

    def aggregate(
        self, data: SideData, rows: DataFrame, group: list[Column], keys: list[str]
    ) -> tuple[DataFrame, DataFrame | None, Column | None]:
        return self._collected(data, rows, group)


class MapView(View):
    kind = "map"
    keyed = True
    one_per_key = True

    def aggregate(
        self, data: SideData, rows: DataFrame, group: list[Column], keys: list[str]
    ) -> tuple[DataFrame, DataFrame | None, Column | None]:
        side, schema = data.side, data.schema()
        if side.pick is None:
            aggregated, duplicates = self._unique(data, rows, group, keys)
            return aggregated, duplicates, None
        if side.pick not in schema.fieldNames():
            raise DeclarationError(
                f"{data.bound.label}: pick={side.pick!r} is not a column of the side table."
                f"{did_you_mean(side.pick, schema.fieldNames())}"
            )
        # Ties on the pick column are broken by the whole row, so replays agree.
        value = _struct_of(schema)
        order = F.col(quoted(side.pick))
        if orderable(_element_type(schema)):
            order = F.struct(order, value)
        aggregated = rows.groupBy(*group).agg(F.max_by(value, order).alias(data.bound.name))
        return aggregated, None, None


class MultimapView(View):
    kind = "multimap"
    keyed = True

    def aggregate(
        self, data: SideData, rows: DataFrame, group: list[Column], keys: list[str]
    ) -> tuple[DataFrame, DataFrame | None, Column | None]:
        return self._collected(data, rows, group)


VIEWS: dict[str, View] = {
    view.kind: view for view in (SingletonView(), ListView(), MapView(), MultimapView())
}


def view_of(side: SideInput) -> View:
    return VIEWS[side.view]


def empty_namespaces(data: SideData, windows: Sequence[WindowSpan] | None) -> list[str]:
    """The side namespaces in play (the given windows, or ``global``) holding no rows."""
    counts = data.window_counts(windows)
    wanted = [GLOBAL] if windows is None else [namespace_id(start) for start, _ in windows]
    return [ns for ns in wanted if counts.get(ns, 0) == 0]


def has_join_relation(side: SideInput, main_columns: Sequence[str]) -> bool:
    """Whether a map/multimap view joins main records by key: through a key translator,
    or because main records have a column named like the side key. Otherwise the
    function gets the whole view."""
    return side.key_translator is not None or side.key in main_columns


def _resolve_main_key(bound: BoundSide, main: DataFrame) -> Column:
    """The main-record expression giving the side key: the translator, or the same column."""
    translator = bound.side.key_translator
    if translator is None:
        assert bound.side.key is not None
        return F.col(quoted(bound.side.key))
    if isinstance(translator, str):
        if translator not in main.columns:
            raise DeclarationError(
                f"The key_translator of {bound.label} names column {translator!r}, which main "
                f"records do not have.{did_you_mean(translator, main.columns)}",
                fix="name a column of the main input, or pass a Column expression",
            )
        return F.col(quoted(translator))
    if isinstance(translator, Column):
        return translator
    try:
        result = translator(main)
    except SideInputError:
        raise
    except Exception as exc:
        raise DeclarationError(
            f"The key_translator of {bound.label} failed: {type(exc).__name__}: {exc}",
            fix="make it a function of the main DataFrame returning a Column, e.g. "
            "lambda main: F.upper(main.currency)",
        ) from exc
    if not isinstance(result, Column):
        raise DeclarationError(
            f"The key_translator of {bound.label} returned {type(result).__name__}, not a Column.",
            fix="return a Column, e.g. lambda main: F.upper(main.currency)",
        )
    return result


_INTEGRAL_WIDTH: dict[type[T.DataType], int] = {
    T.ByteType: 1,
    T.ShortType: 2,
    T.IntegerType: 4,
    T.LongType: 8,
}


def _widens(main: T.DataType, side: T.DataType) -> bool:
    """Whether every value of the main key type is exactly a value of the side key type."""
    main_width, side_width = _INTEGRAL_WIDTH.get(type(main)), _INTEGRAL_WIDTH.get(type(side))
    if main_width is not None and side_width is not None:
        return main_width <= side_width
    if isinstance(side, T.DoubleType):
        return isinstance(main, T.FloatType) or (main_width is not None and main_width <= 4)
    if isinstance(side, T.DecimalType) and main_width is not None:
        return side.precision - side.scale >= {1: 3, 2: 5, 4: 10, 8: 19}[main_width]
    return False


def _cast_main_key(
    bound: BoundSide, expr: Column, main: DataFrame, side_type: T.DataType
) -> Column:
    try:
        main_type = main.select(expr.alias("k")).schema["k"].dataType
    except Exception as exc:
        raise DeclarationError(
            f"{bound.label}: the main-record key expression cannot be evaluated on the main "
            f"input: {str(exc).splitlines()[0][:300]}",
            fix="fix key_translator= (or the main input's key column)",
        ) from exc
    if main_type == side_type:
        return expr
    if isinstance(main_type, _NUMERIC) and isinstance(side_type, _NUMERIC):
        if _widens(main_type, side_type):
            return expr.cast(side_type)
        # A cast that may lose the value (10.5 -> 10, or an overflow, an error under ANSI)
        # would match the wrong side row: a main key that does not survive the round trip
        # has no side row.
        narrowed = expr.try_cast(side_type)
        return F.when(narrowed.cast(main_type) == expr, narrowed)
    if isinstance(main_type, T.StringType | T.DateType | T.TimestampType) and type(
        main_type
    ) is type(side_type):
        return expr
    raise DeclarationError(
        f"{bound.label}: main records give a {main_type.simpleString()} key but the side key "
        f"{bound.side.key!r} is {side_type.simpleString()}; they would never match.",
        fix=f"pass key_translator=F.col(...).cast('{side_type.simpleString()}')",
    )


def build_join(
    data: SideData,
    main: DataFrame,
    *,
    windows: Sequence[WindowSpan] | None,
    main_side_ns: Column,
    event_time: str | None = None,
    as_of: AsOfPlan | None = None,
) -> JoinSpec | None:
    """The join that attaches a view to main records, or None when the view is not joined
    (a non-windowed list, singleton, or map without a key relation: ``sides[name]``).

    Args:
        windows: the side windows released records read (windowed side inputs).
        main_side_ns: main-record expression of the side window it reads.
        event_time: the main records' event-time column (as-of maps).
        as_of: what the batch pinned for an as-of map.
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
    if joins_by_key:
        data.check_key_column()
        assert side.key is not None
        expr = _cast_main_key(
            bound, _resolve_main_key(bound, main), main, schema[side.key].dataType
        )
        keys.append(side_key(bound.name))
        main_keys.append(expr)
        group.append(F.col(quoted(side.key)).alias(side_key(bound.name)))
    if windowed and view.keyed and not joins_by_key and not forward:
        aggregated, duplicates, empty = view.aggregate_window(data, rows, group, keys)
    else:
        aggregated, duplicates, empty = view.aggregate(data, rows, group, keys)
    joined = aggregated.withColumn(matched(bound.name), F.lit(True))
    # Explicit broadcast, or a view without a key (per window / per forward value).
    broadcast = side.distribution == "broadcast" or (side.distribution is None and not joins_by_key)
    return JoinSpec(joined, main_keys, keys, empty, broadcast, matched(bound.name), duplicates)


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
    expr = _cast_main_key(bound, _resolve_main_key(bound, main), main, schema[side.key].dataType)
    rows = temporal_rows(data, entry)
    valid_from, valid_to = f"{VALID_FROM}_{bound.name}", f"{VALID_TO}_{bound.name}"
    view = rows.select(
        F.col(quoted(side.key)).alias(side_key(bound.name)),
        _struct_of(schema).alias(bound.name),
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
        duplicates,
        (valid_from, valid_to, F.col(quoted(event_time)).cast("timestamp")),
    )


def _default_struct(default: Any, schema: T.StructType) -> Column | None:
    if default is None:
        return None
    values = default.asDict() if isinstance(default, Row) else dict(default)
    return F.struct(
        *[
            F.lit(values.get(f.name)).cast(f.dataType).alias(f.name)
            for f in schema.fields
            if not f.name.startswith("_dsi_")
        ]
    )


def apply_join(main: DataFrame, spec: JoinSpec, name: str) -> DataFrame:
    """Left-join a view to main records; unmatched records get the view's empty value."""
    aliases = [f"_dsi_mk_{name}_{i}" for i in range(len(spec.keys))]
    keyed = main
    for alias, expr in zip(aliases, spec.main_keys, strict=True):
        keyed = keyed.withColumn(alias, expr)
    view = F.broadcast(spec.view) if spec.broadcast else spec.view
    condition = [keyed[alias] == view[key] for alias, key in zip(aliases, spec.keys, strict=True)]
    dropped = [*aliases, *spec.keys]
    if spec.valid is not None:
        valid_from, valid_to, time = spec.valid
        alias = f"_dsi_mt_{name}"
        keyed = keyed.withColumn(alias, time)
        start, end, at = view[valid_from], view[valid_to], keyed[alias]
        condition.append((start.isNull() | (start <= at)) & (end.isNull() | (at < end)))
        dropped += [alias, valid_from, valid_to]
    joined = keyed.join(view, condition, "left").drop(*dropped)
    joined = joined.withColumn(spec.matched, F.coalesce(F.col(spec.matched), F.lit(False)))
    if spec.empty_value is not None:
        joined = joined.withColumn(name, F.coalesce(F.col(quoted(name)), spec.empty_value))
    return joined


def duplicate_error(bound: BoundSide, spec: JoinSpec, version: int | None) -> SideInputError:
    """The error for a map (or singleton) holding several rows where it promises one."""
    assert spec.duplicates is not None
    offenders = spec.duplicates.limit(6).collect()
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

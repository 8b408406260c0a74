"""Side input views: what a main record sees of a side input, built as Spark DataFrames.

- ``map``: key -> one row, joined to each main record as a struct column named after
  the side input (null when the key has no row).
- ``multimap``: key -> all rows, joined as an array column (empty when none).
- ``singleton``: one row; a Python value in ``sides[name]`` when there is one
  namespace, a struct column per window when the side input is windowed.
- ``list``: all rows; a DataFrame in ``sides[name]``, or an array column when
  ``forwarded`` (the rows sharing the record's ``forward_column`` value).

Side rows are read at the batch's pinned version and, for windowed side inputs,
only for the side windows in play (files pruned by their min/max statistics).
Views are checked (duplicate keys of a map, several rows of a singleton) when built,
and cached while the side table's version does not change.
"""

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.declarations import SideInput
from dagster_sideinputs.core.windows import (
    GLOBAL,
    as_utc,
    assign_windows,
    namespace_id,
    namespace_id_column,
)
from dagster_sideinputs.delta.storage import DeltaEngine
from dagster_sideinputs.delta.table import TableSnapshot
from dagster_sideinputs.errors import (
    DeclarationError,
    DuplicateKeyError,
    EmptySingletonError,
    SideInputDataError,
    SideInputError,
    SingletonCardinalityError,
    did_you_mean,
    preview,
)

SIDE_NS = "_dsi_side_ns"
DUPLICATE_MARK = "dsi-duplicate-key"
_NUMERIC = (
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.DecimalType,
    T.FloatType,
    T.DoubleType,
)


@dataclass(frozen=True)
class BoundSide:
    """A side input as an operator uses it: its handle, declaration and table."""

    name: str
    side: SideInput
    uri: str

    @property
    def label(self) -> str:
        return f"side input {self.name!r} (asset {self.side.asset!r})"


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
    """

    view: DataFrame
    main_keys: list[Column]
    keys: list[str]
    empty_value: Column | None
    broadcast: bool
    matched: str
    duplicates: DataFrame | None = None


def value_columns(schema: T.StructType) -> list[str]:
    return [f.name for f in schema.fields if not f.name.startswith("_dsi_")]


def _struct_of(schema: T.StructType) -> Column:
    return F.struct(*[F.col(f"`{name}`") for name in value_columns(schema)])


def _orderable(data_type: T.DataType) -> bool:
    if isinstance(data_type, T.MapType):
        return False
    if isinstance(data_type, T.StructType):
        return all(_orderable(f.dataType) for f in data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return _orderable(data_type.elementType)
    return True


def _resolve_main_key(bound: BoundSide, main: DataFrame) -> Column:
    """The main-record expression giving the side key: the translator, or the same column."""
    translator = bound.side.key_translator
    if translator is None:
        assert bound.side.key is not None
        return F.col(f"`{bound.side.key}`")
    if isinstance(translator, str):
        return F.col(f"`{translator}`")
    if isinstance(translator, Column):
        return translator
    result = translator(main)
    if not isinstance(result, Column):
        raise DeclarationError(
            f"The key_translator of {bound.label} returned {type(result).__name__}, not a Column.",
            fix="return a Column, e.g. lambda main: F.upper(main.currency)",
        )
    return result


def has_join_relation(side: SideInput, main_columns: Sequence[str]) -> bool:
    """Whether a map/multimap view joins main records by key: through a key translator,
    or because main records have a column named like the side key. Otherwise the
    function gets the whole view."""
    return side.key_translator is not None or side.key in main_columns


def _cast_main_key(
    bound: BoundSide, expr: Column, main: DataFrame, side_type: T.DataType
) -> Column:
    main_type = main.select(expr.alias("k")).schema["k"].dataType
    if main_type == side_type:
        return expr
    if isinstance(main_type, _NUMERIC) and isinstance(side_type, _NUMERIC):
        return expr.cast(side_type)
    if isinstance(main_type, T.StringType | T.DateType | T.TimestampType) and type(
        main_type
    ) is type(side_type):
        return expr
    raise DeclarationError(
        f"{bound.label}: main records give a {main_type.simpleString()} key but the side key "
        f"{bound.side.key!r} is {side_type.simpleString()}; they would never match.",
        fix=f"pass key_translator=F.col(...).cast('{side_type.simpleString()}')",
    )


@dataclass
class SideData:
    """One side input at the batch's pinned version."""

    bound: BoundSide
    snapshot: TableSnapshot | None
    spark: SparkSession
    engine: DeltaEngine
    _rows_cache: dict[Any, DataFrame] = field(default_factory=dict)

    @property
    def side(self) -> SideInput:
        return self.bound.side

    def schema(self) -> T.StructType:
        if self.snapshot is None:
            raise SideInputDataError(
                f"{self.bound.label}: table {self.bound.uri} does not exist.",
                fix="materialize the side input asset first",
            )
        return self.snapshot.schema

    def rows(self, windows: Sequence[tuple[dt.datetime, dt.datetime]] | None) -> DataFrame:
        """Side rows (with the side namespace column when windowed), at the pinned version."""
        cache_key = None if windows is None else tuple(windows)
        if cache_key in self._rows_cache:
            return self._rows_cache[cache_key]
        assert self.snapshot is not None
        if windows is not None and not windows:
            schema = T.StructType(
                [*self.snapshot.schema.fields, T.StructField(SIDE_NS, T.StringType())]
            )
            return self.spark.createDataFrame([], schema)
        schema = self.snapshot.schema
        files = list(self.snapshot.files)
        window = self.side.window
        if window is not None and windows is not None:
            column = window.time_column
            assert column is not None
            if column not in schema.fieldNames():
                raise SideInputDataError(
                    f"{self.bound.label} is windowed on {column!r}, which the side table does "
                    f"not have (columns: {schema.fieldNames()})."
                    + did_you_mean(column, schema.fieldNames()),
                    fix="fix window=Window...(time_column=...) or the side asset",
                )
            low, high = min(s for s, _ in windows), max(e for _, e in windows)
            files = [f for f in files if _may_overlap(f, column, low, high)]
        frame = self.engine.read_snapshot(
            self.spark, self.snapshot, files=files, name=self.side.asset
        )
        if window is None:
            frame = frame.withColumn(SIDE_NS, F.lit(GLOBAL))
        else:
            assert window.time_column is not None
            frame = assign_windows(frame, window, window.time_column)
            frame = frame.withColumn(SIDE_NS, namespace_id_column(F.col("_dsi_ns_start"))).drop(
                "_dsi_ns_start", "_dsi_ns_end"
            )
            if windows is not None:
                wanted = sorted({namespace_id(start) for start, _ in windows})
                frame = frame.filter(F.col(SIDE_NS).isin(wanted))
        self._rows_cache[cache_key] = frame
        return frame

    def check_key_column(self) -> None:
        schema = self.schema()
        key = self.side.key
        if key is not None and key not in schema.fieldNames():
            raise SideInputDataError(
                f"{self.bound.label} is keyed by {key!r}, but the side table has no such column "
                f"(columns: {schema.fieldNames()}).{did_you_mean(key, schema.fieldNames())}",
                fix="fix key= in the declaration, or restore the side table's schema",
            )

    def singleton_value(self, namespace: str = GLOBAL) -> Any:
        """The singleton's row (or declared default) for one namespace."""
        frame = self.rows(None).drop(SIDE_NS)
        found = frame.limit(2).collect()
        return self._one(found, namespace)

    def _one(self, found: list[Row], namespace: str) -> Any:
        if len(found) > 1:
            raise SingletonCardinalityError(
                f"{self.bound.label} is a singleton but holds more than one row in namespace "
                f"{namespace!r} (version {self.snapshot.version if self.snapshot else '-'}).",
                fix="make the side asset produce exactly one row, or declare it as "
                "SideInput.list(...) / SideInput.map(..., key=...)",
            )
        if not found:
            if self.side.default is not None:
                return self.side.default
            raise EmptySingletonError(
                f"{self.bound.label} is ready for namespace {namespace!r} but holds no row, "
                "and declares no default.",
                fix="materialize a row, or declare SideInput.singleton(..., default=<value>)",
            )
        return found[0]


def _may_overlap(file: Any, column: str, low: dt.datetime, high: dt.datetime) -> bool:
    """Whether a file's [min, max] of a time column can overlap [low, high)."""
    lo, hi = file.min_values.get(column), file.max_values.get(column)
    if lo is None or hi is None:
        return True
    return as_utc(lo) < as_utc(high) and as_utc(hi) >= as_utc(low) - dt.timedelta(milliseconds=1)


def build_join(
    data: SideData,
    main: DataFrame,
    *,
    windows: Sequence[tuple[dt.datetime, dt.datetime]] | None,
    main_side_ns: Column,
) -> JoinSpec | None:
    """The join that attaches a view to main records, or None when the view is not joined."""
    side = data.side
    bound = data.bound
    forward = side.distribution == "forwarded"
    windowed = side.window is not None
    joins_by_key = side.view in ("map", "multimap") and has_join_relation(side, main.columns)
    if not (joins_by_key or forward or (windowed and side.view == "singleton")):
        return None
    if bound.name in main.columns:
        raise DeclarationError(
            f"{bound.label} would be joined as column {bound.name!r}, which main records "
            "already have.",
            fix="rename the side input in side_inputs={...}",
        )
    rows = data.rows(windows if windowed else None)
    schema = data.schema()
    value = _struct_of(schema)
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
        keys.append(f"_dsi_fwd_{bound.name}")
        main_keys.append(F.col(f"`{column}`"))
        group.append(F.col(f"`{column}`").alias(f"_dsi_fwd_{bound.name}"))
    if joins_by_key:
        data.check_key_column()
        assert side.key is not None
        side_type = schema[side.key].dataType
        expr = _cast_main_key(bound, _resolve_main_key(bound, main), main, side_type)
        keys.append(f"_dsi_key_{bound.name}")
        main_keys.append(expr)
        group.append(F.col(f"`{side.key}`").alias(f"_dsi_key_{bound.name}"))

    matched = f"_dsi_matched_{bound.name}"
    if side.view == "map" and side.pick is not None:
        if side.pick not in schema.fieldNames():
            raise DeclarationError(
                f"{bound.label}: pick={side.pick!r} is not a column of the side table."
                f"{did_you_mean(side.pick, schema.fieldNames())}"
            )
        # Ties on the pick column are broken by the whole row, so replays agree.
        order = F.col(f"`{side.pick}`")
        if _orderable(T.StructType([f for f in schema.fields if not f.name.startswith("_dsi_")])):
            order = F.struct(order, value)
        aggregated = rows.groupBy(*group).agg(F.max_by(value, order).alias(bound.name))
        empty = None
        duplicates = None
    elif side.view in ("map", "singleton"):
        # One row per key is checked inside the batch's first Spark job (which runs
        # before anything is written), not by a job of its own.
        counted = rows.groupBy(*group).agg(
            F.first(value).alias("_dsi_value"), F.count(F.lit(1)).alias("_dsi_count")
        )
        guarded = F.when(
            F.col("_dsi_count") > 1, F.raise_error(F.lit(f"{DUPLICATE_MARK}:{bound.name}"))
        ).otherwise(F.col("_dsi_value"))
        aggregated = counted.select(*keys, guarded.alias(bound.name))
        duplicates = counted.filter(F.col("_dsi_count") > 1).select(*keys)
        empty = _default_struct(side.default, schema) if side.view == "singleton" else None
    else:  # multimap, or a forwarded list
        element = T.StructType([f for f in schema.fields if not f.name.startswith("_dsi_")])
        collected = F.collect_list(value)
        if _orderable(element):
            collected = F.array_sort(collected)  # a stable order, so replays agree
        aggregated = rows.groupBy(*group).agg(collected.alias(bound.name))
        empty = F.array().cast(T.ArrayType(element))
        duplicates = None
    view = aggregated.withColumn(matched, F.lit(True))
    # Explicit broadcast, or a view without a key (per window / per forward value).
    broadcast = side.distribution == "broadcast" or (side.distribution is None and not joins_by_key)
    return JoinSpec(view, main_keys, keys, empty, broadcast, matched, duplicates)


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
    joined = keyed.join(view, condition, "left").drop(*aliases, *spec.keys)
    joined = joined.withColumn(spec.matched, F.coalesce(F.col(spec.matched), F.lit(False)))
    if spec.empty_value is not None:
        joined = joined.withColumn(name, F.coalesce(F.col(f"`{name}`"), spec.empty_value))
    return joined


def duplicate_error(bound: BoundSide, spec: JoinSpec, version: int | None) -> SideInputError:
    """The error for a map (or singleton) holding several rows where it promises one."""
    assert spec.duplicates is not None
    offenders = spec.duplicates.limit(6).collect()
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

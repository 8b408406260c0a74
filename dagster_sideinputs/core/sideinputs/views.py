"""Side input view kinds: how each kind's rows aggregate per join key, and its empty value.

- :class:`MapView` (key -> one row): joined to each main record as a struct column
  named after the side input (null when the key has no row).
- :class:`MultimapView` (key -> all rows): joined as an array column (empty when none).
- :class:`SingletonView` (one row): a Python value in ``sides[name]`` when there is one
  namespace, a struct column per window when the side input is windowed.
- :class:`ListView` (all rows): a DataFrame in ``sides[name]``, or an array column when
  ``forwarded`` (the rows sharing the record's ``forward_column`` value).

Windowed side inputs give each record the view of *its own* side window (Beam's
per-window side inputs): a singleton's row, a list's rows (a sorted array column), and
for a map or multimap without a key relation the window's whole map (a map column key
-> row, or key -> sorted rows). A ready window without rows gives the view's empty
value. How a view is joined to main records is :mod:`~dagster_sideinputs.core.sideinputs.joins`.
"""

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.columns import DUPLICATE_MARK, comparable, quoted
from dagster_sideinputs.core.sideinputs.declaration import SideInput
from dagster_sideinputs.core.sideinputs.side_data import SideData, value_columns
from dagster_sideinputs.core.sideinputs.windows import GLOBAL, WindowSpan, namespace_id
from dagster_sideinputs.errors import DeclarationError, did_you_mean


def value_struct(schema: T.StructType) -> Column:
    """A side row's value columns as one struct (the ``_dsi_`` bookkeeping left out)."""
    return F.struct(*[F.col(quoted(name)) for name in value_columns(schema)])


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
        if comparable(element):
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
        value = value_struct(data.schema())
        counted = rows.groupBy(*group).agg(
            F.first(value).alias("_dsi_value"), F.count(F.lit(1)).alias("_dsi_count")
        )
        guarded = F.when(
            F.col("_dsi_count") > 1, F.raise_error(F.lit(f"{DUPLICATE_MARK}:{data.bound.name}"))
        ).otherwise(F.col("_dsi_value"))
        aggregated = counted.select(*keys, guarded.alias(data.bound.name))
        return aggregated, counted.filter(F.col("_dsi_count") > 1).select(*keys)


class SingletonView(View):
    kind = "singleton"
    one_per_key = True

    def aggregate(
        self, data: SideData, rows: DataFrame, group: list[Column], keys: list[str]
    ) -> tuple[DataFrame, DataFrame | None, Column | None]:
        aggregated, duplicates = self._unique(data, rows, group, keys)
        return aggregated, duplicates, _default_struct(data.side.default, data.schema())


class CollectedView(View):
    """A view giving all the rows of a join key: a sorted array (empty when none)."""

    def aggregate(
        self, data: SideData, rows: DataFrame, group: list[Column], keys: list[str]
    ) -> tuple[DataFrame, DataFrame | None, Column | None]:
        element = _element_type(data.schema())
        collected = F.collect_list(value_struct(data.schema()))
        if comparable(element):
            collected = F.array_sort(collected)  # a stable order, so replays agree
        aggregated = rows.groupBy(*group).agg(collected.alias(data.bound.name))
        return aggregated, None, F.array().cast(T.ArrayType(element))


class ListView(CollectedView):
    kind = "list"


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
        value = value_struct(schema)
        order = F.col(quoted(side.pick))
        if comparable(_element_type(schema)):
            order = F.struct(order, value)
        aggregated = rows.groupBy(*group).agg(F.max_by(value, order).alias(data.bound.name))
        return aggregated, None, None

    def as_rows(
        self, data: SideData, rows: DataFrame, group: list[Column], keys: list[str]
    ) -> tuple[DataFrame, Callable[[], DataFrame]]:
        """(the side rows as they are, keyed; what builds the duplicated keys), for a join
        whose keys are checked unique before any job reads it. Without an aggregation per key Spark
        reads only the value fields the function uses and joins the rows as a
        hand-written broadcast join does; aggregating them (a sort-based aggregation of
        every column: a struct value is no hash aggregation buffer) cost ~0.5 s of a 4M
        record batch against a 200k-row map. The check counts rows per key alone
        (:mod:`~dagster_sideinputs.core.batch.one_per_key`)."""
        view = rows.select(*group, value_struct(data.schema()).alias(data.bound.name))

        def duplicates() -> DataFrame:  # built when the driver cannot count the keys
            counted = rows.groupBy(*group).agg(F.count(F.lit(1)).alias("_dsi_count"))
            return counted.filter(F.col("_dsi_count") > 1).select(*keys)

        return view, duplicates


class MultimapView(CollectedView):
    kind = "multimap"
    keyed = True


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

"""One side input at a batch's pinned version: its rows, schema and checks.

Side rows are read at the pinned Delta version and, for windowed side inputs, only
for the side windows in play (files pruned by their min/max statistics), each row
tagged with its side namespace. The rows of one version and set of windows are built
once per batch.
"""

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.conversion import ArrowTableToRowsConversion

from dagster_sideinputs.core.columns import NS_END, NS_START, SIDE_NS
from dagster_sideinputs.core.sideinputs.declaration import SideInput
from dagster_sideinputs.core.sideinputs.windows import (
    GLOBAL,
    WindowSpan,
    as_utc,
    assign_windows,
    check_time_column,
    namespace_id,
    namespace_id_column,
)
from dagster_sideinputs.core.spec import BoundSide
from dagster_sideinputs.delta.engine import DataFile, DeltaEngine, TableSnapshot
from dagster_sideinputs.errors import (
    EmptySingletonError,
    SideInputDataError,
    SingletonCardinalityError,
    did_you_mean,
)


def value_columns(schema: T.StructType) -> list[str]:
    return [f.name for f in schema.fields if not f.name.startswith("_dsi_")]


@dataclass
class SideData:
    """One side input at the batch's pinned version.

    Attributes:
        scan: the table's rows as Spark should read them instead of a plain read (a
            non-windowed side input read as key-group buckets); None: a plain read.
    """

    bound: BoundSide
    snapshot: TableSnapshot | None
    spark: SparkSession
    engine: DeltaEngine
    scan: DataFrame | None = None
    _rows_cache: dict[Any, DataFrame] = field(default_factory=dict)
    _counts_cache: dict[Any, dict[str, int]] = field(default_factory=dict)

    @property
    def side(self) -> SideInput:
        return self.bound.side

    @property
    def version(self) -> int | None:
        return None if self.snapshot is None else self.snapshot.version

    def schema(self) -> T.StructType:
        if self.snapshot is None:
            raise SideInputDataError(
                f"{self.bound.label}: table {self.bound.uri} does not exist.",
                fix="materialize the side input asset first",
            )
        return self.snapshot.schema

    def rows(self, windows: Sequence[WindowSpan] | None) -> DataFrame:
        """Side rows (with the side namespace column), at the pinned version."""
        cache_key = None if windows is None else tuple(windows)
        if cache_key in self._rows_cache:
            return self._rows_cache[cache_key]
        schema = self.schema()
        assert self.snapshot is not None
        if windows is not None and not windows:
            empty = T.StructType([*schema.fields, T.StructField(SIDE_NS, T.StringType())])
            return self.spark.createDataFrame([], empty)
        files: list[DataFile] = list(self.snapshot.files)
        window = self.side.window
        if window is not None and windows is not None:
            column = window.time_column
            assert column is not None
            check_time_column(schema, column, where=self.bound.label)
            low, high = min(s for s, _ in windows), max(e for _, e in windows)
            files = [f for f in files if _may_overlap(f, column, low, high)]
        if self.scan is not None and window is None:
            frame = self.scan
        else:
            frame = self.engine.read_snapshot(
                self.spark, self.snapshot, files=files, name=self.side.asset
            )
        if window is None:
            frame = frame.withColumn(SIDE_NS, F.lit(GLOBAL))
        else:
            assert window.time_column is not None
            frame = assign_windows(frame, window, window.time_column)
            frame = frame.withColumn(SIDE_NS, namespace_id_column(F.col(NS_START))).drop(
                NS_START, NS_END
            )
            if windows is not None:
                wanted = sorted({namespace_id(start) for start, _ in windows})
                frame = frame.filter(F.col(SIDE_NS).isin(wanted))
        self._rows_cache[cache_key] = frame
        return frame

    def window_counts(self, windows: Sequence[WindowSpan] | None) -> dict[str, int]:
        """Rows per side namespace (the given side windows, or ``global``); a namespace
        without rows is absent. One small Spark job per version and set of windows,
        none when statistics settle it (a non-windowed table)."""
        cache_key = None if windows is None else tuple(windows)
        if cache_key in self._counts_cache:
            return self._counts_cache[cache_key]
        counts: dict[str, int] = {}
        total = None if self.snapshot is None or windows is not None else self.snapshot.num_records
        if total is not None:
            counts = {GLOBAL: total} if total else {}
        elif windows is None or windows:
            frame = self.rows(windows)
            counts = {r[0]: r[1] for r in frame.groupBy(SIDE_NS).count().collect()}
        self._counts_cache[cache_key] = counts
        return counts

    def check_key_column(self) -> None:
        schema = self.schema()
        key = self.side.key
        if key is not None and key not in schema.fieldNames():
            raise SideInputDataError(
                f"{self.bound.label} is keyed by {key!r}, but the side table has no such column "
                f"(columns: {schema.fieldNames()}).{did_you_mean(key, schema.fieldNames())}",
                fix="fix key= in the declaration, or restore the side table's schema",
            )

    def on_driver(
        self, columns: Sequence[str] | None = None, limit: int | None = None
    ) -> pa.Table | None:
        """The rows :meth:`rows` ``(None)`` holds (``columns`` of them, the first ``limit``),
        read on the driver by the engine without a Spark job (typed as Spark's ``toArrow``
        types them); None when the engine reads with Spark, or for a windowed side input."""
        if self.snapshot is None or self.side.window is not None:
            return None
        return self.engine.read_on_driver(
            self.snapshot, columns=columns, limit=limit, name=self.side.asset
        )

    def singleton_value(self, namespace: str = GLOBAL) -> Any:
        """The singleton's row (or declared default) for one namespace."""
        table = self.on_driver(limit=2)
        if table is not None:
            found = arrow_rows(self.spark, table, self.schema())
        else:
            found = self.rows(None).drop(SIDE_NS).limit(2).collect()
        return self.one(found, namespace)

    def one(self, found: list[Row], namespace: str) -> Any:
        if len(found) > 1:
            raise SingletonCardinalityError(
                f"{self.bound.label} is a singleton but holds more than one row in namespace "
                f"{namespace!r} (version {self.version if self.version is not None else '-'}).",
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


def arrow_rows(spark: SparkSession, table: pa.Table, schema: T.StructType) -> list[Row]:
    """``table``'s rows as a classic ``collect`` gives them: PySpark's own Arrow-to-Row
    conversion (Spark Connect's ``collect``), binary values as bytes or bytearray as the
    session's ``binaryAsBytes`` says."""
    as_bytes = True
    if "binary" in schema.simpleString():  # a binary type anywhere (a column named so too)
        setting = spark.conf.get("spark.sql.execution.pyspark.binaryAsBytes", "true")
        as_bytes = str(setting).strip().lower() != "false"
    return ArrowTableToRowsConversion.convert(table, schema, binary_as_bytes=as_bytes)


def _may_overlap(file: DataFile, column: str, low: dt.datetime, high: dt.datetime) -> bool:
    """Whether a file's [min, max] of a time column can overlap [low, high)."""
    lo, hi = file.min_values.get(column), file.max_values.get(column)
    if not isinstance(lo, dt.datetime) or not isinstance(hi, dt.datetime):
        return True
    return as_utc(lo) < as_utc(high) and as_utc(hi) >= as_utc(low) - dt.timedelta(milliseconds=1)

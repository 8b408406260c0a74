"""Helpers for operator tests: a lake of small Delta tables and a controllable clock."""

import datetime as dt
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.reader import read_table

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 1, 0, 0, tzinfo=UTC)


def hours(n: float) -> dt.timedelta:
    return dt.timedelta(hours=n)


class Clock:
    """A clock tests move by hand; operators pin it in their batch plans."""

    def __init__(self, now: dt.datetime | None = None) -> None:
        self.now = now or dt.datetime.now(UTC)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, delta: dt.timedelta) -> None:
        self.now += delta


class Lake:
    """Small Delta tables under one storage root, written and read through the bridge."""

    def __init__(self, spark: SparkSession, storage: dsi.DeltaStorage) -> None:
        self.spark = spark
        self.storage = storage

    def append(self, name: str, rows: Iterable[tuple], schema: str, **options: Any) -> None:
        frame = self.spark.createDataFrame(list(rows), schema)
        options.setdefault("storage_options", self.storage.storage_options)
        dsi.write_dataframe(frame, self.storage.table_uri(name), **options)

    def overwrite(self, name: str, rows: Iterable[tuple], schema: str) -> None:
        self.append(name, rows, schema, mode="overwrite", schema_mode="overwrite")

    def exists(self, name: str) -> bool:
        return self.storage.delta.exists(self.storage.table_uri(name))

    def rows(self, name: str, *columns: str) -> list[tuple]:
        """A table's rows as sorted tuples (of the given columns, or all)."""
        if not self.exists(name):
            return []
        frame: DataFrame = read_table(
            self.spark, self.storage.table_uri(name), storage_options=self.storage.storage_options
        )
        if columns:
            frame = frame.select(*columns)
        return sorted((tuple(r) for r in frame.collect()), key=repr)

    def operator(self, **kwargs: Any) -> dsi.SideInputOperator:
        kwargs.setdefault("storage", self.storage)
        return dsi.SideInputOperator(**kwargs)

    def run(
        self,
        op: dsi.SideInputOperator,
        clock: Callable[[], dt.datetime] | None = None,
        **kwargs: Any,
    ) -> dsi.RunResult:
        if clock is not None:
            kwargs["clock"] = clock
        return op.run(self.spark, **kwargs)


@pytest.fixture
def lake(spark, lake_storage: dsi.DeltaStorage) -> Lake:
    """A lake where the storage case says (tests/conftest.py: local unless ``each_storage``)."""
    return Lake(spark, lake_storage)


def passthrough(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    return main

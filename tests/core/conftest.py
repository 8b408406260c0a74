"""Helpers for operator tests: a lake of small Delta tables and a controllable clock."""

import datetime as dt
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.engine import DeltaEngine
from dagster_sideinputs.delta.store.files import is_local
from tests.conftest import StorageCase

ENGINES = {"rs": "delta-rs", "spark": "delta-spark"}
"""Test ids of the two Delta engines -> ``DeltaStorage(engine=...)``."""

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
    """Small Delta tables under one storage root, written and read through the engine
    under test (``engine``: ``delta-rs`` or ``delta-spark``)."""

    def __init__(self, spark: SparkSession, storage: dsi.DeltaStorage) -> None:
        self.spark = spark
        self.storage = storage.bind(spark)

    @property
    def engine(self) -> DeltaEngine:
        """The engine the operators of this lake use (bound to the session)."""
        return self.storage.delta

    @property
    def engine_id(self) -> str:
        """``rs`` or ``spark``."""
        return "spark" if self.engine.name == "delta-spark" else "rs"

    def with_engine(self, engine: DeltaEngine) -> dsi.DeltaStorage:
        """This lake's root with another engine (e.g. one that crashes on purpose)."""
        return dsi.DeltaStorage(self.storage.root, self.storage.storage_options, engine=engine)

    def append(self, name: str, rows: Iterable[tuple], schema: str, **options: Any) -> None:
        """Append rows to a table through the engine under test, except a plain append to a
        local lake under delta-spark: delta-rs writes it (0.05 s against 0.7 s), and the
        operator under test reads it with its own engine. Types delta-rs would store as
        another type (:func:`delta_rs_takes`) and tables it refuses (another schema, a
        feature it cannot write) go through the engine, which decides as it always did."""
        rows = list(rows)
        uri = self.storage.table_uri(name)
        if not options and self.engine_id == "spark" and is_local(self.storage.root):
            struct = self.spark.createDataFrame([], schema).schema
            if delta_rs_takes(struct) and append_with_delta_rs(uri, rows, struct):
                return
        frame = self.spark.createDataFrame(rows, schema)
        self.engine.write(frame, uri, **options)

    def overwrite(self, name: str, rows: Iterable[tuple], schema: str) -> None:
        self.append(name, rows, schema, mode="overwrite", schema_mode="overwrite")

    def exists(self, name: str) -> bool:
        return self.engine.exists(self.storage.table_uri(name))

    def frame(self, name_or_uri: str) -> DataFrame:
        """A table's latest rows (by name under the root, or by location)."""
        uri = name_or_uri if "/" in name_or_uri else self.storage.table_uri(name_or_uri)
        return self.engine.read_snapshot(self.spark, self.engine.snapshot(uri))

    def rows(self, name: str, *columns: str) -> list[tuple]:
        """A table's rows as sorted tuples (of the given columns, or all)."""
        if not self.exists(name):
            return []
        frame = self.frame(name)
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


PLAIN_TYPES = (
    T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType,
    T.DoubleType, T.DecimalType, T.StringType, T.BinaryType, T.DateType, T.TimestampNTZType,
)  # fmt: skip


def delta_rs_takes(data_type: T.DataType) -> bool:
    """Whether delta-rs stores rows of this Spark type as the same Delta type, from the
    same Python values: plain types and arrays, maps and structs of them. ``timestamp``
    only where the local time zone is UTC (Spark reads a naive datetime in local time,
    Arrow in UTC); no variant (Arrow gives a struct), interval or void."""
    if isinstance(data_type, T.StructType):
        return all(delta_rs_takes(f.dataType) for f in data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return delta_rs_takes(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return delta_rs_takes(data_type.keyType) and delta_rs_takes(data_type.valueType)
    if isinstance(data_type, T.TimestampType):
        return time.timezone == 0 and not time.daylight
    return isinstance(data_type, PLAIN_TYPES)


def append_with_delta_rs(uri: str, rows: list[tuple], struct: T.StructType) -> bool:
    """Append with delta-rs, without schema evolution (as a plain Spark append); False,
    with nothing committed, for rows Arrow does not take (a tuple for a struct) or a table
    delta-rs refuses. Not the bridge's ``append_rows``: that merges schemas."""
    names = struct.fieldNames()
    try:
        table = pa.Table.from_pylist(
            [dict(zip(names, row, strict=True)) for row in rows], to_arrow_schema(struct)
        )
        deltalake.write_deltalake(uri, table, mode="append")
    except (deltalake.exceptions.DeltaError, pa.ArrowException, TypeError, ValueError):
        return False
    return True


def default_engine() -> str:
    """The engine id of tests that name none: the one users get (``DSI_DELTA_ENGINE``,
    tests/conftest.py: ``auto``, i.e. delta-spark in the tests' session)."""
    return "rs" if os.environ.get("DSI_DELTA_ENGINE") == "delta-rs" else "spark"


def engines_of(metafunc: pytest.Metafunc) -> tuple[str, ...]:
    """The engines a test using ``delta_engine`` runs under: both in a module that sets
    ``DELTA_ENGINES`` (an engine contract module), for a test marked ``both_engines``,
    and for every test under ``DSI_BOTH_ENGINES=1`` (``make test-engines``); else only
    the default engine."""
    if getattr(metafunc.module, "DELTA_ENGINES", None):
        return tuple(metafunc.module.DELTA_ENGINES)
    if os.environ.get("DSI_BOTH_ENGINES") == "1":
        return tuple(ENGINES)
    if metafunc.definition.get_closest_marker("both_engines") is not None:
        return tuple(ENGINES)
    return (default_engine(),)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests using the ``lake`` run under the engines :func:`engines_of` gives them (test
    ids ``[rs]`` / ``[spark]`` when there are two); an ``each_storage`` test runs under
    its storage case's engine instead (tests/conftest.py STORAGE_CASES)."""
    if "delta_engine" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("each_storage") is not None:
        return
    if any("delta_engine" in _argnames(m) for m in metafunc.definition.iter_markers("parametrize")):
        return  # the test names its engines itself (e.g. a feature only one engine has)
    engines = engines_of(metafunc)
    if len(engines) > 1:
        metafunc.parametrize("delta_engine", list(engines), scope="function")


def _argnames(mark: pytest.Mark) -> list[str]:
    names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
    if isinstance(names, str):
        return [name.strip() for name in names.split(",")]
    return list(names)


@pytest.fixture
def delta_engine(storage_case: StorageCase) -> str:
    """The engine of a test with one: its storage case's, else the default engine."""
    return {"bridge": "rs", "native": "spark"}.get(storage_case.engine, default_engine())


@pytest.fixture
def lake(
    spark, lake_storage: dsi.DeltaStorage, delta_engine: str, storage_case: StorageCase
) -> Lake:
    """A lake where the storage case says (tests/conftest.py: local unless ``each_storage``),
    under the module's engine (``DELTA_ENGINES``), else the storage case's."""
    storage = dsi.DeltaStorage(
        lake_storage.root, lake_storage.storage_options, engine=ENGINES[delta_engine]
    )
    made = Lake(spark, storage)
    assert made.engine_id == delta_engine, (made.engine_id, delta_engine)
    return made


def passthrough(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    return main

"""Helpers for operator tests: a lake of small Delta tables and a controllable clock."""

import datetime as dt
import os
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.engine import DeltaEngine
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
        frame = self.spark.createDataFrame(list(rows), schema)
        self.engine.write(frame, self.storage.table_uri(name), **options)

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


ALTERNATE = "alternate"
"""``ENGINE_MATRIX = ALTERNATE`` in a module that sets ``DELTA_ENGINES``: its tests take
the engines in turn, in the order they are defined (the first under the bridge, the
next under delta-spark...), so that each engine runs about half of them. Tests marked
``both_engines`` still run under both, and so does every test when ``DSI_BOTH_ENGINES=1``
(``make test-engines``): the whole matrix.

For modules whose subject is the operator's logic (semantics, limits, bad input caught
before anything is written), where the engines differ only in how the same tables are
read and written. The modules about writing, staging and committing
(test_one_pass, test_storage_failures, test_bad_input_halfway) keep every test under both."""


def _engines_of(metafunc: pytest.Metafunc, engines: tuple[str, ...]) -> tuple[str, ...]:
    if getattr(metafunc.module, "ENGINE_MATRIX", None) != ALTERNATE:
        return engines
    if os.environ.get("DSI_BOTH_ENGINES") == "1":
        return engines
    if metafunc.definition.get_closest_marker("both_engines") is not None:
        return engines
    tests = sorted(
        (obj.__code__.co_firstlineno, name)
        for name, obj in vars(metafunc.module).items()
        if name.startswith("test_") and callable(obj) and hasattr(obj, "__code__")
    )
    turn = [name for _, name in tests].index(metafunc.function.__name__)
    return (engines[turn % len(engines)],)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Modules that set ``DELTA_ENGINES = ("rs", "spark")`` run each test using the
    ``lake`` under each engine (test ids ``[rs]`` / ``[spark]``), or under one of them in
    turn (:data:`ALTERNATE`); an ``each_storage`` test runs under its storage case's
    engine instead (tests/conftest.py STORAGE_CASES)."""
    engines = getattr(metafunc.module, "DELTA_ENGINES", None)
    if engines and "delta_engine" in metafunc.fixturenames:
        if metafunc.definition.get_closest_marker("each_storage") is not None:
            return
        metafunc.parametrize("delta_engine", list(_engines_of(metafunc, engines)), scope="function")


@pytest.fixture
def delta_engine(storage_case: StorageCase) -> str:
    """The engine of tests whose module does not ask for both: the storage case's
    (``s3-native``: delta-spark), else the bridge, as before."""
    return "spark" if storage_case.native else "rs"


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
    assert made.engine_id == "spark" or not storage_case.native, "s3-native without delta-spark"
    return made


def passthrough(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    return main

"""Shared fixtures: one SparkSession for the whole test session, fresh lakes per test.

Storage cases: a test marked ``each_storage`` runs once per storage case it asks for
(:data:`STORAGE_CASES`), its ``lake`` on the local filesystem or on the S3 test server
(the Spark session reaches the latter through s3a with the lake's own settings), under
the delta-rs bridge, and with ``each_storage(native=True)`` also on S3 under delta-spark.
"""

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import SparkSession

from dagster_sideinputs.core.packages import OPTIONAL_PACKAGES
from dagster_sideinputs.core.session import build_spark_session
from dagster_sideinputs.delta.storage import DeltaStorage
from tests.servers.s3 import S3Server

# The test session has Delta configured, so "auto" would pick delta-spark everywhere.
# Modules that run under both engines say so (DELTA_ENGINES, tests/core/conftest.py) and
# the engine tests name theirs; every other test keeps the bridge unless the environment
# says otherwise (DSI_DELTA_ENGINE=auto runs them under delta-spark).
os.environ.setdefault("DSI_DELTA_ENGINE", "delta-rs")

# Every Spark driver of the tests (this session's, and those tests start in subprocesses:
# workers, demo runs, Connect servers inherit it) collects garbage in one thread. Their
# heaps are small; on 2 cores this measured faster than the default G1, back to back on
# the same machine: tests/core/test_recovery.py 95-100 s against 104-111 s (bridge),
# test_one_pass.py 104-108 s against 110 s (both engines). A value the environment
# already has is kept.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:+UseSerialGC")

# The tests start hundreds of JVMs of a few class paths (this session's, the workers',
# demo runs', Connect servers'): they opt in to the class archive of each class path
# (dagster_sideinputs/core/jvm_archive.py, off by default in users' processes).
os.environ.setdefault("DSI_JVM_ARCHIVE", "on")

if TYPE_CHECKING:
    from tests.servers.kafka import KafkaBroker


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """local[2], UI off, 4 shuffle partitions, UTC (set by build_spark_session).

    With Delta Lake for Spark (``delta=True``: no jar fails the run rather than silently
    testing without it) and the Kafka, avro and S3A packages, so that every engine and
    connector test shares this one JVM. ``make test`` fetched the jars into the Ivy
    cache, so starting it downloads nothing.
    """
    warehouse = tempfile.mkdtemp(prefix="dsi-warehouse-")
    session = build_spark_session(
        master="local[2]",
        app_name="dagster-sideinputs-tests",
        ui_enabled=False,
        shuffle_partitions=4,
        log_level="ERROR",
        delta=True,
        packages=OPTIONAL_PACKAGES,
        configs={
            "spark.sql.warehouse.dir": warehouse,
            "spark.driver.memory": "2g",
            "spark.sql.adaptive.enabled": "true",
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator["KafkaBroker"]:
    """A real Kafka broker on 127.0.0.1 (KRaft, one node), shared by the session.

    Started only when a test asks for it (its jars are fetched on first use), stopped
    at the end of the session whatever the outcome. Tests share it, so each creates its
    own topics (``kafka_broker.unique_topic()``).
    """
    from tests.servers.kafka import KafkaBroker

    with KafkaBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3-compatible server (moto) on 127.0.0.1 with the bucket ``lake``.

    Started the first time a test asks for it, stopped at the end of the session (also
    when the session fails). Tests share it: use ``s3_server.fresh_prefix()`` for a
    folder of your own.
    """
    with S3Server() as server:
        yield server


@dataclass(frozen=True)
class StorageCase:
    """Where a test's lake lives, and which Delta engine serves it."""

    store: str  # "local" (a temporary folder) or "s3" (a fresh prefix on the S3 test server)
    engine: str = "bridge"  # "bridge": the delta-rs bridge; "native": delta-spark

    @property
    def id(self) -> str:
        return f"{self.store}-{self.engine}"

    @property
    def native(self) -> bool:
        return self.engine == "native"


STORAGE_CASES: tuple[StorageCase, ...] = (
    StorageCase("local"),
    StorageCase("s3"),
    StorageCase("s3", "native"),
)
"""Every storage case. An ``each_storage`` test runs on the bridge cases, its lake on the
local filesystem and on the S3 test server (``local-bridge``, ``s3-bridge``);
``each_storage(native=True)`` also runs it on S3 under delta-spark (``s3-native``): the
representative subset that CI time allows (docs/object-storage.md lists it).

Under ``s3-native`` the lake is ``DeltaStorage(engine="delta-spark")`` with the S3 server's
endpoint and credentials given once, as storage options: Spark reaches the bucket through
s3a with them (set per bucket on the session by ``DeltaStorage.bind``), and the operator's
state (plans, claims, commit records, the lock's lease) goes through the same options with
the store's conditional writes (obstore), as under the bridge.

Local delta-spark is covered by the modules that set ``DELTA_ENGINES``
(tests/core/conftest.py): their tests that are not ``each_storage`` run under both
engines; an ``each_storage`` test runs under its storage case's engine."""


def storage_cases(marker: pytest.Mark) -> tuple[StorageCase, ...]:
    """The storage cases of an ``each_storage`` marker (see :data:`STORAGE_CASES`)."""
    unknown = set(marker.kwargs) - {"native"}
    if unknown:
        raise pytest.UsageError(f"each_storage: unknown arguments {sorted(unknown)}")
    if marker.kwargs.get("native"):
        return STORAGE_CASES
    return tuple(case for case in STORAGE_CASES if not case.native)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("each_storage")
    if marker is None:
        return
    if "storage_case" not in metafunc.fixturenames:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: each_storage without a lake")
    cases = storage_cases(marker)
    metafunc.parametrize("storage_case", cases, ids=[case.id for case in cases], indirect=True)


@pytest.fixture
def storage_case(request: pytest.FixtureRequest) -> StorageCase:
    """The storage case of an ``each_storage`` test; the local filesystem otherwise."""
    return getattr(request, "param", STORAGE_CASES[0])


@pytest.fixture
def lake_storage(
    request: pytest.FixtureRequest, storage_case: StorageCase, tmp_path
) -> DeltaStorage:
    """An empty storage root for Delta tables, where the storage case says, under its
    engine (bridge cases: the tests' default engine, see ``DSI_DELTA_ENGINE`` above;
    ``s3-native``: delta-spark).

    On S3 the options are passed explicitly, once (the other form, ``AWS_*`` environment
    variables, is what tests/dagster_layer use); delta-spark gets them as s3a settings.
    """
    engine = "delta-spark" if storage_case.native else None
    if storage_case.store == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        return DeltaStorage(
            root=server.fresh_prefix("lake"), storage_options=server.storage_options, engine=engine
        )
    root = tmp_path / "lake"
    root.mkdir()
    return DeltaStorage(root=str(root), engine=engine)


@pytest.fixture
def lake(lake_storage: DeltaStorage) -> DeltaStorage:
    """An empty storage root for Delta tables."""
    return lake_storage


def table_files(uri: str) -> set[str]:
    """Every file under a table folder except the log, relative to it."""
    found = set()
    for directory, _, names in os.walk(uri):
        for name in names:
            relative = os.path.relpath(os.path.join(directory, name), uri)
            if not relative.startswith("_delta_log"):
                found.add(relative)
    return found

"""Shared fixtures: one SparkSession for the whole test session, fresh lakes per test."""

import os
import tempfile
from collections.abc import Iterator
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


@pytest.fixture
def lake(tmp_path) -> DeltaStorage:
    """An empty storage root for Delta tables."""
    root = tmp_path / "lake"
    root.mkdir()
    return DeltaStorage(root=str(root))


def table_files(uri: str) -> set[str]:
    """Every file under a table folder except the log, relative to it."""
    found = set()
    for directory, _, names in os.walk(uri):
        for name in names:
            relative = os.path.relpath(os.path.join(directory, name), uri)
            if not relative.startswith("_delta_log"):
                found.add(relative)
    return found

"""Shared fixtures: one SparkSession for the whole test session, fresh lakes per test."""

import os
import tempfile
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from dagster_sideinputs.core.packages import OPTIONAL_PACKAGES
from dagster_sideinputs.core.session import build_spark_session
from dagster_sideinputs.delta.storage import DeltaStorage


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

"""Fixtures for the server tests: Spark's Kafka connector in a session of its own."""

from collections.abc import Iterator

import pytest

from tests.servers.spark_kafka import SparkKafkaSession


@pytest.fixture(scope="session")
def spark_kafka(tmp_path_factory) -> Iterator[SparkKafkaSession]:
    """A SparkSession with ``spark-sql-kafka-0-10``, in a subprocess (see spark_kafka.py)."""
    with SparkKafkaSession(tmp_path_factory.mktemp("spark-kafka")) as session:
        yield session

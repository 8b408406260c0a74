"""Fixtures for the server tests: Spark's Kafka connector in the shared session."""

import pytest
from pyspark.sql import SparkSession

from tests.servers.spark_kafka import SparkKafka


@pytest.fixture
def spark_kafka(spark: SparkSession) -> SparkKafka:
    """The connector in the tests' shared session (see spark_kafka.py)."""
    return SparkKafka(spark)

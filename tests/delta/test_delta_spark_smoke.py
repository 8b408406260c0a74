"""Delta Lake for Spark (delta-spark 4.4.0's jar) works on the pinned pyspark.

delta-spark_4.1 is built against Spark 4.1.0, and some 4.1.x patch releases broke it
(Spark 4.1.2 removed ``IgnoreCachedData``, used by ALTER / OPTIMIZE, and changed the
``ParquetToSparkSchemaConverter`` constructor used to read checkpoints). These tests run
each operation the project relies on against the shared session (real Spark, real
delta-spark), so a pyspark or delta-spark bump that breaks one fails here.
"""

import json
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest
from delta.pip_utils import configure_spark_with_delta_pip
from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from dagster_sideinputs.delta.spark.setup import delta_package, is_delta_configured

SCHEMA = "id long, part string, v long"
CONSTRAINT_CHECK = "spark.databricks.delta.replaceWhere.constraintCheck.enabled"


def frame(spark: SparkSession, rows: list[tuple], schema: str = SCHEMA) -> DataFrame:
    return spark.createDataFrame(rows, schema)


def rows(spark: SparkSession, path: Path, **options: object) -> list[tuple]:
    reader = spark.read.format("delta")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return sorted(tuple(row) for row in reader.load(str(path)).collect())


def latest_version(spark: SparkSession, path: Path) -> int:
    return DeltaTable.forPath(spark, str(path)).history(1).collect()[0].version


def commit_actions(path: Path, version: int) -> list[dict]:
    log = path / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@pytest.fixture
def table(spark, tmp_path) -> Path:
    """A two-partition table at version 0: (1, a, 10), (2, b, 20)."""
    path = tmp_path / "t"
    frame(spark, [(1, "a", 10), (2, "b", 20)]).write.format("delta").partitionBy("part").save(
        str(path)
    )
    return path


def append_with_txn(spark: SparkSession, path: Path, data: DataFrame, version: int) -> None:
    (
        data.write.format("delta")
        .mode("append")
        .option("txnAppId", "smoke-app")
        .option("txnVersion", version)
        .save(str(path))
    )


# --- the session -----------------------------------------------------------------------------


def test_shared_session_has_delta_from_configure_spark_with_delta_pip(spark):
    assert is_delta_configured(spark)
    # The session loads delta_package() (which make install fetches), and it is the jar
    # configure_spark_with_delta_pip asks for.
    packages = spark.conf.get("spark.dsi.packages").split(",")
    asked = configure_spark_with_delta_pip(SparkSession.builder)._options["spark.jars.packages"]
    assert packages[0] == delta_package() == asked == "io.delta:delta-spark_4.1_2.13:4.4.0"


def test_history_names_the_spark_and_delta_versions(spark, table):
    engine = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()[0].engineInfo
    assert engine == f"Apache-Spark/{spark.version} Delta-Lake/4.4.0"


# --- the operations ------------------------------------------------------------------------


def test_create_then_read_back(spark, table):
    assert rows(spark, table) == [(1, "a", 10), (2, "b", 20)]
    assert latest_version(spark, table) == 0


def test_second_append_with_the_same_txn_version_is_skipped(spark, table):
    data = frame(spark, [(3, "a", 30)])
    append_with_txn(spark, table, data, 5)
    append_with_txn(spark, table, data, 5)
    assert latest_version(spark, table) == 1
    assert rows(spark, table) == [(1, "a", 10), (2, "b", 20), (3, "a", 30)]
    txns = [a["txn"] for a in commit_actions(table, 1) if "txn" in a]
    assert [(t["appId"], t["version"]) for t in txns] == [("smoke-app", 5)]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    assert [(h.version, h.operation) for h in history] == [(1, "WRITE"), (0, "WRITE")]


def test_a_lower_txn_version_is_skipped_and_a_higher_one_commits(spark, table):
    append_with_txn(spark, table, frame(spark, [(3, "a", 30)]), 5)
    append_with_txn(spark, table, frame(spark, [(4, "a", 40)]), 4)
    append_with_txn(spark, table, frame(spark, [(5, "a", 50)]), 6)
    assert [r[0] for r in rows(spark, table)] == [1, 2, 3, 5]


def test_delete(spark, table):
    DeltaTable.forPath(spark, str(table)).delete("id = 2")
    assert rows(spark, table) == [(1, "a", 10)]


def test_merge_updates_and_inserts(spark, table):
    source = frame(spark, [(1, "a", 11), (4, "b", 40)])
    (
        DeltaTable.forPath(spark, str(table))
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    assert rows(spark, table) == [(1, "a", 11), (2, "b", 20), (4, "b", 40)]


def test_time_travel_reads_an_older_version(spark, table):
    DeltaTable.forPath(spark, str(table)).delete("id = 1")
    assert rows(spark, table, versionAsOf=0) == [(1, "a", 10), (2, "b", 20)]
    assert rows(spark, table) == [(2, "b", 20)]


def test_replace_where_overwrites_only_the_matching_partition(spark, table):
    (
        frame(spark, [(7, "a", 70)])
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", "part = 'a'")
        .save(str(table))
    )
    assert rows(spark, table) == [(2, "b", 20), (7, "a", 70)]


def test_merge_schema_adds_a_column(spark, table):
    (
        frame(spark, [(8, "b", 80, "x")], SCHEMA + ", extra string")
        .write.format("delta")
        .mode("append")
        .option("mergeSchema", "true")
        .save(str(table))
    )
    assert rows(spark, table) == [(1, "a", 10, None), (2, "b", 20, None), (8, "b", 80, "x")]


def test_alter_optimize_and_reading_from_a_checkpoint(spark, table):
    # ALTER and OPTIMIZE broke on Spark 4.1.2 (IgnoreCachedData); reading a checkpoint's
    # schema broke too (ParquetToSparkSchemaConverter).
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    for i in range(3):
        frame(spark, [(100 + i, "b", i)]).write.format("delta").mode("append").save(str(table))
    spark.sql(f"OPTIMIZE delta.`{table}`").collect()
    assert list((table / "_delta_log").glob("*.checkpoint.parquet"))
    assert len(rows(spark, table)) == 5
    assert deltalake.DeltaTable(str(table)).to_pyarrow_table().num_rows == 5


# --- replaceWhere with rows outside its predicate (for the buffer) ---------------------------


def overwrite_a_with_rows_of_a_b_and_c(spark: SparkSession, path: Path, txn_version: int) -> None:
    (
        frame(spark, [(9, "a", 90), (10, "b", 100), (11, "c", 110)])
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", "part = 'a'")
        .option("txnAppId", "buffer")
        .option("txnVersion", txn_version)
        .save(str(path))
    )


def test_replace_where_rejects_rows_outside_its_predicate_by_default(spark, table):
    with pytest.raises(AnalysisException, match="DELTA_REPLACE_WHERE_MISMATCH"):
        overwrite_a_with_rows_of_a_b_and_c(spark, table, 1)
    assert latest_version(spark, table) == 0


def test_replace_where_without_constraint_check_removes_matching_and_adds_all_in_one_commit(
    spark, table
):
    """The buffer's release: drop some partitions' files and add rows of others, atomically.

    With the check off, Delta removes the files the predicate matches (partition ``a``
    only), adds every written row wherever it belongs (``a``, the existing ``b`` next to
    its old file, and the new ``c``), and records the txn, all in one commit; a repeat
    of the same txn version is skipped.
    """
    spark.conf.set(CONSTRAINT_CHECK, "false")
    try:
        overwrite_a_with_rows_of_a_b_and_c(spark, table, 1)
        overwrite_a_with_rows_of_a_b_and_c(spark, table, 1)
    finally:
        spark.conf.unset(CONSTRAINT_CHECK)
    assert latest_version(spark, table) == 1
    actions = commit_actions(table, 1)
    removed = sorted(a["remove"]["partitionValues"]["part"] for a in actions if "remove" in a)
    added = sorted(a["add"]["partitionValues"]["part"] for a in actions if "add" in a)
    assert removed == ["a"]
    assert added == ["a", "b", "c"]
    assert [a["txn"]["version"] for a in actions if "txn" in a] == [1]
    assert rows(spark, table) == [(2, "b", 20), (9, "a", 90), (10, "b", 100), (11, "c", 110)]


# --- the two engines read each other's tables ----------------------------------------------


def test_delta_rs_reads_a_table_delta_spark_wrote(spark, table):
    DeltaTable.forPath(spark, str(table)).delete("id = 2")
    read = deltalake.DeltaTable(str(table))
    assert read.version() == 1
    assert read.to_pyarrow_table().to_pylist() == [{"id": 1, "part": "a", "v": 10}]
    protocol = read.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)


def test_delta_spark_reads_a_table_delta_rs_wrote(spark, tmp_path):
    path = tmp_path / "rs"
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "part": ["a", "b"]})
    deltalake.write_deltalake(str(path), data, partition_by=["part"])
    deltalake.write_deltalake(str(path), data.slice(0, 1), mode="append")
    assert rows(spark, path) == [(1, "a"), (1, "a"), (2, "b")]

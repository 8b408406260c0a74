"""delta-spark appends to one table staged as the split stages each of its tables
(delta/spark/split.py, ``stage_append_native``): one Spark job writes the files, their
statistics come from the footers, Delta's transaction commits them. Tables Delta must
check while writing still go through Delta's writer, which checks them."""

import json
from pathlib import Path

import deltalake
import pytest
from pyspark.sql import functions as F

from dagster_sideinputs.delta.engine import AppTransaction
from dagster_sideinputs.delta.spark.engine import DeltaSparkEngine
from dagster_sideinputs.errors import SchemaMismatchError
from tests.delta.test_spark_direct import commit_file, jobs_of
from tests.delta.test_spark_split import SCHEMA, data, data_files


def table_rows(spark, uri):
    return sorted(r.id for r in spark.read.format("delta").load(uri).collect())


@pytest.mark.parametrize("existing", [True, False], ids=["existing", "new"])
def test_an_append_is_one_job_and_commits_as_delta_would(spark, tmp_path, existing):
    """Before: Delta's writeFiles computed the statistics from the rows (an existing
    table), or the rows were persisted and checked by a job of their own, then written
    by Delta's writer at commit (a new table). Now the write is the only job."""
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    if existing:
        engine.write(data(spark, [1000]), uri, app_transaction=AppTransaction("op", 0))
    version = 1 if existing else 0
    before = data_files(uri) if existing else set()  # (the writer may leave a 0-row file)

    staged, jobs = jobs_of(
        spark, f"append-{existing}", lambda: engine.stage(data(spark, range(60)), uri)
    )
    assert jobs == 1
    assert staged.num_rows == 60
    if existing:
        assert table_rows(spark, uri) == [1000]  # nothing visible before the commit
    else:
        assert not engine.exists(uri)  # nothing visible before the commit
        assert (Path(uri) / "_dsi_staging" / "_creating").exists()
    result = engine.commit(staged, app_transaction=AppTransaction("op", 1))

    assert (result.version, result.num_rows, result.skipped) == (version, 60, False)
    actions = commit_file(uri, version)
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert (info["operation"], info["isBlindAppend"]) == ("WRITE", True)
    assert [(a["txn"]["appId"], a["txn"]["version"]) for a in actions if "txn" in a] == [("op", 1)]
    adds = [a["add"] for a in actions if "add" in a]
    assert sum(json.loads(a["stats"])["numRecords"] for a in adds) == 60
    wanted = ([1000] if existing else []) + list(range(60))
    assert table_rows(spark, uri) == sorted(wanted)
    assert sorted(deltalake.DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == sorted(wanted)
    skipping = spark.read.format("delta").load(uri).filter("id >= 55")  # footer statistics
    assert skipping.count() == len([i for i in wanted if i >= 55])
    assert data_files(uri) - {f.path for f in engine.snapshot(uri).files} <= before  # no stray
    assert not list(Path(uri).glob("_dsi_staging/*"))
    # The batch again: its transaction is there, nothing is added.
    again = engine.stage(data(spark, range(5)), uri)
    assert engine.commit(again, app_transaction=AppTransaction("op", 1)).skipped
    assert table_rows(spark, uri) == sorted(wanted)


def test_a_discarded_or_failed_append_leaves_no_file(spark, tmp_path):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(data(spark, [1000]), uri)
    before = data_files(uri)
    engine.discard(engine.stage(data(spark, range(30)), uri))
    assert data_files(uri) == before
    boom = F.when(F.col("id") == 7, F.raise_error(F.lit("bad row 7")))
    failing = data(spark, range(30)).withColumn("name", F.coalesce(boom, F.col("name")))
    with pytest.raises(Exception, match="bad row 7"):
        engine.stage(failing, uri)
    # Nothing added; the cleanup of the failed write may also remove a file no version
    # references (the empty file of an empty task of the first write), never a live one.
    assert data_files(uri) <= before
    assert {f.path for f in engine.snapshot(uri).files} <= data_files(uri)
    assert engine.snapshot(uri).version == 0
    assert table_rows(spark, uri) == [1000]


@pytest.mark.parametrize("rule", ["check constraint", "not null"])
def test_tables_with_rules_delta_checks_go_through_its_writer_which_checks_them(
    spark, tmp_path, rule
):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    if rule == "not null":
        schema = SCHEMA.replace("name string", "name string NOT NULL")
        spark.sql(f"CREATE TABLE delta.`{uri}` ({schema}) USING delta")
        bad = data(spark, range(10)).withColumn(
            "name", F.when(F.col("id") == 4, F.lit(None)).otherwise(F.col("name"))
        )
    else:
        spark.createDataFrame([], SCHEMA).write.format("delta").save(uri)
        spark.sql(f"ALTER TABLE delta.`{uri}` ADD CONSTRAINT small CHECK (id < 5)")
        bad = data(spark, range(10))
    with pytest.raises(SchemaMismatchError, match="violates a constraint of table t"):
        engine.commit(engine.stage(bad, uri, name="t"), app_transaction=AppTransaction("op", 1))
    assert table_rows(spark, uri) == []
    good = data(spark, range(3))
    engine.commit(engine.stage(good, uri), app_transaction=AppTransaction("op", 2))
    assert table_rows(spark, uri) == [0, 1, 2]

"""delta-spark split writes (delta/spark/split.py): one Spark job stages appends to
several existing tables, each then committed through Delta's transaction with its
application transaction: tables any Delta reader reads as if Delta's writer wrote them."""

import contextlib
import datetime as dt
import decimal
import json
import os
from pathlib import Path

import deltalake
import pytest
from pyspark.sql import functions as F

from dagster_sideinputs.delta.engine import AppTransaction, SplitTarget
from dagster_sideinputs.delta.session import session_setting
from dagster_sideinputs.delta.spark.engine import DeltaSparkEngine
from dagster_sideinputs.errors import SchemaMismatchError
from tests.delta.test_spark_direct import commit_file, jobs_of

SCHEMA = "id long, name string, ts timestamp, amount decimal(10,2), tags array<string>"
TAG = "_t"


def ts(i):
    return dt.datetime(2026, 1, 1, 0, 0, 0, 123456) + dt.timedelta(minutes=i, microseconds=i)


def data(spark, ids):
    rows = [
        (
            i,
            f"name-{i:04d}" + "x" * (40 if i % 7 == 0 else 0),  # some beyond stats' 32 chars
            ts(i),
            decimal.Decimal(i) / 4,
            [f"t{i % 3}"],
        )
        for i in ids
    ]
    return spark.createDataFrame(rows, SCHEMA)


def tagged(frame):
    """Every row in table 0; rows with an even id in table 1 too."""
    tags = F.when(F.col("id") % 2 == 0, F.array(F.lit(0), F.lit(1))).otherwise(F.array(F.lit(0)))
    return frame.select("*", F.explode(tags).alias(TAG))


def tables(spark, tmp_path, engine, names=("all", "even"), schema=SCHEMA):
    uris = []
    for name in names:
        uri = str(tmp_path / name)
        engine.write(spark.createDataFrame([], schema), uri)
        CREATED[uri] = data_files(uri)
        uris.append(uri)
    return uris


def targets(uris):
    return [SplitTarget(i, uri, os.path.basename(uri)) for i, uri in enumerate(uris)]


def data_files(uri):
    return {p.name for p in Path(uri).rglob("*.parquet") if "_delta_log" not in p.parts}


def stray(uri, engine):
    """Files of the table no commit references, besides the (0-row) ones Delta's writer
    left when it created the table."""
    live = {f.path for f in engine.snapshot(uri).files}
    return data_files(uri) - live - CREATED.get(uri, set())


CREATED: dict[str, set[str]] = {}


def test_one_job_stages_every_table_and_each_commits_as_delta_would(spark, tmp_path):
    engine = DeltaSparkEngine(spark)
    uris = tables(spark, tmp_path, engine)
    ids = range(200)
    staged, jobs = jobs_of(
        spark, "split", lambda: engine.stage_split(tagged(data(spark, ids)), TAG, targets(uris))
    )
    assert staged is not None
    assert jobs == 1  # the write; statistics come from the files' footers
    assert [s.num_rows for s in staged] == [200, 100]
    for uri, stage in zip(uris, staged, strict=True):
        assert spark.read.format("delta").load(uri).count() == 0  # nothing visible yet
        result = engine.commit(stage, app_transaction=AppTransaction("op", 7))
        assert (result.version, result.num_rows, result.skipped) == (1, stage.num_rows, False)
        actions = commit_file(uri, 1)
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        assert (info["operation"], info["isBlindAppend"]) == ("WRITE", True)
        assert [(a["txn"]["appId"], a["txn"]["version"]) for a in actions if "txn" in a] == [
            ("op", 7)
        ]
        adds = [a["add"] for a in actions if "add" in a]
        assert adds
        assert all("/" not in a["path"] and a["dataChange"] for a in adds)
        assert sum(json.loads(a["stats"])["numRecords"] for a in adds) == stage.num_rows
        assert stray(uri, engine) == set()
        assert not list(Path(uri).glob("_dsi_staging/*"))
    expected = {"all": list(ids), "even": [i for i in ids if i % 2 == 0]}
    for uri in uris:
        wanted = expected[os.path.basename(uri)]
        table = spark.read.format("delta").load(uri)
        assert sorted(r.id for r in table.collect()) == wanted
        assert sorted(deltalake.DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == wanted
        # Data skipping reads the footers' statistics: filters on every kind of column
        # still find exactly their rows.
        probes = {
            "id >= 150": [i for i in wanted if i >= 150],
            "name > 'name-0190'": [i for i in wanted if f"name-{i:04d}" > "name-0190"],
            "name = 'name-0007" + "x" * 40 + "'": [i for i in wanted if i == 7],
            f"ts <= timestamp'{ts(3)}'": [i for i in wanted if i <= 3],  # microseconds
            f"ts > timestamp'{ts(198)}'": [i for i in wanted if i > 198],
            "amount < 2.5": [i for i in wanted if i < 10],
        }
        for condition, rows in probes.items():
            assert sorted(r.id for r in table.filter(condition).collect()) == rows, condition
    again = engine.stage_split(tagged(data(spark, range(3))), TAG, targets(uris))
    assert again is not None
    for uri, stage in zip(uris, again, strict=True):  # the transaction is there: skipped
        assert engine.commit(stage, app_transaction=AppTransaction("op", 7)).skipped
        assert stray(uri, engine) == set()


def test_a_discarded_split_leaves_no_file(spark, tmp_path):
    engine = DeltaSparkEngine(spark)
    uris = tables(spark, tmp_path, engine)
    staged = engine.stage_split(tagged(data(spark, range(50))), TAG, targets(uris))
    assert staged is not None
    assert all(stray(uri, engine) for uri in uris)  # staged: in the tables, unreferenced
    for stage in staged:
        engine.discard(stage)
    assert [stray(uri, engine) for uri in uris] == [set(), set()]
    assert [engine.snapshot(uri).version for uri in uris] == [0, 0]


def test_a_failing_split_job_leaves_no_file(spark, tmp_path):
    engine = DeltaSparkEngine(spark)
    uris = tables(spark, tmp_path, engine)
    boom = F.when(F.col("id") == 33, F.raise_error(F.lit("bad row 33")))
    frame = tagged(data(spark, range(50))).withColumn("name", F.coalesce(boom, F.col("name")))
    with pytest.raises(Exception, match="bad row 33"):
        engine.stage_split(frame, TAG, targets(uris))
    for uri in uris:
        assert data_files(uri) == CREATED[uri]


def test_a_commit_racing_another_writer_appends_alongside_it(spark, tmp_path):
    engine = DeltaSparkEngine(spark)
    uris = tables(spark, tmp_path, engine)
    staged = engine.stage_split(tagged(data(spark, range(10))), TAG, targets(uris))
    assert staged is not None
    engine.write(data(spark, [1000]), uris[0])  # another writer's blind append meanwhile
    result = engine.commit(staged[0], app_transaction=AppTransaction("op", 1))
    assert result.version == 2
    assert sorted(r.id for r in spark.read.format("delta").load(uris[0]).collect()) == [
        *range(10),
        1000,
    ]
    engine.discard(staged[1])


@pytest.mark.parametrize(
    "shape",
    ["partitioned", "check constraint", "not null", "column mapping", "order", "new, mapped"],
)
def test_tables_delta_must_check_or_shape_are_staged_on_their_own(spark, tmp_path, shape):
    """None, before any job, when some table needs Delta's writer (constraints, NOT NULL,
    partitions, column mapping, also one a new table would get from the session's
    defaults) or the rows in another shape."""
    engine = DeltaSparkEngine(spark)
    uris = tables(spark, tmp_path, engine, names=("plain",))
    other = str(tmp_path / "other")
    schema = SCHEMA
    if shape == "order":
        schema = "name string, id long, ts timestamp, amount decimal(10,2), tags array<string>"
    if shape == "not null":  # (a DataFrame's write makes every column nullable)
        not_null = SCHEMA.replace("id long", "id long NOT NULL")
        spark.sql(f"CREATE TABLE delta.`{other}` ({not_null}) USING delta")
    elif shape != "new, mapped":
        writer = spark.createDataFrame([], schema).write.format("delta")
        if shape == "partitioned":
            writer = writer.partitionBy("name")
        if shape == "column mapping":
            writer = writer.option("delta.columnMapping.mode", "name")
        writer.save(other)
        if shape == "check constraint":
            spark.sql(f"ALTER TABLE delta.`{other}` ADD CONSTRAINT positive CHECK (id >= 0)")
    frame = tagged(data(spark, range(10)))
    mapped = "spark.databricks.delta.properties.defaults.columnMapping.mode"
    with session_setting(spark, mapped, "name" if shape == "new, mapped" else None):
        result, jobs = jobs_of(
            spark,
            f"refused-{shape}",
            lambda: engine.stage_split(frame, TAG, targets([*uris, other])),
        )
    assert result is None
    assert jobs == 0
    assert stray(uris[0], engine) == set()


@pytest.mark.parametrize("defaults", [{}, {"enableDeletionVectors": "true"}])
def test_new_tables_are_created_as_delta_writer_creates_them(spark, tmp_path, defaults):
    """A split into tables that do not exist creates each in its commit, with the metadata
    and protocol Delta's writer gives the same rows (the session's default table
    properties included); until then the folder holds no table."""
    engine = DeltaSparkEngine(spark)
    settings = {f"spark.databricks.delta.properties.defaults.{k}": v for k, v in defaults.items()}
    with contextlib.ExitStack() as stack:
        for key, value in settings.items():
            stack.enter_context(session_setting(spark, key, value))
        uris = [str(tmp_path / "all"), str(tmp_path / "even")]
        staged = engine.stage_split(tagged(data(spark, range(20))), TAG, targets(uris))
        assert staged is not None
        assert not any(engine.exists(uri) for uri in uris)
        for uri, stage in zip(uris, staged, strict=True):
            result = engine.commit(stage, app_transaction=AppTransaction("op", 1))
            assert (result.version, result.num_rows) == (0, stage.num_rows)
            assert not (Path(uri) / "_dsi_staging" / "_creating").exists()
        reference = str(tmp_path / "reference")
        data(spark, range(20)).write.format("delta").save(reference)
    created = {a_key: a for a_key, a in _first_commit(reference).items()}
    for uri in uris:
        ours = _first_commit(uri)
        assert ours["protocol"] == created["protocol"]
        assert ours["metaData"]["schemaString"] == created["metaData"]["schemaString"]
        assert ours["metaData"]["configuration"] == created["metaData"]["configuration"]
        assert ours["metaData"]["partitionColumns"] == []
        assert [a["txn"]["version"] for a in commit_file(uri, 0) if "txn" in a] == [1]
    assert sorted(r.id for r in spark.read.format("delta").load(uris[1]).collect()) == list(
        range(0, 20, 2)
    )
    if not defaults:  # (deltalake's pyarrow reader refuses the deletionVectors feature)
        table = deltalake.DeltaTable(uris[0]).to_pyarrow_table()
        assert sorted(table["id"].to_pylist()) == list(range(20))


def _first_commit(uri):
    return {
        key: a[key] for a in commit_file(uri, 0) for key in a if key in ("protocol", "metaData")
    }


def test_an_interrupted_first_split_leaves_a_folder_the_next_write_takes(spark, tmp_path):
    """Files staged into a table's folder before its first commit are marked; a crash
    then leaves a folder later writes (split or not) still write into."""
    engine = DeltaSparkEngine(spark)
    uris = [str(tmp_path / "all"), str(tmp_path / "even")]
    staged = engine.stage_split(tagged(data(spark, range(20))), TAG, targets(uris))
    assert staged is not None  # and the process dies here: nothing discarded
    assert data_files(uris[0])
    boom = F.when(F.col("id") == 3, F.raise_error(F.lit("bad row 3")))
    failing = tagged(data(spark, range(8))).withColumn("name", F.coalesce(boom, F.col("name")))
    with pytest.raises(Exception, match="bad row 3"):  # a failed retry keeps the marker
        engine.stage_split(failing, TAG, targets(uris))
    engine.write(data(spark, [100]), uris[0], app_transaction=AppTransaction("op", 1))
    assert [r.id for r in spark.read.format("delta").load(uris[0]).collect()] == [100]
    again = engine.stage_split(tagged(data(spark, range(4))), TAG, targets(uris))
    assert again is not None
    for stage in again:
        engine.commit(stage, app_transaction=AppTransaction("op", 2))
    assert sorted(r.id for r in spark.read.format("delta").load(uris[1]).collect()) == [0, 2]


def test_a_column_delta_cannot_store_fails_a_new_tables_split_as_its_own_write_would(
    spark, tmp_path
):
    """The split plans each table as a write of its own does: a void column (a bare
    lit(None)) is refused naming the column and the fix, before any job or file."""
    engine = DeltaSparkEngine(spark)
    uris = [str(tmp_path / "all"), str(tmp_path / "even")]
    frame = tagged(data(spark, range(10))).withColumn("note", F.lit(None))
    with pytest.raises(
        SchemaMismatchError, match=r"(?s)'note' of table all.*void.*Nothing"
    ) as raised:
        jobs_of(spark, "void", lambda: engine.stage_split(frame, TAG, targets(uris)))
    assert "cast(" in raised.value.fix
    for uri in uris:
        assert not engine.exists(uri)
        assert not Path(uri).exists() or data_files(uri) == set()

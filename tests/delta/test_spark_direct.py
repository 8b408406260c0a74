"""delta-spark appends with their transaction, committed through Delta's transaction
(delta/spark/direct.py): the same commit as the writer's, without the state lookup."""

import json
from pathlib import Path
from urllib.parse import unquote

import deltalake
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.delta.engine import AppTransaction, StagedWrite
from dagster_sideinputs.delta.session import session_setting
from dagster_sideinputs.delta.spark import commit as spark_commit
from dagster_sideinputs.delta.spark import engine as spark_engine
from dagster_sideinputs.delta.spark.direct import commit_stage, open_append, qualifies
from dagster_sideinputs.delta.spark.engine import DeltaSparkEngine
from dagster_sideinputs.delta.spark.predicates import sql_table
from dagster_sideinputs.errors import ConcurrentWriteError, SchemaMismatchError

TX = "tx_id long, customer_id long, amount double"


@pytest.fixture(params=["footers", "writeFiles"])
def staging(request, monkeypatch):
    """The two ways a plain append is staged through Delta's transaction: Spark writes
    the files and their statistics come from the footers (delta/spark/split.py, the
    default), or Delta's ``writeFiles`` writes them (tables with CHECK constraints or
    NOT NULL fields, which it checks)."""
    if request.param == "writeFiles":
        monkeypatch.setattr(spark_engine, "stage_append_native", lambda *a, **k: None)
    return request.param


def commit_file(uri: str, version: int) -> list[dict]:
    text = (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def jobs_of(spark, group: str, action) -> tuple[object, int]:
    """What ``action`` returns, and how many Spark jobs it ran."""
    context = spark.sparkContext
    context.setJobGroup(group, group)
    try:
        result = action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return result, len(context.statusTracker().getJobIdsForGroup(group))


def rows(spark, uri: str) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(uri).collect())


def test_an_append_commits_with_its_transaction_in_fewer_jobs_than_the_writer(
    spark, tmp_path, monkeypatch
):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(
        spark.createDataFrame([(0, 1, 0.5)], TX), uri, app_transaction=AppTransaction("op", 1)
    )
    data = spark.createDataFrame([(i, i % 3, float(i)) for i in range(1, 51)], TX)
    # Rows Delta's transaction writes (as for a table staging refuses), not staged ones.
    monkeypatch.setattr(spark_engine, "stage_append_native", lambda *a, **k: None)

    direct, direct_jobs = jobs_of(
        spark, "direct", lambda: engine.write(data, uri, app_transaction=AppTransaction("op", 2))
    )
    monkeypatch.setattr(spark_commit, "qualifies", lambda *args: False)
    written, writer_jobs = jobs_of(
        spark, "writer", lambda: engine.write(data, uri, app_transaction=AppTransaction("op", 3))
    )

    # The writer reconstructs the table's state to look the transaction up; the direct
    # commit runs the write's own job only.
    assert direct_jobs < writer_jobs, (direct_jobs, writer_jobs)
    assert (direct.version, direct.num_rows, direct.skipped) == (1, 50, False)
    assert (written.version, written.num_rows) == (2, 50)
    for version, batch in ((1, 2), (2, 3)):
        actions = commit_file(uri, version)
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        assert info["operation"] == "WRITE"
        assert info["isBlindAppend"] is True
        assert info["operationParameters"]["mode"] == "Append"
        assert "dsi.write" in json.loads(info["userMetadata"])
        assert [a["txn"]["appId"] for a in actions if "txn" in a] == ["op"]
        assert [a["txn"]["version"] for a in actions if "txn" in a] == [batch]
        assert sum(json.loads(a["add"]["stats"])["numRecords"] for a in actions if "add" in a) == 50
    monkeypatch.undo()
    again = engine.write(data, uri, app_transaction=AppTransaction("op", 2))
    assert again.skipped
    assert len(rows(spark, uri)) == 101
    assert deltalake.DeltaTable(uri).transaction_version("op") == 3


def test_a_concurrent_commit_of_the_same_transaction_fails_the_direct_commit(spark, tmp_path):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(spark.createDataFrame([(0, 1, 0.5)], TX), uri)
    state = engine._state(uri)
    ours = spark.createDataFrame([(1, 1, 1.0)], TX)
    commit = open_append(ours, uri, state, AppTransaction("op", 5), "{}")
    assert commit is not None
    # Another writer commits the same batch between our check and our commit.
    engine.write(
        spark.createDataFrame([(2, 1, 2.0)], TX), uri, app_transaction=AppTransaction("op", 5)
    )

    with pytest.raises(Exception, match="ConcurrentTransaction") as failure:
        commit()
    assert isinstance(spark_commit._translated(failure.value, "t", None), ConcurrentWriteError)
    assert rows(spark, uri) == [(0, 1, 0.5), (2, 1, 2.0)]


def test_a_table_that_moved_since_the_check_is_left_to_the_writer(spark, tmp_path):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(spark.createDataFrame([(0, 1, 0.5)], TX), uri)
    stale = engine._state(uri)
    engine.write(
        spark.createDataFrame([(2, 1, 2.0)], TX), uri, app_transaction=AppTransaction("op", 5)
    )
    frame = spark.createDataFrame([(1, 1, 1.0)], TX)

    assert open_append(frame, uri, stale, AppTransaction("op", 5), "{}") is None
    # Through the engine: the writer finds the transaction held, and nothing is added.
    assert engine.write(frame, uri, app_transaction=AppTransaction("op", 5)).skipped
    assert rows(spark, uri) == [(0, 1, 0.5), (2, 1, 2.0)]


def test_a_partitioned_column_mapped_table_gets_the_writers_files(spark, tmp_path):
    uri = str(tmp_path / "t")
    (
        spark.createDataFrame([(0, "a", 0.5)], "id long, slot string, amount double")
        .write.format("delta")
        .partitionBy("slot")
        .option("delta.columnMapping.mode", "name")
        .save(uri)
    )
    spark.sql(f"ALTER TABLE {sql_table(uri)} RENAME COLUMN amount TO value")
    engine = DeltaSparkEngine(spark)
    data = spark.createDataFrame(
        [(1, "a", 1.0), (2, "b", 2.0)], "id long, slot string, value double"
    )
    staged = engine.stage(data, uri)
    assert qualifies(staged.handle.frame, staged, engine._state(uri))

    result = engine.commit(staged, app_transaction=AppTransaction("op", 1))

    assert (result.num_rows, result.num_files) == (2, 2)
    adds = [a["add"] for a in commit_file(uri, result.version) if "add" in a]
    # Under column mapping the partition column goes by its physical name.
    assert sorted(v for a in adds for v in a["partitionValues"].values()) == ["a", "b"]
    assert rows(spark, uri) == [(0, "a", 0.5), (1, "a", 1.0), (2, "b", 2.0)]
    for add in adds:  # the files hold the columns by their physical names
        names = pq.read_schema(str(Path(uri) / unquote(add["path"]))).names
        assert names
        assert all(name.startswith("col-") for name in names), names


def test_a_check_constraint_refuses_the_append_and_the_table_is_unchanged(spark, tmp_path):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(spark.createDataFrame([(0, 1, 0.5)], TX), uri)
    spark.sql(f"ALTER TABLE {sql_table(uri)} ADD CONSTRAINT positive CHECK (amount > 0)")
    bad = spark.createDataFrame([(1, 1, -1.0)], TX)

    # Delta's transaction writes the files at staging, and checks the constraint there
    # (also for a commit that removes files, as the buffer's does): the batch stops
    # before any of its tables commits.
    for removes_files in (False, True):
        with pytest.raises(SchemaMismatchError, match="constraint"):
            engine.stage(bad, uri, removes_files=removes_files)
    # Staged through the cache instead (a new column: Delta's writer merges the schema),
    # the commit refuses it.
    wider = bad.withColumn("note", F.lit("x"))
    staged = engine.stage(wider, uri, schema_mode="merge")
    assert staged.handle.direct is None
    assert not qualifies(staged.handle.frame, staged, engine._state(uri))
    with pytest.raises(SchemaMismatchError, match="constraint"):
        engine.commit(staged, app_transaction=AppTransaction("op", 1))
    assert rows(spark, uri) == [(0, 1, 0.5)]
    assert deltalake.DeltaTable(uri).transaction_version("op") is None


def data_files(uri: str) -> set[str]:
    return {str(p.relative_to(uri)) for p in Path(uri).rglob("*.parquet")}


def referenced(uri: str) -> set[str]:
    return {
        str(Path(unquote(u.removeprefix("file://"))).relative_to(uri))
        for u in deltalake.DeltaTable(uri).file_uris()
    }


def unreferenced(uri: str) -> set[str]:
    return data_files(uri) - referenced(uri)


def staged_files(staged: StagedWrite) -> set[str]:
    """The files Delta's transaction wrote at staging (relative to the table)."""
    return {unquote(path) for path in staged.handle.direct.paths}


def test_an_append_is_written_at_staging_and_committed_by_the_same_transaction(
    spark, tmp_path, monkeypatch, staging
):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(spark.createDataFrame([(0, 1, 0.5)], TX), uri)
    data = spark.createDataFrame([(i, i % 3, float(i)) for i in range(1, 41)], TX)

    staged, stage_jobs = jobs_of(spark, "stage", lambda: engine.stage(data, uri))
    # The files exist, counted from their statistics, and the table does not show them.
    assert staged.handle.direct is not None
    assert not staged.handle.persisted
    assert staged.num_rows == 40
    written = staged_files(staged)
    assert staged.num_files == len(written) >= 1
    assert written <= unreferenced(uri)
    assert rows(spark, uri) == [(0, 1, 0.5)]
    result, commit_jobs = jobs_of(
        spark, "commit", lambda: engine.commit(staged, app_transaction=AppTransaction("op", 1))
    )
    assert (result.version, result.num_rows, result.skipped) == (1, 40, False)
    assert written <= referenced(uri)
    assert deltalake.DeltaTable(uri).transaction_version("op") == 1

    # Staged through the cache and committed by the writer, the same append takes more
    # jobs (the rows are computed into the cache, counted, then written).
    monkeypatch.setattr("dagster_sideinputs.delta.spark.stage.plain_append", lambda *a, **k: False)
    monkeypatch.setattr(spark_engine, "stage_append_native", lambda *a, **k: None)
    cached, cached_stage_jobs = jobs_of(spark, "cached", lambda: engine.stage(data, uri))
    assert cached.handle.direct is None
    assert cached.handle.persisted
    _, cached_commit_jobs = jobs_of(
        spark,
        "cached-commit",
        lambda: engine.commit(cached, app_transaction=AppTransaction("op", 2)),
    )
    assert stage_jobs + commit_jobs < cached_stage_jobs + cached_commit_jobs, (
        stage_jobs, commit_jobs, cached_stage_jobs, cached_commit_jobs,
    )  # fmt: skip
    assert len(rows(spark, uri)) == 81


def test_files_written_without_statistics_are_counted_by_reading_them(spark, tmp_path, staging):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(spark.createDataFrame([(0, 1, 0.5)], TX), uri)
    data = spark.createDataFrame([(i, i % 3, float(i)) for i in range(1, 8)], TX)

    with session_setting(spark, "spark.databricks.delta.stats.collect", "false"):
        staged = engine.stage(data, uri)
    assert staged.handle.direct is not None
    # Delta's writeFiles then leaves numRecords out; footers always have it.
    assert staged.handle.direct.rows == (None if staging == "writeFiles" else 7)
    assert staged.num_rows == 7
    result = engine.commit(staged, app_transaction=AppTransaction("op", 1))
    assert (result.version, result.num_rows) == (1, 7)
    assert len(rows(spark, uri)) == 8


def test_files_staged_for_a_commit_that_does_not_happen_are_deleted(spark, tmp_path, staging):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(
        spark.createDataFrame([(0, 1, 0.5)], TX), uri, app_transaction=AppTransaction("op", 1)
    )
    data = spark.createDataFrame([(1, 1, 1.0), (2, 2, 2.0)], TX)

    # Discarded (another table of the batch failed to stage).
    staged = engine.stage(data, uri)
    written = staged_files(staged)
    assert written <= unreferenced(uri)
    assert staged.num_files == len(written) >= 1
    engine.discard(staged)
    assert not written & data_files(uri)
    # A replay whose transaction the table holds: skipped, its files deleted.
    staged = engine.stage(data, uri)
    written = staged_files(staged)
    assert engine.commit(staged, app_transaction=AppTransaction("op", 1)).skipped
    assert not written & data_files(uri)
    # No transaction to commit with: the staged files are what the commit adds.
    staged = engine.stage(data, uri)
    written = staged_files(staged)
    result = engine.commit(staged)
    assert (result.version, result.num_rows) == (1, 2)
    assert written <= data_files(uri)
    assert not written & unreferenced(uri)
    # An empty append that commits nothing.
    staged = engine.stage(spark.createDataFrame([], TX), uri)
    written = staged_files(staged)
    empty = engine.commit(staged, app_transaction=AppTransaction("op", 2), skip_empty_commit=True)
    assert empty.version == 1
    assert not written & data_files(uri)
    assert len(rows(spark, uri)) == 3


def test_a_staged_append_whose_commit_fails_keeps_its_files_and_commits_nothing(
    spark, tmp_path, staging
):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(spark.createDataFrame([(0, 1, 0.5)], TX), uri)
    staged = engine.stage(spark.createDataFrame([(1, 1, 1.0)], TX), uri)
    # Another writer commits the same batch between staging and our commit; the engine's
    # own check sees the table as it was (the log state is read before).
    other = spark.createDataFrame([(2, 1, 2.0)], TX)
    open_other = engine.stage(other, uri)
    commit_stage(open_other.handle.direct, AppTransaction("op", 5), "{}")
    with pytest.raises(Exception, match="ConcurrentTransaction") as failure:
        commit_stage(staged.handle.direct, AppTransaction("op", 5), "{}")
    assert isinstance(spark_commit._translated(failure.value, "t", None), ConcurrentWriteError)
    # A commit was tried: its files are never deleted (a commit may hold them); the
    # table does not reference them.
    written = staged_files(staged)
    engine.discard(staged)
    assert written
    assert written <= unreferenced(uri)
    assert rows(spark, uri) == [(0, 1, 0.5), (2, 1, 2.0)]


def test_a_commit_removes_exactly_the_files_named_beside_the_rows_it_adds(spark, tmp_path):
    # Part of a partition (Delta's writer could only replace whole partitions), with the
    # batch's transaction, in one commit made by Delta's transaction.
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(spark.createDataFrame([(0, 1, 0.5)], TX), uri, partition_by=["customer_id"])
    first = list(engine.snapshot(uri).files)
    engine.write(spark.createDataFrame([(1, 1, 1.5), (2, 2, 2.5)], TX), uri)
    staged = engine.stage(
        spark.createDataFrame([(3, 1, 3.5)], TX), uri, partition_by=["customer_id"],
        removes_files=True,
    )  # fmt: skip
    assert staged.handle.direct is not None  # written by Delta's transaction, not cached
    result = engine.commit(staged, app_transaction=AppTransaction("op", 7), remove_files=first)
    assert rows(spark, uri) == [(1, 1, 1.5), (2, 2, 2.5), (3, 1, 3.5)]
    table = deltalake.DeltaTable(uri)
    assert (result.version, table.version(), table.transaction_version("op")) == (2, 2, 7)
    [entry] = table.history(1)
    assert entry["operation"] == "WRITE"

    # Removals alone: the same commit with no rows.
    gone = [f for f in engine.snapshot(uri).files if f.partition_values["customer_id"] == 2]
    engine.commit_removals(uri, gone, app_transaction=AppTransaction("op", 8))
    assert rows(spark, uri) == [(1, 1, 1.5), (3, 1, 3.5)]
    assert deltalake.DeltaTable(uri).transaction_version("op") == 8


def test_a_removal_of_a_file_no_longer_live_commits_nothing(spark, tmp_path):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(spark.createDataFrame([(0, 1, 0.5)], TX), uri)
    files = list(engine.snapshot(uri).files)
    engine.commit_removals(uri, files)
    with pytest.raises(ConcurrentWriteError, match="not all live"):
        engine.commit_removals(uri, files, app_transaction=AppTransaction("op", 1))
    assert deltalake.DeltaTable(uri).version() == 1


def test_a_file_with_a_deletion_vector_is_removed_with_its_vector(spark, tmp_path):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    spark.createDataFrame([(0, 1, 0.5), (1, 1, 1.5)], TX).coalesce(1).write.format("delta").option(
        "delta.enableDeletionVectors", "true"
    ).save(uri)
    spark.sql(f"DELETE FROM {sql_table(uri)} WHERE tx_id = 0")
    [file] = engine.snapshot(uri).files
    assert file.deletion_vector
    engine.write(spark.createDataFrame([(2, 2, 2.5)], TX), uri)
    engine.commit_removals(uri, [file], app_transaction=AppTransaction("op", 1))
    assert rows(spark, uri) == [(2, 2, 2.5)]
    actions = [
        json.loads(line)
        for line in (Path(uri) / "_delta_log" / f"{3:020d}.json").read_text().splitlines()
    ]
    removed = [a["remove"] for a in actions if "remove" in a]
    assert [r.get("deletionVector") is not None for r in removed] == [True]


def _target(uri: str, **kwargs) -> StagedWrite:
    fields = {"mode": "append", "partition_by": [], "replace_partition": None, "schema_mode": None}
    return StagedWrite(uri=uri, name="t", **{**fields, **kwargs})


@pytest.mark.parametrize(
    ("case", "table_ddl", "frame_ddl", "target"),
    [
        ("a new column", TX, TX + ", note string", {"schema_mode": "merge"}),
        ("another column order", TX, "customer_id long, tx_id long, amount double", {}),
        ("an overwrite", TX, TX, {"mode": "overwrite"}),
        ("a schema overwrite", TX, TX, {"schema_mode": "overwrite"}),
        ("other partitions", TX, TX, {"partition_by": ["customer_id"]}),
    ],
)
def test_writes_that_change_the_table_go_through_the_writer(
    spark, tmp_path, case, table_ddl, frame_ddl, target
):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(spark.createDataFrame([], table_ddl), uri)
    frame = spark.createDataFrame([], frame_ddl)
    assert not qualifies(frame, _target(uri, **target), engine._state(uri)), case


def test_generated_columns_go_through_the_writer(spark, tmp_path):
    uri = str(tmp_path / "t")
    spark.sql(
        f"CREATE TABLE {sql_table(uri)} (tx_id LONG, doubled LONG GENERATED ALWAYS AS (tx_id * 2)) "
        "USING DELTA"
    )
    engine = DeltaSparkEngine(spark)
    frame = spark.createDataFrame([(1, 2)], "tx_id long, doubled long")
    assert not qualifies(frame, _target(uri), engine._state(uri))
    assert engine.write(frame, uri, app_transaction=AppTransaction("op", 1)).num_rows == 1
    assert rows(spark, uri) == [(1, 2)]
    assert isinstance(engine._state(uri).schema["doubled"].dataType, T.LongType)


@pytest.mark.parametrize(
    "feature",
    ["delta.enableChangeDataFeed", "delta.enableRowTracking"],
)
def test_tables_with_other_writer_features_go_through_the_writer(spark, tmp_path, feature):
    uri = str(tmp_path / "t")
    spark.createDataFrame([(0, 1, 0.5)], TX).write.format("delta").option(feature, "true").save(uri)
    engine = DeltaSparkEngine(spark)
    frame = spark.createDataFrame([(1, 1, 1.0)], TX)
    assert not qualifies(frame, _target(uri), engine._state(uri))
    assert engine.write(frame, uri, app_transaction=AppTransaction("op", 1)).num_rows == 1
    assert rows(spark, uri) == [(0, 1, 0.5), (1, 1, 1.0)]
    assert deltalake.DeltaTable(uri).transaction_version("op") == 1


# --- write(): the operator's staging for a plain append or a whole-table overwrite ------


@pytest.fixture
def staged_writes(monkeypatch):
    """Whether each ``write`` was staged as the operator stages an append (True), or went
    to Delta's writer (False)."""
    seen: list[bool] = []
    real = spark_engine.stage_append_native

    def recording(*args, **kwargs):
        staged = real(*args, **kwargs)
        seen.append(staged is not None)
        return staged

    monkeypatch.setattr(spark_engine, "stage_append_native", recording)
    return seen


def _info(uri: str, version: int) -> dict:
    return next(a["commitInfo"] for a in commit_file(uri, version) if "commitInfo" in a)


PARTED = "tx_id long, day date, region string, amount double"


def test_write_stages_appends_and_whole_table_overwrites_in_one_job(spark, tmp_path, staged_writes):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    first = spark.createDataFrame([(i, i % 3, float(i)) for i in range(10)], TX)
    second = spark.createDataFrame([(i, i % 3, float(i)) for i in range(10, 15)], TX)

    created, created_jobs = jobs_of(spark, "create", lambda: engine.write(first, uri))
    appended, append_jobs = jobs_of(spark, "append", lambda: engine.write(second, uri))
    overwritten = engine.write(second, uri, mode="overwrite")

    assert staged_writes == [True, True, True]
    # One job writes the rows; the statistics come from the files' footers. Delta's
    # checksums are written without their list of files (which would cost a new table
    # a second job, and the commit after it two more).
    assert append_jobs == 1
    assert created_jobs == 1
    for version in (0, 1, 2):
        checksum = json.loads((tmp_path / "t" / "_delta_log" / f"{version:020d}.crc").read_text())
        assert checksum["numFiles"] >= 1
        assert "allFiles" not in checksum
    assert [(r.version, r.num_rows) for r in (created, appended, overwritten)] == [
        (0, 10), (1, 5), (2, 5)
    ]  # fmt: skip
    assert [_info(uri, v)["operationParameters"]["mode"] for v in (0, 1, 2)] == [
        "Append", "Append", "Overwrite"
    ]  # fmt: skip
    assert rows(spark, uri) == sorted(tuple(r) for r in second.collect())
    for version in (0, 1, 2):
        adds = [a["add"] for a in commit_file(uri, version) if "add" in a]
        stats = [json.loads(a["stats"]) for a in adds]
        assert all(s["minValues"]["tx_id"] <= s["maxValues"]["tx_id"] for s in stats)
    removed = sorted(a["remove"]["path"] for a in commit_file(uri, 2) if "remove" in a)
    added = sorted(a["add"]["path"] for v in (0, 1) for a in commit_file(uri, v) if "add" in a)
    assert removed == added
    # delta-rs reads what Delta's transaction committed.
    assert deltalake.DeltaTable(uri).to_pyarrow_table().num_rows == 5


def test_write_stages_a_partitioned_table_with_the_values_delta_would_log(
    spark, tmp_path, staged_writes
):
    engine = DeltaSparkEngine(spark)
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    data = spark.createDataFrame(
        [(1, None, "eu west", 1.0), (2, None, None, 2.0), (3, None, "a/b=c%d", 3.0)], PARTED
    ).withColumn("day", F.expr("date_add(date'2024-01-30', cast(tx_id as int))"))

    engine.write(data, ours, partition_by=["day", "region"])
    engine.write(data, ours, partition_by=["day", "region"])  # an append to it
    data.write.format("delta").partitionBy("day", "region").save(theirs)

    assert staged_writes == [True, True]

    def values(uri: str) -> list[tuple]:
        adds = [a["add"] for a in commit_file(uri, 0) if "add" in a]
        return sorted(tuple(sorted(a["partitionValues"].items())) for a in adds)

    assert values(ours) == values(theirs)
    assert rows(spark, ours) == sorted(2 * rows(spark, theirs))
    on_a_day = spark.read.format("delta").load(ours).where("day = date'2024-02-01'")
    assert on_a_day.count() == 2
    table = deltalake.DeltaTable(ours)
    assert table.metadata().partition_columns == ["day", "region"]
    assert table.to_pyarrow_table().num_rows == 6


def test_write_leaves_an_append_only_tables_overwrite_to_the_writer(spark, tmp_path, staged_writes):
    engine = DeltaSparkEngine(spark)
    locked = str(tmp_path / "locked")
    spark.createDataFrame([(0, 1, 0.5)], TX).write.format("delta").option(
        "delta.appendOnly", "true"
    ).save(locked)
    with pytest.raises(Exception, match=r"(?i)append"):
        engine.write(spark.createDataFrame([(1, 1, 1.0)], TX), locked, mode="overwrite")
    assert staged_writes == []  # refused by Delta's writer, never staged
    assert rows(spark, locked) == [(0, 1, 0.5)]


def test_a_staged_overwrite_fails_when_another_writer_appended_meanwhile(
    spark, tmp_path, monkeypatch
):
    """As Delta's own overwrite: an append committed after the files to remove were
    listed fails the overwrite (Delta's transaction, which removes files and read no
    predicate, counts as having read the whole table), and nothing is committed."""
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    engine.write(spark.createDataFrame([(0, 1, 0.5)], TX), uri)
    real = DeltaSparkEngine.commit
    raced: list[bool] = []

    def race_then_commit(self, staged, **kwargs):
        assert staged.handle.direct is not None  # staged, not Delta's writer
        if not raced:  # (the other writer's own commit comes through here too)
            raced.append(True)
            DeltaSparkEngine(spark).write(spark.createDataFrame([(9, 9, 9.0)], TX), uri)
        return real(self, staged, **kwargs)

    monkeypatch.setattr(DeltaSparkEngine, "commit", race_then_commit)
    with pytest.raises(ConcurrentWriteError):
        engine.write(spark.createDataFrame([(1, 1, 1.0)], TX), uri, mode="overwrite")
    assert rows(spark, uri) == [(0, 1, 0.5), (9, 9, 9.0)]

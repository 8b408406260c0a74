"""The bridge keeps the tables it commits to cheap to open, however long their history."""

import json
import os
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from dagster_sideinputs.core.batch.record import OWN_LOG_RETENTION, RETENTION_KEY
from dagster_sideinputs.delta.bridge import commit as bridge_commit
from dagster_sideinputs.delta.bridge.commit import CHECKPOINT_EVERY
from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine
from dagster_sideinputs.delta.engine import AppTransaction
from dagster_sideinputs.delta.spark.engine import (
    LISTING_PARALLELISM,
    DeltaSparkEngine,
    listing_parallelism,
)
from tests.delta.test_spark_direct import jobs_of


def test_commits_write_a_checkpoint_every_few_versions(tmp_path):
    """Opening a table reads its newest checkpoint and the commits after it: never more
    than CHECKPOINT_EVERY commit files, where delta-rs alone would replay up to 99."""
    engine, uri = DeltaRsEngine(), str(tmp_path / "ledger")
    for batch in range(2 * CHECKPOINT_EVERY + 3):
        rows = pa.table({"path": [f"f{batch}.json"], "batch_id": pa.array([batch], pa.int64())})
        engine.append_rows(uri, rows, app_transaction=AppTransaction("op", batch))
    log = tmp_path / "ledger" / "_delta_log"
    newest = json.loads((log / "_last_checkpoint").read_text())["version"]
    assert newest == 2 * CHECKPOINT_EVERY
    assert (log / f"{newest:020d}.checkpoint.parquet").exists()
    table = DeltaTable(uri)
    assert table.version() - newest < CHECKPOINT_EVERY
    # Application transactions and rows are carried by the checkpoint.
    assert engine.transaction_version(uri, "op") == 2 * CHECKPOINT_EVERY + 2
    assert table.to_pyarrow_table().num_rows == 2 * CHECKPOINT_EVERY + 3


def test_compaction_keeps_rows_and_transactions(tmp_path):
    engine, uri = DeltaRsEngine(), str(tmp_path / "ledger")
    for batch in range(5):
        rows = pa.table({"path": [f"f{batch}.json"], "batch_id": pa.array([batch], pa.int64())})
        engine.append_rows(uri, rows, app_transaction=AppTransaction("op", batch))
    engine.compact(uri)
    snapshot = engine.snapshot(uri)
    assert len(snapshot.files) == 1
    assert sorted(engine.read_rows(uri).column("path").to_pylist()) == [
        f"f{b}.json" for b in range(5)
    ]
    assert engine.transaction_version(uri, "op") == 4
    # A compaction adds no data: an incremental reader of the table reads nothing new.
    assert engine.added_files(uri, 4, snapshot.version) == []


def test_native_compaction_keeps_rows_and_transactions(spark, tmp_path):
    """delta-spark's compaction (OPTIMIZE) of a bookkeeping table: one file, the same rows
    and application transactions, and no data for incremental readers."""
    engine, uri = DeltaSparkEngine(spark), str(tmp_path / "ledger")
    for batch in range(4):
        rows = pa.table({"path": [f"f{batch}.json"], "batch_id": pa.array([batch], pa.int64())})
        engine.append_rows(uri, rows, app_transaction=AppTransaction("op", batch))
    before = engine.snapshot(uri).version
    engine.compact(uri)
    snapshot = engine.snapshot(uri)
    assert snapshot.version == before + 1
    assert len(snapshot.files) == 1
    assert sorted(engine.read_rows(uri).column("path").to_pylist()) == [
        f"f{b}.json" for b in range(4)
    ]
    assert engine.transaction_version(uri, "op") == 3
    assert engine.added_files(uri, before, snapshot.version) == []


def test_native_vacuum_lists_with_the_sessions_parallelism_not_ten_thousand_tasks(spark, tmp_path):
    """delta-spark's VACUUM lists a table's folders in Spark's file-listing parallelism,
    10,000 by default: 150,093 tasks for this 4-file table, 31-76 s on local[2], a stall
    of the operator's batch every VACUUM_EVERY batches. The engine lists with the
    session's shuffle partitions instead, and leaves a parallelism the session set."""
    engine, uri = DeltaSparkEngine(spark), str(tmp_path / "ledger")
    for batch in range(4):
        rows = pa.table({"path": [f"f{batch}.json"], "batch_id": pa.array([batch], pa.int64())})
        engine.append_rows(uri, rows, app_transaction=AppTransaction("op", batch))
    engine.compact(uri)
    on_disk = {p.name for p in (tmp_path / "ledger").glob("*.parquet")}
    assert len(on_disk) == 5  # four appended, one compacted

    jobs_of(spark, "vacuum-tasks", lambda: engine.vacuum(uri, retention_hours=0))
    tasks = tasks_of(spark, "vacuum-tasks")
    assert 0 < tasks < 1_000, tasks
    assert {p.name for p in (tmp_path / "ledger").glob("*.parquet")} == {
        f.path for f in engine.snapshot(uri).files
    }
    assert sorted(engine.read_rows(uri).column("path").to_pylist()) == [
        f"f{b}.json" for b in range(4)
    ]
    assert spark.conf.get(LISTING_PARALLELISM, None) is None  # the session as it was

    spark.conf.set(LISTING_PARALLELISM, "3")
    try:
        assert listing_parallelism(spark) is None  # the session's own choice is kept
        engine.vacuum(uri, retention_hours=0)
        assert spark.conf.get(LISTING_PARALLELISM) == "3"
    finally:
        spark.conf.unset(LISTING_PARALLELISM)


def tasks_of(spark, group: str, timeout_s: float = 120.0) -> int:
    """The tasks of a job group's stages, once Spark's status store has every job's end.

    The store is fed by the asynchronous listener bus, in order: a stage is there once its
    job's end is (CI's first run of this test, on a busy machine, found a stage missing);
    a stage evicted or never stored counts no task."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
        if jobs and all(job is not None and job.status == "SUCCEEDED" for job in jobs):
            break
        assert time.monotonic() < deadline, f"the jobs of {group} never all ended: {jobs}"
        time.sleep(0.2)
    stages = [tracker.getStageInfo(stage) for job in jobs for stage in job.stageIds]  # type: ignore[union-attr]
    assert any(stages), stages
    return sum(stage.numTasks for stage in stages if stage is not None)


@pytest.mark.parametrize("engine_name", ["delta-rs", "delta-spark"])
def test_an_own_tables_short_log_retention_keeps_its_log_short(
    spark, tmp_path, monkeypatch, engine_name
):
    """The operator gives its own tables (buffer, ledger) a short log retention
    (record.OWN_LOG_RETENTION): at the next checkpoint due for cleanup the expired commit
    files go (under delta-spark, those of days before the cutoff's), and the table keeps
    its rows and application transactions."""
    monkeypatch.setattr(bridge_commit, "CLEANUP_EVERY", CHECKPOINT_EVERY)
    engine = DeltaRsEngine() if engine_name == "delta-rs" else DeltaSparkEngine(spark)
    uri, log = str(tmp_path / "ledger"), tmp_path / "ledger" / "_delta_log"

    def append(batch: int) -> None:
        rows = pa.table({"path": [f"f{batch}.json"], "batch_id": pa.array([batch], pa.int64())})
        engine.append_rows(uri, rows, app_transaction=AppTransaction("op", batch))

    append(0)
    engine.set_properties(uri, OWN_LOG_RETENTION)
    assert engine.snapshot(uri).configuration[RETENTION_KEY] == OWN_LOG_RETENTION[RETENTION_KEY]
    batch = 1

    def append_to(version: int) -> None:
        nonlocal batch
        while engine.snapshot(uri).version < version:
            append(batch)
            batch += 1

    append_to(2 * CHECKPOINT_EVERY - 1)
    three_days_ago = time.time() - 3 * 86_400  # the log so far, checkpoint at 10 included
    for entry in log.iterdir():
        if entry.is_file():
            os.utime(entry, (three_days_ago, three_days_ago))
    append_to(2 * CHECKPOINT_EVERY)  # the checkpoint at 20: the cleanup cuts the log there
    commits_left = sorted(int(p.name[:20]) for p in log.glob("*.json"))
    assert commits_left == [2 * CHECKPOINT_EVERY], commits_left  # every expired one
    assert engine.transaction_version(uri, "op") == batch - 1
    assert sorted(engine.read_rows(uri).column("batch_id").to_pylist()) == list(range(batch))

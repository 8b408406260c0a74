"""The bridge keeps the tables it commits to cheap to open, however long their history."""

import json

import pyarrow as pa
from deltalake import DeltaTable

from dagster_sideinputs.delta.bridge.commit import CHECKPOINT_EVERY
from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine
from dagster_sideinputs.delta.engine import AppTransaction
from dagster_sideinputs.delta.spark.engine import DeltaSparkEngine


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

"""A table's metadata costs the same to read at version 10,000 as at version 10.

Our log reader (both engines, local tables) finds a known table's newer commits by asking
for each next commit file, not by listing ``_delta_log``; the bridge's commits skip
delta-rs's per-commit log cleanup, which lists the folder too.
"""

import dataclasses
import os
import shutil
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from dagster_sideinputs.delta.bridge import table as delta_table
from dagster_sideinputs.delta.bridge.commit import CLEANUP_EVERY
from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine
from dagster_sideinputs.delta.engine import AppTransaction
from dagster_sideinputs.delta.log.files import LocalLogFiles
from dagster_sideinputs.delta.log.reader import LogReader


class Unlisted(LocalLogFiles):
    """A local log whose folder must not be listed."""

    def list_log(self):
        raise AssertionError(f"listed {self.root}/_delta_log")


def _append(uri: str, first: int, count: int, **kwargs) -> None:
    ids = pa.array(range(first, first + count), pa.int64())
    write_deltalake(uri, pa.table({"id": ids}), mode="append", **kwargs)


def _state_without_cache(uri: str):
    return LogReader().state(LocalLogFiles(uri), table="fresh")


def test_a_known_table_is_brought_up_to_date_without_listing_its_log(tmp_path):
    uri = str(tmp_path / "t")
    for n in range(3):
        _append(uri, n, 1)
    reader = LogReader()
    assert reader.state(LocalLogFiles(uri), table="t").version == 2  # lists once
    for n in range(3, 7):
        _append(uri, n, 1)
    probed = reader.state(Unlisted(uri), table="t")
    fresh = _state_without_cache(uri)
    assert probed.version == fresh.version == 6
    assert probed.files == fresh.files
    assert probed.metadata == fresh.metadata
    assert reader.latest_version(Unlisted(uri)) == 6
    assert reader.state(Unlisted(uri), table="t") is probed  # nothing new: the same state
    assert reader.state(Unlisted(uri), 2, table="t").version == 2  # a pinned, known version
    assert probed.table_snapshot().files == fresh.table_snapshot().files


@pytest.mark.parametrize("versions_after", [1, 5])
def test_a_table_created_again_at_the_same_place_is_read_anew(tmp_path, versions_after):
    uri = str(tmp_path / "t")
    for n in range(3):
        _append(uri, n, 1)
    reader = LogReader()
    before = reader.state(LocalLogFiles(uri), table="t")
    shutil.rmtree(uri)
    time.sleep(0.01)  # commit files are told apart by size and modification time (ms)
    for n in range(versions_after):
        write_deltalake(uri, pa.table({"other": [f"v{n}"]}), mode="append")
    after = reader.state(LocalLogFiles(uri), table="t")
    assert after.version == versions_after - 1
    assert after.table_id != before.table_id
    assert after.schema.fieldNames() == ["other"]
    assert after == _state_without_cache(uri)


def test_bridge_metadata_and_commits_after_the_first_read_list_no_log(tmp_path, monkeypatch):
    """What a batch asks of a table it already knows (exists, latest snapshot, its
    application transaction, the version its own commit made) needs no listing."""
    engine, uri = DeltaRsEngine(), str(tmp_path / "ledger")
    rows = pa.table({"path": ["a"], "batch_id": pa.array([0], pa.int64())})
    engine.append_rows(uri, rows, app_transaction=AppTransaction("op", 0))
    assert engine.snapshot(uri).version == 0
    monkeypatch.setattr(LocalLogFiles, "list_log", Unlisted.list_log)
    for batch in range(1, 4):
        rows = pa.table({"path": [f"f{batch}"], "batch_id": pa.array([batch], pa.int64())})
        result = engine.append_rows(uri, rows, app_transaction=AppTransaction("op", batch))
        assert result.version == batch
        assert engine.exists(uri)
        snapshot = engine.snapshot(uri)
        assert snapshot.version == batch
        assert snapshot.num_records == batch + 1
        assert engine.transaction_version(uri, "op") == batch
    assert engine.append_rows(uri, rows, app_transaction=AppTransaction("op", 3)).skipped


def test_bridge_snapshots_equal_delta_rs_own(tmp_path):
    """The snapshot the bridge now replays itself is the one delta-rs gave: files (paths,
    partition values, statistics), schema, partitioning, configuration, table id."""
    uri = str(tmp_path / "t")
    table = pa.table(
        {
            "k": ["a:b", "c d", None],
            "n": pa.array([1, 2, 3], pa.int64()),
            "x": [1.5, None, 2.5],
        }
    )
    write_deltalake(uri, table, partition_by=["k"], configuration={"delta.checkpointInterval": "2"})
    for _ in range(3):
        write_deltalake(uri, table, mode="append", partition_by=["k"])
    ours = DeltaRsEngine().snapshot(uri)
    delta_rs = DeltaTable(uri)
    theirs = delta_table._data_files(delta_rs, os.path.abspath(uri))
    assert ours.version == delta_rs.version() == 3
    assert _by_path(ours.files) == _by_path(theirs)
    assert ours.partition_columns == ("k",)
    assert ours.table_id == delta_rs.metadata().id
    assert ours.configuration == delta_rs.metadata().configuration


def _by_path(files):
    """Files in path order; a column without a min / max (all null) is absent either way
    (delta-rs says None; readers use ``.get``)."""

    def known(values):
        return {k: v for k, v in values.items() if v is not None}

    return [
        dataclasses.replace(f, min_values=known(f.min_values), max_values=known(f.max_values))
        for f in sorted(files, key=lambda f: f.path)
    ]


def test_expired_log_files_are_cleaned_up_on_schedule(tmp_path):
    """Without delta-rs's per-commit cleanup, the bridge deletes log files past the table's
    retention itself, every CLEANUP_EVERY versions; the table reads the same after."""
    engine, uri = DeltaRsEngine(), str(tmp_path / "ledger")
    write_deltalake(
        uri,
        pa.table({"path": ["x"], "batch_id": pa.array([-1], pa.int64())}),
        configuration={"delta.logRetentionDuration": "interval 0 seconds"},
    )
    log = tmp_path / "ledger" / "_delta_log"
    for batch in range(CLEANUP_EVERY):
        rows = pa.table({"path": [f"f{batch}"], "batch_id": pa.array([batch], pa.int64())})
        engine.append_rows(uri, rows, app_transaction=AppTransaction("op", batch))
        if batch == CLEANUP_EVERY - 2:
            assert (log / f"{0:020d}.json").exists()  # nothing cleaned up before it is due
    assert not (log / f"{0:020d}.json").exists()
    assert len(list(log.glob("*.json"))) < 10
    assert DeltaTable(uri).to_pyarrow_table().num_rows == CLEANUP_EVERY + 1
    assert engine.transaction_version(uri, "op") == CLEANUP_EVERY - 1
    assert engine.snapshot(uri).version == CLEANUP_EVERY

"""The bridge writes a plain commit to a local table itself (the next commit file, linked
into place only if no other writer took that version), and hands everything else to
delta-rs. Either way the table reads the same to delta-rs, delta-spark and our reader."""

import errno
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from dagster_sideinputs.delta.bridge import log_commit
from dagster_sideinputs.delta.bridge.commit import CHECKPOINT_EVERY
from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine
from dagster_sideinputs.delta.bridge.writer import write_dataframe
from dagster_sideinputs.delta.engine import AppTransaction

SCHEMA = "k string, n long"


def ordered(rows) -> list[tuple]:
    return sorted(rows, key=lambda r: (r[0] is None, r[0] or "", r[1]))


def commit_infos(uri: str) -> list[dict]:
    log = Path(uri) / "_delta_log"
    infos = []
    for path in sorted(log.glob("*.json")):
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                infos.append(action["commitInfo"])
    return infos


def delta_spark_rows(spark, uri: str) -> list[tuple]:
    return ordered(
        tuple(r) for r in spark.read.format("delta").load(uri).select("k", "n").collect()
    )


def delta_rs_rows(uri: str) -> list[tuple]:
    table = DeltaTable(uri).to_pyarrow_table(columns=["k", "n"]).to_pylist()
    return ordered((r["k"], r["n"]) for r in table)


def test_plain_commits_are_ours_and_every_reader_reads_them(spark, tmp_path):
    """Partition values that need escaping in folder names and in the log (a colon, a
    space, a percent sign, a plus, null) survive adds and removals written by us."""
    uri = str(tmp_path / "t")
    engine = DeltaRsEngine()
    first = [("a:b", 1), ("c d", 2), ("5%", 3), ("x+y", 4), (None, 5)]
    write_dataframe(spark.createDataFrame(first, SCHEMA), uri, partition_by=["k"])
    for batch in range(1, 4):
        rows = [(k, n + 10 * batch) for k, n in first]
        result = write_dataframe(
            spark.createDataFrame(rows, SCHEMA),
            uri,
            partition_by=["k"],
            app_transaction=AppTransaction("op", batch),
        )
        assert result.version == batch
    infos = commit_infos(uri)
    assert infos[0]["engineInfo"].startswith("delta-rs:")  # the table's creation
    assert {i["engineInfo"] for i in infos[1:]} == {log_commit.ENGINE_INFO}
    assert all(i["engineInfo.dsi"] == "dagster-sideinputs" for i in infos)
    expected = ordered((k, n + 10 * b) for b in range(4) for k, n in first)
    assert delta_rs_rows(uri) == expected == delta_spark_rows(spark, uri)
    assert engine.transaction_version(uri, "op") == 3
    assert DeltaTable(uri).transaction_version("op") == 3

    # Remove the files of two partitions (one of them null) in one commit of ours.
    gone = [f for f in engine.snapshot(uri).files if f.partition_values["k"] in ("a:b", None)]
    result = engine.commit_removals(uri, gone, app_transaction=AppTransaction("op", 4))
    assert result.version == 4
    assert commit_infos(uri)[-1]["engineInfo"] == log_commit.ENGINE_INFO
    kept = [(k, n) for k, n in expected if k not in ("a:b", None)]
    assert delta_rs_rows(uri) == kept == delta_spark_rows(spark, uri)
    assert engine.commit_removals(uri, gone, app_transaction=AppTransaction("op", 4)).skipped
    # Each file is logged as delta-rs logs it: our reader keys live files by that path.
    logged = {a["add"]["path"] for a in _actions(uri) if "add" in a}
    assert any("%253A" in path for path in logged)
    assert any("%20" in path for path in logged)


def _actions(uri: str) -> list[dict]:
    log = Path(uri) / "_delta_log"
    return [
        json.loads(line) for p in sorted(log.glob("*.json")) for line in p.read_text().splitlines()
    ]


def test_a_writer_that_takes_the_version_first_hands_the_commit_to_delta_rs(
    spark, tmp_path, monkeypatch
):
    """Another writer commits the very version we are about to write: our link fails,
    nothing of ours is in its commit, and delta-rs commits ours after it."""
    uri = str(tmp_path / "t")
    write_dataframe(spark.createDataFrame([("a", 1)], SCHEMA), uri)
    link = os.link

    def another_writer_first(source: str, target: str) -> None:
        if os.path.basename(os.path.dirname(target)) != "_delta_log":
            link(source, target)  # not a commit (os.link is the os module's)
            return
        write_deltalake(
            uri, pa.table({"k": ["theirs"], "n": pa.array([2], pa.int64())}), mode="append"
        )
        link(source, target)

    monkeypatch.setattr(log_commit.os, "link", another_writer_first)
    result = write_dataframe(
        spark.createDataFrame([("b", 3)], SCHEMA), uri, app_transaction=AppTransaction("op", 1)
    )
    assert result.version == 2
    infos = commit_infos(uri)
    assert [i["engineInfo"].split(":")[0] for i in infos] == ["delta-rs"] * 3
    assert delta_rs_rows(uri) == [("a", 1), ("b", 3), ("theirs", 2)]
    assert DeltaTable(uri).transaction_version("op") == 1
    assert not [p for p in os.listdir(Path(uri) / "_delta_log") if p.endswith(".tmp")]


@pytest.mark.parametrize(
    "configuration",
    [{"delta.enableChangeDataFeed": "true"}, {"delta.appendOnly": "true"}],
    ids=["writer-version-4", "append-only"],
)
def test_tables_with_more_protocol_are_committed_by_delta_rs(spark, tmp_path, configuration):
    uri = str(tmp_path / "t")
    write_deltalake(
        uri,
        pa.table({"k": ["a"], "n": pa.array([1], pa.int64())}),
        configuration=configuration,
    )
    engine = DeltaRsEngine()
    write_dataframe(spark.createDataFrame([("b", 2)], SCHEMA), uri)
    append_only = configuration.get("delta.appendOnly") == "true"
    # An append-only table still takes appends from us; removals go to delta-rs.
    ours = append_only
    assert (commit_infos(uri)[-1]["engineInfo"] == log_commit.ENGINE_INFO) == ours
    assert delta_rs_rows(uri) == [("a", 1), ("b", 2)]
    if append_only:
        with pytest.raises(Exception):  # noqa: B017, PT011 (delta-rs refuses it its way)
            engine.commit_removals(uri, list(engine.snapshot(uri).files)[:1])
        assert delta_rs_rows(uri) == [("a", 1), ("b", 2)]


def test_our_commits_get_checkpoints_on_schedule(spark, tmp_path):
    uri = str(tmp_path / "t")
    for batch in range(CHECKPOINT_EVERY + 2):
        rows = spark.createDataFrame([("k", batch)], SCHEMA)
        write_dataframe(rows, uri, app_transaction=AppTransaction("op", batch))
    log = Path(uri) / "_delta_log"
    assert (log / f"{CHECKPOINT_EVERY:020d}.checkpoint.parquet").exists()
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == CHECKPOINT_EVERY
    assert len(delta_rs_rows(uri)) == CHECKPOINT_EVERY + 2
    assert DeltaTable(uri).transaction_version("op") == CHECKPOINT_EVERY + 1


def test_a_filesystem_without_hard_links_hands_commits_to_delta_rs(spark, tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    write_dataframe(spark.createDataFrame([("a", 1)], SCHEMA), uri)

    def no_links(source: str, target: str) -> None:
        raise PermissionError(errno.EPERM, "hard links not supported", target)

    monkeypatch.setattr(log_commit.os, "link", no_links)
    write_dataframe(
        spark.createDataFrame([("b", 2)], SCHEMA), uri, app_transaction=AppTransaction("op", 1)
    )
    assert commit_infos(uri)[-1]["engineInfo"].startswith("delta-rs:")
    assert delta_rs_rows(uri) == [("a", 1), ("b", 2)]
    assert not [p for p in os.listdir(Path(uri) / "_delta_log") if p.endswith(".tmp")]

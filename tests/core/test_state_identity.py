"""The identities the exactly-once argument relies on are recorded and checked (issue 10,
class 2).

Each case changes something behind the operator's back (an input replaced, a file that
grew, an operator id shared, the operator's own state deleted or damaged), checks that the
next run stops with an error naming what changed and how to proceed (never skipping or
repeating records), then follows that advice (a restored backup, or the documented
``operator.reset(main_from=..., drop_buffered=...)``) and checks where every main record is.
"""

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.storage import DeltaRsEngine
from tests.core.accounting import assert_accounted, placement
from tests.core.conftest import Clock, Lake, hours
from tests.core.reliability import put, refused
from tests.core.test_crash_safety import CrashingEngine, InjectedCrash

TX = "tx_id long, customer_id long, amount double"
PROFILES = "customer_id long, name string"
UNMATCHED = dsi.OutputTag("unmatched")


def enrich(main, sides):
    return main.select("tx_id", "customer_id", F.col("profile.name").alias("name"))


def waiting_operator(lake: Lake, **kwargs: Any) -> dsi.SideInputOperator:
    """Records of customers without a profile wait for it (an hour, then unmatched)."""
    side = dsi.SideInput.map("profiles", key="customer_id", missing=dsi.Wait(hours(1)))
    return lake.operator(
        main=kwargs.pop("main", dsi.MainInput("transactions", key="customer_id")),
        side_inputs={"profile": side},
        fn=enrich,
        main_output=kwargs.pop("main_output", "enriched"),
        routes=dsi.Routes(unmatched=UNMATCHED),
        **kwargs,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def running(lake: Lake, clock: Clock) -> tuple[Lake, dsi.SideInputOperator]:
    """Two batches done: tx 1-3 released, tx 4 (customer 77) waiting in the buffer."""
    put(lake, "profiles", [(10, "ann"), (11, "bob")], PROFILES)
    op = waiting_operator(lake)
    put(lake, "transactions", [(1, 10, 1.0), (2, 11, 1.0)], TX)
    lake.run(op, clock)
    put(lake, "transactions", [(3, 10, 1.0), (4, 77, 1.0)], TX)
    lake.run(op, clock)
    assert op.buffer().rows() == 1
    return lake, op


def state_path(op: dsi.SideInputOperator, *parts: str) -> Path:
    return Path(op.state_uri, *parts)


def newest(folder: Path) -> Path:
    return max((p for p in folder.glob("*.json")), key=lambda p: int(p.stem))


# --- the main input ------------------------------------------------------------------------


def test_main_table_deleted_and_created_again_is_refused_then_read_from_its_beginning(
    running, clock
):
    lake, op = running
    old_id = DeltaRsEngine().snapshot(lake.storage.table_uri("transactions")).table_id
    shutil.rmtree(lake.storage.table_uri("transactions"))
    put(lake, "transactions", [(5, 10, 1.0)], TX)  # version 0 of a new table
    put(lake, "transactions", [(6, 11, 1.0)], TX)  # version 1: the old position
    with refused(
        dsi.errors.OperatorStateError,
        "'transactions'",
        "deleted and created again",
        old_id,
        fix="operator.reset(main_from='beginning')",
    ):
        lake.run(op, clock)  # it used to read on after version 1, skipping tx 5 and 6

    op.reset(main_from="beginning")
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1, 2, 3, 4, 5, 6])


def test_main_table_deleted_is_refused_then_restored(running, clock, tmp_path):
    lake, op = running
    uri = lake.storage.table_uri("transactions")
    shutil.copytree(uri, tmp_path / "backup")
    shutil.rmtree(uri)
    with refused(
        dsi.errors.OperatorStateError, "'transactions'", "is gone", fix="restore the table"
    ):
        lake.run(op, clock)
    shutil.copytree(tmp_path / "backup", uri)
    put(lake, "transactions", [(5, 10, 1.0)], TX)
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1, 2, 3, 4, 5])


# --- landing folders -----------------------------------------------------------------------


def landing_operator(lake: Lake, folder: Path) -> dsi.SideInputOperator:
    main = dsi.MainInput.files(str(folder), format="json", schema=TX, key="customer_id")
    return waiting_operator(lake, main=main)


def lines(*ids: int) -> str:
    return "".join(f'{{"tx_id": {i}, "customer_id": 10, "amount": 1}}\n' for i in ids)


@pytest.fixture
def landed(lake: Lake, clock: Clock, tmp_path: Path) -> tuple[Lake, dsi.SideInputOperator, Path]:
    put(lake, "profiles", [(10, "ann")], PROFILES)
    folder = tmp_path / "landing"
    folder.mkdir()
    (folder / "a.json").write_text(lines(1, 2))
    op = landing_operator(lake, folder)
    lake.run(op, clock)
    return lake, op, folder


def test_landed_file_that_grew_after_it_was_read_is_refused_then_landed_anew(landed, clock):
    lake, op, folder = landed
    with open(folder / "a.json", "a") as handle:
        handle.write(lines(3))  # its new line used to be never read
    with refused(
        dsi.errors.MainInputDataError,
        "'a.json'",
        "changed after the operator read it",
        fix="land its new lines as a new file",
    ):
        lake.run(op, clock)
    shutil.move(folder / "a.json", folder.parent / "a.json")
    (folder / "a-more.json").write_text(lines(3))
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1, 2, 3])


def test_landed_file_rewritten_with_the_same_size_is_refused(landed, clock):
    lake, op, folder = landed
    path = folder / "a.json"
    path.write_text(lines(3, 4))  # same size, another content, a later modification time
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10_000_000))
    with refused(dsi.errors.MainInputDataError, "'a.json'", "changed after", fix="new files"):
        lake.run(op, clock)
    path.rename(folder.parent / "a.json")
    (folder / "b.json").write_text(lines(3, 4))
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1, 2, 3, 4])


def test_ledger_of_landed_files_deleted_is_refused_then_reset_to_latest(landed, clock):
    lake, op, folder = landed
    shutil.rmtree(state_path(op, "files_seen"))  # every file would be read again
    with refused(
        dsi.errors.OperatorStateError,
        "files_seen",
        "was deleted",
        fix=["operator.reset(main_from='latest')", "main_from='beginning'"],
    ):
        lake.run(op, clock)
    op.reset(main_from="latest")
    (folder / "b.json").write_text(lines(3))
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1, 2, 3])


# --- operator ids ---------------------------------------------------------------------------


def test_two_operators_sharing_an_operator_id_is_refused_then_separated(running, clock):
    lake, op = running
    other = waiting_operator(lake, main_output="enriched_copy", operator_id="enriched")
    with refused(
        dsi.errors.OperatorStateError,
        "'enriched'",
        "'enriched_copy'",
        fix="give one of them its own operator_id",
    ):
        lake.run(other, clock)  # it used to resume from the first one's position
    separate = waiting_operator(lake, main_output="enriched_copy")
    lake.run(separate, clock)
    assert_accounted(lake.spark, separate, [1, 2, 3, 4])
    assert_accounted(lake.spark, op, [1, 2, 3, 4])


def test_derived_operator_ids_that_collide_are_refused_then_named(lake, clock):
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    nested = waiting_operator(lake, main_output="a/b")
    flat = waiting_operator(lake, main_output="a__b")
    assert nested.operator_id == flat.operator_id == "a__b"
    lake.run(nested, clock)
    with refused(dsi.errors.OperatorStateError, "'a/b'", "'a__b'", fix="its own operator_id"):
        lake.run(flat, clock)
    named = waiting_operator(lake, main_output="a__b", operator_id="flat")
    lake.run(named, clock)
    assert_accounted(lake.spark, nested, [1])
    assert_accounted(lake.spark, named, [1])


def test_same_operator_id_on_another_main_input_is_refused(running, clock):
    lake, op = running
    put(lake, "payments", [(9, 10, 1.0)], TX)
    moved = waiting_operator(lake, main=dsi.MainInput("payments", key="customer_id"))
    with refused(
        dsi.errors.OperatorStateError, "transactions", "payments", fix="use a new operator_id"
    ):
        lake.run(moved, clock)
    renamed = waiting_operator(
        lake,
        main=dsi.MainInput("payments", key="customer_id"),
        main_output="enriched_payments",
    )
    lake.run(renamed, clock)
    assert_accounted(lake.spark, renamed, [9])
    assert_accounted(lake.spark, op, [1, 2, 3, 4])


@pytest.mark.parametrize("where", ["main", "side"])
def test_an_output_that_is_also_an_input_is_refused_when_declared(lake, clock, where):
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    spelled = "file://" + lake.storage.table_uri("transactions")  # the same table
    main = dsi.MainInput("transactions", key="customer_id")
    side = dsi.SideInput.map("profiles", key="customer_id")
    if where == "main":
        main = dsi.MainInput("transactions", key="customer_id", path=spelled)
        output = "transactions"
    else:
        output = "profiles"
    with refused(dsi.DeclarationError, "is also its", fix="write the output to another asset"):
        lake.operator(main=main, side_inputs={"profile": side}, fn=enrich, main_output=output)
    op = lake.operator(main=main, side_inputs={"profile": side}, fn=enrich, main_output="out")
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1])


# --- the buffer -----------------------------------------------------------------------------


def test_buffer_deleted_with_records_is_refused_then_restored(running, clock, tmp_path):
    lake, op = running
    shutil.copytree(op.spec.buffer_uri, tmp_path / "buffer")
    shutil.rmtree(op.spec.buffer_uri)
    put(lake, "transactions", [(5, 10, 1.0)], TX)
    with refused(
        dsi.errors.OperatorStateError,
        "buffer",
        "was deleted",
        fix=["restore the buffer folder", "reset(drop_buffered=True)"],
    ):
        lake.run(op, clock)  # tx 4 used to vanish silently
    shutil.copytree(tmp_path / "buffer", op.spec.buffer_uri)
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1, 2, 3, 4, 5])


def test_buffer_deleted_with_records_then_the_loss_acknowledged(running, clock):
    lake, op = running
    shutil.rmtree(op.spec.buffer_uri)
    with refused(dsi.errors.OperatorStateError, "buffer", fix="reset(drop_buffered=True)"):
        lake.run(op, clock)
    op.reset(drop_buffered=True)
    put(lake, "transactions", [(5, 10, 1.0), (6, 78, 1.0)], TX)
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1, 2, 3, 5, 6])  # tx 4 is the acknowledged loss


def test_empty_buffer_deleted_loses_nothing_and_is_created_again(lake, clock):
    put(lake, "transactions", [(1, 77, 1.0)], TX)
    op = waiting_operator(lake)
    lake.run(op, clock)  # tx 1 waits for the profile table
    put(lake, "profiles", [(77, "ann")], PROFILES)
    lake.run(op, clock)  # released: the buffer is empty
    assert op.buffer().rows() == 0
    shutil.rmtree(op.spec.buffer_uri)
    put(lake, "transactions", [(2, 78, 1.0)], TX)
    lake.run(op, clock)  # no error: nothing was lost
    assert op.buffer().rows() == 1
    lake.run(op, clock)  # and the new buffer is the one recorded
    assert_accounted(lake.spark, op, [1, 2])


# --- plans and commit records ----------------------------------------------------------------


def test_plans_and_commits_deleted_is_refused_then_reset_to_latest(running, clock):
    lake, op = running
    shutil.rmtree(state_path(op, "plans"))
    shutil.rmtree(state_path(op, "commits"))
    put(lake, "transactions", [(5, 10, 1.0)], TX)
    with refused(
        dsi.errors.OperatorStateError,
        "holds batch 1",
        "knows batches up to -1",
        fix="main_from='latest'",
    ):
        lake.run(op, clock)  # it used to read everything again, or skip batches as done
    with refused(
        dsi.errors.OperatorStateError, "no recorded position", fix="main_from='beginning'"
    ):
        op.reset(main_from="keep")  # nothing to keep: it used to read from the beginning
    op.reset(main_from=1)  # the operator had read versions 0 and 1; tx 5 is version 2
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1, 2, 3, 4, 5])


def test_state_folder_deleted_while_outputs_remain_is_refused_then_reset_to_latest(running, clock):
    lake, op = running
    shutil.rmtree(op.state_uri)
    with refused(
        dsi.errors.OperatorStateError,
        "no state",
        "'enriched'",
        "holds its batch 1",
        fix="reset(",
    ):
        lake.run(op, clock)
    op.reset(main_from="latest")
    put(lake, "transactions", [(5, 10, 1.0)], TX)
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1, 2, 3, 5])  # tx 4 was in the deleted buffer


def test_last_commit_record_deleted_then_the_batch_is_replayed_without_effect(running, clock):
    lake, op = running
    newest(state_path(op, "commits")).unlink()
    result = lake.run(op, clock)
    assert result.batches[0].replayed
    assert all(write.skipped for write in result.batches[0].writes.values())
    assert_accounted(lake.spark, op, [1, 2, 3, 4])


def test_truncated_commit_record_then_the_batch_is_replayed_and_recorded_again(running, clock):
    lake, op = running
    record = newest(state_path(op, "commits"))
    record.write_text(record.read_text()[:25])
    lake.run(op, clock)
    assert json.loads(record.read_text())["batch_id"] == 1
    put(lake, "transactions", [(5, 10, 1.0)], TX)
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1, 2, 3, 4, 5])


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_plan_of_the_last_committed_batch_lost_then_its_commit_record_repeats_it(
    running, clock, damage
):
    lake, op = running
    plan = newest(state_path(op, "plans"))
    if damage == "deleted":
        plan.unlink()
    else:
        plan.write_text(plan.read_text()[:40])
    put(lake, "transactions", [(5, 10, 1.0)], TX)
    lake.run(op, clock)  # position from the commit record; it used to be an error or a loop
    assert_accounted(lake.spark, op, [1, 2, 3, 4, 5])


def crash_before_any_commit(lake: Lake, clock: Clock, crash_after: int = 0) -> None:
    """Run the next batch with an engine that fails after ``crash_after`` commits."""
    engine = CrashingEngine(DeltaRsEngine(), crash_after)
    crashing = waiting_operator(lake, storage=dsi.DeltaStorage(lake.storage.root, engine=engine))
    with pytest.raises(InjectedCrash):
        lake.run(crashing, clock)


def test_truncated_plan_of_a_batch_no_table_committed_is_set_aside(running, clock):
    lake, op = running
    put(lake, "transactions", [(5, 10, 1.0), (6, 79, 1.0)], TX)
    crash_before_any_commit(lake, clock)
    plan = newest(state_path(op, "plans"))
    plan.write_text(plan.read_text()[:40])
    result = lake.run(op, clock)
    assert not result.batches[0].replayed
    assert len(list(state_path(op, "plans", "discarded").iterdir())) == 1
    assert_accounted(lake.spark, op, [1, 2, 3, 4, 5, 6])


def test_truncated_plan_of_a_batch_written_in_part_is_refused_then_restored(
    running, clock, tmp_path
):
    lake, op = running
    put(lake, "transactions", [(5, 10, 1.0), (6, 79, 1.0)], TX)
    crash_before_any_commit(lake, clock, crash_after=1)  # enriched holds batch 2
    plan = newest(state_path(op, "plans"))
    shutil.copy(plan, tmp_path / "plan.json")
    plan.write_text(plan.read_text()[:40])
    with refused(
        dsi.errors.OperatorStateError,
        plan.name,
        "cannot be replayed exactly",
        fix=["restore the plan file", "main_from='keep'"],
    ):
        lake.run(op, clock)
    shutil.copy(tmp_path / "plan.json", plan)
    assert lake.run(op, clock).batches[0].replayed
    assert_accounted(lake.spark, op, [1, 2, 3, 4, 5, 6])


def test_truncated_plan_of_a_batch_written_in_part_then_reset_keeps_every_record(running, clock):
    lake, op = running
    put(lake, "transactions", [(5, 10, 1.0), (6, 79, 1.0)], TX)
    crash_before_any_commit(lake, clock, crash_after=1)  # enriched holds tx 5, not the buffer
    plan = newest(state_path(op, "plans"))
    plan.write_text(plan.read_text()[:40])
    with refused(dsi.errors.OperatorStateError, "cannot be replayed exactly"):
        lake.run(op, clock)
    op.reset(main_from="keep")
    lake.run(op, clock)
    # As documented: the batch is read again, none of its records is lost, and those the
    # tables that had committed it hold appear there twice.
    found = placement(lake.spark, op, "tx_id")
    assert set(found) == {1, 2, 3, 4, 5, 6}
    assert {i for i, n in found.items() if n > 1} == {5}


# --- operator.json --------------------------------------------------------------------------


def test_corrupt_operator_json_is_refused_then_reset_keeping_the_position(running, clock):
    lake, op = running
    state_path(op, "operator.json").write_text('{"operator_id": "enri')
    with refused(
        dsi.errors.OperatorStateError, "operator.json", "cannot be read", fix="operator.reset("
    ):
        lake.run(op, clock)
    op.reset(main_from="keep")
    put(lake, "transactions", [(5, 10, 1.0)], TX)
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1, 2, 3, 4, 5])


def test_deleted_operator_json_is_refused_then_reset_keeping_the_position(running, clock):
    lake, op = running
    state_path(op, "operator.json").unlink()
    # Without it, another main input or a replaced buffer would go unnoticed.
    with refused(
        dsi.errors.OperatorStateError, "operator.json", "is missing", fix="reset(main_from='keep')"
    ):
        lake.run(op, clock)
    op.reset(main_from="keep")
    put(lake, "transactions", [(5, 10, 1.0)], TX)
    lake.run(op, clock)
    assert_accounted(lake.spark, op, [1, 2, 3, 4, 5])


# --- side tables ------------------------------------------------------------------------------


def test_side_table_deleted_is_refused_then_created_again_at_the_same_version_rechecks_waiting(
    running, clock
):
    lake, op = running
    shutil.rmtree(lake.storage.table_uri("profiles"))
    with refused(dsi.errors.SideInputDataError, "'profile'", "is gone", fix="rematerialize"):
        lake.run(op, clock)  # waiting for a table batch 1 read would hold tx 4 forever
    assert op.buffer().rows() == 1
    put(lake, "profiles", [(10, "ann"), (11, "bob"), (77, "cy")], PROFILES)  # version 0 again
    lake.run(op, clock)  # tx 4 used to wait until its timeout: "version 0" had not changed
    assert lake.rows("enriched", "tx_id", "name") == [(1, "ann"), (2, "bob"), (3, "ann"), (4, "cy")]
    assert_accounted(lake.spark, op, [1, 2, 3, 4])


def test_a_batch_written_in_part_is_replayed_with_the_side_version_it_planned_with(running, clock):
    """A profile added after the crash is not seen by the replay: the table that holds the
    batch was computed without it. The next batch sees it. (Before, only the plan's
    content was checked in process: a replay reading the latest side version passed.)"""
    lake, op = running
    put(lake, "transactions", [(5, 10, 1.0), (6, 77, 1.0)], TX)
    crash_before_any_commit(lake, clock, crash_after=1)  # enriched holds tx 5, not the buffer
    put(lake, "profiles", [(77, "zed")], PROFILES)
    replay = lake.run(op, clock).batches[0]
    assert replay.replayed
    assert (replay.routes["released"], replay.routes["key_wait"]) == (1, 1)  # tx 6 waits
    assert_accounted(lake.spark, op, [1, 2, 3, 4, 5, 6])
    if op.buffer().rows():  # the side change releases tx 6 in the next batch
        lake.run(op, clock)
    assert (6, "zed") in lake.rows("enriched", "tx_id", "name")


def test_side_table_replaced_while_a_batch_is_written_in_part_is_refused_then_restored(
    running, clock, tmp_path
):
    lake, op = running
    put(lake, "transactions", [(5, 10, 1.0), (6, 79, 1.0)], TX)
    crash_before_any_commit(lake, clock, crash_after=1)
    uri = lake.storage.table_uri("profiles")
    shutil.move(uri, tmp_path / "profiles")
    put(lake, "profiles", [(10, "ANN"), (11, "BOB")], PROFILES)
    with refused(
        dsi.errors.OperatorStateError,
        "'profile'",
        "was deleted and created again",
        fix="restore the side table",
    ):
        lake.run(op, clock)
    shutil.rmtree(uri)
    shutil.move(tmp_path / "profiles", uri)
    assert lake.run(op, clock).batches[0].replayed
    assert_accounted(lake.spark, op, [1, 2, 3, 4, 5, 6])

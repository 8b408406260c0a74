"""The lake's storage failing outside Spark (a file where a folder should be, a folder
where a file should be) is a StorageError naming the path; nothing is committed twice or
lost, and the rerun after the repair gives every record exactly once."""

import shutil
from pathlib import Path

import pytest

import dagster_sideinputs as dsi
from tests.core.test_one_pass import fill, operator

DELTA_ENGINES = ("rs", "spark")


def state_folder(lake, op: dsi.SideInputOperator) -> Path:
    return Path(op.state_uri.removeprefix("file://"))


def block(path: Path, *, with_folder: bool = False) -> None:
    """Put a file where the operator expects a folder (or a folder where it expects a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if with_folder:
        path.mkdir()
    else:
        path.write_text("not the operator's")


def unblock(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()


def assert_exact(lake) -> None:
    assert lake.rows("enriched") == [(1, "ann"), (2, "bob"), (3, None)]
    assert lake.rows("big") == [(2, "bob"), (3, None)]


def test_a_file_where_the_state_folder_goes_is_a_storage_error_and_the_rerun_is_exact(lake):
    fill(lake)
    op = operator(lake)
    blocked = state_folder(lake, op)
    block(blocked)
    with pytest.raises(dsi.StorageError, match=r"storage failed at .*_sideinputs") as failure:
        lake.run(op)
    assert str(blocked) in str(failure.value)
    assert failure.value.fix
    assert not lake.exists("enriched")
    assert not lake.exists("big")
    unblock(blocked)
    lake.run(operator(lake))
    assert_exact(lake)


def test_the_plans_folder_turned_into_a_file_is_a_storage_error_and_the_rerun_is_exact(lake):
    fill(lake, [(1, 10, 50.0)])
    op = operator(lake)
    lake.run(op)
    plans = state_folder(lake, op) / "plans"
    aside = plans.with_name("plans.aside")
    plans.rename(aside)  # e.g. a mount that went away, leaving a stale file behind
    block(plans)
    fill(lake, [(2, 11, 500.0), (3, 12, 900.0)])
    with pytest.raises(dsi.StorageError, match=r"storage failed at .*plans") as failure:
        lake.run(operator(lake))
    assert "Nothing is lost" in str(failure.value)
    assert lake.rows("enriched") == [(1, "ann")]  # the second batch wrote nothing
    unblock(plans)
    aside.rename(plans)
    lake.run(operator(lake))
    assert_exact(lake)


def test_a_file_where_an_output_table_goes_fails_the_batch_and_the_rerun_completes_it(lake):
    """The bridge finds it while staging (nothing committed); delta-spark creates a new
    table's log only when it commits, so the batch is committed to the main output first
    and the error says so. Either way the rerun writes each table once."""
    fill(lake)
    big = Path(lake.storage.table_uri("big").removeprefix("file://"))
    block(big)
    with pytest.raises(dsi.SideInputError) as failure:
        lake.run(operator(lake))
    message = str(failure.value)
    assert "big" in message
    if lake.engine_id == "rs":
        assert not lake.exists("enriched")
    else:
        assert "committed to ['enriched'] but not to ['big']" in message
        assert "Nothing was written" not in message
        assert lake.rows("enriched") == [(1, "ann"), (2, "bob"), (3, None)]
    unblock(big)
    lake.run(operator(lake))
    assert_exact(lake)


def test_the_operators_introspection_raises_a_storage_error_too(lake):
    fill(lake, [(1, 10, 50.0)])
    op = operator(lake)
    lake.run(op)
    folder = state_folder(lake, op)
    aside = folder.with_name(folder.name + ".aside")
    folder.rename(aside)
    block(folder)
    for look in (op.last_committed_batch, op.last_plan, op.peek):
        with pytest.raises(dsi.StorageError, match=str(folder.name)):
            look()
    unblock(folder)
    aside.rename(folder)
    assert op.last_committed_batch() == 0

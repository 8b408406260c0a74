"""The lake's storage failing outside Spark (a file where a folder should be, a write the
filesystem refuses) is a StorageError naming the path; nothing is committed twice or
lost, and the rerun after the repair gives every record exactly once."""

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.engine import DeltaEngine
from tests.core.test_one_pass import fill, operator

DELTA_ENGINES = ("rs", "spark")


def state_folder(op: dsi.SideInputOperator) -> Path:
    return Path(op.state_uri.removeprefix("file://"))


def block(path: Path) -> None:
    """Put a file where the operator expects a folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not the operator's")


@contextmanager
def replaced_by_a_file(folder: Path) -> Iterator[None]:
    """The folder out of reach for the block (e.g. a mount that went away and left a stale
    file behind), then back as it was."""
    aside = folder.with_name(folder.name + ".aside")
    folder.rename(aside)
    block(folder)
    yield
    folder.unlink()
    aside.rename(folder)


def assert_exact(lake) -> None:
    assert lake.rows("enriched") == [(1, "ann"), (2, "bob"), (3, None)]
    assert lake.rows("big") == [(2, "bob"), (3, None)]


def test_a_file_where_the_state_folder_goes_is_a_storage_error_and_the_rerun_is_exact(lake):
    fill(lake)
    op = operator(lake)
    blocked = state_folder(op)
    block(blocked)
    with pytest.raises(dsi.StorageError, match=r"storage failed at .*_sideinputs") as failure:
        lake.run(op)
    assert str(blocked) in str(failure.value)
    assert failure.value.fix
    assert not lake.exists("enriched")
    assert not lake.exists("big")
    blocked.unlink()
    lake.run(operator(lake))
    assert_exact(lake)


def test_the_plans_folder_turned_into_a_file_is_a_storage_error_and_the_rerun_is_exact(lake):
    fill(lake, [(1, 10, 50.0)])
    op = operator(lake)
    lake.run(op)
    fill(lake, [(2, 11, 500.0), (3, 12, 900.0)])
    with replaced_by_a_file(state_folder(op) / "plans"):
        with pytest.raises(dsi.StorageError, match=r"storage failed at .*plans") as failure:
            lake.run(operator(lake))
        assert "Nothing is lost" in str(failure.value)
        assert lake.rows("enriched") == [(1, "ann")]  # the second batch wrote nothing
    lake.run(operator(lake))
    assert_exact(lake)


def test_the_operators_introspection_raises_a_storage_error_too(lake):
    fill(lake, [(1, 10, 50.0)])
    op = operator(lake)
    lake.run(op)
    folder = state_folder(op)
    with replaced_by_a_file(folder):
        for look in (op.last_committed_batch, op.last_plan, op.peek, op.buffer):
            with pytest.raises(dsi.StorageError, match=folder.name):
                look()
    assert op.last_committed_batch() == 0


def test_a_file_where_a_new_output_table_goes_fails_the_batch_before_any_commit(lake):
    """Both engines find it while staging: delta-spark, which creates a table's log only
    when it commits, too."""
    fill(lake)
    big = Path(lake.storage.table_uri("big").removeprefix("file://"))
    block(big)
    with pytest.raises(dsi.StorageError, match=f"{big} is a file") as failure:
        lake.run(operator(lake))
    assert failure.value.fix
    assert not lake.exists("enriched")
    big.unlink()
    lake.run(operator(lake))
    assert_exact(lake)


def table_folder(lake, name: str) -> Path:
    return Path(lake.storage.table_uri(name).removeprefix("file://"))


def test_an_existing_output_table_turned_into_a_file_fails_the_batch_before_any_commit(lake):
    fill(lake, [(1, 10, 50.0)])
    lake.run(operator(lake))
    fill(lake, [(2, 11, 500.0), (3, 12, 900.0)])
    big = table_folder(lake, "big")
    with replaced_by_a_file(big):
        with pytest.raises(dsi.StorageError, match=f"{big} is a file"):
            lake.run(operator(lake))
        assert lake.rows("enriched") == [(1, "ann")]
    lake.run(operator(lake))
    assert_exact(lake)


@pytest.mark.parametrize("what", ["table", "log"])
def test_a_side_input_whose_folder_turned_into_a_file_is_a_storage_error_not_a_missing_table(
    lake, what
):
    """Read as "no table", the side input would look not ready and the records would
    wait for a profile table that is there all along, out of reach."""
    fill(lake, [(1, 10, 50.0)])
    lake.run(operator(lake))
    fill(lake, [(2, 11, 500.0), (3, 12, 900.0)])
    profiles = table_folder(lake, "profiles")
    with replaced_by_a_file(profiles if what == "table" else profiles / "_delta_log"):
        with pytest.raises(dsi.StorageError, match="profiles") as failure:
            lake.run(operator(lake))
        assert "Nothing is lost" in str(failure.value)
        assert lake.rows("enriched") == [(1, "ann")]
    lake.run(operator(lake))
    assert_exact(lake)


@dataclass
class FullDiskOnSecondCommit:
    """The real engine, whose second commit of a run meets a full disk."""

    inner: DeltaEngine
    commits: int = 0

    def commit(self, staged: Any, **kwargs: Any) -> Any:
        self.commits += 1
        if self.commits == 2:
            raise OSError(errno.ENOSPC, "No space left on device", f"{staged.uri}/_delta_log")
        return self.inner.commit(staged, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_commit_failing_after_another_committed_says_which_tables_hold_the_batch(lake):
    fill(lake)
    failing = lake.with_engine(FullDiskOnSecondCommit(lake.engine))  # type: ignore[arg-type]
    with pytest.raises(dsi.StorageError) as failure:
        lake.run(operator(lake, storage=failing))
    message = str(failure.value)
    assert "No space left on device" in message
    assert "committed to ['enriched'] but not to ['big']" in message
    assert "Nothing was written" not in message
    assert lake.rows("enriched") == [(1, "ann"), (2, "bob"), (3, None)]
    assert not lake.exists("big")
    result = lake.run(operator(lake))
    assert result.batches[0].replayed
    assert_exact(lake)

"""Two runs of one operator whose lock did not keep them apart (a run paused longer than
its lease on an object store, then resumed) still cannot both commit a batch: each plan's
claim (``claims/``, created with put-if-absent / ``O_EXCL``) decides once whether it
commits or is set aside. On the local filesystem and on the S3 test server.

The lock is taken out of both operators here (what a lost lease amounts to), and run A
is held still at the worst moments in a thread while run B does its work.
"""

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core.state.folder import COMMIT
from dagster_sideinputs.delta.store.files import TableFiles
from tests.core.conftest import Lake

pytestmark = pytest.mark.slow

TX = "tx_id long, customer_id long, amount double"


class Pause:
    """Holds run A at one point until the test lets it go."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()

    def here(self) -> None:
        self.reached.set()
        assert self.go.wait(300), "never released"


def operator(lake: Lake, fn: Callable[..., DataFrame]) -> dsi.SideInputOperator:
    op = lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=fn,
        main_output="enriched",
    )
    # What a lost lease amounts to: nothing keeps the two runs apart.
    op._lock = lambda wait_s: contextlib.nullcontext()  # type: ignore[method-assign]
    return op


def enrich(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    return main.select("tx_id", F.col("profile.name").alias("name"))


def in_thread(action: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = action()
        except BaseException as exc:  # the test inspects it
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def prepare(lake: Lake) -> None:
    lake.append("profiles", [(10, "ann"), (11, "bob")], "customer_id long, name string")
    lake.append("transactions", [(i, 10 + i % 2, 1.0) for i in range(20)], TX)


def state_files(lake: Lake, folder: str) -> list[str]:
    uri = lake.storage.table_uri(["_sideinputs", "enriched"])
    state = TableFiles(uri, lake.storage.storage_options)
    return sorted(e.path for e in state.list_files(folder) if "/" not in e.path[len(folder) + 1 :])


@pytest.mark.each_storage
def test_a_plan_set_aside_while_its_run_was_paused_commits_nothing(lake):
    """A plans batch 0 and is paused in its function. B finds the plan with no table
    committed and nothing claimed: sets it aside, plans batch 0 again (with 10 more
    records) and commits it. A resumes: its claim finds the plan set aside, so it commits
    nothing and says why. Every record is in the output once."""
    prepare(lake)
    pause = Pause()

    def paused_enrich(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
        pause.here()
        return enrich(main, sides)

    a, b = operator(lake, paused_enrich), operator(lake, enrich)
    thread, outcome = in_thread(lambda: lake.run(a))
    assert pause.reached.wait(300), outcome
    lake.append("transactions", [(i, 10 + i % 2, 1.0) for i in range(20, 30)], TX)
    result = lake.run(b)
    assert [m.batch_id for m in result.batches] == [0]
    pause.go.set()
    thread.join(300)
    error = outcome.get("error")
    assert isinstance(error, dsi.errors.OperatorStateError), outcome
    assert "was set aside by another run" in str(error)
    assert "committed nothing" in str(error)
    assert sorted(r[0] for r in lake.rows("enriched", "tx_id")) == list(range(30))
    claims = state_files(lake, "claims")
    assert len(claims) == 2, claims  # A's plan: set aside; B's: commit
    assert state_files(lake, "commits") == ["commits/00000000000000000000.json"]
    assert lake.run(operator(lake, enrich)).batches == []


def test_a_plan_claimed_before_its_run_was_paused_is_replayed_not_planned_again(lake):
    """A claims batch 0 for commit and is paused before its first table commit. B must
    not plan the batch again (A may still commit it): it replays A's plan. A resumes and
    finds every table holding the batch. Every record is in the output once, and records
    appended meanwhile wait for the next batch."""
    prepare(lake)
    pause = Pause()
    a, b = operator(lake, enrich), operator(lake, enrich)
    claim = a.state.claim

    def claim_then_pause(plan: Any, action: str) -> str:
        decided = claim(plan, action)
        if decided == COMMIT:
            pause.here()
        return decided

    a.state.claim = claim_then_pause  # type: ignore[method-assign]
    thread, outcome = in_thread(lambda: lake.run(a))
    assert pause.reached.wait(300), outcome
    lake.append("transactions", [(i, 10 + i % 2, 1.0) for i in range(20, 30)], TX)
    result = lake.run(b)
    first = result.batches[0]
    assert (first.batch_id, first.replayed) == (0, True), result
    assert sorted(r[0] for r in lake.rows("enriched", "tx_id")) == list(range(30))
    pause.go.set()
    thread.join(300)
    assert not thread.is_alive()
    assert sorted(r[0] for r in lake.rows("enriched", "tx_id")) == list(range(30))
    assert len(state_files(lake, "plans/discarded")) == 0

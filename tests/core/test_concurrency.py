"""Two runs of the same operator at once cannot both write the same batch."""

import os
import subprocess
import sys

import pytest

from tests.core.conftest import Lake

TX = "tx_id long, customer_id long, amount double"


def start(root: str, wait: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.core.concurrent_worker", root, str(wait)],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def prepare(lake: Lake) -> None:
    lake.append("profiles", [(10, "ann"), (11, "bob")], "customer_id long, name string")
    lake.append("transactions", [(i, 10 + i % 2, 1.0) for i in range(50)], TX)


@pytest.mark.slow
def test_a_second_concurrent_run_is_refused_and_the_tables_stay_exact(lake):
    prepare(lake)
    runs = [start(lake.storage.root, wait=0), start(lake.storage.root, wait=0)]
    outcomes = [(p.wait(timeout=300), p.stderr.read()) for p in runs]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 3], outcomes
    refused = next(err for code, err in outcomes if code == 3)
    assert "is already running (pid" in refused
    assert "limit the job's concurrency" in refused
    assert sorted(r[0] for r in lake.rows("enriched", "tx_id")) == list(range(50))


@pytest.mark.slow
def test_a_second_run_that_waits_finds_the_work_done_and_writes_nothing_twice(lake):
    prepare(lake)
    runs = [start(lake.storage.root, wait=120), start(lake.storage.root, wait=120)]
    outputs = sorted(p.communicate(timeout=300)[0].strip() for p in runs)
    assert [p.returncode for p in runs] == [0, 0]
    assert outputs == ["batches=0", "batches=1"]
    assert sorted(r[0] for r in lake.rows("enriched", "tx_id")) == list(range(50))

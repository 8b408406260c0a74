"""Two runs of the same operator at once cannot both write the same batch, on the local
filesystem (flock) and on the S3 test server (a lease on conditional writes); a run
killed while it holds the lock is taken over (at once locally, after its lease on S3)."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagster_sideinputs.delta.store.files import TableFiles
from tests.core.conftest import Lake

TX = "tx_id long, customer_id long, amount double"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
LEASE_S = 5.0

pytestmark = pytest.mark.slow
# The lock's two implementations (flock locally, a lease on S3) are tested where they
# differ, on each store (the lock does not depend on the Delta engine): taking over from
# a killed run. Refusing a second run is the storage contract's
# (test_inputs_and_limits.py); here, and waiting for the lock, locally.


class Worker:
    """One worker process (its own process group: the JVM dies with it), its output lines."""

    def __init__(
        self, lake: Lake, wait: float, function_s: float = 6.0, gate: Path | None = None
    ) -> None:
        """``gate``: the worker starts its session at once but runs the operator only once
        that file exists (tests/core/concurrent_worker.py)."""
        env = {**os.environ, **lake.storage.storage_options, "DSI_LOCK_LEASE_SECONDS": str(LEASE_S)}
        if gate is not None:
            env["DSI_TEST_START_GATE"] = str(gate)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.core.concurrent_worker",
                lake.storage.root,
                str(wait),
                str(function_s),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []
        self.stderr = ""
        self._reading = True
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        self.stderr = self.process.stderr.read()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append((time.time(), line.strip()))
                self._changed.notify_all()
        with self._changed:
            self._reading = False
            self._changed.notify_all()

    def wait_for(self, prefix: str, timeout: float = 300) -> tuple[float, str]:
        """(arrival time, line) of the first output line starting with ``prefix``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [(t, line) for t, line in self.lines if line.startswith(prefix)]
                if found:
                    return found[0]
                ended = self.process.poll() is not None
                if time.monotonic() > deadline or (ended and not self._reading):
                    raise AssertionError(f"no {prefix!r} from the worker: {self.finish()}")
                self._changed.wait(1.0)

    def has(self, prefix: str) -> bool:
        with self._changed:
            return any(line.startswith(prefix) for _, line in self.lines)

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) once the worker ends (killed after ``timeout``)."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join(30)
        with self._changed:
            out = "\n".join(line for _, line in self.lines)
        return self.process.returncode, out, self.stderr

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


@contextlib.contextmanager
def workers(*started: Worker) -> Iterator[None]:
    try:
        yield
    finally:
        for worker in started:
            worker.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(timeout=30)


def prepare(lake: Lake) -> None:
    lake.append("profiles", [(10, "ann"), (11, "bob")], "customer_id long, name string")
    lake.append("transactions", [(i, 10 + i % 2, 1.0) for i in range(50)], TX)


@pytest.mark.extended  # tier 3: subprocesses (the lock refusing in-process: test_inputs_and_limits)
def test_a_second_concurrent_run_is_refused_and_the_tables_stay_exact(lake):
    prepare(lake)
    runs = [Worker(lake, wait=0), Worker(lake, wait=0)]
    with workers(*runs):
        outcomes = [run.finish() for run in runs]
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 3], outcomes
    refused = next(err for code, _, err in outcomes if code == 3)
    assert "is already running (pid" in refused
    assert "limit the job's concurrency" in refused
    assert sorted(r[0] for r in lake.rows("enriched", "tx_id")) == list(range(50))


@pytest.mark.extended  # tier 3: subprocesses (the lock refusing in-process: test_inputs_and_limits)
def test_a_second_run_that_waits_finds_the_work_done_and_writes_nothing_twice(lake):
    prepare(lake)
    runs = [Worker(lake, wait=120), Worker(lake, wait=120)]
    with workers(*runs):
        outcomes = [run.finish() for run in runs]
    assert [code for code, _, _ in outcomes] == [0, 0], outcomes
    last_lines = sorted(out.splitlines()[-1] for _, out, _ in outcomes)
    assert last_lines == ["batches=0 replayed=0", "batches=1 replayed=0"], outcomes
    assert sorted(r[0] for r in lake.rows("enriched", "tx_id")) == list(range(50))


def test_a_run_killed_holding_the_lock_is_taken_over_and_its_batch_completed(lake, tmp_path):
    """A is SIGKILLed in the middle of its batch, while B waits for the lock. B gets it at
    once on a filesystem (the kernel drops a dead process's flock) and completes the batch;
    the output holds every record once. (On S3 the lease of a killed holder passes on after
    a lease: tests/delta/test_object_store.py, across processes.) B's JVM starts beside
    A's; B asks for the lock only once A holds it and is in its batch."""
    prepare(lake)
    gate = tmp_path / "holder-in-batch"
    holder = Worker(lake, wait=0, function_s=120)
    waiting = Worker(lake, wait=180, function_s=0, gate=gate)
    with workers(holder, waiting):
        holder.wait_for("in-batch")  # A holds the lock and has planned its batch
        waiting.wait_for("ready")
        gate.touch()
        time.sleep(2 * LEASE_S)  # B tries meanwhile; A, alive, renews its lease
        assert not waiting.has("locked"), "B took the lock while A held it"
        holder.kill()
        killed_at = time.time()
        took_over_at, _ = waiting.wait_for("locked", timeout=120)
        code, out, err = waiting.finish()
    assert code == 0, err[-3000:]
    assert out.splitlines()[-1].startswith("batches=1"), out
    assert took_over_at - killed_at < LEASE_S / 2, took_over_at - killed_at
    state = TableFiles(f"{lake.storage.root}/_sideinputs/enriched", lake.storage.storage_options)
    assert [e.path for e in state.list_files("commits")] == ["commits/00000000000000000000.json"]
    assert sorted(r[0] for r in lake.rows("enriched", "tx_id")) == list(range(50))

"""Crash harness: the example pipeline killed with SIGKILL at random points, then rerun.

    python bench/crash_harness.py --trials 20 --seed 1
    python bench/crash_harness.py --script short --trials 0 --side-change

Every trial copies a template (a Dagster instance and a Delta lake holding the side
inputs), runs the example pipeline (``assets/``) in a worker subprocess, kills the
worker's whole process group (the Python driver and its Spark JVM) with SIGKILL after a
random delay, possibly more than once, reruns it to completion, and compares every
output table and the operators' buffers with a reference run that was never killed:
no record lost, none duplicated, nothing else different.

The pipeline is a fixed script of idempotent actions, so a rerun continues where the
killed worker stopped (its progress is a file, advanced after each action):

1. append transactions batch A (hours 00-01 of 2024-05-01; a few unknown customers),
   run ``payments_enrichment_job``;
2. append batch B (hours 02-03: hour 03 waits for its FX partition), run the job;
3. materialize ``fx_rates`` 03:00, append batch C (some 6 hours late), run the job;
4. materialize ``customer_profiles`` with 25 more customers (releases some waiting
   transactions), append batch D (some in hour 04, whose FX never arrives), run the job;
5. with a zero profile timeout (a second worker process): append batch E, run the job
   (the transactions still waiting for a profile go to ``unmatched_transactions``);
6. materialize profiles with 60 more customers, run
   ``replay_unmatched_transactions_job`` (the replay operator has its own state).

The lake is a local folder, or (``--lake s3://bucket/prefix``) a prefix on an object
store, reached with the ``AWS_*`` environment variables like the example's resources
(each trial gets its own ``<prefix>/<trial>``). The Dagster instance stays local.

Side-change trials (``--script short --side-change``) kill the first job right after
batch 0's plan, either before any table is committed (``before-create-enriched``) or after
the first one (``after-first-table``), then add 25 customer profiles before the rerun.
A batch no table committed is planned again and must equal a run without faults that
added them before the job (``short-change-first``); a batch some table committed is
replayed with the profiles it planned with, and must equal a run that added them after
the job (``short-change-after``).

Nothing that changes the outputs depends on the wall clock: event times are fixed,
the profile timeout is huge (then zero), and the side inputs with freshness policies
are materialized when the template is made (a run of the harness must stay well inside
the 12 hours of the fraud rules' policy). Transactions are appended with delta-rs and
an application transaction (idempotent); every other action goes through Dagster like
``assets/demo.py``: ``materialize`` for the sources, ``execute_in_process`` for the
jobs, against the trial's own ``DAGSTER_HOME``.
"""

import argparse
import collections
import contextlib
import datetime as dt
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
HOUR0 = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
INPUT_APP = "crash-harness-inputs"
TEMPLATE_FX_HOURS = ("2024-05-01-00:00", "2024-05-01-01:00", "2024-05-01-02:00")
OUTPUTS = (
    "enriched_transactions",
    "suspicious_transactions",
    "late_transactions",
    "unmatched_transactions",
)
STATE = "_sideinputs"
LONG_TIMEOUT_MINUTES = "10000000"  # ~19 years: nothing times out while the harness runs
ZERO_TIMEOUT_MINUTES = (
    "0.000001"  # 60 µs: every transaction waiting since an earlier batch times out
)
TEMPLATE_MAX_AGE = dt.timedelta(hours=11)  # fraud_rules must stay fresh (12 hours)
WORKER_TIMEOUT_S = 900.0


# --- the pipeline script ----------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """A deterministic batch of transactions."""

    index: int
    count: int
    hours: tuple[int, ...]  # event hours, relative to HOUR0
    unknown_share: float = 0.0  # customers 1001..1070 (no profile at first)
    late_share: float = 0.0  # event time 6 hours earlier


BATCHES = (
    Batch(1, 400, (0, 1), unknown_share=0.04),
    Batch(2, 400, (2, 3), unknown_share=0.04),
    Batch(3, 300, (3,), unknown_share=0.02, late_share=0.15),
    Batch(4, 200, (3, 4), unknown_share=0.03),
    Batch(5, 100, (3,), unknown_share=0.05),
)


@dataclass(frozen=True)
class Action:
    """One idempotent step of the pipeline; ``group`` is the profile timeout it needs."""

    kind: str  # append | fx | profiles | job
    arg: Any
    group: str = "long"

    @property
    def label(self) -> str:
        return f"{self.kind} {self.arg}"


ACTIONS = (
    Action("append", 1),
    Action("job", "payments_enrichment_job"),
    Action("append", 2),
    Action("job", "payments_enrichment_job"),
    Action("fx", "2024-05-01-03:00"),
    Action("append", 3),
    Action("job", "payments_enrichment_job"),
    Action("profiles", 25),
    Action("append", 4),
    Action("job", "payments_enrichment_job"),
    Action("append", 5, "zero"),
    Action("job", "payments_enrichment_job", "zero"),
    Action("profiles", 60, "zero"),
    Action("job", "replay_unmatched_transactions_job", "zero"),
)
SHORT_ACTIONS = (
    Action("append", 1),
    Action("job", "payments_enrichment_job"),
    Action("fx", "2024-05-01-03:00"),
    Action("append", 2),
    Action("job", "payments_enrichment_job"),
)
"""A CI-sized pipeline: two batches, one worker group (one JVM start when not killed)."""
SIDE_CHANGE = Action("profiles", 25)
"""The side-input change of the side-change trials: 25 more customer profiles (some
transactions of the script's first batch wait for them)."""
SCRIPTS = {
    "full": ACTIONS,
    "short": SHORT_ACTIONS,
    # References of the side-change trials (the short script with the change inserted):
    # the change before the first job (what a batch planned again must equal), and after
    # it (what a batch replayed from its plan, then the next batch, must equal).
    "short-change-first": (SHORT_ACTIONS[0], SIDE_CHANGE, *SHORT_ACTIONS[1:]),
    "short-change-after": (*SHORT_ACTIONS[:2], SIDE_CHANGE, *SHORT_ACTIONS[1:]),
}
GROUP_TIMEOUTS = {"long": LONG_TIMEOUT_MINUTES, "zero": ZERO_TIMEOUT_MINUTES}


def _actions(folder: Path) -> tuple[Action, ...]:
    """The script of a template / trial folder (written by ``prepare_template``)."""
    return SCRIPTS[(folder / "script").read_text().strip()]


def transactions(batch: Batch) -> Any:
    """The rows of a batch as a pyarrow table (same bytes on every call)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(1_000 + batch.index)
    n = batch.count
    unknown = rng.random(n) < batch.unknown_share
    customers = np.where(unknown, rng.integers(1001, 1071, n), rng.integers(1, 1001, n))
    hours = rng.choice(np.array(batch.hours), n)
    seconds = hours * 3600 + rng.integers(0, 3600, n)
    seconds = seconds - np.where(rng.random(n) < batch.late_share, 6 * 3600, 0)
    start_us = int(HOUR0.timestamp()) * 1_000_000
    currencies = np.array(["USD", "EUR", "GBP", "JPY", "CHF"])
    return pa.table(
        {
            "tx_id": pa.array(batch.index * 1_000_000 + np.arange(n), pa.int64()),
            "customer_id": pa.array(customers, pa.int64()),
            "card_id": pa.array([f"card-{c}" for c in rng.integers(0, 3000, n)]),
            "merchant": pa.array([f"merchant-{m}" for m in rng.integers(0, 200, n)]),
            "amount": pa.array(np.round(np.exp(rng.random(n) * 9), 2), pa.float64()),
            "currency": pa.array(currencies[rng.integers(0, len(currencies), n)]),
            "ts": pa.array(start_us + seconds * 1_000_000, pa.timestamp("us", tz="UTC")),
        }
    )


# --- the lake (a local folder or an object store prefix) ------------------------------------


class Lake:
    """A trial's lake, read and listed through the project's own file layer, so the same
    code serves a local folder and an object store (options: the ``AWS_*`` environment)."""

    def __init__(self, root: str) -> None:
        from dagster_sideinputs.delta.store.files import normalize_uri
        from dagster_sideinputs.delta.store.s3 import resolve_storage_options

        self.root = normalize_uri(root)
        self.options = resolve_storage_options(self.root, None)

    @property
    def local(self) -> bool:
        from dagster_sideinputs.delta.store.files import is_local

        return is_local(self.root)

    def uri(self, *parts: str) -> str:
        from dagster_sideinputs.delta.store.files import join_uri

        return join_uri(self.root, *parts)

    def files(self, *parts: str) -> Any:
        from dagster_sideinputs.delta.store.files import TableFiles

        return TableFiles(self.uri(*parts), self.options)

    def entries(self, *parts: str) -> list[Any]:
        """Every file below a folder (recursively), paths relative to it."""
        return list(self.files(*parts).list_files(""))

    def operators(self) -> list[str]:
        """The operator ids with a state folder."""
        return sorted({e.path.split("/", 1)[0] for e in self.entries(STATE) if "/" in e.path})

    def ids(self, *parts: str) -> list[int]:
        """Batch ids of the ``<id>.json`` files directly in a folder (plans, commits)."""
        names = [e.path for e in self.entries(*parts) if "/" not in e.path]
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def log_actions(self, table: str) -> list[dict[str, Any]]:
        """Every action of a table's Delta log, in version order (empty without a log)."""
        files = self.files(table)
        logs = sorted(e.path for e in self.entries(table, "_delta_log") if e.path.endswith(".json"))
        actions = []
        for name in logs:
            text = files.read_bytes(f"_delta_log/{name}").decode()
            actions += [json.loads(line) for line in text.splitlines() if line.strip()]
        return actions

    def is_table(self, table: str) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.uri(table), self.options or None)

    def copy_to(self, target: "Lake") -> None:
        """Every file of this lake into ``target`` (emptied first)."""
        target.delete()
        if self.local and target.local:
            shutil.copytree(self.root, target.root)
            return
        source, destination = self.files(), target.files()
        for entry in self.entries():
            destination.write_bytes_atomic(entry.path, source.read_bytes(entry.path))

    def delete(self) -> None:
        if self.local:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        files = self.files()
        for entry in self.entries():
            files.delete_file(entry.path)


def lake_of(trial: Path) -> Lake:
    """A trial's (or the template's) lake: ``<trial>/lake``, or the object store prefix
    named in ``<trial>/lake-root``."""
    named = trial / "lake-root"
    return Lake(named.read_text().strip() if named.exists() else str(trial / "lake"))


# --- the worker (a subprocess: its own process group, its own JVM) -------------------------


def _worker_env(trial: Path, group: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(trial / "dagster_home"),
        DSI_LAKE_ROOT=lake_of(trial).root,
        DSI_PROFILE_TIMEOUT_MINUTES=GROUP_TIMEOUTS[group],
        DSI_FX_START="2024-05-01-00:00",  # the scripts' FX hours (the demo starts yesterday)
        # A killed worker's S3 lock lease must lapse before the rerun's JVM is up (the
        # default 60 s lease made the rerun fail with OperatorBusyError).
        DSI_LOCK_LEASE_SECONDS="5",
        DSI_SPARK_MASTER="local[2]",
        DSI_SPARK_UI="false",
        DSI_SPARK_DRIVER_MEMORY="1g",
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        PYTHONUNBUFFERED="1",
    )
    return env


def _progress(trial: Path) -> int:
    path = trial / "progress.json"
    return json.loads(path.read_text())["done"] if path.exists() else 0


def _set_progress(trial: Path, done: int) -> None:
    temp = trial / "progress.json.tmp"
    temp.write_text(json.dumps({"done": done}))
    os.replace(temp, trial / "progress.json")


def _event(trial: Path, **data: Any) -> None:
    with open(trial / "events.jsonl", "a") as handle:
        handle.write(json.dumps({"t": time.time(), "pid": os.getpid(), **data}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _append(lake: Lake, batch_index: int) -> None:
    from deltalake import DeltaTable, Transaction, write_deltalake
    from deltalake.transaction import CommitProperties

    uri, options = lake.uri("transactions"), lake.options or None
    if lake.is_table("transactions"):
        done = DeltaTable(uri, storage_options=options).transaction_version(INPUT_APP)
        if done is not None and done >= batch_index:
            return
    batch = next(b for b in BATCHES if b.index == batch_index)
    write_deltalake(
        uri,
        transactions(batch),
        mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction(INPUT_APP, batch_index)]),
        storage_options=options,
    )


KILL_POINTS = {
    "before-first-plan": "dagster_sideinputs.core.state.folder:OperatorState.create_plan:1",
    "after-first-table": "dagster_sideinputs.delta.bridge.writer:commit_files:2",
    "before-publish-1": "dagster_sideinputs.delta.staging:Staging.publish:1",
    "before-create-enriched": "dagster_sideinputs.delta.bridge.writer:commit_files:1",
    "before-create-buffer": "dagster_sideinputs.delta.bridge.writer:commit_files:5",
    "before-commit-8": "dagster_sideinputs.delta.bridge.writer:commit_directly:3",
    "before-commit-record-2": "dagster_sideinputs.core.state.folder:OperatorState.commit:2",
    # delta-spark's Delta commits: one DeltaSparkEngine.commit per staged table (it commits
    # through Delta's own writer, `save`, or its py4j fast path, `commit_staged_files`).
    "after-first-table-spark": "dagster_sideinputs.delta.spark.engine:DeltaSparkEngine.commit:2",
}
"""Exact kill points (``--kill-at``): ``module:attribute:n`` kills the worker's process
group with SIGKILL when ``attribute`` is called for the n-th time in that worker, before
the call runs. ``commit_files`` is the Delta commit of a write whose files Spark has written
and the bridge has already moved into the table (a new table was created empty just
before: ``before-create-enriched`` once left a folder of files without a log, which every
rerun refused); in the first job, calls 1-5 create
the four output tables and the buffer (batch 0). Plain commits to existing local tables
are the bridge's own (``commit_directly``, delta/bridge/log_commit.py): its call 3 is batch 1's
buffer write, the 8th commit of the job.
``before-create-enriched`` (batch 0 planned and staged, no table committed: the rerun
plans it again) and ``after-first-table`` (one table committed: the rerun replays it) are
the kill points of the side-change trials. ``after-first-table-spark`` is
``after-first-table`` under delta-spark (its commits are ``DeltaSparkEngine.commit``; the
bridge's kill points are never reached there)."""


def kill_point_engine(name: str, *, local: bool = True) -> str | None:
    """The Delta engine a kill point's code runs under: the bridge's writer only under
    ``delta-rs``, delta-spark's engine only under ``delta-spark``; the staging both share
    under either on a local lake, on an object store only under ``delta-rs`` (delta-spark
    stages files itself only for local tables); None for the operator's own code (either
    engine: the environment's)."""
    module = KILL_POINTS[name].split(":", 1)[0]
    if ".delta.bridge." in module:
        return "delta-rs"
    if ".delta.spark." in module:
        return "delta-spark"
    if module.endswith(".delta.staging") and not local:
        return "delta-rs"
    return None


def _engine_of(kill_point: str, template: "Template") -> Any:
    """The workers' engine (``DSI_DELTA_ENGINE``, which they inherit) for a whole trial:
    the one whose code holds the kill point, so that the kill lands (the environment's
    ``auto`` is delta-spark where its jars are) and the rerun runs the same engine."""
    engine = kill_point_engine(kill_point, local=lake_of(template.path).local)
    return mock.patch.dict(os.environ, {"DSI_DELTA_ENGINE": engine} if engine else {})


def worker(trial: Path, *, template: bool = False) -> None:
    """Run the pending actions of this process's group (or build the template's sources)."""
    _event(trial, event="launch")
    import dagster as dg

    from assets.definitions import defs
    from assets.payments import customer_profiles, fraud_rules, fx_rates
    from resources import RESOURCES

    instance = dg.DagsterInstance.get()
    lake = Lake(os.environ["DSI_LAKE_ROOT"])
    started_spark = False
    kill_at = os.environ.get("DSI_HARNESS_KILL_AT")
    if kill_at:
        # Local like the imports above: the repository is on PYTHONPATH in workers only.
        from tests.kill_points import arm_kill_point

        arm_kill_point(kill_at, lambda: _event(trial, event="kill-point", where=kill_at))

    def spark() -> None:
        nonlocal started_spark
        if not started_spark:
            RESOURCES["spark"].spark_session  # noqa: B018 (start the JVM; Dagster reuses it)
            started_spark = True
            _event(trial, event="spark")

    def materialize(assets: list[Any], **kwargs: Any) -> None:
        spark()
        result = dg.materialize(assets, resources=RESOURCES, instance=instance, **kwargs)
        if not result.success:
            raise RuntimeError(f"materializing {assets} failed")

    if template:
        materialize([fraud_rules])
        materialize([customer_profiles])
        for key in TEMPLATE_FX_HOURS:
            materialize([fx_rates], partition_key=key)
        return

    def perform(action: Action) -> None:
        if action.kind == "append":
            _append(lake, action.arg)
        elif action.kind == "fx":
            materialize([fx_rates], partition_key=action.arg)
        elif action.kind == "profiles":
            materialize(
                [customer_profiles],
                run_config={
                    "ops": {"customer_profiles": {"config": {"extra_customers": action.arg}}}
                },
            )
        else:
            spark()
            result = defs.resolve_job_def(action.arg).execute_in_process(instance=instance)
            if not result.success:
                raise RuntimeError(f"job {action.arg} failed")

    change = os.environ.get("DSI_HARNESS_CHANGE")
    if change:  # an input change made between a kill and the rerun (side-change trials)
        kind, arg = change.split(":", 1)
        _event(trial, event="change", action=f"{kind} {arg}")
        perform(Action(kind, int(arg) if arg.isdigit() else arg))
    group = os.environ["DSI_HARNESS_GROUP"]
    _await_left_locks(trial, lake)
    actions = _actions(trial)
    for index in range(_progress(trial), len(actions)):
        action = actions[index]
        if action.group != group:
            break
        _event(trial, event="start", index=index, action=action.label)
        perform(action)
        _event(trial, event="done", index=index, action=action.label)
        _set_progress(trial, index + 1)


def _await_left_locks(trial: Path, lake: Lake) -> None:
    """On an object store, wait for the operator locks a killed worker left, as a user
    rerunning after a crash would.

    A killed worker stops renewing its lock's lease; another run may take the lock over
    once the lease (``DSI_LOCK_LEASE_SECONDS``, 5 s here) and its clock-skew margin (5 s)
    have passed, and a run before that is refused with ``OperatorBusyError`` (nothing
    done), as documented. A rerun reaching the lock about 9 s after the kill raced that
    window (two S3 trials failed so in CI). So each lock left under ``_sideinputs`` is
    taken (waiting while its holder's lease runs) and let go before any action runs.
    """
    if lake.local:
        return
    from dagster_sideinputs.delta.store.lease import ObjectStoreLease

    lease_s = float(os.environ.get("DSI_LOCK_LEASE_SECONDS", "60"))
    for entry in list(lake.files("_sideinputs").list_files("")):
        parts = entry.path.split("/")
        if len(parts) != 2 or parts[1] != "lock":
            continue
        lease = ObjectStoreLease(
            lake.uri("_sideinputs", parts[0]), "lock", lake.options, lease_s=lease_s
        )
        waited = time.monotonic()
        if lease.acquire(wait_s=4 * lease_s + 30):
            lease.release()
        _event(trial, event="lock", operator=parts[0], waited=time.monotonic() - waited)


# --- launching and killing workers -------------------------------------------------------


@dataclass
class Launch:
    """One worker process: how long it ran and whether it was killed."""

    group: str
    seconds: float
    killed: bool
    returncode: int | None
    phase: "Phase | None" = None


def _living(pgid: int, family: Sequence[Any]) -> list[int]:
    """Processes of the group, or of the given descendants, that are not dead (zombies
    count as dead: they cannot write anything)."""
    import psutil

    alive = []
    for proc in psutil.process_iter():
        try:
            member = os.getpgid(proc.pid) == pgid or proc in family
            if member and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return alive


def _launch(
    trial: Path,
    args: list[str],
    group: str,
    kill_after: float | None,
    kill_at: str | None = None,
    change: Action | None = None,
) -> Launch:
    env = _worker_env(trial, group)
    env["DSI_HARNESS_GROUP"] = group
    if kill_at:
        env["DSI_HARNESS_KILL_AT"] = kill_at
    if change is not None:
        env["DSI_HARNESS_CHANGE"] = f"{change.kind}:{change.arg}"
    number = len(list(trial.glob("worker-*.out")))
    with open(trial / f"worker-{number:02d}.out", "w") as out:
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args, "--trial", str(trial)],
            env=env,
            cwd=trial,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the JVM child is in it too
        )
        try:
            limit = WORKER_TIMEOUT_S if kill_after is None else min(kill_after, WORKER_TIMEOUT_S)
            process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill(process)
            if kill_after is None or kill_after >= WORKER_TIMEOUT_S:
                raise RuntimeError(f"worker hung for {WORKER_TIMEOUT_S}s in {trial}") from None
            return Launch(group, time.monotonic() - started, True, None)
        finally:
            if process.poll() is None:
                _kill(process)
        seconds = time.monotonic() - started
        if process.returncode == -signal.SIGKILL:  # a kill point fired
            return Launch(group, seconds, True, None)
        return Launch(group, seconds, False, process.returncode)


def _kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker's process group (Python driver, JVM, Dagster's helpers), and
    any descendant that left the group (PySpark's daemon makes its own), then wait until
    none of them is alive: nothing may touch the lake after the kill."""
    import psutil

    pgid = process.pid
    try:
        family = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for child in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    process.wait()
    deadline = time.monotonic() + 30
    alive = _living(pgid, family)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = _living(pgid, family)
    if alive:
        raise RuntimeError(f"processes of worker {pgid} survived SIGKILL: {alive}")


def run_pipeline(
    trial: Path, reference: "Reference | None" = None, *, change: Action | None = None
) -> list[Launch]:
    """Run the pipeline in ``trial`` to completion (from wherever it stopped), making
    ``change`` first when given."""
    launches: list[Launch] = []
    actions = _actions(trial)
    while _progress(trial) < len(actions):
        group = actions[_progress(trial)].group
        launch = _launch(trial, ["_worker"], group, None, change=change)
        change = None
        launches.append(launch)
        if launch.returncode != 0:
            raise WorkerFailed(trial, launches)
        if reference is not None:
            reference.observe(trial)
    return launches


def run_until_killed(
    trial: Path, delay: float, reference: "Reference | None" = None
) -> list[Launch]:
    """Run workers until one is killed after ``delay`` seconds of worker time, or the
    pipeline is done. A delay counts from a worker's launch; when the worker finishes its
    group first, the rest of the delay carries over to the next worker."""
    launches: list[Launch] = []
    remaining = delay
    actions = _actions(trial)
    while _progress(trial) < len(actions):
        launch = _launch(trial, ["_worker"], actions[_progress(trial)].group, remaining)
        launches.append(launch)
        if launch.killed:
            launch.phase = inspect_phase(trial, reference.expected if reference else None)
            return launches
        if launch.returncode != 0:
            raise WorkerFailed(trial, launches)
        if reference is not None:
            reference.observe(trial)
        remaining = max(0.0, remaining - launch.seconds)
    return launches


class WorkerFailed(Exception):
    """A worker exited with an error (e.g. a rerun could not recover)."""

    def __init__(self, trial: Path, launches: list[Launch]) -> None:
        last = sorted(trial.glob("worker-*.out"))[-1]
        tail = "\n".join(last.read_text(errors="replace").splitlines()[-40:])
        super().__init__(f"worker failed in {trial} (see {last}):\n{tail}")
        self.launches = launches


# --- where a kill landed -----------------------------------------------------------------


@dataclass
class Phase:
    """What the pipeline was doing when its worker was killed."""

    category: str
    detail: str

    def __str__(self) -> str:
        return f"{self.category} ({self.detail})" if self.detail else self.category


def _events(trial: Path) -> list[dict[str, Any]]:
    path = trial / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _txns(lake: Lake, table: str) -> dict[str, int]:
    """Application transactions recorded in a Delta log (app id -> highest version)."""
    found: dict[str, int] = {}
    for action in lake.log_actions(table):
        txn = action.get("txn")
        if txn:
            found[txn["appId"]] = max(found.get(txn["appId"], -1), txn["version"])
    return found


def _tables(operator_id: str) -> dict[str, str]:
    """Table name -> its folder in the lake."""
    tables = {name: name for name in OUTPUTS}
    tables["buffer"] = f"{STATE}/{operator_id}/buffer"
    return tables


def _staging(lake: Lake, table: str, since: float) -> str | None:
    """What a write in progress (staged after ``since``) was doing; older staging folders
    are leftovers of earlier kills (their files are older; the marker of a new table's
    first write counts as publishing)."""
    staged: dict[str, list[Any]] = collections.defaultdict(list)
    for entry in lake.entries(table, "_dsi_staging"):
        staged[entry.path.split("/", 1)[0]].append(entry)
    for entries in staged.values():
        if max(e.modification_time_ms for e in entries) / 1000 < since:
            continue
        parquet = any(e.path.endswith(".parquet") for e in entries)
        return "spark writing" if parquet else "publishing/committing"
    return None


def inspect_phase(trial: Path, expected: dict[tuple[str, int], set[str]] | None = None) -> Phase:
    """Where the last kill landed, from the worker's events and the operators' state."""
    events = _events(trial)
    last_launch = max((i for i, e in enumerate(events) if e["event"] == "launch"), default=-1)
    since = events[last_launch + 1 :]
    launched = events[last_launch]["t"] if last_launch >= 0 else 0.0
    lake = lake_of(trial)
    started = [e for e in since if e["event"] == "start"]
    if not started:
        spark = any(e["event"] == "spark" for e in since)
        return Phase("startup", "Spark up" if spark else "imports / before Spark")
    current = started[-1]
    if any(e["event"] == "done" and e["index"] == current["index"] for e in since):
        return Phase("between actions", f"after {current['action']}")
    action = _actions(trial)[current["index"]]
    if action.kind != "job":
        spark_pending = action.kind != "append" and not any(e["event"] == "spark" for e in since)
        return Phase(
            f"input {action.kind}", f"{action.label}{', starting Spark' if spark_pending else ''}"
        )
    for operator_id in lake.operators():
        plans = lake.ids(STATE, operator_id, "plans")
        commits = lake.ids(STATE, operator_id, "commits")
        if not plans or (commits and commits[-1] >= plans[-1]):
            continue
        batch = plans[-1]
        tables = _tables(operator_id)
        written = sorted(
            n for n, t in tables.items() if _txns(lake, t).get(operator_id, -1) >= batch
        )
        staging = sorted(n for n, t in tables.items() if _staging(lake, t, launched))
        todo = None if expected is None else expected.get((operator_id, batch), set())
        where = f"{operator_id} batch {batch}"
        if staging:
            category = "batch: writing a table"
            doing = _staging(lake, tables[staging[0]], launched)
            detail = f"{where}; {doing} {staging[0]}; written {written}"
        elif not written:
            category = "batch: planned, before writes"
            detail = where
        elif todo is not None and set(written) >= todo:
            category = "batch: all written, before commit record"
            detail = f"{where}; written {written}"
        else:
            category = "batch: between table writes"
            detail = f"{where}; written {written}"
        return Phase(category, detail)
    spark = any(e["event"] == "spark" for e in since)
    latest = {op: lake.ids(STATE, op, "commits") for op in lake.operators()}
    last = {k: (v[-1] if v else None) for k, v in latest.items()}
    return Phase(
        "job: no batch in flight" if spark else "job: starting Spark",
        f"{action.arg}; planning, between batches or reporting; last commits {last}",
    )


# --- tables and comparisons --------------------------------------------------------------


Rows = list[tuple[Any, ...]]


def _sort_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((value is None, str(value)) for value in row)


def _read(lake: Lake, table: str, columns: list[str] | None = None) -> Rows | None:
    from deltalake import DeltaTable

    if not lake.is_table(table):
        return None
    data = DeltaTable(lake.uri(table), storage_options=lake.options or None).to_pyarrow_table(
        columns=columns
    )
    names = data.column_names
    rows = [tuple(r[c] for c in names) for r in data.to_pylist()]
    return sorted(rows, key=_sort_key)


def snapshot_tables(lake: Lake) -> dict[str, Rows | None]:
    """Every output table (all columns), the main input, and each operator's buffer."""
    tables: dict[str, Rows | None] = {name: _read(lake, name) for name in OUTPUTS}
    tables["transactions"] = _read(lake, "transactions")
    for operator_id in lake.operators():
        tables[f"buffer:{operator_id}"] = _read(
            lake, f"{STATE}/{operator_id}/buffer", ["tx_id", "_dsi_slot"]
        )
    return tables


def expected_writes(lake: Lake) -> dict[tuple[str, int], set[str]]:
    """(operator, batch) -> the tables the batch committed to, from the Delta logs."""
    found: dict[tuple[str, int], set[str]] = collections.defaultdict(set)
    for operator_id in lake.operators():
        for name, table in _tables(operator_id).items():
            for action in lake.log_actions(table):
                txn = action.get("txn")
                if txn and txn["appId"] == operator_id:
                    found[(operator_id, txn["version"])].add(name)
    return dict(found)


@dataclass
class TableDiff:
    """How one table differs from the reference."""

    lost: int = 0  # tx_ids present fewer times than in the reference
    duplicated: int = 0  # tx_ids present more times than in the reference
    missing_rows: int = 0
    extra_rows: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.missing_rows or self.extra_rows)


def compare(
    reference: dict[str, Rows | None], actual: dict[str, Rows | None]
) -> dict[str, TableDiff]:
    """Per table: lost / duplicated tx_ids and rows missing / extra (empty when equal)."""
    diffs: dict[str, TableDiff] = {}
    for name in sorted(set(reference) | set(actual)):
        ref, got = reference.get(name) or [], actual.get(name) or []
        diff = TableDiff()
        ref_ids = collections.Counter(r[0] for r in ref)
        got_ids = collections.Counter(r[0] for r in got)
        for tx in set(ref_ids) | set(got_ids):
            if got_ids[tx] < ref_ids[tx]:
                diff.lost += ref_ids[tx] - got_ids[tx]
                diff.examples.append(f"tx {tx} x{got_ids[tx]} (reference x{ref_ids[tx]})")
            elif got_ids[tx] > ref_ids[tx]:
                diff.duplicated += got_ids[tx] - ref_ids[tx]
                diff.examples.append(f"tx {tx} x{got_ids[tx]} (reference x{ref_ids[tx]})")
        ref_rows, got_rows = collections.Counter(ref), collections.Counter(got)
        diff.missing_rows = sum((ref_rows - got_rows).values())
        diff.extra_rows = sum((got_rows - ref_rows).values())
        if (reference.get(name) is None) != (actual.get(name) is None):
            diff.examples.append("table exists in only one of the runs")
            diff.missing_rows = diff.missing_rows or int(actual.get(name) is None)
            diff.extra_rows = diff.extra_rows or int(reference.get(name) is None)
        if not diff.ok:
            diff.examples = sorted(diff.examples)[:5]
            diffs[name] = diff
    return diffs


# --- template, reference, trials ---------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """The prepared starting point: a Dagster home and a lake with the side inputs."""

    path: Path
    created: dt.datetime


@dataclass
class Reference:
    """The tables of the run without faults, and its timings."""

    tables: dict[str, Rows | None]
    expected: dict[tuple[str, int], set[str]]
    startup_s: float  # worker launch -> first action
    action_s: list[float]  # per action
    total_s: float
    batches: dict[str, int]
    pace: float = 1.0  # how much slower the machine runs now than during the reference

    def remaining_s(self, done: int) -> float:
        """Expected time of a fresh worker to finish from ``done`` actions, at today's pace."""
        return self.pace * (self.startup_s + sum(self.action_s[done:]))

    def observe(self, trial: Path) -> None:
        """Update the pace from the last worker of a trial that ran without being killed
        (the machine is shared: its speed changes, and kill delays must follow it)."""
        events = _events(trial)
        last = max(i for i, e in enumerate(events) if e["event"] == "launch")
        since = events[last + 1 :]
        starts = {e["index"]: e["t"] for e in since if e["event"] == "start"}
        ends = {e["index"]: e["t"] for e in since if e["event"] == "done"}
        done = [i for i in starts if i in ends]
        if not done:
            return
        seen = ends[max(done)] - events[last]["t"]
        expected = self.startup_s + sum(self.action_s[i] for i in done)
        if expected >= 10.0:
            self.pace = 0.5 * self.pace + 0.5 * seen / expected


@dataclass
class TrialResult:
    """One trial: its kills, where they landed, and the differences found."""

    number: int
    seed: int
    path: Path
    delays: list[float]
    launches: list[Launch]
    diffs: dict[str, TableDiff]
    seconds: float
    error: str | None = None
    kill_point: str | None = None
    note: str = ""
    pace: float = 1.0

    @property
    def kills(self) -> list[Launch]:
        return [launch for launch in self.launches if launch.killed]

    @property
    def ok(self) -> bool:
        return self.error is None and not self.diffs

    def line(self) -> str:
        landed = (
            "; ".join(f"{launch.seconds:.1f}s: {launch.phase}" for launch in self.kills)
            or "no kill landed"
        )
        verdict = "OK" if self.ok else ("ERROR" if self.error else "DIFFERENT")
        verdict += f" {self.note}" if self.note else ""
        how = f"kill-at={self.kill_point}" if self.kill_point else f"seed={self.seed}"
        how += f" delays={[round(d, 1) for d in self.delays]}" if self.delays else ""
        text = (
            f"trial {self.number:2d} {how} kills={len(self.kills)} "
            f"launches={len(self.launches)} pace={self.pace:.2f} {self.seconds:.0f}s {verdict} "
            f"| {landed}"
        )
        for name, diff in self.diffs.items():
            text += (
                f"\n    {name}: lost={diff.lost} duplicated={diff.duplicated} "
                f"missing_rows={diff.missing_rows} extra_rows={diff.extra_rows} {diff.examples}"
            )
        if self.error:
            text += "\n    " + self.error.replace("\n", "\n    ")
        return text


def prepare_template(path: Path, script: str = "full", lake: str | None = None) -> Template:
    """A Dagster home and a lake holding the side inputs (sources materialized through
    Dagster, so the instance knows them); the same starting point for every run of
    ``script`` (``full`` or ``short``). ``lake``: an object store prefix under which the
    template's and every trial's lake live (default: local folders)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    if lake is not None:
        (path / "lake-root").write_text(f"{lake.rstrip('/')}/{path.name}")
    lake_of(path).delete()
    if lake_of(path).local:
        (path / "lake").mkdir()
    (path / "script").write_text(script)
    home = path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    launch = _launch(path, ["_template"], "long", None)
    if launch.returncode != 0:
        raise WorkerFailed(path, [launch])
    for name in ("events.jsonl", "progress.json"):
        (path / name).unlink(missing_ok=True)
    for out in path.glob("worker-*.out"):
        out.rename(path / f"template-{out.name}")
    return Template(path, dt.datetime.now(dt.timezone.utc))


def _copy(template: Template, target: Path) -> None:
    age = dt.datetime.now(dt.timezone.utc) - template.created
    if age > TEMPLATE_MAX_AGE:
        raise RuntimeError(
            f"The template is {age} old: the fraud rules' 12-hour freshness policy would "
            "start holding records back. Prepare a new template."
        )
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(template.path, target, ignore=shutil.ignore_patterns("template-*", "lake"))
    source = lake_of(template.path)
    if not source.local:
        base = source.root.rsplit("/", 1)[0]
        (target / "lake-root").write_text(f"{base}/{target.name}")
    source.copy_to(lake_of(target))


def _batches(lake: Lake) -> dict[str, int]:
    return {op: len(lake.ids(STATE, op, "commits")) for op in lake.operators()}


def reference_tables(template: Template, path: Path, script: str | None = None) -> Reference:
    """Run the pipeline once without faults (the template's script, or ``script``); its
    tables and timings."""
    _copy(template, path)
    if script is not None:
        (path / "script").write_text(script)
    started = time.monotonic()
    run_pipeline(path)
    total = time.monotonic() - started
    events = _events(path)
    launch = next(e["t"] for e in events if e["event"] == "launch")
    first = next(e["t"] for e in events if e["event"] == "start")
    starts = {e["index"]: e["t"] for e in events if e["event"] == "start"}
    ends = {e["index"]: e["t"] for e in events if e["event"] == "done"}
    return Reference(
        tables=snapshot_tables(lake_of(path)),
        expected=expected_writes(lake_of(path)),
        startup_s=first - launch,
        action_s=[ends[i] - starts[i] for i in range(len(_actions(path)))],
        total_s=total,
        batches=_batches(lake_of(path)),
    )


def run_trial(
    template: Template,
    reference: Reference,
    seed: int,
    path: Path,
    *,
    number: int = 0,
    max_kills: int = 3,
    attempts: int = 4,
) -> TrialResult:
    """Copy the template, run the pipeline with 1..max_kills random SIGKILLs, compare.

    Delays are drawn uniformly over the reference run's duration scaled by the machine's
    current pace; when the pipeline still outran the first kill, the trial starts over
    from a fresh copy with the next delay of its RNG (at most ``attempts`` times).
    """
    rng = random.Random(seed)
    kills = min(rng.choice([1, 1, 2, 3]), max(1, max_kills))
    started = time.monotonic()
    delays: list[float] = []
    launches: list[Launch] = []
    error, diffs = None, {}
    try:
        for _ in range(attempts):
            _copy(template, path)
            delays, launches = [rng.uniform(0.0, reference.remaining_s(0))], []
            launches += run_until_killed(path, delays[-1], reference)
            if any(launch.killed for launch in launches):
                break
            # The whole pipeline ran unharmed: the best measure of today's pace.
            reference.pace = sum(launch.seconds for launch in launches) / reference.total_s
        for _ in range(kills - 1):
            if _progress(path) >= len(_actions(path)):
                break
            # Later kills: uniform over the rest of the pipeline, seen from a new worker.
            delays.append(rng.uniform(0.0, reference.remaining_s(_progress(path))))
            launches += run_until_killed(path, delays[-1], reference)
        launches += run_pipeline(path, reference)
        diffs = compare(reference.tables, snapshot_tables(lake_of(path)))
    except WorkerFailed as exc:
        launches += exc.launches
        error = str(exc)
    except RuntimeError as exc:  # a hung worker, or a process surviving SIGKILL
        error = str(exc)
    seconds = time.monotonic() - started
    return _noted(
        reference,
        TrialResult(number, seed, path, delays, launches, diffs, seconds, error),
    )


def _noted(reference: Reference, result: TrialResult) -> TrialResult:
    """Batch counts that differ from the reference's (allowed, but worth seeing)."""
    result.pace = reference.pace
    batches = _batches(lake_of(result.path))
    if batches != reference.batches:
        result.note = f"(batches {batches}, reference {reference.batches})"
    return result


# --- command line ------------------------------------------------------------------------


def run_targeted_trial(
    template: Template, reference: Reference, name: str, path: Path, *, number: int = 0
) -> TrialResult:
    """Copy the template, run the first worker with a kill point armed, rerun, compare
    (under the kill point's engine: :func:`kill_point_engine`)."""
    with _engine_of(name, template):
        return _targeted_trial(template, reference, name, path, number)


def _targeted_trial(
    template: Template, reference: Reference, name: str, path: Path, number: int
) -> TrialResult:
    _copy(template, path)
    started = time.monotonic()
    launches: list[Launch] = []
    error, diffs = None, {}
    try:
        group = _actions(path)[0].group
        launch = _launch(path, ["_worker"], group, None, KILL_POINTS[name])
        launches.append(launch)
        if launch.killed:
            launch.phase = inspect_phase(path, reference.expected)
        elif launch.returncode != 0:
            raise WorkerFailed(path, launches)
        else:
            error = f"kill point {name} was not reached"
        launches += run_pipeline(path, reference)
        diffs = compare(reference.tables, snapshot_tables(lake_of(path)))
    except WorkerFailed as exc:
        launches += exc.launches
        error = str(exc)
    seconds = time.monotonic() - started
    return _noted(
        reference, TrialResult(number, -1, path, [], launches, diffs, seconds, error, name)
    )


@dataclass
class PlanPath:
    """How the rerun of a side-change trial finished the killed batch 0."""

    replanned: bool  # its plan was set aside and the batch planned again
    profiles_version: int | None  # the customer_profiles version batch 0 read
    template_version: int | None  # the version the killed worker planned with

    def __str__(self) -> str:
        how = "planned again" if self.replanned else "replayed from its plan"
        return (
            f"batch 0 {how}; it read customer_profiles version {self.profiles_version} "
            f"(version {self.template_version} when first planned)"
        )


def plan_path(trial: Path) -> PlanPath:
    """Read the payments operator's state: was batch 0 planned again or replayed?"""
    lake = lake_of(trial)
    state = lake.files(STATE, "enriched_transactions")
    discarded = sorted(
        e.path for e in lake.entries(STATE, "enriched_transactions", "plans", "discarded")
    )
    discarded = [p for p in discarded if p.endswith(".json") and "/" not in p]
    committed = json.loads(state.read_bytes(f"commits/{0:020d}.json"))
    first = json.loads(state.read_bytes(f"plans/discarded/{discarded[0]}")) if discarded else None
    return PlanPath(
        replanned=bool(discarded),
        profiles_version=committed["side_versions"].get("profile"),
        template_version=None if first is None else first["side_versions"].get("profile"),
    )


def run_side_change_trial(
    template: Template,
    reference: Reference,
    kill_point: str,
    path: Path,
    *,
    number: int = 0,
) -> tuple[TrialResult, PlanPath | None]:
    """Copy the template (short script), SIGKILL the first job at ``kill_point``, change a
    side input (:data:`SIDE_CHANGE`), rerun, and compare with ``reference`` (a run without
    faults of ``short-change-first`` for a batch planned again, ``short-change-after`` for
    a replayed one). Under the kill point's engine (:func:`kill_point_engine`)."""
    with _engine_of(kill_point, template):
        return _side_change_trial(template, reference, kill_point, path, number)


def _side_change_trial(
    template: Template, reference: Reference, kill_point: str, path: Path, number: int
) -> tuple[TrialResult, PlanPath | None]:
    _copy(template, path)
    (path / "script").write_text("short")
    started = time.monotonic()
    launches: list[Launch] = []
    error, diffs, how = None, {}, None
    try:
        launch = _launch(path, ["_worker"], "long", None, KILL_POINTS[kill_point])
        launches.append(launch)
        if not launch.killed:
            raise RuntimeError(f"kill point {kill_point} was not reached")
        launch.phase = inspect_phase(path)
        launches += run_pipeline(path, change=SIDE_CHANGE)
        diffs = compare(reference.tables, snapshot_tables(lake_of(path)))
        how = plan_path(path)
    except WorkerFailed as exc:
        launches += exc.launches
        error = str(exc)
    except RuntimeError as exc:
        error = str(exc)
    result = TrialResult(
        number, -1, path, [], launches, diffs, time.monotonic() - started, error, kill_point
    )
    result.note = "" if how is None else f"({how})"
    return result, how


def run(
    trials: int,
    seed: int,
    root: Path,
    *,
    max_kills: int = 3,
    kill_points: Sequence[str] = (),
    script: str = "full",
    lake: str | None = None,
    side_change: bool = False,
    log: Any = print,
) -> tuple[Reference, list[TrialResult]]:
    """Template, reference, then ``trials`` random trials with seeds ``seed``, ``seed + 1``,
    ..., then one trial per named kill point, then (``side_change``, short script only)
    the side-change trials (lakes under ``lake`` when given)."""
    started = time.monotonic()
    template = prepare_template(root / "template", script, lake)
    log(f"template ready in {time.monotonic() - started:.0f}s", flush=True)
    reference = reference_tables(template, root / "reference")
    counts = {k: len(v or []) for k, v in reference.tables.items()}
    log(
        f"reference run: {reference.total_s:.0f}s (startup {reference.startup_s:.0f}s), "
        f"batches {reference.batches}, rows {counts}",
        flush=True,
    )
    results = []
    for number in range(1, trials + 1):
        result = run_trial(
            template,
            reference,
            seed + number - 1,
            root / f"trial-{number:02d}",
            number=number,
            max_kills=max_kills,
        )
        results.append(result)
        log(result.line(), flush=True)
    for offset, name in enumerate(kill_points, start=trials + 1):
        result = run_targeted_trial(
            template, reference, name, root / f"trial-{offset:02d}-{name}", number=offset
        )
        results.append(result)
        log(result.line(), flush=True)
    if side_change:
        results += side_change_trials(template, root, start=len(results) + 1, log=log)
    return reference, results


SIDE_CHANGE_TRIALS = {
    # Claimed before its first commit (state/folder.py), the batch is replayed either way.
    "before-create-enriched": "short-change-after",
    "after-first-table": "short-change-after",
}
"""Kill point -> the script whose run without faults the trial must equal."""


def side_change_trials(
    template: Template, root: Path, *, start: int = 1, log: Any = print
) -> list[TrialResult]:
    """A kill after the first plan (re-plan path) and after the first table (replay
    path), each followed by a side-input change; compared with their references."""
    results = []
    for offset, (point, script) in enumerate(SIDE_CHANGE_TRIALS.items(), start=start):
        reference = reference_tables(template, root / f"reference-{script}", script)
        result, _ = run_side_change_trial(
            template, reference, point, root / f"trial-{offset:02d}-change-{point}", number=offset
        )
        results.append(result)
        log(result.line(), flush=True)
    return results


def summary(results: Sequence[TrialResult], seconds: float) -> str:
    kills = [launch for r in results for launch in r.kills]
    phases = collections.Counter(launch.phase.category for launch in kills if launch.phase)
    failed = [r for r in results if not r.ok]
    lines = [
        f"trials: {len(results)}, kills landed: {len(kills)}, "
        f"worker launches: {sum(len(r.launches) for r in results)}, total {seconds:.0f}s",
        "kills by phase:",
        *[f"  {count:3d}  {phase}" for phase, count in sorted(phases.items())],
        f"failures: {len(failed)}"
        + (
            f" (trials {[r.number for r in failed]}, seeds {[r.seed for r in failed]})"
            if failed
            else ""
        ),
    ]
    totals: collections.Counter[str] = collections.Counter()
    for r in results:
        for diff in r.diffs.values():
            totals.update(
                lost=diff.lost,
                duplicated=diff.duplicated,
                missing_rows=diff.missing_rows,
                extra_rows=diff.extra_rows,
            )
    lines.append(
        "records lost: {lost}, duplicated: {duplicated}, rows missing: {missing_rows}, "
        "rows extra: {extra_rows}".format(
            **{k: totals.get(k, 0) for k in ("lost", "duplicated", "missing_rows", "extra_rows")}
        )
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("_worker", "_template"):
        trial = Path(argv[argv.index("--trial") + 1])
        worker(trial, template=argv[0] == "_template")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="number of trials")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first trial")
    parser.add_argument("--max-kills", type=int, default=3, help="most kills in one trial")
    parser.add_argument(
        "--kill-at",
        action="append",
        default=[],
        choices=[*KILL_POINTS, "all"],
        help="also run one trial killed at this exact point (repeatable; 'all' for every one)",
    )
    parser.add_argument(
        "--script", choices=sorted(SCRIPTS), default="full", help="the pipeline to run"
    )
    parser.add_argument(
        "--lake",
        help="an object store prefix (s3://bucket/prefix) for the lakes, reached with the "
        "AWS_* environment variables (default: local folders in the workdir)",
    )
    parser.add_argument(
        "--side-change",
        action="store_true",
        help="also kill after the first plan and after the first table, change a side input, "
        "rerun and compare (needs --script short)",
    )
    parser.add_argument(
        "--engine",
        choices=["auto", "delta-spark", "delta-rs"],
        help="the workers' Delta engine (DSI_DELTA_ENGINE; default: the environment's, else "
        "auto, which is delta-spark since the workers' sessions configure Delta)",
    )
    parser.add_argument("--workdir", help="keep everything here (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    if args.engine:
        os.environ["DSI_DELTA_ENGINE"] = args.engine  # the workers inherit it
    if args.side_change and args.script != "short":
        parser.error("--side-change needs --script short")
    started = time.monotonic()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="dsi-crash-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    engine = os.environ.get("DSI_DELTA_ENGINE", "auto")
    print(
        f"crash harness: {args.trials} trials from seed {args.seed} under {root}, Delta "
        f"engine {engine}",
        flush=True,
    )
    points = list(KILL_POINTS) if "all" in args.kill_at else args.kill_at
    _, results = run(
        args.trials,
        args.seed,
        root,
        max_kills=args.max_kills,
        kill_points=points,
        script=args.script,
        lake=args.lake,
        side_change=args.side_change,
    )
    print(summary(results, time.monotonic() - started))
    ok = all(r.ok for r in results)
    if ok and not (args.workdir or args.keep):
        shutil.rmtree(root, ignore_errors=True)
    elif not ok:
        print(f"evidence kept in {root}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""A failure after any write step of a batch, then a rerun, gives exactly the tables of a run
without failure: nothing lost, nothing written twice.

Each step's batch makes a few table writes (``WRITES``: the main output, the side
outputs, the buffer; a route with nothing to write is skipped once its table exists;
removal-only buffer commits count). Crashes are injected before the first write, after
each write but the last, and after all of them but before the commit record.
"""

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pytest
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.engine import DeltaEngine
from tests.core.conftest import Clock, Lake, hours

ENGINES = ("rs", "spark")
"""The delta-rs bridge and delta-spark (the ``delta_engine`` fixture of tests/core/conftest.py)."""

TX = "tx_id long, customer_id long, amount double"
PROFILES = "customer_id long, name string"
SUSPICIOUS = dsi.OutputTag("suspicious")
UNMATCHED = dsi.OutputTag("unmatched")


class InjectedCrash(Exception):
    """Raised by the crashing engine in place of a process dying."""


@dataclass
class CrashingEngine:
    """The real engine, failing right after its n-th commit of the run (n = 0: before the
    first commit, every table's data already staged)."""

    inner: DeltaEngine
    crash_after: int
    writes: int = 0
    log: list[str] = field(default_factory=list)

    def _counted(self, uri: str, action: Any) -> Any:
        if self.writes == self.crash_after:
            raise InjectedCrash(f"before write {self.writes + 1} ({uri})")
        result = action()
        self.writes += 1
        self.log.append(uri)
        return result

    def commit(self, staged: Any, **kwargs: Any) -> Any:
        return self._counted(staged.uri, lambda: self.inner.commit(staged, **kwargs))

    def commit_removals(self, uri: str, *args: Any, **kwargs: Any) -> Any:
        return self._counted(uri, lambda: self.inner.commit_removals(uri, *args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def enrich(main, sides):
    enriched = main.select("tx_id", "customer_id", "amount", F.col("profile.name").alias("name"))
    return {dsi.MAIN: enriched, SUSPICIOUS: enriched.filter(F.col("amount") > 100).select("tx_id")}


def operator(storage: dsi.DeltaStorage) -> dsi.SideInputOperator:
    return dsi.SideInputOperator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id", missing=dsi.Wait(hours(1)))
        },
        fn=enrich,
        main_output="enriched",
        side_outputs=[SUSPICIOUS],
        routes=dsi.Routes(unmatched=UNMATCHED),
        storage=storage,
    )


STEPS = [
    lambda lake: (
        lake.append("profiles", [(10, "ann"), (11, "bob")], PROFILES),
        lake.append(
            "transactions", [(1, 10, 50.0), (2, 11, 500.0), (3, 12, 5.0), (4, 13, 7.0)], TX
        ),
    ),
    lambda lake: (
        lake.append("profiles", [(12, "cy")], PROFILES),
        lake.append("transactions", [(5, 10, 900.0), (6, 12, 1.0)], TX),
    ),
    lambda lake: lake.append("transactions", [(7, 11, 2.0)], TX),
]


def snapshot(lake: Lake, op: dsi.SideInputOperator) -> dict[str, list]:
    tables = {name: lake.rows(name) for name in ("enriched", "suspicious", "unmatched")}
    buffer = op.buffer().snapshot
    rows = [] if buffer is None else lake.frame(buffer.uri).select("tx_id", "_dsi_slot").collect()
    tables["buffer"] = sorted(tuple(r) for r in rows)
    return tables


COMMIT_RECORD = -1
WRITES = {0: 4, 1: 3, 2: 4}
"""Table writes of each step's batch (checked by the commit-record crashes)."""
CRASHES = [
    (step, write) for step, count in WRITES.items() for write in [*range(count), COMMIT_RECORD]
]


def crash_now(*_: Any) -> None:
    raise InjectedCrash("after every write, before the commit record")


def run_all(lake: Lake, clock: Clock, crash: tuple[int, int] | None = None) -> dict[str, list]:
    """Run the steps, crashing once at (step, write); the next run resumes normally."""
    for index, step in enumerate(STEPS):
        step(lake)
        if crash is not None and crash[0] == index:
            writes = crash[1] if crash[1] != COMMIT_RECORD else 1_000
            engine = CrashingEngine(lake.engine, writes)
            crashing = operator(lake.with_engine(engine))
            if crash[1] == COMMIT_RECORD:
                crashing.state.commit = crash_now  # type: ignore[method-assign]
            with pytest.raises(InjectedCrash):
                crashing.run(lake.spark, clock=clock)
            if crash[1] == COMMIT_RECORD:  # every write happened: the crash points cover all
                assert engine.writes == WRITES[index], engine.log
        op = operator(lake.storage)
        result = op.run(lake.spark, clock=clock)
        if crash is not None and crash[0] == index:
            # Every crash point is at or after the plan's claim (state/folder.py: a run claims
            # its plan before its first commit), so the batch is replayed exactly, also
            # when no table committed yet (a plan given up before its claim is planned
            # again: tests/core/test_recovery.py, test_concurrent_plans.py).
            assert result.batches[0].replayed
        clock.advance(dt.timedelta(minutes=40))
    return snapshot(lake, op)


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory) -> dict[str, list]:
    root = tmp_path_factory.mktemp("reference")
    lake = Lake(spark, dsi.DeltaStorage(str(root)))
    return run_all(lake, Clock(dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)))


def test_reference_run_routes_every_record(reference):
    assert [r[0] for r in reference["enriched"]] == [1, 2, 3, 5, 6, 7]
    assert reference["suspicious"] == [(2,), (5,)]
    assert reference["unmatched"] == [(4, 13, 7.0, "no side row in: profile")]
    assert reference["buffer"] == []


DEFAULT_CRASHES = [
    (step, write) for step, write in CRASHES if step == 1 or write in (0, COMMIT_RECORD)
]
"""Under delta-spark (the engine users get): every crash point of the step that both
writes and releases, and the first write and the commit record of the others (the first
batch creates every table; the last releases the rest)."""
BRIDGE_CRASHES = [(step, write) for step, write in CRASHES if step == 1]
"""Under the delta-rs bridge (the engine contract: its commits carry the same
transactions): the crash points of the step that both writes and releases."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("delta_engine", "step", "write"),
    [("spark", *crash) for crash in DEFAULT_CRASHES] + [("rs", *crash) for crash in BRIDGE_CRASHES],
)
def test_crash_after_any_write_then_rerun_gives_the_reference_tables(
    lake, reference, delta_engine, step, write
):
    result = run_all(
        lake, Clock(dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)), crash=(step, write)
    )
    assert result == reference


S3_CRASHES = [(0, 2), (1, COMMIT_RECORD)]
"""On the S3 test server: between the writes of a batch, and after every write before the
commit record (the other points take the same paths on both stores: test_crash_after_any_write)."""


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.parametrize(("step", "write"), S3_CRASHES)
def test_crash_on_s3_then_rerun_gives_the_reference_tables_of_a_local_run(
    spark, s3_server, reference, step, write
):
    storage = dsi.DeltaStorage(s3_server.fresh_prefix("crash"), s3_server.storage_options)
    lake = Lake(spark, storage)
    result = run_all(
        lake, Clock(dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)), crash=(step, write)
    )
    assert result == reference


@pytest.mark.slow
@pytest.mark.parametrize("delta_engine", ENGINES)
def test_crash_in_a_batch_without_new_main_records_then_rerun_replays_it(lake, delta_engine):
    # Found by the SIGKILL harness: a batch that only releases buffered records (its
    # main range is empty) could not be replayed (the main input's columns were lost).
    clock = Clock(dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc))
    STEPS[0](lake)  # transactions 3 and 4 wait for the profiles of customers 12 and 13
    operator(lake.storage).run(lake.spark, clock=clock)
    lake.append("profiles", [(12, "cy")], PROFILES)  # no new transactions

    engine = CrashingEngine(lake.engine, crash_after=1)
    with pytest.raises(InjectedCrash):
        operator(lake.with_engine(engine)).run(lake.spark, clock=clock)
    result = operator(lake.storage).run(lake.spark, clock=clock)

    assert result.batches[0].replayed
    tables = snapshot(lake, operator(lake.storage))
    assert [r[0] for r in tables["enriched"]] == [1, 2, 3]
    assert [r[0] for r in tables["buffer"]] == [4]

"""The bad-input catalogue: each case is a clear error naming the asset, column and fix, or
goes to a declared tag; buffered and already-written data is intact afterwards."""

import datetime as dt
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core.batch import one_per_key, route
from dagster_sideinputs.core.sideinputs.side_data import SideData
from dagster_sideinputs.delta.engine import DeltaEngine
from tests.core.conftest import T0, Clock, Lake, hours

"""The tests run under the engine users get (delta-spark); ``both_engines`` ones, whose
point is a difference between the engines, and all under ``DSI_BOTH_ENGINES=1``, run under
both (tests/core/conftest.py)."""
TX = "tx_id long, customer_id long, amount double"
TXT = "tx_id long, customer_id long, amount double, ts timestamp"
PROFILES = "customer_id long, name string"
INVALID = dsi.OutputTag("invalid")


def enrich(main, sides):
    return main.select("tx_id", "customer_id", F.col("profile.name").alias("name"))


def operator(lake: Lake, **kwargs: Any) -> dsi.SideInputOperator:
    main = kwargs.pop("main", dsi.MainInput("transactions", key="customer_id"))
    sides = kwargs.pop("sides", {"profile": dsi.SideInput.map("profiles", key="customer_id")})
    return lake.operator(
        main=main, side_inputs=sides, fn=kwargs.pop("fn", enrich), main_output="enriched", **kwargs
    )


@dataclass
class State:
    """What must survive a failed batch untouched."""

    tables: dict[str, list] = field(default_factory=dict)
    buffer: list = field(default_factory=list)


def state(lake: Lake, op: dsi.SideInputOperator) -> State:
    snap = op.buffer().snapshot
    buffer = (
        []
        if snap is None
        else sorted(tuple(r) for r in lake.frame(snap.uri).select("tx_id").collect())
    )
    return State({name: lake.rows(name) for name in op.output_tables}, buffer)


def with_buffered_record(
    lake: Lake, op: dsi.SideInputOperator, clock: Clock | None = None
) -> State:
    """One batch released (tx 1 of customer 10): one output row, an empty buffer."""
    lake.append("transactions", [(1, 10, 1.0)], TX)
    lake.run(op, clock)
    before = state(lake, op)
    assert before.tables["enriched"] == [(1, 10, "ann")]
    return before


@pytest.fixture
def ready(lake) -> Lake:
    lake.append("profiles", [(10, "ann")], PROFILES)
    return lake


# --- keys ----------------------------------------------------------------------------------------


def test_null_key_without_a_tag_is_an_error_naming_the_column(ready):
    op = operator(ready)
    before = with_buffered_record(ready, op)
    ready.append("transactions", [(2, None, 1.0)], TX)
    with pytest.raises(
        dsi.errors.MainInputDataError, match=r"(?s)'transactions'.*null key 'customer_id'.*invalid="
    ):
        ready.run(op)
    assert state(ready, op) == before


# --- schema drift of the main input --------------------------------------------------------------


@pytest.mark.both_engines
def test_main_input_with_a_new_column_is_refused_before_writing_unless_merging(ready):
    op = operator(ready, fn=lambda main, sides: main.drop("profile"))
    ready.append("transactions", [(1, 10, 1.0)], TX)
    ready.run(op)
    before = state(ready, op)
    ready.append(
        "transactions", [(2, 10, 1.0, "web")], TX + ", channel string", schema_mode="merge"
    )
    with pytest.raises(
        dsi.errors.SchemaMismatchError,
        match=r"(?s)'channel' \(string\) is not in the table.*schema_mode=\"merge\"",
    ):
        ready.run(op)
    assert state(ready, op) == before
    merging = operator(ready, fn=lambda main, sides: main.drop("profile"), schema_mode="merge")
    ready.run(merging)
    assert ready.rows("enriched", "tx_id", "channel") == [(1, None), (2, "web")]


@pytest.mark.both_engines
def test_main_input_overwritten_with_another_schema_names_the_version(ready):
    op = operator(ready)
    before = with_buffered_record(ready, op)
    ready.overwrite("transactions", [(1, "x")], "tx_id long, customer_id string")
    with pytest.raises(
        dsi.errors.NonAppendOnlyChangeError,
        match=r"(?s)Version 1 of table transactions removed data.*append-only",
    ):
        ready.run(op)
    assert state(ready, op) == before


# --- landing folders -----------------------------------------------------------------------------


def landing(lake: Lake, folder, **kwargs: Any) -> dsi.SideInputOperator:
    return operator(
        lake,
        main=dsi.MainInput.files(str(folder), format="json", schema=TX, key="customer_id"),
        **kwargs,
    )


def test_empty_files_in_a_landing_folder_are_consumed_without_rows(ready, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "empty.json").write_text("")
    (folder / "empty.parquet").write_bytes(b"")
    batch = ready.run(landing(ready, folder)).batches[0]
    assert batch.rows_in == 0
    assert ready.run(landing(ready, folder)).batches == []


# --- side inputs ---------------------------------------------------------------------------------


@pytest.mark.both_engines
def test_side_table_deleted_after_use_is_an_error_and_buffer_is_kept(ready):
    import shutil

    op = operator(
        ready,
        sides={
            "profile": dsi.SideInput.map("profiles", key="customer_id", missing=dsi.Wait(hours(1)))
        },
        routes=dsi.Routes(unmatched=dsi.OutputTag("unmatched")),
    )
    ready.append("transactions", [(1, 10, 1.0), (2, 77, 1.0)], TX)
    ready.run(op)
    before = state(ready, op)
    assert before.buffer == [(2,)]
    shutil.rmtree(ready.storage.table_uri("profiles"))
    ready.append("transactions", [(3, 10, 1.0)], TX)
    with pytest.raises(
        dsi.errors.SideInputDataError,
        match=r"(?s)'profile'.*is gone.*rematerialize.*buffered records are kept",
    ):
        ready.run(op)
    assert state(ready, op) == before


def test_side_table_overwritten_without_its_key_column_is_named(ready):
    op = operator(ready)
    ready.append("transactions", [(1, 10, 1.0)], TX)
    ready.run(op)
    before = state(ready, op)
    ready.overwrite("profiles", [(10, "ann")], "id long, name string")
    ready.append("transactions", [(2, 10, 1.0)], TX)
    with pytest.raises(
        dsi.errors.SideInputDataError,
        match=r"(?s)keyed by 'customer_id'.*no such column.*\['id', 'name'\]",
    ):
        ready.run(op)
    assert state(ready, op) == before


@pytest.mark.both_engines
def test_side_table_with_new_columns_changes_the_output_schema_clearly(ready):
    op = operator(ready, fn=lambda main, sides: main.select("tx_id", "profile"))
    ready.append("transactions", [(1, 10, 1.0)], TX)
    ready.run(op)
    before = state(ready, op)
    ready.overwrite("profiles", [(10, "ann", "gold")], "customer_id long, name string, tier string")
    ready.append("transactions", [(2, 10, 1.0)], TX)
    with pytest.raises(
        dsi.errors.SchemaMismatchError, match=r"(?s)column 'profile' is struct<.*tier.*in the data"
    ):
        ready.run(op)
    assert state(ready, op) == before


NAMED = dsi.OutputTag("named")


def test_map_with_duplicate_keys_is_refused_before_an_output_that_ignores_it_is_written(lake):
    lake.append("profiles", [(10, "a"), (10, "b")], PROFILES)
    lake.append("transactions", [(1, 10, 1.0)], TX)

    def fn(main, sides):  # the main output does not read the side input; "named" does
        return {
            dsi.MAIN: main.select("tx_id"),
            NAMED: main.select("tx_id", F.col("profile.name").alias("name")),
        }

    profile = dsi.SideInput.map("profiles", key="customer_id")
    op = operator(lake, sides={"profile": profile}, fn=fn, side_outputs=[NAMED])
    with pytest.raises(dsi.errors.DuplicateKeyError, match=r"\[10\]"):
        lake.run(op)
    assert not lake.exists("enriched")
    assert not lake.exists("named")


def test_a_map_with_duplicate_keys_is_refused_when_no_output_reads_it(lake):
    """The check before staging, not the view's guard: a function that never reads the
    side input leaves Spark nothing to evaluate the guard in, and the map's promise of one
    row per key is still checked."""
    lake.append("profiles", [(10, "a"), (10, "b")], PROFILES)
    lake.append("transactions", [(1, 10, 1.0)], TX)
    profile = dsi.SideInput.map("profiles", key="customer_id")
    op = operator(lake, sides={"profile": profile}, fn=lambda main, sides: main.select("tx_id"))
    with pytest.raises(dsi.errors.DuplicateKeyError, match=r"\[10\]"):
        lake.run(op)
    assert not lake.exists("enriched")


def test_a_map_with_duplicate_keys_is_refused_before_any_job_reads_its_join(lake, monkeypatch):
    """Ready side data is joined as it is (no aggregation per key), so its one row per key
    is checked before any Spark job reads the join: no job meets a duplicated key (it
    would count, buffer or route a record twice), and a batch releasing no record (its one
    record has a null key) is refused too."""
    counted = []
    count_routes = route.count_routes
    monkeypatch.setattr(
        route, "count_routes", lambda *args: counted.append(args) or count_routes(*args)
    )
    lake.append("profiles", [(10, "a"), (10, "b")], PROFILES)
    lake.append("transactions", [(1, None, 1.0)], TX)
    invalid = dsi.OutputTag("invalid_transactions")
    op = operator(lake, routes=dsi.Routes(invalid=invalid))
    with pytest.raises(dsi.errors.DuplicateKeyError, match=r"\[10\]"):
        lake.run(op)
    assert counted == []
    assert not lake.exists("enriched")
    assert not lake.exists("invalid_transactions")


@pytest.mark.both_engines
def test_a_small_maps_keys_are_counted_on_the_driver(lake, monkeypatch):
    """A map of few rows (by its files' statistics) has its keys counted on the driver
    (one Spark stage reading them, not a count per key); a larger one in Spark. Either
    way a duplicated key is refused and named."""
    lake.append("profiles", [(10, "a"), (11, "b")], PROFILES)
    lake.append("transactions", [(1, 10, 1.0)], TX)
    op = operator(lake)
    [batch] = lake.run(op).batches
    assert "side input 'profile': one row per key checked on the driver" in batch.notes
    monkeypatch.setattr(one_per_key, "DRIVER_CHECK_ROWS", 2)
    lake.append("profiles", [(12, "c")], PROFILES)
    lake.append("transactions", [(2, 12, 1.0)], TX)
    [batch] = lake.run(op).batches
    assert not any("checked on the driver" in note for note in batch.notes)
    assert lake.rows("enriched", "tx_id") == [(1,), (2,)]
    for tx_id, limit in ((3, 2), (4, 1_000_000)):
        monkeypatch.setattr(one_per_key, "DRIVER_CHECK_ROWS", limit)
        lake.append("profiles", [(12, "d")], PROFILES)
        lake.append("transactions", [(tx_id, 10, 1.0)], TX)
        with pytest.raises(dsi.errors.DuplicateKeyError, match=r"\[12\]"):
            lake.run(op)
        lake.overwrite("profiles", [(10, "a"), (11, "b"), (12, "c")], PROFILES)
        [batch] = lake.run(op).batches
    assert lake.rows("enriched", "tx_id") == [(1,), (2,), (3,), (4,)]


@pytest.mark.parametrize("limit", [1_000_000, 1], ids=["on-the-driver", "in-spark"])
def test_null_keys_are_one_key_to_a_maps_promise_however_counted(lake, monkeypatch, limit):
    """Spark's count per key groups null keys as one, and so does the count on the driver
    (Arrow's distinct count takes null as a value): one null-key row keeps the promise,
    counted on the driver with no Spark check; a second one breaks it, refused and named
    whichever way the keys are counted."""
    monkeypatch.setattr(one_per_key, "DRIVER_CHECK_ROWS", limit)
    lake.append("profiles", [(None, "a"), (10, "c")], PROFILES)
    lake.append("transactions", [(1, 10, 1.0)], TX)
    op = operator(lake)
    [batch] = lake.run(op).batches
    on_the_driver = "side input 'profile': one row per key checked on the driver"
    assert (on_the_driver in batch.notes) == (limit > 1)
    lake.append("profiles", [(None, "b")], PROFILES)
    lake.append("transactions", [(2, 10, 1.0)], TX)
    with pytest.raises(dsi.errors.DuplicateKeyError, match=r"\[None\]"):
        lake.run(op)
    assert lake.rows("enriched", "tx_id") == [(1,)]


def test_a_maps_keys_are_read_beside_the_planning_and_its_fault_is_raised_there(lake, monkeypatch):
    """The map's keys are read and counted in a thread of their own while the route plans
    the batch; what that read meets (here a damaged file's error, injected into the key
    read) reaches the user as the same error, before any Spark job, nothing written."""
    read_on_driver = SideData.on_driver
    readers: list[str] = []

    def on_driver(self: SideData, columns: Any = None, limit: Any = None) -> Any:
        if columns is not None:  # the key columns, not the singleton's row
            readers.append(threading.current_thread().name)
            if len(readers) > 1:
                raise dsi.errors.CorruptDataFileError("profiles: a data file went bad")
        return read_on_driver(self, columns, limit)

    monkeypatch.setattr(SideData, "on_driver", on_driver)
    lake.append("profiles", [(10, "a"), (11, "b")], PROFILES)
    lake.append("transactions", [(1, 10, 1.0)], TX)
    op = operator(lake)
    [batch] = lake.run(op).batches
    assert "side input 'profile': one row per key checked on the driver" in batch.notes
    lake.append("profiles", [(12, "c")], PROFILES)  # a new version: counted again
    lake.append("transactions", [(2, 12, 1.0)], TX)
    with pytest.raises(dsi.errors.CorruptDataFileError, match="a data file went bad"):
        lake.run(op)
    assert len(readers) == 2
    assert all(r.startswith("dsi-key-count") for r in readers)
    assert lake.rows("enriched", "tx_id") == [(1,)]


def test_float_keys_spark_makes_one_are_duplicates(lake):
    """-0.0 and 0.0 are one key to Spark's join (every NaN too), two to Arrow's grouping:
    a map of such keys is checked in Spark, and refused."""
    lake.append("profiles", [(0.0, "a"), (-0.0, "b")], "customer_id double, name string")
    lake.append("transactions", [(1, 0.0, 1.0)], "tx_id long, customer_id double, amount double")
    with pytest.raises(dsi.errors.DuplicateKeyError):
        lake.run(operator(lake))
    assert not lake.exists("enriched")


def test_a_batch_without_records_does_not_check_a_maps_keys(lake):
    """No record, nothing joined: a batch of a main version adding no rows spends no Spark
    job on the map's keys (a duplicated key could change no output); the first batch
    with records is refused on them."""
    lake.append("profiles", [(10, "a"), (10, "b")], PROFILES)
    lake.append("transactions", [], TX)
    op = operator(lake)
    [batch] = lake.run(op).batches
    assert batch.rows_in == 0
    lake.append("transactions", [(1, 10, 1.0)], TX)
    with pytest.raises(dsi.errors.DuplicateKeyError, match=r"\[10\]"):
        lake.run(op)
    assert not lake.exists("enriched")


@pytest.mark.both_engines
def test_main_table_with_a_truncated_data_file_is_named_and_nothing_is_written(ready):
    op = operator(ready)
    before = with_buffered_record(ready, op)
    ready.append("transactions", [(2, 10, 1.0)], TX)
    newest = max(
        DeltaTable(ready.storage.table_uri("transactions")).file_uris(), key=os.path.getmtime
    )
    with open(newest, "r+b") as handle:
        handle.truncate(20)
    with pytest.raises(
        dsi.errors.CorruptDataFileError, match=r"(?s)of table transactions has 20 bytes"
    ):
        ready.run(op)
    assert state(ready, op) == before


@pytest.mark.both_engines
@pytest.mark.parametrize(
    "damage",
    ['{"add": {"path": "part-0.parquet", "partitionVal', '{"add": {"size": 1}}', "not json"],
    ids=["truncated", "add-without-path", "not-json"],
)
def test_main_table_with_a_damaged_commit_is_named_and_a_restored_one_resumes(ready, damage):
    op = operator(ready)
    before = with_buffered_record(ready, op)
    ready.append("transactions", [(2, 10, 1.0)], TX)
    log = os.path.join(ready.storage.table_uri("transactions"), "_delta_log")
    newest = max(name for name in os.listdir(log) if name.endswith(".json"))
    commit = os.path.join(log, newest)
    with open(commit, "rb") as handle:
        good = handle.read()
    with open(commit, "w") as handle:
        handle.write(damage + "\n")
    damaged = r"(?s)log of table.*transactions.*damaged"
    with pytest.raises(dsi.errors.DeltaTableError, match=damaged) as info:
        ready.run(op)
    assert type(info.value) is dsi.errors.DeltaTableError
    assert "restore the damaged _delta_log file" in (info.value.fix or "")
    assert state(ready, op) == before
    with open(commit, "wb") as handle:
        handle.write(good)
    ready.run(op)
    assert ready.rows("enriched") == [(1, 10, "ann"), (2, 10, "ann")]


@pytest.mark.both_engines
def test_main_input_folder_that_is_not_delta_is_named(ready, tmp_path):
    ready.spark.range(3).write.parquet(ready.storage.table_uri("transactions"))
    with pytest.raises(dsi.errors.NotADeltaTableError, match="convert_to_deltalake"):
        ready.run(operator(ready))


# --- time ----------------------------------------------------------------------------------------


def windowed(lake: Lake, **kwargs: Any) -> dsi.SideInputOperator:
    return lake.operator(
        main=dsi.MainInput("transactions", key="customer_id", event_time="ts"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=enrich,
        main_output="enriched",
        window=dsi.Window.tumbling(hours(1), watermark=hours(1)),
        **kwargs,
    )


def test_event_times_far_in_the_future_are_invalid_not_a_watermark_jump(ready):
    clock = Clock(T0 + hours(3))
    ready.append(
        "transactions",
        [(1, 10, 1.0, T0), (2, 10, 1.0, dt.datetime(9999, 1, 1, tzinfo=dt.timezone.utc))],
        TXT,
    )
    batch = (
        windowed(
            ready,
            routes=dsi.Routes(invalid=INVALID, late=dsi.OutputTag("late")),
        )
        .run(ready.spark, clock=clock)
        .batches[0]
    )
    assert ready.rows("invalid", "tx_id") == [(2,)]
    assert "ahead of the batch" in ready.rows("invalid", "reason")[0][0]
    assert batch.max_event_time == T0
    ready.append("transactions", [(3, 10, 1.0, T0 + hours(1))], TXT)
    windowed(
        ready,
        routes=dsi.Routes(invalid=INVALID, late=dsi.OutputTag("late")),
    ).run(ready.spark, clock=clock)
    assert ready.rows("enriched", "tx_id") == [(1,), (3,)]


def test_timestamps_without_zone_are_read_as_utc(ready):
    schema = "tx_id long, customer_id long, amount double, ts timestamp_ntz"
    ready.append("transactions", [(1, 10, 1.0, dt.datetime(2024, 5, 1, 10, 30))], schema)
    op = ready.operator(
        main=dsi.MainInput("transactions", key="customer_id", event_time="ts"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=lambda main, sides: main.select("tx_id", F.col("window.start").alias("start")),
        main_output="hours",
        window=dsi.Window.tumbling(hours(1)),
    )
    ready.run(op, Clock(T0 + hours(12)))
    assert ready.rows("hours") == [(1, dt.datetime(2024, 5, 1, 10, 0))]


# --- the function and concurrent writers ---------------------------------------------------------


@pytest.mark.each_storage
def test_a_failing_function_writes_nothing_and_a_fixed_rerun_resumes(ready):
    calls = {"n": 0}

    def flaky(main, sides):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("bug in the enrichment")
        return enrich(main, sides)

    op = operator(ready, fn=flaky)
    before = with_buffered_record(ready, op)
    ready.append("transactions", [(2, 10, 1.0)], TX)
    with pytest.raises(
        dsi.errors.FunctionError, match=r"(?s)flaky raised RuntimeError: bug in the enrich"
    ):
        ready.run(op)
    assert state(ready, op) == before
    ready.run(op)
    assert ready.rows("enriched", "tx_id") == [(1,), (2,)]


@dataclass
class InterferingEngine:
    """The real engine; another writer overwrites the output table just before our commit."""

    inner: DeltaEngine
    spark: Any
    target: str
    done: bool = False

    def commit(self, staged: Any, **kwargs: Any) -> Any:
        if staged.uri.endswith(self.target) and not self.done:
            self.done = True
            other = self.spark.createDataFrame(
                [(99, 99, "intruder")], "tx_id long, customer_id long, name string"
            )
            self.inner.write(other, staged.uri, mode="overwrite")
        return self.inner.commit(staged, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.both_engines
def test_a_concurrent_writer_to_an_output_table_does_not_break_exactly_once(ready):
    op = operator(ready)
    with_buffered_record(ready, op)
    ready.append("transactions", [(2, 10, 1.0)], TX)
    engine = InterferingEngine(ready.engine, ready.spark, "enriched")
    interfered = operator(ready, storage=ready.with_engine(engine))
    ready.run(interfered)
    ready.run(op)
    assert ready.rows("enriched", "tx_id") == [(2,), (99,)]
    history = DeltaTable(ready.storage.table_uri("enriched")).history()
    assert [h["operation"] for h in history][:2] == ["WRITE", "WRITE"]


def test_plan_files_record_what_a_refused_batch_would_have_done(ready):
    """A batch refused before writing leaves only its plan: the rerun replays it."""
    op = operator(ready)
    with_buffered_record(ready, op)
    ready.append("transactions", [(2, None, 1.0)], TX)
    with pytest.raises(dsi.errors.MainInputDataError):
        ready.run(op)
    plan = op.last_plan()
    assert plan is not None
    assert plan.batch_id == op.last_committed_batch() + 1
    assert json.loads(plan.to_json())["main"]["end_version"] == 1

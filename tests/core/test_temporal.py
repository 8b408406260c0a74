"""Temporal (as-of) side inputs: each main record sees, for its key, the side row valid at
its event time, from a validity column or from the side table's own Delta history;
records later than the side data's horizon wait; replays and late records see the row of
their own time. Keyed and broadcast distributions.

An as-of map is joined to the records before the function runs, in either mode (rows
mode reads the joined column; it looks nothing up on the driver): the join, the horizon,
the grace and the pinned versions are the same code in both modes, so the cases run in
frames mode, and the first also in rows mode (what a row function sees of the join)."""

import datetime as dt
import time
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from dagster_sideinputs.core.state.plan import BatchPlan
from dagster_sideinputs.delta.storage import DeltaRsEngine
from tests.core.accounting import assert_accounted
from tests.core.conftest import T0, Clock, hours
from tests.core.test_crash_safety import CrashingEngine, InjectedCrash

ORDERS = "order_id long, sku string, ts timestamp"
PRICES = "sku string, price double, valid_from timestamp"
PRICED = dsi.OutputTag(
    "priced",
    schema=T.StructType(
        [T.StructField("order_id", T.LongType()), T.StructField("price", T.DoubleType())]
    ),
)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def priced_frames(main, sides):
    return main.select("order_id", F.col("price.price").alias("price"))


def priced_rows(record, ctx):
    row = ctx.side_input("price")
    yield {"order_id": record.order_id, "price": row.price if row else None}


def operator(lake, mode: str = "frames", **side: Any) -> dsi.SideInputOperator:
    side.setdefault("as_of", "valid_from")
    options = {k: side.pop(k) for k in ("routes", "storage") if k in side}
    return lake.operator(
        main=dsi.MainInput("orders", event_time="ts"),
        side_inputs={"price": dsi.SideInput.map("prices", key="sku", **side)},
        fn=priced_frames if mode == "frames" else priced_rows,
        mode=mode,
        main_output=PRICED,
        **options,
    )


def priced(lake) -> dict[int, float | None]:
    return {row[0]: row[1] for row in lake.rows("priced")}


@pytest.mark.parametrize(
    ("mode", "distribution"),
    [("frames", "keyed"), ("frames", "broadcast"), ("rows", "keyed")],
    ids=["frames-keyed", "frames-broadcast", "rows-keyed"],
)
def test_as_of_map_gives_each_record_the_row_valid_at_its_event_time(lake, mode, distribution):
    lake.append(
        "prices",
        [("a", 1.0, at(0)), ("a", 3.0, at(120)), ("a", 2.0, at(60)), ("b", 10.0, at(30))],
        PRICES,
    )
    lake.append(
        "orders",
        [
            (1, "a", at(10)),
            (2, "a", at(60)),  # validity starts are inclusive
            (3, "a", at(119)),
            (4, "b", at(10)),  # before b's first row
            (5, "b", at(100)),
            (6, "c", at(50)),  # no row for c
        ],
        ORDERS,
    )
    lake.run(operator(lake, mode, distribution=distribution))
    assert priced(lake) == {1: 1.0, 2: 2.0, 3: 2.0, 4: None, 5: 10.0, 6: None}


def test_a_valid_to_column_ends_a_rows_validity(lake):
    lake.append(
        "prices",
        [("a", 1.0, at(0), at(30)), ("a", 2.0, at(60), None), ("b", 0.0, at(100), None)],
        PRICES + ", valid_to timestamp",
    )
    lake.append("orders", [(1, "a", at(10)), (2, "a", at(30)), (3, "a", at(70))], ORDERS)
    lake.run(operator(lake, as_of=dsi.AsOf.column("valid_from", valid_to="valid_to")))
    assert priced(lake) == {1: 1.0, 2: None, 3: 2.0}


def test_records_after_the_side_horizon_wait_until_it_passes_them(lake):
    lake.append("prices", [("a", 1.0, at(0)), ("b", 5.0, at(20))], PRICES)  # horizon: 20
    lake.append("orders", [(1, "a", at(10)), (2, "a", at(90))], ORDERS)
    op = operator(lake)
    first = lake.run(op).batches[0]
    assert first.routes["key_wait"] == 1
    assert priced(lake) == {1: 1.0}
    buffered = dsi.tables.read_table(lake.spark, op.spec.buffer_uri).select("_dsi_reason").first()
    assert buffered[0].startswith("waiting for side input 'price' to reach 2024-05-01T01:30")
    assert "known up to 2024-05-01T00:20:00+00:00" in first.readiness["price"]["global"]["reason"]

    lake.append("prices", [("a", 2.0, at(60)), ("a", 3.0, at(100))], PRICES)
    lake.run(op)  # the horizon (100) passed order 2's time: it sees the row valid at 90
    assert priced(lake) == {1: 1.0, 2: 2.0}
    assert_accounted(lake.spark, op, [1, 2], column="order_id")


def test_records_after_the_horizon_go_on_with_what_is_known_after_the_grace(lake):
    lake.append("prices", [("a", 1.0, at(0))], PRICES)
    lake.append("orders", [(1, "a", at(90))], ORDERS)
    op = operator(lake, grace=hours(1))
    clock = Clock(at(100))
    assert lake.run(op, clock).batches[0].routes["key_wait"] == 1
    clock.now = at(151)  # 90 + 1 h: the side data for order 1's time is final
    lake.run(op, clock)
    assert priced(lake) == {1: 1.0}
    assert op.buffer().rows() == 0


def test_a_late_record_gets_the_row_of_its_own_time_not_the_newest(lake):
    lake.append("prices", [("a", 1.0, at(0)), ("a", 2.0, at(60))], PRICES)
    lake.append("orders", [(1, "a", at(50))], ORDERS)
    op = operator(lake)
    lake.run(op)
    lake.append("prices", [("a", 3.0, at(180))], PRICES)
    lake.append("orders", [(2, "a", at(180)), (3, "a", at(30))], ORDERS)  # 3 is late
    lake.run(op)
    assert priced(lake) == {1: 1.0, 2: 3.0, 3: 1.0}


def test_overlapping_validity_is_an_error_naming_the_keys_unless_pick_says_which(lake):
    lake.append("prices", [("a", 1.0, at(0)), ("a", 2.0, at(0)), ("b", 5.0, at(0))], PRICES)
    lake.append("orders", [(1, "b", at(0))], ORDERS)
    with pytest.raises(dsi.errors.DuplicateKeyError, match=r"as-of map.*\('a'"):
        lake.run(operator(lake))
    assert not lake.exists("priced")
    lake.run(operator(lake, pick="price"))
    lake.append("orders", [(2, "a", at(0))], ORDERS)
    lake.run(operator(lake, pick="price"))
    assert priced(lake) == {1: 5.0, 2: 2.0}


def test_as_of_declarations_are_checked(lake):
    with pytest.raises(dsi.DeclarationError, match="declares none"):
        lake.operator(
            main=dsi.MainInput("orders"),
            side_inputs={"price": dsi.SideInput.map("prices", key="sku", as_of="valid_from")},
            fn=priced_frames,
            main_output="priced",
        )
    with pytest.raises(dsi.DeclarationError, match="as_of= and window="):
        dsi.SideInput.map(
            "prices",
            key="sku",
            as_of="valid_from",
            window=dsi.Window.tumbling(hours(1), time_column="ts"),
        )
    with pytest.raises(dsi.DeclarationError, match="only applies to map"):
        dsi.SideInput.list("prices", as_of="valid_from")  # type: ignore[call-arg]
    assert repr(dsi.SideInput.map("p", key="k", as_of=dsi.AsOf.history())) == (
        "SideInput.map('p', key='k', as_of=AsOf.history())"
    )


def test_a_replayed_as_of_batch_keeps_its_pinned_horizon(lake):
    lake.append("prices", [("a", 1.0, at(0)), ("b", 5.0, at(20))], PRICES)
    lake.append("orders", [(1, "a", at(10)), (2, "a", at(90))], ORDERS)
    engine = CrashingEngine(DeltaRsEngine(), crash_after=1)
    with pytest.raises(InjectedCrash):  # order 1 committed; order 2 not yet buffered
        operator(lake, storage=dsi.DeltaStorage(lake.storage.root, engine=engine)).run(lake.spark)
    lake.append("prices", [("a", 2.0, at(60)), ("a", 3.0, at(100))], PRICES)
    op = operator(lake)
    replay = lake.run(op, max_batches=1).batches[0]
    assert replay.replayed
    assert replay.routes["key_wait"] == 1  # as planned before the side data moved
    assert op.buffer().rows() == 1
    lake.run(op)
    assert priced(lake) == {1: 1.0, 2: 2.0}


def test_an_as_of_plan_round_trips_through_json(lake):
    lake.append("prices", [("a", 1.0, at(0)), ("b", 5.0, at(20))], PRICES)
    lake.append("orders", [(1, "a", at(10)), (2, "a", at(90))], ORDERS)
    op = operator(lake)
    batch = lake.run(op).batches[0]
    plan = op.state.plan(batch.batch_id)
    assert plan.as_of["price"].horizon == at(20)
    assert BatchPlan.from_json(plan.to_json()) == plan


# --- Delta history ----------------------------------------------------------------------------

HISTORY = "sku string, price double"


def _versions(lake, prices: list[float]) -> list[dt.datetime]:
    """Overwrite the side table once per price; the commit timestamps of the versions."""
    for price in prices:
        lake.overwrite("prices", [("a", price), ("b", price * 10)], HISTORY)
        time.sleep(0.05)  # distinct commit timestamps
    engine = lake.storage.delta
    return [stamp for _, stamp in engine.commit_timestamps(lake.storage.table_uri("prices"))]


def test_as_of_history_gives_the_row_of_the_version_committed_before_the_record(lake):
    v0, v1, v2 = _versions(lake, [1.0, 2.0, 3.0])
    second = dt.timedelta(milliseconds=1)
    lake.append(
        "orders",
        [
            (1, "a", v0 - second),  # before the table existed
            (2, "a", v0),
            (3, "a", v1 - second),
            (4, "b", v1 + second),
            (5, "a", v2 + second),
        ],
        ORDERS,
    )
    op = operator(lake, as_of=dsi.AsOf.history())
    lake.run(op, Clock(v2 + dt.timedelta(seconds=5)))
    assert priced(lake) == {1: None, 2: 1.0, 3: 1.0, 4: 20.0, 5: 3.0}


def test_a_replayed_as_of_history_batch_reads_its_pinned_versions(lake):
    v0, v1 = _versions(lake, [1.0, 2.0])
    millis = dt.timedelta(milliseconds=1)
    lake.append("orders", [(1, "a", v0 + millis), (2, "a", v1 + millis)], ORDERS)
    unmatched = dsi.OutputTag("unmatched_orders")
    clock = Clock(v1 + dt.timedelta(seconds=5))
    engine = CrashingEngine(DeltaRsEngine(), crash_after=1)
    crashing = operator(
        lake,
        as_of=dsi.AsOf.history(),
        missing="unmatched",
        routes=dsi.Routes(unmatched=unmatched),
        storage=dsi.DeltaStorage(lake.storage.root, engine=engine),
    )
    with pytest.raises(InjectedCrash):
        crashing.run(lake.spark, clock=clock)  # the main output is committed, not the rest

    lake.overwrite("prices", [("c", 9.0)], HISTORY)  # a new version: a re-plan would differ
    op = operator(
        lake,
        as_of=dsi.AsOf.history(),
        missing="unmatched",
        routes=dsi.Routes(unmatched=unmatched),
    )
    result = lake.run(op, clock)
    assert result.batches[0].replayed
    assert priced(lake) == {1: 1.0, 2: 2.0}
    assert lake.rows("unmatched_orders") == []
    plan = op.state.plan(result.batches[0].batch_id)
    assert [version for version, _ in plan.as_of["price"].versions] == [0, 1]

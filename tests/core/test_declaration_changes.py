"""What each declaration change under the same operator id does to buffered records
(issue 10, class 3; docs/DECISIONS.md, "Declaration changes").

The operator records a fingerprint of what routes a buffered record (main key, event
time, window, pre-keyed groups, side inputs and their views, keys, waiting rules, route
tags). When it changes while records are buffered, the next batch reads every buffer
slot and routes every buffered record again under the new declaration: new key groups,
and new windows for the records whose window is not one of the new declaration's; the
batch decides the readiness of those windows itself, so a record whose side data is
ready is released in that batch. Changes that cannot be applied to buffered records are
refused with the way out.
"""

import datetime as dt
from collections import Counter
from typing import Any

import pytest
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core.keyed import key_group
from dagster_sideinputs.delta.storage import DeltaRsEngine
from tests.core.accounting import assert_accounted, placement
from tests.core.conftest import T0, Clock, Lake, hours
from tests.core.reliability import put, refused
from tests.core.test_crash_safety import CrashingEngine, InjectedCrash

TXT = "tx_id long, currency string, ts timestamp"
FX = "currency string, rate double, ts timestamp"
TX = "tx_id long, customer_id long, amount double"
PROFILES = "customer_id long, name string"
HOURLY = dsi.Window.tumbling(hours(1), time_column="ts")


def at(hour: float, minutes: int = 0) -> dt.datetime:
    return T0 + hours(hour) + dt.timedelta(minutes=minutes)


def rate(main, sides):
    return main.select("tx_id", F.col("fx.rate").alias("rate"))


def converting(lake: Lake, fx: dsi.SideInput, **kwargs: Any) -> dsi.SideInputOperator:
    """transactions converted with FX rates (main event time ``ts``), to ``converted``."""
    return lake.operator(
        main=kwargs.pop("main", dsi.MainInput("transactions", event_time="ts")),
        side_inputs={"fx": fx},
        fn=kwargs.pop("fn", rate),
        main_output="converted",
        operator_id="converting",
        **kwargs,
    )


def hourly_fx(**kwargs: Any) -> dsi.SideInput:
    return dsi.SideInput.map("fx_rates", key="currency", window=HOURLY, **kwargs)


def latest_fx() -> dsi.SideInput:
    return dsi.SideInput.map("fx_rates", key="currency", pick="ts")


@pytest.fixture
def clock() -> Clock:
    return Clock(T0 + hours(12))


def slots(op: dsi.SideInputOperator) -> list[str]:
    return op.buffer().slots()


# --- windows ------------------------------------------------------------------------------


def test_windowed_made_non_windowed_releases_the_window_slots(lake, clock):
    limits = dsi.BufferLimits(max_age=hours(2))
    put(lake, "fx_rates", [("EUR", 1.0, at(0, 5)), ("EUR", 1.1, at(1, 5))], FX)  # hour 0 done
    put(
        lake, "transactions", [(1, "EUR", at(0, 10)), (2, "EUR", at(1, 10)), (3, "EUR", at(2))], TXT
    )
    windowed = converting(lake, hourly_fx(), buffer=limits)
    lake.run(windowed, clock)
    assert slots(windowed) == ["ns=2024-05-01T01:00:00Z", "ns=2024-05-01T02:00:00Z"]

    plain = converting(lake, latest_fx(), buffer=limits)
    clock.advance(hours(3))  # past max_age: slots kept forever used to fail every batch
    batch = lake.run(plain, clock).batches[0]
    assert batch.released_from_buffer == 2
    assert lake.rows("converted") == [(1, 1.0), (2, 1.1), (3, 1.1)]
    assert slots(plain) == []
    put(lake, "transactions", [(4, "EUR", at(13))], TXT)
    lake.run(plain, clock)
    assert_accounted(lake.spark, plain, [1, 2, 3, 4])


def test_non_windowed_made_windowed_decides_the_new_windows_in_the_same_batch(lake, clock):
    put(lake, "transactions", [(1, "EUR", at(0, 10)), (2, "EUR", at(1, 10))], TXT)
    plain = converting(lake, latest_fx())
    lake.run(plain, clock)  # no FX table yet: both wait in the global slot
    assert slots(plain) == ["ns=global"]

    put(lake, "fx_rates", [("EUR", 1.0, at(0, 5)), ("EUR", 1.1, at(1, 5))], FX)
    windowed = converting(lake, hourly_fx())
    batch = lake.run(windowed, clock).batches[0]
    # Hour 0 is complete: tx 1 is released by the batch that routes it again (it used to
    # be buffered once more under its new window, until a later run).
    assert batch.routes["released"] == 1
    assert lake.rows("converted") == [(1, 1.0)]
    assert slots(windowed) == ["ns=2024-05-01T01:00:00Z"]
    assert_accounted(lake.spark, windowed, [1, 2])


def test_window_size_changed_routes_buffered_records_into_the_new_windows(lake, clock):
    put(
        lake,
        "fx_rates",
        [("EUR", 1.0, at(0, 5)), ("EUR", 1.1, at(1, 5)), ("EUR", 1.2, at(2, 5))],
        FX,
    )
    put(lake, "transactions", [(1, "EUR", at(2, 10)), (2, "EUR", at(3, 10))], TXT)
    hourly = converting(lake, hourly_fx(), window=dsi.Window.tumbling(hours(1)))
    lake.run(hourly, clock)
    assert slots(hourly) == ["ns=2024-05-01T02:00:00Z", "ns=2024-05-01T03:00:00Z"]

    def with_window(main, sides):
        return main.select(
            "tx_id", F.col("fx.rate").alias("rate"), F.col("window.end").alias("end")
        )

    two_hours = converting(lake, hourly_fx(), window=dsi.Window.tumbling(hours(2)), fn=with_window)
    lake.run(two_hours, clock)  # [02:00, 04:00) reads the FX hour 03:00: not complete yet
    assert slots(two_hours) == ["ns=2024-05-01T02:00:00Z"]
    put(lake, "fx_rates", [("EUR", 1.3, at(3, 5)), ("EUR", 1.4, at(4, 5))], FX)
    lake.run(two_hours, clock)
    end = at(4).replace(tzinfo=None)
    assert lake.rows("converted", "tx_id", "rate", "end") == [(1, 1.3, end), (2, 1.3, end)]
    assert_accounted(lake.spark, two_hours, [1, 2])


def rules_operator(lake: Lake, window: dsi.Window | None, **kwargs: Any) -> dsi.SideInputOperator:
    """Records wait for the ``rules`` singleton; sliding windows give two rows each."""
    return lake.operator(
        main=dsi.MainInput("transactions", event_time="ts"),
        side_inputs={"rules": dsi.SideInput.singleton("rules")},
        fn=kwargs.pop(
            "fn", lambda main, sides: main.select("tx_id", F.col("window.start").alias("start"))
        ),
        main_output="windowed",
        window=window,
        **kwargs,
    )


SLIDING = dsi.Window.sliding(hours(1), slide=dt.timedelta(minutes=30))


def test_sliding_window_changed_with_buffered_rows_is_refused_until_they_drain(lake, clock):
    put(lake, "transactions", [(1, "EUR", at(0, 40))], TXT)
    sliding = rules_operator(lake, SLIDING)
    lake.run(sliding, clock)
    assert sliding.buffer().rows() == 2  # one row per window
    tumbling = rules_operator(lake, dsi.Window.tumbling(hours(1)))
    with refused(
        dsi.errors.OperatorStateError,
        "sliding windows",
        fix=["restore the previous window until the buffer drains", "drop_buffered=True"],
    ):
        lake.run(tumbling, clock)

    put(lake, "rules", [(1.0,)], "limit double")
    lake.run(sliding, clock)  # the previous declaration drains the buffer
    put(lake, "transactions", [(2, "EUR", at(1, 40))], TXT)
    lake.run(tumbling, clock)  # nothing buffered: the change applies at once
    assert placement(lake.spark, tumbling, "tx_id") == Counter({1: 2, 2: 1})


# A sliding window kept while the declaration changes (its rows routed again, each in its own
# window): test_bad_input_vanish.py, test_sliding_window_records_routed_again_after_a_...


# --- side inputs ----------------------------------------------------------------------------


def enriched_operator(
    lake: Lake, sides: dict[str, dsi.SideInput], **kwargs: Any
) -> dsi.SideInputOperator:
    def enrich(main, sides_):
        frame = main.select("tx_id", "customer_id")
        if "profile" in main.columns:
            frame = main.select("tx_id", "customer_id", F.col("profile.name").alias("name"))
        return frame

    return lake.operator(
        main=kwargs.pop("main", dsi.MainInput("transactions", key="customer_id")),
        side_inputs=sides,
        fn=kwargs.pop("fn", enrich),
        main_output="enriched",
        operator_id="enriching",
        schema_mode="merge",
        **kwargs,
    )


RULES = {"rules": dsi.SideInput.singleton("rules")}
PROFILE = {"profile": dsi.SideInput.map("profiles", key="customer_id")}


@pytest.fixture
def waiting_for_rules(lake, clock) -> Lake:
    """tx 1 and 2 wait for the rules singleton, which does not exist yet."""
    put(lake, "profiles", [(10, "ann"), (11, "bob")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0), (2, 11, 1.0)], TX)
    op = enriched_operator(lake, RULES)
    lake.run(op, clock)
    assert op.buffer().rows() == 2
    return lake


def test_side_input_added_routes_buffered_records_through_it(waiting_for_rules, clock):
    lake = waiting_for_rules
    both = enriched_operator(lake, {**RULES, **PROFILE})
    lake.run(both, clock)  # still waiting for the rules, now with the profile declared
    assert both.buffer().rows() == 2
    put(lake, "rules", [(1.0,)], "limit double")
    lake.run(both, clock)
    assert lake.rows("enriched", "tx_id", "name") == [(1, "ann"), (2, "bob")]
    assert_accounted(lake.spark, both, [1, 2])


def test_side_input_removed_releases_records_that_waited_only_for_it(waiting_for_rules, clock):
    lake = waiting_for_rules
    without = enriched_operator(lake, PROFILE)
    batch = lake.run(without, clock).batches[0]
    assert batch.released_from_buffer == 2
    assert lake.rows("enriched", "tx_id", "name") == [(1, "ann"), (2, "bob")]
    assert_accounted(lake.spark, without, [1, 2])


def waiting_side(**kwargs: Any) -> dict[str, dsi.SideInput]:
    options: dict[str, Any] = {"missing": "wait", "timeout": hours(1), **kwargs}
    return {"profile": dsi.SideInput.map("profiles", key="customer_id", **options)}


@pytest.mark.parametrize(
    ("change", "advance", "route"),
    [
        ({"missing": "null", "timeout": None}, dt.timedelta(0), "released"),
        ({"timeout": dt.timedelta(minutes=10)}, dt.timedelta(minutes=20), "unmatched"),
        ({"timeout": hours(3)}, hours(2), "key_wait"),
    ],
    ids=["wait-to-null", "shorter-timeout", "longer-timeout"],
)
def test_waiting_rule_changed_applies_to_the_waiting_records(lake, clock, change, advance, route):
    unmatched = dsi.OutputTag("unmatched")
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0), (2, 77, 1.0)], TX)
    before = enriched_operator(
        lake,
        waiting_side(),
        routes=dsi.Routes(unmatched=unmatched),
    )
    lake.run(before, clock)
    assert before.buffer().slots() == ["key=global"]

    options = {k: v for k, v in change.items() if v is not None}
    if change.get("missing") == "null":
        options.pop("timeout", None)
        side = {"profile": dsi.SideInput.map("profiles", key="customer_id", **options)}
    else:
        side = waiting_side(**options)
    after = enriched_operator(
        lake,
        side,
        routes=dsi.Routes(unmatched=unmatched),
    )
    clock.advance(advance)
    batch = lake.run(after, clock).batches[0]
    assert batch.routes[route] == 1  # tx 2, first seen when it was first read
    assert_accounted(lake.spark, after, [1, 2])


def test_main_key_changed_joins_waiting_records_by_the_new_key(lake, clock):
    schema = "tx_id long, customer_id long, account_id long"
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 77, 10)], schema)
    unmatched = dsi.OutputTag("unmatched")
    by_customer = enriched_operator(
        lake,
        waiting_side(),
        routes=dsi.Routes(unmatched=unmatched),
    )
    lake.run(by_customer, clock)
    assert by_customer.buffer().rows() == 1
    side = waiting_side(key_translator="account_id")
    by_account = enriched_operator(
        lake,
        side,
        main=dsi.MainInput("transactions", key="account_id"),
        routes=dsi.Routes(unmatched=unmatched),
    )
    lake.run(by_account, clock)
    assert lake.rows("enriched", "tx_id", "name") == [(1, "ann")]
    assert_accounted(lake.spark, by_account, [1])


def test_event_time_changed_routes_buffered_records_by_the_new_column(lake, clock):
    schema = "tx_id long, currency string, ts timestamp, booked timestamp"
    put(lake, "fx_rates", [("EUR", 1.0, at(0, 5)), ("EUR", 1.1, at(1, 5))], FX)
    put(lake, "transactions", [(1, "EUR", at(3), at(0, 30))], schema)
    by_ts = converting(lake, hourly_fx())
    lake.run(by_ts, clock)  # hour 3 is not complete
    assert slots(by_ts) == ["ns=2024-05-01T03:00:00Z"]
    by_booking = converting(
        lake, hourly_fx(), main=dsi.MainInput("transactions", event_time="booked")
    )
    batch = lake.run(by_booking, clock).batches[0]
    assert batch.released_from_buffer == 1
    assert lake.rows("converted") == [(1, 1.0)]
    assert_accounted(lake.spark, by_booking, [1])


def test_pre_keyed_declared_recomputes_the_key_groups_of_buffered_records(lake, clock):
    frame = lake.spark.createDataFrame([(1, 10, 1.0), (2, 11, 1.0)], TX)
    keyed = frame.withColumn("key_group", key_group("customer_id", 4))
    dsi.tables.write_dataframe(
        keyed, lake.storage.table_uri("transactions"), partition_by=["key_group"]
    )
    put(lake, "profiles", [(10, "ann"), (11, "bob")], PROFILES)
    plain = enriched_operator(lake, {**RULES, **PROFILE})
    lake.run(plain, clock)
    assert plain.buffer().rows() == 2
    pre_keyed = dsi.MainInput("transactions", key="customer_id", pre_keyed=dsi.KeyGroups(4))
    declared = enriched_operator(lake, {**RULES, **PROFILE}, main=pre_keyed)
    put(lake, "rules", [(1.0,)], "limit double")
    lake.run(declared, clock)  # buffered rows' key groups must match the promise's
    assert lake.rows("enriched", "tx_id", "name") == [(1, "ann"), (2, "bob")]
    assert_accounted(lake.spark, declared, [1, 2])


# --- routes and outputs -------------------------------------------------------------------


def test_late_tag_added_never_makes_buffered_records_late(lake, clock):
    late = dsi.OutputTag("late")
    window = dsi.Window.tumbling(hours(1), watermark=dt.timedelta(0))
    put(lake, "transactions", [(1, "EUR", at(0, 10)), (2, "EUR", at(5, 10))], TXT)
    before = rules_operator(lake, window)
    lake.run(before, clock)  # both wait for the rules; the watermark moves to 05:10
    after = rules_operator(
        lake,
        window,
        routes=dsi.Routes(late=late),
    )
    put(lake, "rules", [(1.0,)], "limit double")
    put(lake, "transactions", [(3, "EUR", at(1, 10))], TXT)  # new and behind: late
    lake.run(after, clock)
    assert lake.rows("late", "tx_id") == [(3,)]
    assert [r[0] for r in lake.rows("windowed")] == [1, 2]
    assert_accounted(lake.spark, after, [1, 2, 3])


def test_side_output_added_then_removed(waiting_for_rules, clock):
    lake = waiting_for_rules
    named = dsi.OutputTag("named")

    def split(main, sides):
        frame = main.select("tx_id", "customer_id")
        return {dsi.MAIN: frame, named: frame.select("tx_id")}

    with_output = enriched_operator(lake, RULES, fn=split, side_outputs=[named])
    put(lake, "rules", [(1.0,)], "limit double")
    lake.run(with_output, clock)
    assert lake.rows("named") == [(1,), (2,)]  # buffered records reach the new output
    without = enriched_operator(lake, RULES)
    put(lake, "transactions", [(3, 10, 1.0)], TX)
    lake.run(without, clock)
    assert lake.rows("named") == [(1,), (2,)]  # a removed output's table is left as it is
    assert_accounted(lake.spark, without, [1, 2, 3])


# --- a change in the middle of a batch ----------------------------------------------------


def test_declaration_changed_while_a_batch_is_written_in_part_is_refused_until_finished(
    lake, clock
):
    unmatched = dsi.OutputTag("unmatched")
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0), (2, 77, 1.0)], TX)
    engine = CrashingEngine(DeltaRsEngine(), crash_after=1)  # enriched, not the buffer
    crashing = enriched_operator(
        lake,
        waiting_side(),
        routes=dsi.Routes(unmatched=unmatched),
        storage=dsi.DeltaStorage(lake.storage.root, engine=engine),
    )
    with pytest.raises(InjectedCrash):
        lake.run(crashing, clock)
    nulls = {"profile": dsi.SideInput.map("profiles", key="customer_id")}
    changed = enriched_operator(
        lake,
        nulls,
        routes=dsi.Routes(unmatched=unmatched),
    )
    with refused(
        dsi.errors.OperatorStateError,
        "written in part",
        "declaration changed",
        fix="restore the previous declaration",
    ):
        lake.run(changed, clock)  # tx 2 would have been released and buffered
    lake.run(
        enriched_operator(
            lake,
            waiting_side(),
            routes=dsi.Routes(unmatched=unmatched),
        ),
        clock,
    )
    lake.run(changed, clock)
    assert lake.rows("enriched", "tx_id", "name") == [(1, "ann"), (2, None)]
    assert_accounted(lake.spark, changed, [1, 2])

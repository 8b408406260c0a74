"""The semantics users rely on (docs/SEMANTICS.md), one behaviour per test."""

import datetime as dt

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from tests.core.conftest import T0, Clock, hours, passthrough

"""The tests run under the engine users get (delta-spark); ``both_engines`` ones, whose
point is a difference between the engines, and all under ``DSI_BOTH_ENGINES=1``, run under
both (tests/core/conftest.py)."""
TX = "tx_id long, customer_id long, amount double"
PROFILES = "customer_id long, name string"


def enrich_with_profile(main, sides):
    return main.select("tx_id", "customer_id", F.col("profile.name").alias("name"))


def keyed_operator(lake, **options):
    options.setdefault("fn", enrich_with_profile)
    return lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id", **options.pop("side", {}))
        },
        main_output="enriched",
        **options,
    )


# --- readiness and buffering ---------------------------------------------------------------


def test_main_records_wait_for_the_first_side_data(lake):
    lake.append("transactions", [(1, 10, 5.0), (2, 11, 6.0)], TX)
    op = keyed_operator(lake)
    first = lake.run(op)
    assert first.batches[0].routes["buffered"] == 2
    assert lake.rows("enriched") == []
    assert op.buffer().rows() == 2

    lake.append("profiles", [(10, "ann"), (11, "bob")], PROFILES)
    second = lake.run(op)
    assert second.batches[0].released_from_buffer == 2
    assert lake.rows("enriched") == [(1, 10, "ann"), (2, 11, "bob")]
    assert op.buffer().rows() == 0
    assert second.batches[0].buffer_rows == 0  # the figure leaves out the released records


def test_buffered_records_are_released_exactly_once(lake):
    lake.append("transactions", [(1, 10, 5.0)], TX)
    op = keyed_operator(lake)
    lake.run(op)
    lake.append("profiles", [(10, "ann")], PROFILES)
    lake.append("transactions", [(2, 10, 6.0)], TX)
    [second] = lake.run(op).batches
    # Counted by a job: the new file's statistics do not know the buffered record.
    assert (second.rows_in, second.released_from_buffer, second.routes["released"]) == (1, 1, 2)
    lake.append("transactions", [(3, 10, 7.0)], TX)
    lake.run(op)
    lake.run(op)  # nothing new: no batch
    assert lake.rows("enriched", "tx_id") == [(1,), (2,), (3,)]


@pytest.mark.both_engines
def test_records_with_map_and_variant_columns_wait_and_are_released_unchanged(lake):
    # Spark refuses to hash maps and variants; the buffer's fingerprint of such records
    # hashes their string form (the first run failed as a "function error" before).
    attrs = "tx_id long, customer_id long, attrs map<string,double>, tags array<map<string,int>>"
    lake.append("transactions", [(1, 10, {"a": 1.5}, [{"x": 1}]), (2, 11, {}, None)], attrs)
    variant = lake.engine_id == "spark"  # the bridge refuses tables with variant columns
    if variant:
        frame = lake.frame("transactions").withColumn(
            "doc",
            F.parse_json(F.concat(F.lit('{"n": '), F.col("tx_id").cast("string"), F.lit("}"))),
        )
        lake.engine.write(
            frame, lake.storage.table_uri("transactions"), mode="overwrite", schema_mode="overwrite"
        )
    op = keyed_operator(lake, fn=lambda main, sides: main.drop("profile"))
    assert lake.run(op).batches[0].routes["buffered"] == 2
    lake.append("profiles", [(10, "ann"), (11, "bob")], PROFILES)
    assert lake.run(op).batches[0].released_from_buffer == 2
    columns = ["tx_id", "attrs", "tags"] + (["doc"] if variant else [])
    out = lake.frame("enriched").select(*columns[:3], *([F.to_json("doc")] if variant else []))
    assert sorted(tuple(r) for r in out.collect()) == [
        (1, {"a": 1.5}, [{"x": 1}], *(['{"n":1}'] if variant else [])),
        (2, {}, None, *(['{"n":2}'] if variant else [])),
    ]
    assert op.buffer().rows() == 0


@pytest.mark.both_engines
def test_side_rows_with_map_and_variant_columns_feed_sorted_and_picked_views(lake):
    # A multimap's rows are sorted, a pick's ties broken by the whole row: neither may
    # compare maps or variants (a variant side column failed as a "function error").
    side = "customer_id long, v int, attrs map<string,int>"
    lake.append("profiles", [(10, 1, {"a": 1}), (10, 2, {"a": 2})], side)
    if lake.engine_id == "spark":  # the bridge refuses tables with variant columns
        # The variant alone: a map beside it would already make the rows unsortable.
        doc = F.parse_json(F.lit('{"n": 1}'))
        frame = lake.frame("profiles").withColumn("doc", doc).drop("attrs")
        uri = lake.storage.table_uri("profiles")
        lake.engine.write(frame, uri, mode="overwrite", schema_mode="overwrite")
    lake.append("transactions", [(1, 10, 5.0)], TX)
    op = lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "all": dsi.SideInput.multimap("profiles", key="customer_id"),
            "last": dsi.SideInput.map("profiles", key="customer_id", pick="v"),
        },
        fn=lambda main, sides: main.select(
            "tx_id", F.size("all").alias("rows"), F.col("last.v").alias("picked")
        ),
        main_output="enriched",
    )
    lake.run(op)
    assert lake.rows("enriched") == [(1, 2, 2)]


def test_successive_batches_see_the_updated_side_input(lake):
    lake.append("transactions", [(1, 10, 5.0)], TX)
    op = keyed_operator(lake, side={"pick": "version"})
    lake.overwrite("profiles", [(10, "ann", 1)], "customer_id long, name string, version int")
    assert lake.run(op).batches[0].side_versions["profile"] == 0
    lake.overwrite("profiles", [(10, "ANN", 2)], "customer_id long, name string, version int")
    lake.append("transactions", [(2, 10, 6.0)], TX)
    result = lake.run(op)
    assert lake.rows("enriched") == [(1, 10, "ann"), (2, 10, "ANN")]
    assert result.batches[0].side_versions["profile"] == 1


@pytest.mark.both_engines
def test_replayed_batch_plan_pins_side_versions(lake):
    lake.append("profiles", [(10, "ann")], PROFILES)
    lake.append("transactions", [(1, 10, 5.0)], TX)
    op = keyed_operator(lake)
    metrics = lake.run(op).batches[0]
    plan = op.state.plan(metrics.batch_id)
    assert plan.side_versions == {"profile": 0}
    assert plan.decisions["profile"]["global"].ready


def test_a_stale_side_input_stops_releasing_until_refreshed(lake):
    clock = Clock()
    lake.append("rules", [(100.0,)], "threshold double")
    op = lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"rules": dsi.SideInput.singleton("rules", max_age=hours(1))},
        fn=passthrough,
        main_output="checked",
    )
    lake.append("transactions", [(1, 10, 5.0)], TX)
    assert lake.run(op, clock).batches[0].released == 1

    clock.advance(hours(2))  # the rules were committed more than an hour ago
    lake.append("transactions", [(2, 10, 6.0)], TX)
    stale = lake.run(op, clock).batches[0]
    assert stale.routes["buffered"] == 1
    assert "stale" in stale.readiness["rules"]["global"]["reason"]

    lake.overwrite("rules", [(50.0,)], "threshold double")
    clock.now = dt.datetime.now(dt.timezone.utc)
    refreshed = lake.run(op, clock).batches[0]
    assert refreshed.released_from_buffer == 1
    assert lake.rows("checked", "tx_id") == [(1,), (2,)]


def test_present_side_input_with_no_rows_is_not_ready(lake):
    lake.append("profiles", [], PROFILES)
    lake.append("transactions", [(1, 10, 5.0)], TX)
    op = keyed_operator(lake, side={"readiness": "present"})
    batch = lake.run(op).batches[0]
    assert batch.routes["buffered"] == 1
    assert "no rows yet" in batch.readiness["profile"]["global"]["reason"]


@pytest.mark.both_engines
def test_complete_side_input_with_no_rows_gives_an_empty_view(lake):
    lake.append("profiles", [], PROFILES)
    lake.append("transactions", [(1, 10, 5.0)], TX)
    op = keyed_operator(lake, side={"readiness": "complete"})
    lake.run(op)
    assert lake.rows("enriched") == [(1, 10, None)]


# --- views -----------------------------------------------------------------------------------


def test_singleton_view_is_a_row_value(lake):
    lake.append("rules", [(100.0, "EUR")], "threshold double, currency string")
    lake.append("transactions", [(1, 10, 50.0), (2, 10, 500.0)], TX)
    seen = {}

    def flag(main, sides):
        rules = sides["rules"]
        seen["rules"] = rules
        return main.withColumn("flagged", F.col("amount") > F.lit(rules.threshold))

    op = lake.operator(
        main=dsi.MainInput("transactions"),
        side_inputs={"rules": dsi.SideInput.singleton("rules")},
        fn=flag,
        main_output="flagged",
    )
    lake.run(op)
    assert seen["rules"].currency == "EUR"
    assert lake.rows("flagged", "tx_id", "flagged") == [(1, False), (2, True)]


def test_empty_singleton_uses_its_default(lake):
    lake.append("rules", [], "threshold double")
    lake.append("transactions", [(1, 10, 5.0)], TX)
    op = lake.operator(
        main=dsi.MainInput("transactions"),
        side_inputs={
            "rules": dsi.SideInput.singleton(
                "rules", readiness="complete", default={"threshold": 9.0}
            )
        },
        fn=lambda main, sides: main.withColumn("t", F.lit(sides["rules"]["threshold"])),
        main_output="out",
    )
    lake.run(op)
    assert lake.rows("out", "tx_id", "t") == [(1, 9.0)]


def test_empty_singleton_without_default_is_an_error(lake):
    lake.append("rules", [], "threshold double")
    lake.append("transactions", [(1, 10, 5.0)], TX)
    op = lake.operator(
        main=dsi.MainInput("transactions"),
        side_inputs={"rules": dsi.SideInput.singleton("rules", readiness="complete")},
        fn=lambda main, sides: main.withColumn("t", F.lit(sides["rules"].threshold)),
        main_output="out",
    )
    with pytest.raises(dsi.errors.EmptySingletonError, match="declares no default"):
        lake.run(op)


def test_list_view_is_a_dataframe_of_all_side_rows(lake):
    lake.append("blocked", [(10,), (12,)], "customer_id long")
    lake.append("transactions", [(1, 10, 5.0), (2, 11, 6.0), (3, 12, 7.0)], TX)

    def drop_blocked(main, sides):
        return main.join(sides["blocked"], "customer_id", "left_anti")

    op = lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"blocked": dsi.SideInput.list("blocked")},
        fn=drop_blocked,
        main_output="allowed",
    )
    lake.run(op)
    assert lake.rows("allowed", "tx_id") == [(2,)]


def test_map_view_joins_one_row_per_key_as_a_struct(lake):
    lake.append("profiles", [(10, "ann"), (11, "bob")], PROFILES)
    lake.append("transactions", [(1, 10, 5.0), (2, 99, 6.0)], TX)
    seen = {}

    def capture(main, sides):
        seen["schema"] = main.schema
        return enrich_with_profile(main, sides)

    lake.run(keyed_operator(lake, fn=capture))
    assert isinstance(seen["schema"]["profile"].dataType, T.StructType)
    assert lake.rows("enriched") == [(1, 10, "ann"), (2, 99, None)]


def test_map_with_duplicate_keys_and_pick_keeps_the_greatest(lake):
    lake.append(
        "profiles", [(10, "old", 1), (10, "new", 2)], "customer_id long, name string, version int"
    )
    lake.append("transactions", [(1, 10, 5.0)], TX)
    lake.run(keyed_operator(lake, side={"pick": "version"}))
    assert lake.rows("enriched") == [(1, 10, "new")]


def test_multimap_view_joins_all_rows_of_the_key_and_empty_lists(lake):
    lake.append("cards", [(10, "c1"), (10, "c2"), (11, "c3")], "customer_id long, card string")
    lake.append("transactions", [(1, 10, 5.0), (2, 12, 6.0)], TX)

    def cards(main, sides):
        return main.select("tx_id", F.transform("cards", lambda c: c.card).alias("cards"))

    op = lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"cards": dsi.SideInput.multimap("cards", key="customer_id")},
        fn=cards,
        main_output="with_cards",
    )
    lake.run(op)
    assert lake.rows("with_cards") == [(1, ["c1", "c2"]), (2, [])]


# --- distribution and keys -------------------------------------------------------------------


@pytest.mark.parametrize("distribution", ["broadcast", "keyed"])
def test_broadcast_and_keyed_distributions_give_the_same_lookups(lake, distribution):
    lake.append("profiles", [(k, f"n{k}") for k in range(50)], PROFILES)
    lake.append("transactions", [(i, i % 60, 1.0) for i in range(200)], TX)
    lake.run(keyed_operator(lake, side={"distribution": distribution}))
    rows = lake.rows("enriched")
    assert len(rows) == 200
    assert all(name == (f"n{c}" if c < 50 else None) for _, c, name in rows)


def test_forwarded_distribution_sees_only_rows_with_the_same_column_value(lake):
    lake.append("limits", [("eu", 100.0), ("us", 50.0), ("us", 70.0)], "region string, cap double")
    lake.append(
        "transactions",
        [(1, 10, "eu"), (2, 11, "us"), (3, 12, "apac")],
        "tx_id long, customer_id long, region string",
    )

    def caps(main, sides):
        return main.select(
            "tx_id", F.array_sort(F.transform("limits", lambda r: r.cap)).alias("caps")
        )

    op = lake.operator(
        main=dsi.MainInput("transactions"),
        side_inputs={
            "limits": dsi.SideInput.list(
                "limits", distribution="forwarded", forward_column="region"
            )
        },
        fn=caps,
        main_output="capped",
    )
    lake.run(op)
    assert lake.rows("capped") == [(1, [100.0]), (2, [50.0, 70.0]), (3, [])]


def test_key_translator_maps_main_records_to_side_keys(lake):
    lake.append("fx", [("USD", 1.0), ("EUR", 1.1)], "currency string, rate double")
    lake.append(
        "transactions", [(1, 10, "usd"), (2, 11, "eur")], "tx_id long, customer_id long, cur string"
    )

    def convert(main, sides):
        return main.select("tx_id", F.col("fx.rate").alias("rate"))

    op = lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "fx": dsi.SideInput.map("fx", key="currency", key_translator=lambda m: F.upper(m.cur))
        },
        fn=convert,
        main_output="converted",
    )
    lake.run(op)
    assert lake.rows("converted") == [(1, 1.0), (2, 1.1)]


def test_a_side_key_of_another_type_is_a_clear_declaration_error(lake):
    lake.append("profiles", [("10", "ann")], "customer_id string, name string")
    lake.append("transactions", [(1, 10, 5.0)], TX)
    with pytest.raises(
        dsi.DeclarationError, match=r"(?s)'profile'.*bigint key.*customer_id.*string.*cast"
    ) as caught:
        lake.run(keyed_operator(lake))
    assert "key_translator" in str(caught.value)
    assert not lake.exists("enriched")


# --- per-key waiting -------------------------------------------------------------------------


def test_per_key_wait_then_timeout_goes_to_unmatched(lake):
    clock = Clock()
    unmatched = dsi.OutputTag("unmatched_transactions")
    lake.append("profiles", [(10, "ann")], PROFILES)
    lake.append("transactions", [(1, 10, 5.0), (2, 11, 6.0), (3, 12, 7.0)], TX)
    op = keyed_operator(
        lake,
        side={"missing": "wait", "timeout": hours(1)},
        routes=dsi.Routes(unmatched=unmatched),
    )
    first = lake.run(op, clock).batches[0]
    assert first.routes["released"] == 1
    assert first.routes["key_wait"] == 2

    lake.append("profiles", [(11, "bob")], PROFILES)
    clock.advance(dt.timedelta(minutes=10))
    second = lake.run(op, clock).batches[0]
    assert second.released_from_buffer == 2
    assert second.routes["released"] == 1
    assert second.routes["key_wait"] == 1

    clock.advance(hours(1))
    third = lake.run(op, clock).batches[0]
    assert third.routes["unmatched"] == 1
    assert lake.rows("enriched") == [(1, 10, "ann"), (2, 11, "bob")]
    assert lake.rows("unmatched_transactions", "tx_id", "reason") == [
        (3, "no side row in: profile")
    ]
    assert op.buffer().rows() == 0


def test_per_key_wait_timeout_can_join_with_nulls(lake):
    clock = Clock()
    lake.append("profiles", [(10, "ann")], PROFILES)
    lake.append("transactions", [(1, 12, 5.0)], TX)
    op = keyed_operator(lake, side={"missing": "wait", "timeout": hours(1), "on_timeout": "null"})
    lake.run(op, clock)
    clock.advance(hours(2))
    lake.run(op, clock)
    assert lake.rows("enriched") == [(1, 12, None)]


def test_unmatched_route_without_a_declared_tag_is_refused_at_declaration(lake):
    with pytest.raises(dsi.DeclarationError, match="unmatched tag"):
        keyed_operator(lake, side={"missing": "wait", "timeout": hours(1)})


# --- windows ---------------------------------------------------------------------------------


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


TXT = "tx_id long, currency string, ts timestamp"
FX = "currency string, rate double, ts timestamp"


def windowed_operator(lake, main_window, side_window, **kwargs):
    def rate(main, sides):
        return main.select("tx_id", F.col("fx.rate").alias("rate"))

    return lake.operator(
        main=dsi.MainInput("transactions", event_time="ts"),
        side_inputs={
            "fx": dsi.SideInput.map(
                "fx_rates",
                key="currency",
                window=dsi.Window.tumbling(side_window, time_column="ts"),
            )
        },
        fn=rate,
        main_output="converted",
        window=dsi.Window.tumbling(main_window, **kwargs) if main_window else None,
    )


def test_windowed_side_input_same_window_releases_hour_by_hour(lake):
    lake.append("transactions", [(1, "EUR", at(10)), (2, "EUR", at(70)), (3, "EUR", at(130))], TXT)
    op = windowed_operator(lake, hours(1), hours(1))
    assert lake.run(op).batches[0].routes["buffered"] == 3

    lake.append("fx_rates", [("EUR", 1.0, at(5)), ("EUR", 1.1, at(65))], FX)  # hour 0 complete
    lake.run(op)
    assert lake.rows("converted") == [(1, 1.0)]

    lake.append("fx_rates", [("EUR", 1.2, at(125))], FX)  # hour 1 complete, hour 2 open
    lake.run(op)
    assert lake.rows("converted") == [(1, 1.0), (2, 1.1)]


def test_windowed_side_input_smaller_main_window_reads_the_containing_side_window(lake):
    lake.append("transactions", [(1, "EUR", at(10)), (2, "EUR", at(50))], TXT)
    lake.append("fx_rates", [("EUR", 1.0, at(1)), ("EUR", 2.0, at(61))], FX)
    op = windowed_operator(lake, dt.timedelta(minutes=15), hours(1))
    lake.run(op)
    assert lake.rows("converted") == [(1, 1.0), (2, 1.0)]


def test_windowed_side_input_larger_main_window_reads_the_last_side_window_inside(lake):
    lake.append("transactions", [(1, "EUR", at(10)), (2, "EUR", at(100))], TXT)
    lake.append(
        "fx_rates",
        [("EUR", 1.0, at(5)), ("EUR", 1.5, at(95)), ("EUR", 9.0, at(125))],
        FX,
    )
    op = windowed_operator(lake, hours(2), hours(1))
    lake.run(op)
    assert lake.rows("converted") == [(1, 1.5), (2, 1.5)]


def test_window_membership_not_time_order_decides_visibility(lake):
    lake.append("transactions", [(1, "EUR", at(1))], TXT)
    lake.append("fx_rates", [("EUR", 1.3, at(59)), ("EUR", 0.0, at(61))], FX)
    lake.run(windowed_operator(lake, hours(1), hours(1)))
    assert lake.rows("converted") == [(1, 1.3)]


def test_custom_window_mapping_replaces_the_default(lake):
    lake.append("transactions", [(1, "EUR", at(70))], TXT)
    lake.append("fx_rates", [("EUR", 1.0, at(5)), ("EUR", 2.0, at(65)), ("EUR", 3.0, at(125))], FX)
    previous_hour = lambda start, end: (start - hours(1), end - hours(1))  # noqa: E731
    op = lake.operator(
        main=dsi.MainInput("transactions", event_time="ts"),
        side_inputs={
            "fx": dsi.SideInput.map(
                "fx_rates",
                key="currency",
                window=dsi.Window.tumbling(hours(1), time_column="ts"),
                window_mapping=previous_hour,
            )
        },
        fn=lambda main, sides: main.select("tx_id", F.col("fx.rate").alias("rate")),
        main_output="converted",
        window=dsi.Window.tumbling(hours(1)),
    )
    lake.run(op)
    assert lake.rows("converted") == [(1, 1.0)]


def test_late_records_go_to_the_late_tag(lake):
    late = dsi.OutputTag("late_transactions")
    lake.append("rules", [(1.0,)], "threshold double")
    op = lake.operator(
        main=dsi.MainInput("transactions", event_time="ts"),
        side_inputs={"rules": dsi.SideInput.singleton("rules")},
        fn=lambda main, sides: main.select("tx_id"),
        main_output="processed",
        window=dsi.Window.tumbling(hours(1), watermark=dt.timedelta(minutes=10)),
        routes=dsi.Routes(late=late),
    )
    lake.append("transactions", [(1, "EUR", at(30)), (2, "EUR", at(200))], TXT)
    lake.run(op)
    # watermark is now 200 - 10 = 190 minutes: hours 0, 1 and 2 (ends 60, 120, 180) are closed
    lake.append("transactions", [(3, "EUR", at(100)), (4, "EUR", at(185))], TXT)
    batch = lake.run(op).batches[0]
    assert batch.routes["late"] == 1
    assert lake.rows("late_transactions", "tx_id") == [(3,)]
    assert lake.rows("processed") == [(1,), (2,), (4,)]


def test_late_records_without_a_late_tag_are_processed(lake):
    lake.append("rules", [(1.0,)], "threshold double")
    op = lake.operator(
        main=dsi.MainInput("transactions", event_time="ts"),
        side_inputs={"rules": dsi.SideInput.singleton("rules")},
        fn=lambda main, sides: main.select("tx_id"),
        main_output="processed",
        window=dsi.Window.tumbling(hours(1), watermark=dt.timedelta(minutes=10)),
    )
    lake.append("transactions", [(1, "EUR", at(200))], TXT)
    lake.run(op)
    lake.append("transactions", [(2, "EUR", at(10))], TXT)
    lake.run(op)
    assert lake.rows("processed") == [(1,), (2,)]


def test_sliding_main_windows_process_a_record_once_per_window(lake):
    lake.append("rules", [(1.0,)], "threshold double")
    op = lake.operator(
        main=dsi.MainInput("transactions", event_time="ts"),
        side_inputs={"rules": dsi.SideInput.singleton("rules")},
        fn=lambda main, sides: main.select("tx_id", F.col("window.start").alias("start")),
        main_output="windowed",
        window=dsi.Window.sliding(hours(1), slide=dt.timedelta(minutes=30)),
    )
    lake.append("transactions", [(1, "EUR", at(40))], TXT)
    batch = lake.run(op).batches[0]
    assert batch.rows_in == 2
    starts = sorted(r[1] for r in lake.rows("windowed"))
    assert [s.minute for s in starts] == [0, 30]


# --- side outputs ----------------------------------------------------------------------------


@pytest.mark.each_storage
def test_several_side_outputs_with_different_schemas(lake):
    big = dsi.OutputTag("big")
    counts = dsi.OutputTag("counts")
    lake.append("rules", [(10.0,)], "threshold double")
    lake.append("transactions", [(1, 10, 5.0), (2, 10, 50.0), (3, 11, 70.0)], TX)

    def split(main, sides):
        limit = sides["rules"].threshold
        return {
            dsi.MAIN: main.select("tx_id"),
            big: main.filter(F.col("amount") > limit).select("tx_id", "amount"),
            counts: main.groupBy("customer_id").count(),
        }

    op = lake.operator(
        main=dsi.MainInput("transactions"),
        side_inputs={"rules": dsi.SideInput.singleton("rules")},
        fn=split,
        main_output="all",
        side_outputs=[big, counts],
    )
    result = lake.run(op).batches[0]
    assert lake.rows("all") == [(1,), (2,), (3,)]
    assert lake.rows("big") == [(2, 50.0), (3, 70.0)]
    assert lake.rows("counts") == [(10, 2), (11, 1)]
    assert result.emitted("big") == 2


def test_emitting_to_an_undeclared_tag_is_an_error_naming_it_and_the_declared_ones(lake):
    lake.append("rules", [(10.0,)], "threshold double")
    lake.append("transactions", [(1, 10, 5.0)], TX)
    op = lake.operator(
        main=dsi.MainInput("transactions"),
        side_inputs={"rules": dsi.SideInput.singleton("rules")},
        fn=lambda main, sides: {dsi.MAIN: main, dsi.OutputTag("suspicous"): main},
        main_output="all",
        side_outputs=[dsi.OutputTag("suspicious")],
    )
    with pytest.raises(
        dsi.errors.UndeclaredOutputTagError, match=r"'suspicous'.*\['suspicious'\].*Did you mean"
    ):
        lake.run(op)
    assert not lake.exists("all")


def test_output_tags_are_equal_by_name_only():
    assert dsi.OutputTag("a") == dsi.OutputTag("a", schema=T.StructType([]))
    assert dsi.OutputTag("a") != dsi.OutputTag("b")


# --- accounting ------------------------------------------------------------------------------


@pytest.mark.each_storage
def test_every_record_is_accounted_for_in_the_metrics(lake):
    clock = Clock()
    unmatched = dsi.OutputTag("unmatched")
    lake.append("profiles", [(10, "ann")], PROFILES)
    lake.append("transactions", [(1, 10, 5.0), (2, 11, 6.0)], TX)
    op = keyed_operator(
        lake,
        side={"missing": "wait", "timeout": hours(1)},
        routes=dsi.Routes(unmatched=unmatched),
    )
    for _ in range(2):
        for batch in lake.run(op, clock).batches:
            assert batch.accounted
        clock.advance(hours(2))
    assert lake.rows("enriched", "tx_id") + lake.rows("unmatched", "tx_id") == [(1,), (2,)]


@pytest.mark.both_engines
def test_a_batch_releasing_every_record_counts_them_from_delta_statistics(lake):
    statistics = "routes counted from file statistics"
    invalid = dsi.OutputTag("invalid_transactions")
    lake.append("profiles", [(10, "ann")], PROFILES)
    lake.append("transactions", [(1, 10, 5.0), (2, 11, 6.0)], TX)
    lake.append("transactions", [(3, 10, 7.0)], TX)
    op = keyed_operator(
        lake,
        routes=dsi.Routes(invalid=invalid),
    )
    [batch] = lake.run(op).batches
    assert any(statistics in note for note in batch.notes)
    assert (batch.rows_in, batch.routes["released"], batch.accounted) == (3, 3, True)

    lake.append("transactions", [(4, 10, 1.0)], TX)
    lake.append("transactions", [(5, None, 1.0)], TX)  # a null key: a Spark job counts
    [batch] = lake.run(op).batches
    assert not any(statistics in note for note in batch.notes)
    assert (batch.rows_in, batch.routes["released"], batch.routes["invalid"]) == (2, 1, 1)
    assert lake.rows("enriched", "tx_id") == [(1,), (2,), (3,), (4,)]
    assert lake.rows("invalid_transactions", "tx_id") == [(5,)]


def test_a_main_version_adding_no_rows_is_counted_without_a_job(lake):
    """A version that adds no file (an empty append) holds no record: its batch moves the
    position with no Spark job counting records (an empty batch cost ~0.3 s more)."""
    lake.append("profiles", [(10, "ann")], PROFILES)
    lake.append("transactions", [(1, 10, 5.0)], TX)
    op = keyed_operator(lake)
    lake.run(op)
    lake.append("transactions", [], TX)
    [batch] = lake.run(op).batches
    assert any("routes counted from file statistics" in note for note in batch.notes)
    assert (batch.rows_in, sum(batch.routes.values()), batch.accounted) == (0, 0, True)
    assert lake.run(op).batches == []
    assert lake.rows("enriched", "tx_id") == [(1,)]

"""Row mode: Flink-style ``fn(record, ctx)`` with ``ctx.side_input`` and ``ctx.output``."""

import pytest
from pyspark.sql import types as T

import dagster_sideinputs as dsi

TX = "tx_id long, customer_id long, amount double"
ENRICHED = dsi.OutputTag(
    "enriched",
    schema=T.StructType(
        [
            T.StructField("tx_id", T.LongType()),
            T.StructField("name", T.StringType()),
            T.StructField("segment", T.StringType()),
        ]
    ),
)
ALERTS = dsi.OutputTag(
    "alerts",
    schema=T.StructType(
        [T.StructField("tx_id", T.LongType()), T.StructField("why", T.StringType())]
    ),
)


def enrich(record, ctx):
    profile = ctx.side_input("profile")
    rules = ctx.side_input("rules")
    if record.amount > rules.threshold:
        ctx.output(ALERTS, {"tx_id": record.tx_id, "why": f"amount {record.amount:.0f}"})
    yield {
        "tx_id": record["tx_id"],
        "name": profile.name if profile else None,
        "segment": ctx.side_input("segments").get(record.customer_id % 2),
    }


def row_operator(lake, fn=enrich, **kwargs):
    return lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id"),
            "rules": dsi.SideInput.singleton("rules"),
            "segments": dsi.SideInput.map(
                "segments", key="parity", distribution="broadcast", key_translator=None
            ),
        },
        fn=fn,
        mode="rows",
        main_output=ENRICHED,
        side_outputs=[ALERTS],
        **kwargs,
    )


def fill(lake):
    lake.append("profiles", [(10, "ann"), (11, "bob")], "customer_id long, name string")
    lake.append("rules", [(100.0,)], "threshold double")
    lake.append("segments", [(0, "even"), (1, "odd")], "parity long, label string")
    lake.append("transactions", [(1, 10, 50.0), (2, 11, 500.0), (3, 12, 5.0)], TX)


def test_row_function_sees_keyed_lookups_singletons_and_broadcast_maps(lake):
    fill(lake)

    def fn(record, ctx):
        segments = ctx.side_input("segments")
        profile = ctx.side_input("profile")
        rules = ctx.side_input("rules")
        if record.amount > rules.threshold:
            ctx.output(ALERTS, (record.tx_id, "big"))
        yield {
            "tx_id": record.tx_id,
            "name": profile.name if profile else None,
            "segment": segments[record.customer_id % 2].label,
        }

    # "segments" has no key relation to main records (no column "parity"): a whole-view map.
    batch = row_operator(lake, fn=fn).run(lake.spark).batches[0]
    assert lake.rows("enriched") == [(1, "ann", "even"), (2, "bob", "odd"), (3, None, "even")]
    assert lake.rows("alerts") == [(2, "big")]
    assert batch.emitted("alerts") == 1


def test_row_function_emitting_to_an_undeclared_tag_is_an_error_and_writes_nothing(lake):
    fill(lake)

    def fn(record, ctx):
        ctx.output("alert", {"tx_id": record.tx_id, "why": "x"})
        yield {"tx_id": record.tx_id, "name": None, "segment": None}

    with pytest.raises(dsi.UndeclaredOutputTagError, match=r"'alert'.*\['alerts'\]"):
        row_operator(lake, fn=fn).run(lake.spark)
    assert not lake.exists("enriched")


def test_row_mode_needs_schemas_for_its_outputs(lake):
    with pytest.raises(dsi.DeclarationError, match="every output needs a schema"):
        lake.operator(
            main=dsi.MainInput("transactions"),
            side_inputs={},
            fn=enrich,
            mode="rows",
            main_output="enriched",
        )


def test_row_function_may_yield_several_records_or_none(lake):
    fill(lake)

    def fn(record, ctx):
        for _ in range(record.tx_id - 1):
            yield {"tx_id": record.tx_id, "name": None, "segment": None}

    row_operator(lake, fn=fn).run(lake.spark)
    assert lake.rows("enriched", "tx_id") == [(2,), (3,), (3,)]


NAMES = dsi.OutputTag(
    "names",
    schema=T.StructType(
        [
            T.StructField("tx_id", T.LongType()),
            T.StructField("name", T.StringType()),
            T.StructField("cards", T.LongType()),
        ]
    ),
)


def broadcast_lookup_operator(lake):
    def fn(record, ctx):
        profile = ctx.side_input("profile")
        yield {
            "tx_id": record.tx_id,
            "name": profile.name if profile else None,
            "cards": len(ctx.side_input("cards")),
        }

    return lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id", distribution="broadcast"),
            "cards": dsi.SideInput.multimap("cards", key="customer_id", distribution="broadcast"),
        },
        fn=fn,
        mode="rows",
        main_output=NAMES,
    )


def test_broadcast_keyed_views_are_looked_up_per_record_in_row_mode(lake):
    lake.append("profiles", [(10, "ann"), (11, "bob")], "customer_id long, name string")
    lake.append("cards", [(10, "c1"), (10, "c2")], "customer_id long, card string")
    lake.append("transactions", [(1, 10, 1.0), (2, 11, 1.0), (3, 12, 1.0)], TX)
    broadcast_lookup_operator(lake).run(lake.spark)
    assert lake.rows("names") == [(1, "ann", 2), (2, "bob", 0), (3, None, 0)]


def test_broadcast_map_with_duplicate_keys_is_an_error_in_row_mode_too(lake):
    lake.append("profiles", [(10, "ann"), (10, "anne")], "customer_id long, name string")
    lake.append("cards", [(10, "c1")], "customer_id long, card string")
    lake.append("transactions", [(1, 10, 1.0)], TX)
    with pytest.raises(dsi.DuplicateKeyError, match=r"key\(s\) \[10\]"):
        broadcast_lookup_operator(lake).run(lake.spark)
    assert not lake.exists("names")

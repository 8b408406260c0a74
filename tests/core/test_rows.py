"""Row mode: Flink-style ``fn(record, ctx)`` with ``ctx.side_input`` and ``ctx.output``."""

import datetime as dt
import gc

import pyarrow as pa
import pytest
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from dagster_sideinputs.core.batch.tagged_layout import TaggedLayout
from dagster_sideinputs.core.records import cyclic_gc_paused, python_values
from dagster_sideinputs.delta.bridge.read import read_table


def tag(tag_name: str, /, **fields: T.DataType) -> dsi.OutputTag:
    """An output tag whose schema has these (nullable) fields, in order."""
    return dsi.OutputTag(
        tag_name, schema=T.StructType([T.StructField(f, kind) for f, kind in fields.items()])
    )


TX = "tx_id long, customer_id long, amount double"
ENRICHED = tag("enriched", tx_id=T.LongType(), name=T.StringType(), segment=T.StringType())
ALERTS = tag("alerts", tx_id=T.LongType(), why=T.StringType())


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

    with pytest.raises(dsi.errors.UndeclaredOutputTagError, match=r"'alert'.*\['alerts'\]"):
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


NAMES = tag("names", tx_id=T.LongType(), name=T.StringType(), cards=T.LongType())


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
    with pytest.raises(dsi.errors.DuplicateKeyError, match=r"key\(s\) \[10\]"):
        broadcast_lookup_operator(lake).run(lake.spark)
    assert not lake.exists("names")


# --- values as row functions see them ---------------------------------------------------------

UTC = dt.timezone.utc
INSTANTS = [
    dt.datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=UTC),
    None,
    dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    dt.datetime(1, 1, 1, tzinfo=UTC),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
]


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
@pytest.mark.parametrize("with_nulls", [True, False])
def test_utc_timestamps_become_aware_datetimes_like_arrows_own_conversion(unit, with_nulls):
    instants = [i for i in INSTANTS if with_nulls or i is not None]
    if unit == "ns":  # nanoseconds since the epoch only reach years 1677-2262
        instants = [i for i in instants if i is None or 1700 < i.year < 2200]
    column = pa.array(instants, pa.timestamp("us", tz="UTC")).cast(
        pa.timestamp(unit, tz="UTC"), safe=False
    )
    values = python_values(column)
    assert values == column.to_pylist()
    assert all(v is None or v.tzinfo is dt.timezone.utc for v in values)
    assert python_values(pa.chunked_array([column, column])) == values + values


STAMPED = tag(
    "stamped", tx_id=T.LongType(), next_day=T.TimestampType(), opened_before=T.BooleanType()
)


def test_row_functions_see_timestamps_as_aware_utc_datetimes(lake):
    lake.append("profiles", [(10, INSTANTS[0])], "customer_id long, opened timestamp")
    lake.append(
        "transactions",
        [(i, 10, at) for i, at in enumerate(INSTANTS[:3])],
        "tx_id long, customer_id long, at timestamp",
    )

    def fn(record, ctx):
        opened = ctx.side_input("profile").opened
        assert opened.tzinfo is dt.timezone.utc, opened
        at = record.at
        assert at is None or at.tzinfo is dt.timezone.utc, at
        yield {
            "tx_id": record.tx_id,
            "next_day": None if at is None else at + dt.timedelta(days=1),
            "opened_before": None if at is None else opened < at,
        }

    lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id", distribution="broadcast")
        },
        fn=fn,
        mode="rows",
        main_output=STAMPED,
    ).run(lake.spark)
    day = dt.timedelta(days=1)
    assert lake.rows("stamped") == [
        (0, (INSTANTS[0] + day).replace(tzinfo=None), False),
        (1, None, None),
        (2, (INSTANTS[2] + day).replace(tzinfo=None), False),
    ]


# --- several outputs travel as one flat result ---------------------------------------------------

AS_NUMBER = tag("as_number", tx_id=T.LongType(), value=T.DoubleType())
AS_TEXT = dsi.OutputTag(
    "as_text",
    schema=T.StructType(
        [
            T.StructField("value", T.StringType()),
            T.StructField("tx_id", T.LongType()),
            T.StructField("note", T.StringType(), nullable=False),
        ]
    ),
)


def test_outputs_share_columns_by_name_and_type_only():
    layout = TaggedLayout([AS_NUMBER, AS_TEXT])
    number_columns, text_columns = layout.columns
    assert number_columns[0] == text_columns[1]  # tx_id long: one column
    assert number_columns[1] != text_columns[0]  # value double / value string: two
    assert len(layout.schema.fields) == 1 + 4
    assert all(field.nullable for field in layout.schema.fields)


def test_outputs_with_clashing_field_types_keep_their_own_schemas_and_values(lake):
    lake.append("transactions", [(1, 10, 2.5), (2, 11, 7.0)], TX)

    def fn(record, ctx):
        yield {"tx_id": record.tx_id, "value": record.amount}
        ctx.output(AS_TEXT, {"value": f"{record.amount:.1f}", "tx_id": record.tx_id, "note": "n"})

    lake.operator(
        main=dsi.MainInput("transactions"),
        side_inputs={},
        fn=fn,
        mode="rows",
        main_output=AS_NUMBER,
        side_outputs=[AS_TEXT],
    ).run(lake.spark)
    assert lake.rows("as_number") == [(1, 2.5), (2, 7.0)]
    assert lake.rows("as_text") == [("2.5", 1, "n"), ("7.0", 2, "n")]
    written = read_table(lake.spark, lake.storage.table_uri("as_text")).schema
    assert [(f.name, f.dataType) for f in written.fields] == [
        (f.name, f.dataType) for f in AS_TEXT.schema.fields
    ]


def test_struct_fields_of_main_records_are_records_too(lake):
    lake.append(
        "transactions",
        [(1, ("web", ("de", 3))), (2, None)],
        "tx_id long, source struct<channel: string, origin: struct<country: string, hops: int>>",
    )

    def fn(record, ctx):
        source = record.source
        yield {
            "tx_id": record.tx_id,
            "value": None if source is None else f"{source.channel}/{source.origin.country}",
        }

    lake.operator(
        main=dsi.MainInput("transactions"),
        side_inputs={},
        fn=fn,
        mode="rows",
        main_output=tag("sources", tx_id=T.LongType(), value=T.StringType()),
    ).run(lake.spark)
    assert lake.rows("sources") == [(1, "web/de"), (2, None)]


def test_a_paused_collector_comes_back_as_it_was_even_after_an_error():
    def fail_while_paused():
        with cyclic_gc_paused():
            assert not gc.isenabled()
            raise RuntimeError("a row function failed")

    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="a row function failed"):
        fail_while_paused()
    assert gc.isenabled()
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()  # the caller had it off: it stays off
    finally:
        gc.enable()


def test_row_mode_refuses_more_outputs_than_its_tag_column_holds():
    tags = [tag(f"out_{i}", tx_id=T.LongType()) for i in range(128)]
    with pytest.raises(dsi.DeclarationError, match="at most 127 outputs"):
        TaggedLayout(tags)
    assert len(TaggedLayout(tags[:127]).schema.fields) == 2

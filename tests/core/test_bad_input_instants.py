"""Bad-input catalogue, issue 37 class 4: null instants in temporal side inputs.

A side row's instant (an as-of map's ``valid_from``, a windowed side input's time) that
is null is refused (``SideInputDataError`` naming the side input, the column and some
keys): such a row would be valid at no time or at every time (two of them gave one main
record two output rows). The check runs before anything is staged, whatever the mode
(rows mode reads an as-of map's joined column, as frames mode does): the cases run in
frames mode, one in rows mode; the windowed one under both engines. A null ``valid_to``
stays open-ended; a null main event time stays invalid. After the fix (the rows given an
instant, or deleted), every main record is in exactly one place.
"""

import datetime as dt

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from tests.core.catalogue import (
    INVALID,
    T0,
    UNMATCHED,
    UTC,
    accounted,
    hours,
    nothing_committed,
    put,
    refused,
)
from tests.core.conftest import Lake
from tests.core.test_temporal import ORDERS, PRICES, at, operator, priced

"""The tests run under the engine users get (delta-spark); ``both_engines`` ones, whose
point is a difference between the engines, and all under ``DSI_BOTH_ENGINES=1``, run under
both (tests/core/conftest.py)."""

SINCE_ALWAYS = dt.datetime(1, 1, 1, tzinfo=UTC)  # what the fix suggests for "since always"
Z = ("z", 0.0, T0 + dt.timedelta(hours=1))  # another key's row: the horizon passes the orders


def refused_null_valid_from(lake: Lake, op: dsi.SideInputOperator, key: str) -> None:
    with (
        refused(
            dsi.errors.SideInputDataError,
            "'price'",
            "'prices'",
            "valid_from 'valid_from' is null",
            f"'{key}'",
            fix=["give those rows a 'valid_from'", "0001-01-01", "delete them"],
        ),
        nothing_committed(lake, op),
    ):
        lake.run(op)


def test_two_null_valid_from_rows_of_one_key_are_refused_not_joined_twice(lake):
    put(lake, "prices", [("a", 1.0, None), ("a", 2.0, None), ("b", 5.0, at(0)), Z], PRICES)
    put(lake, "orders", [(1, "a", at(10)), (2, "b", at(10))], ORDERS)
    op = operator(lake, "frames")
    refused_null_valid_from(lake, op, "a")
    put(
        lake,
        "prices",
        [("a", 1.0, at(-60)), ("a", 2.0, at(0)), ("b", 5.0, at(0)), Z],
        PRICES,
        mode="overwrite",
    )
    lake.run(op)
    assert priced(lake) == {1: 2.0, 2: 5.0}
    accounted(lake, op, [1, 2], column="order_id")


def test_one_null_valid_from_is_refused_and_the_suggested_since_always_works(lake):
    put(lake, "prices", [("a", 1.0, None), ("a", 2.0, at(60))], PRICES)
    put(lake, "orders", [(1, "a", at(10)), (2, "a", at(60))], ORDERS)
    op = operator(lake, "frames")
    refused_null_valid_from(lake, op, "a")
    put(lake, "prices", [("a", 1.0, SINCE_ALWAYS), ("a", 2.0, at(60))], PRICES, mode="overwrite")
    lake.run(op)
    assert priced(lake) == {1: 1.0, 2: 2.0}
    accounted(lake, op, [1, 2], column="order_id")


def test_a_null_valid_from_with_a_valid_to_column_is_refused(lake):
    ddl = PRICES + ", valid_to timestamp"
    put(lake, "prices", [("a", 1.0, None, at(30)), ("a", 2.0, at(30), None)], ddl)
    put(lake, "orders", [(1, "a", at(10)), (2, "a", at(30))], ORDERS)
    op = operator(lake, "frames", as_of=dsi.AsOf.column("valid_from", valid_to="valid_to"))
    refused_null_valid_from(lake, op, "a")
    put(lake, "prices", [("a", 2.0, at(30), None)], ddl, mode="overwrite")  # deleted
    lake.run(op)
    assert priced(lake) == {1: None, 2: 2.0}  # a null valid_to: open-ended
    accounted(lake, op, [1, 2], column="order_id")


def test_a_null_valid_from_is_refused_under_pick_too(lake):
    ddl = PRICES + ", rank long"
    put(lake, "prices", [("a", 1.0, None, 1), ("a", 2.0, None, 2), ("a", 3.0, at(0), 1)], ddl)
    later = ("z", 0.0, at(60), 1)
    put(lake, "orders", [(1, "a", at(10))], ORDERS)
    op = operator(lake, "rows", pick="rank")
    refused_null_valid_from(lake, op, "a")
    put(lake, "prices", [("a", 3.0, at(0), 1), ("a", 4.0, at(0), 2), later], ddl, mode="overwrite")
    lake.run(op)
    assert priced(lake) == {1: 4.0}
    accounted(lake, op, [1], column="order_id")


def test_a_null_valid_from_is_refused_even_when_no_record_would_be_released(lake):
    """Key b's only row has no start: its record must not go to unmatched silently (nor
    the operator wait for a row that is there)."""
    put(lake, "prices", [("a", 1.0, at(0)), ("b", 7.0, None)], PRICES)
    put(lake, "orders", [(1, "b", at(10))], ORDERS)
    op = operator(
        lake,
        "frames",
        missing="unmatched",
        routes=dsi.Routes(unmatched=UNMATCHED),
    )
    refused_null_valid_from(lake, op, "b")
    put(lake, "prices", [("a", 1.0, at(0)), ("b", 7.0, at(5)), Z], PRICES, mode="overwrite")
    lake.run(op)
    assert priced(lake) == {1: 7.0}
    accounted(lake, op, [1], column="order_id")


@pytest.mark.both_engines
def test_a_null_time_in_a_windowed_side_input_is_refused(lake):
    names = dsi.OutputTag(
        "seen",
        schema=T.StructType(
            [
                T.StructField("tx_id", T.LongType()),
                T.StructField("names", T.ArrayType(T.StringType())),
            ]
        ),
    )
    events = "name string, ts timestamp"
    put(lake, "transactions", [(1, at(10)), (2, at(70))], "tx_id long, ts timestamp")
    put(lake, "events", [("a", at(5)), ("lost", None), ("z", at(130))], events)
    op = lake.operator(
        main=dsi.MainInput("transactions", event_time="ts"),
        side_inputs={
            "events": dsi.SideInput.list(
                "events", window=dsi.Window.tumbling(hours(1), time_column="ts")
            )
        },
        fn=lambda main, sides: main.select(
            "tx_id", F.transform(F.col("events"), lambda e: e["name"]).alias("names")
        ),
        main_output=names,
        window=dsi.Window.tumbling(hours(1)),
    )
    with (
        refused(
            dsi.errors.SideInputDataError,
            "'events'",
            "time column 'ts' is null",
            fix=["give those rows a 'ts'", "delete them"],
        ),
        nothing_committed(lake, op),
    ):
        lake.run(op)
    put(lake, "events", [("a", at(5)), ("lost", at(65)), ("z", at(130))], events, mode="overwrite")
    lake.run(op)
    assert lake.rows("seen") == [(1, ["a"]), (2, ["lost"])]
    accounted(lake, op, [1, 2], column="tx_id")


def test_a_null_main_event_time_with_an_as_of_side_input_is_invalid(lake):
    put(lake, "prices", [("a", 1.0, at(0)), Z], PRICES)
    put(lake, "orders", [(1, "a", at(10)), (2, "a", None)], ORDERS)
    op = operator(lake, "frames")
    with (
        refused(dsi.errors.MainInputDataError, "'orders'", "null event time 'ts'", fix="invalid="),
        nothing_committed(lake, op),
    ):
        lake.run(op)
    fixed = operator(
        lake,
        "frames",
        routes=dsi.Routes(invalid=INVALID),
    )
    lake.run(fixed)
    assert priced(lake) == {1: 1.0}
    assert lake.rows("invalid", "order_id", "reason") == [(2, "null event time 'ts'")]
    accounted(lake, fixed, [1, 2], column="order_id")

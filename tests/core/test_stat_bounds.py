"""Decisions taken from file statistics are exact at the microsecond, under both engines.

Delta statistics hold timestamps at millisecond precision (our writer rounds outward,
delta-spark's truncates): a side input's horizon, a side window's finality and the
windows a batch plans must treat them as bounds (core/sideinputs/time_stats.py), and take the
exact value from the few files that may hold it."""

import datetime as dt

from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from dagster_sideinputs.core.sideinputs.time_stats import cached_max_time, exact_max_time, time_span
from dagster_sideinputs.delta.engine import DataFile, TableSnapshot
from tests.core.accounting import assert_accounted
from tests.core.conftest import T0, hours
from tests.core.test_temporal import ORDERS, PRICED, PRICES, priced

DELTA_ENGINES = ("rs", "spark")


def us(n: int) -> dt.datetime:
    return T0 + dt.timedelta(microseconds=n)


def test_as_of_horizon_is_exact_at_the_microsecond(lake):
    """The issue's sequence: a side row at T+500 µs, a record at T+700 µs (waits: the side
    data reaches only T+500 µs), a row at T+600 µs arriving later (the record's row)."""
    lake.append("prices", [("a", 1.0, us(0)), ("a", 2.0, us(500))], PRICES)
    lake.append("orders", [(1, "a", us(500)), (2, "a", us(700))], ORDERS)
    op = lake.operator(
        main=dsi.MainInput("orders", event_time="ts"),
        side_inputs={"price": dsi.SideInput.map("prices", key="sku", as_of="valid_from")},
        fn=lambda main, sides: main.select("order_id", F.col("price.price").alias("price")),
        main_output=PRICED,
    )
    first = lake.run(op).batches[0]
    # T+500 µs is known (not floored to T), T+700 µs is not (not ceiled to T+1 ms).
    assert priced(lake) == {1: 2.0}
    assert first.routes["key_wait"] == 1
    assert (
        "known up to 2024-05-01T00:00:00.000500+00:00"
        in (first.readiness["price"]["global"]["reason"])
    )
    lake.append("prices", [("a", 3.0, us(600))], PRICES)
    lake.run(op)  # the side data reaches T+600 µs only: order 2 still waits
    assert priced(lake) == {1: 2.0}
    lake.append("prices", [("b", 9.0, us(701))], PRICES)
    lake.run(op)
    assert priced(lake) == {1: 2.0, 2: 3.0}  # the row valid at T+700 µs: T+600 µs's
    assert_accounted(lake.spark, op, [1, 2], column="order_id")


NAMES = dsi.OutputTag(
    "seen",
    schema=T.StructType(
        [
            T.StructField("tx_id", T.LongType()),
            T.StructField("names", T.ArrayType(T.StringType())),
        ]
    ),
)


def test_side_window_is_final_only_when_its_data_reaches_its_end_to_the_microsecond(lake):
    hour = dsi.Window.tumbling(hours(1), time_column="ts")
    end = T0 + hours(1)
    lake.append("transactions", [(1, T0 + dt.timedelta(minutes=5))], "tx_id long, ts timestamp")
    lake.append(
        "events",
        [("a", T0 + dt.timedelta(minutes=10)), ("b", end - dt.timedelta(microseconds=500))],
        "name string, ts timestamp",
    )
    op = lake.operator(
        main=dsi.MainInput("transactions", event_time="ts"),
        side_inputs={"events": dsi.SideInput.list("events", window=hour)},
        fn=lambda main, sides: main.select(
            "tx_id", F.array_sort(F.transform(F.col("events"), lambda e: e["name"])).alias("names")
        ),
        main_output=NAMES,
        window=dsi.Window.tumbling(hours(1)),
    )
    lake.run(op)  # the side data reaches end - 500 µs, not the window's end
    assert lake.rows("seen") == []
    lake.append(
        "events",
        [("c", end - dt.timedelta(microseconds=400)), ("z", end)],
        "name string, ts timestamp",
    )
    lake.run(op)
    assert lake.rows("seen") == [(1, ["a", "b", "c"])]
    assert_accounted(lake.spark, op, [1], column="tx_id")


def test_windows_on_a_sub_millisecond_grid_are_planned_from_bounds(lake):
    """Windows of 1 ms starting at x.5 ms: a record at T+700 µs is in [T+500 µs, T+1.5 ms),
    which a statistic truncated to T (delta-spark) would leave out of the plan."""
    grid = dsi.Window.tumbling(
        dt.timedelta(milliseconds=1), offset=dt.timedelta(microseconds=500), time_column="ts"
    )
    lake.append("transactions", [(1, us(100)), (2, us(700))], "tx_id long, ts timestamp")
    lake.append(
        "events", [("a", us(200)), ("b", us(900)), ("z", us(5000))], "name string, ts timestamp"
    )
    op = lake.operator(
        main=dsi.MainInput("transactions", event_time="ts"),
        side_inputs={"events": dsi.SideInput.list("events", window=grid)},
        fn=lambda main, sides: main.select(
            "tx_id", F.array_sort(F.transform(F.col("events"), lambda e: e["name"])).alias("names")
        ),
        main_output=NAMES,
        window=grid,
    )
    first = lake.run(op).batches[0]
    # Both windows decided in the first batch (not record 2 buffered under a window the
    # plan lacks, then planned again from the buffer).
    assert first.routes.get("released") == 2, first.routes
    assert lake.rows("seen") == [(1, ["a"]), (2, ["b"])]
    assert_accounted(lake.spark, op, [1, 2], column="tx_id")


# --- the bounds themselves (no Spark) ----------------------------------------------------------


def _file(path: str, low: dt.datetime, high: dt.datetime, *, dv: bool = False) -> DataFile:
    return DataFile(
        path=path,
        uri=path,
        size=1,
        num_records=2,
        min_values={"ts": low},
        max_values={"ts": high},
        null_count={"ts": 0},
        deletion_vector=dv,
    )


def test_the_exact_maximum_reads_only_the_files_that_may_hold_it():
    ms = dt.timedelta(milliseconds=1)
    files = [
        _file("old", T0, T0 + hours(1)),
        _file("near", T0, T0 + hours(2) - ms),  # may hold up to 2 h - 1 µs
        _file("top", T0, T0 + hours(2)),  # holds more than 2 h - 1 ms
        _file("dv", T0, T0 + hours(3), dv=True),  # its max row may be deleted
    ]
    read: list[list[str]] = []

    def reader(chosen):
        read.append(sorted(f.path for f in chosen))
        return T0 + hours(2) - dt.timedelta(microseconds=300)

    assert exact_max_time(files, "ts", reader) == T0 + hours(2) - dt.timedelta(microseconds=300)
    assert read == [["dv", "near", "top"]]
    # Without Spark (peeking): the greatest upper bound.
    assert exact_max_time(files[:3], "ts", None) == T0 + hours(2) + ms - dt.timedelta(
        microseconds=1
    )
    # Planning windows: every instant the statistics allow.
    assert time_span(files[:1], "ts") == (T0, T0 + hours(1) + ms - dt.timedelta(microseconds=1))


def test_date_statistics_are_exact_and_need_no_read():
    day = dt.date(2024, 5, 1)
    file = DataFile("d", "d", 1, num_records=1, min_values={"d": day}, max_values={"d": day})

    def reader(chosen):
        raise AssertionError("dates are exact")

    assert exact_max_time([file], "d", reader) == T0


def test_the_exact_maximum_is_read_once_per_table_version():
    files = (_file("f", T0, T0 + hours(1)),)
    snapshot = TableSnapshot(
        uri="memory://cached-max-test",
        version=7,
        schema=T.StructType([]),
        partition_columns=(),
        files=files,
        commit_timestamp=T0,
        configuration={},
        table_id="t1",
    )
    reads: list[int] = []

    def reader(chosen):
        reads.append(len(chosen))
        return T0 + hours(1) - dt.timedelta(microseconds=1)

    uri = "memory://cached-max-test"
    for _ in range(3):  # three batches planned at one side version
        assert cached_max_time(uri, snapshot, "ts", reader) == T0 + hours(1) - dt.timedelta(
            microseconds=1
        )
    assert cached_max_time(uri, snapshot, "ts", None) == T0 + hours(1) - dt.timedelta(
        microseconds=1
    )  # peeking reuses it
    assert reads == [1]

"""Bad-input catalogue, class 4: records must not vanish inside Spark.

Every filter, join, explode and parse the operator plans (implicit ones included) is fed
the records that fall through such steps: null, NaN and out-of-range event times and
keys, sliding windows, keys that do not survive a cast, landed lines that only some
columns' parsing finds corrupt, pre-keyed scans, the overflow ranking: the record reaches
exactly one output, route or the buffer. Each case runs in frames and rows mode (their
functions get their input and build their outputs apart), unless what it checks happens
before any function runs (records that all wait, overflow or are invalid; the buffer
routed again): those run in frames mode only, the mode's code being that of released
records alone (core/batch/compute.py).
"""

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core.keyed import key_group
from tests.core.catalogue import (
    INVALID,
    MODES,
    OVERFLOW,
    PROFILES,
    T0,
    TX,
    TXT,
    UNMATCHED,
    UTC,
    accounted,
    hours,
    nothing_committed,
    operator,
    placed,
    put,
    refused,
)
from tests.core.conftest import Clock, Lake

# Under the engine users get (delta-spark): these cases are about routing records (what
# Spark computes before any write), the same under both engines; test_bad_input_halfway.py,
# whose cases commit, runs under both.

NOW = T0 + hours(3)
HOUR = dsi.Window.tumbling(hours(1))
SLIDING = dsi.Window.sliding(hours(2), slide=hours(1))  # two windows per record


@pytest.fixture
def ready(lake: Lake) -> Lake:
    put(lake, "profiles", [(10, "ann")], PROFILES)
    return lake


def windowed(lake: Lake, mode: str, window: dsi.Window = HOUR, **kwargs: Any):
    kwargs.setdefault("main", dsi.MainInput("transactions", key="customer_id", event_time="ts"))
    return operator(lake, mode, window=window, **kwargs)


# --- event times -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_null_event_time_is_invalid_not_dropped_by_the_window_assignment(ready, mode):
    put(ready, "transactions", [(1, 10, 1.0, T0), (2, 10, 1.0, None)], TXT)
    with (
        refused(
            dsi.errors.MainInputDataError, "'transactions'", "null event time 'ts'", fix="invalid="
        ),
        nothing_committed(ready, windowed(ready, mode)),
    ):
        ready.run(windowed(ready, mode), Clock(NOW))
    fixed = windowed(
        ready,
        mode,
        routes=dsi.Routes(invalid=INVALID),
    )
    ready.run(fixed, Clock(NOW))
    accounted(ready, fixed, [1, 2])
    assert ready.rows("invalid", "tx_id", "reason") == [(2, "null event time 'ts'")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ((2, 10, 1.0, None), "null event time 'ts'"),
        # A null or NaN key takes the far-future record's path: it has a time, so windows,
        # and one of core/batch/invalid_records.py's checks (all of them give it one row).
        ((2, 10, 1.0, dt.datetime(2030, 1, 1, tzinfo=UTC)), "ahead of the batch"),
    ],
    ids=["null-time", "far-future"],
)
def test_an_invalid_record_in_sliding_windows_is_routed_once_not_once_per_window(
    ready, mode, bad, reason
):
    put(ready, "transactions", [(1, 10, 1.0, T0), bad], TXT)
    with refused(dsi.errors.MainInputDataError, "'transactions'", reason, fix="invalid="):
        ready.run(windowed(ready, mode, SLIDING), Clock(NOW))
    fixed = windowed(
        ready,
        mode,
        SLIDING,
        routes=dsi.Routes(invalid=INVALID),
    )
    ready.run(fixed, Clock(NOW))
    placed(ready, fixed, {1: 2, 2: 1})  # a valid record is released once per window
    ((why,),) = ready.rows("invalid", "reason")
    assert reason in why


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("when", "tolerance"),
    [
        (dt.datetime(1, 1, 1, 0, 30, tzinfo=UTC), dt.timedelta(days=1)),
        (dt.datetime(9999, 12, 31, 23, 30, tzinfo=UTC), None),
    ],
    ids=["year-1", "year-9999"],
)
def test_an_event_time_whose_window_does_not_fit_in_timestamps_is_invalid(
    ready, mode, when, tolerance
):
    """Before: ValueError / OverflowError from the driver's window arithmetic."""
    put(ready, "transactions", [(1, 10, 1.0, T0), (2, 10, 1.0, when)], TXT)
    build = lambda **kw: windowed(ready, mode, future_tolerance=tolerance, **kw)  # noqa: E731
    with refused(dsi.errors.MainInputDataError, "event time 'ts' outside", fix="invalid="):
        ready.run(build(), Clock(NOW))
    fixed = build(routes=dsi.Routes(invalid=INVALID))
    batch = ready.run(fixed, Clock(NOW)).batches[0]
    accounted(ready, fixed, [1, 2])
    assert ready.rows("invalid", "tx_id") == [(2,)]
    assert batch.max_event_time == T0  # the invalid time moved nothing


def _window_start(main, sides):
    return main.select("tx_id", F.date_format("window.start", "yyyy-MM-dd HH:mm").alias("name"))


def _row_window_start(record, ctx):
    yield {"tx_id": record.tx_id, "name": record.window.start.strftime("%Y-%m-%d %H:%M")}


@pytest.mark.parametrize("mode", MODES)
def test_event_times_before_1970_fall_in_their_windows(ready, mode):
    before = dt.datetime(1969, 12, 31, 23, 59, tzinfo=UTC)
    put(ready, "transactions", [(1, 10, 1.0, before), (2, 10, 1.0, T0)], TXT)
    fn = _window_start if mode == "frames" else _row_window_start
    op = windowed(ready, mode, fn=fn)
    ready.run(op, Clock(NOW))
    accounted(ready, op, [1, 2])
    assert ready.rows("enriched") == [(1, "1969-12-31 23:00"), (2, "2024-05-01 00:00")]


@pytest.mark.parametrize("mode", MODES)
def test_a_date_typed_event_time_works_and_a_null_date_is_invalid(ready, mode):
    """Before: an AttributeError in the record stage, after every table had committed
    (each rerun replayed the batch and failed the same way)."""
    put(
        ready,
        "transactions",
        [(1, 10, dt.date(2024, 5, 1)), (2, 10, None)],
        "tx_id long, customer_id long, d date",
    )
    main = dsi.MainInput("transactions", key="customer_id", event_time="d")
    day = dsi.Window.tumbling(dt.timedelta(days=1))
    with refused(dsi.errors.MainInputDataError, "null event time 'd'", fix="invalid="):
        ready.run(operator(ready, mode, main=main, window=day), Clock(T0 + hours(30)))
    fixed = operator(
        ready,
        mode,
        main=main,
        window=day,
        routes=dsi.Routes(invalid=INVALID),
    )
    batch = ready.run(fixed, Clock(T0 + hours(30))).batches[0]
    accounted(ready, fixed, [1, 2])
    assert batch.max_event_time == T0
    assert ready.run(fixed, Clock(T0 + hours(30))).batches == []  # committed, nothing replayed


# --- landed files: a line corrupt in a column one job does not read -------------------------


def landing(lake: Lake, mode: str, folder: Path, fmt: str, **kwargs: Any):
    main = dsi.MainInput.files(str(folder), format=fmt, schema=TX, key="customer_id")
    return operator(lake, mode, main=main, **kwargs)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("fmt", "lines"),
    [
        (
            "json",
            [
                '{"tx_id": 1, "customer_id": 10, "amount": 1}',
                '{"tx_id": 2, "customer_id": 10, "amount": "abc"}',
            ],
        ),
        ("csv", ["1,10,1.0", "2,10,abc"]),
        ("csv", ["1,10,1.0", "2,10"]),
    ],
    ids=["json-mistyped", "csv-mistyped", "csv-short"],
)
def test_a_landed_line_corrupt_in_a_column_the_routing_does_not_read_is_invalid(
    ready, tmp_path, mode, fmt, lines
):
    """The routes were counted by a job parsing only the key, the outputs written by jobs
    parsing every column: the line was released to no output and routed to none."""
    folder = tmp_path / "landed"
    folder.mkdir()
    (folder / f"a.{fmt}").write_text("\n".join(lines) + "\n")
    with refused(dsi.errors.MainInputDataError, "'landed'", "corrupt record", fix="invalid="):
        ready.run(landing(ready, mode, folder, fmt))
    fixed = landing(
        ready,
        mode,
        folder,
        fmt,
        routes=dsi.Routes(invalid=INVALID),
    )
    ready.run(fixed)
    accounted(ready, fixed, [1, 2])
    assert ready.rows("enriched", "tx_id") == [(1,)]


# --- keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_nan_key_is_invalid_in_both_modes(lake, mode):
    put(lake, "profiles", [(10.0, "ann"), (float("nan"), "nan")], "customer_id double, name string")
    put(lake, "transactions", [(1, 10.0), (2, float("nan"))], "tx_id long, customer_id double")
    with refused(dsi.errors.MainInputDataError, "NaN key 'customer_id'", fix="invalid="):
        lake.run(operator(lake, mode))
    fixed = operator(
        lake,
        mode,
        routes=dsi.Routes(invalid=INVALID),
    )
    lake.run(fixed)
    accounted(lake, fixed, [1, 2])
    assert lake.rows("enriched") == [(1, "ann")]  # NaN matched no side row, not even NaN


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("main_ddl", "side_ddl", "keys"),
    [
        ("tx_id long, customer_id double", "customer_id long, name string", [10.0, 10.5]),
        ("tx_id long, customer_id long", "customer_id int, name string", [10, 2**40]),
    ],
    ids=["fractional-to-integral", "overflowing-to-int"],
)
def test_a_key_that_does_not_survive_the_cast_to_the_side_key_type_matches_nothing(
    lake, mode, main_ddl, side_ddl, keys
):
    """Before: 10.5 matched the side row of 10; 2**40 failed the batch with a CAST_OVERFLOW."""
    put(lake, "profiles", [(10, "ann")], side_ddl)
    put(lake, "transactions", [(1, keys[0]), (2, keys[1])], main_ddl)
    profile = dsi.SideInput.map("profiles", key="customer_id", missing="unmatched")
    with pytest.raises(dsi.DeclarationError, match=r"(?s)'profile'.*unmatched="):
        operator(lake, mode, side_inputs={"profile": profile})
    op = operator(
        lake,
        mode,
        side_inputs={"profile": profile},
        routes=dsi.Routes(unmatched=UNMATCHED),
    )
    lake.run(op)
    accounted(lake, op, [1, 2])
    assert lake.rows("enriched") == [(1, "ann")]
    assert lake.rows("unmatched", "tx_id") == [(2,)]


@pytest.mark.parametrize("mode", MODES)
def test_a_key_translator_returning_null_waits_then_times_out_to_unmatched(ready, mode):
    put(ready, "transactions", [(1, 10, 1.0), (2, 11, 1.0)], TX)
    profile = dsi.SideInput.map(
        "profiles",
        key="customer_id",
        key_translator=lambda main: F.when(main.customer_id == 10, main.customer_id),
        missing=dsi.Wait(hours(1)),
    )
    op = operator(
        ready,
        mode,
        side_inputs={"profile": profile},
        routes=dsi.Routes(unmatched=UNMATCHED),
    )
    clock = Clock(T0)
    ready.run(op, clock)
    accounted(ready, op, [1, 2])
    assert op.buffer().rows() == 1
    clock.advance(hours(2))
    ready.run(op, clock)
    accounted(ready, op, [1, 2])
    assert ready.rows("unmatched", "tx_id") == [(2,)]


@pytest.mark.parametrize("mode", MODES)
def test_a_null_key_in_a_pre_keyed_input_is_invalid(ready, mode):
    frame = ready.spark.createDataFrame([(1, 10), (2, None)], "tx_id long, customer_id long")
    frame = frame.withColumn("kg", key_group("customer_id", 4))
    dsi.tables.write_dataframe(frame, ready.storage.table_uri("transactions"), partition_by=["kg"])
    main = dsi.MainInput("transactions", key="customer_id", pre_keyed=dsi.KeyGroups(4, "kg"))
    keyed = {"profile": dsi.SideInput.map("profiles", key="customer_id", distribution="keyed")}
    with refused(dsi.errors.MainInputDataError, "null key 'customer_id'", fix="invalid="):
        ready.run(operator(ready, mode, main=main, side_inputs=keyed))
    fixed = operator(
        ready,
        mode,
        main=main,
        side_inputs=keyed,
        routes=dsi.Routes(invalid=INVALID),
    )
    ready.run(fixed)
    accounted(ready, fixed, [1, 2])


# --- windowed side inputs and the overflow ranking ---------------------------------------------


def test_a_null_event_time_does_not_wait_for_a_side_window(lake):
    """A record without a window waits for no side window: it is invalid at once."""
    put(lake, "rates", [(T0, 1.5)], "rate_time timestamp, rate double")
    put(lake, "transactions", [(1, 10, 1.0, T0), (2, 10, 1.0, None)], TXT)
    rates = dsi.SideInput.singleton(
        "rates", window=dsi.Window.tumbling(hours(1), time_column="rate_time")
    )
    main = dsi.MainInput("transactions", key="customer_id", event_time="ts")
    with refused(dsi.errors.MainInputDataError, "null event time 'ts'", fix="invalid="):
        lake.run(operator(lake, main=main, side_inputs={"rate": rates}), Clock(NOW))
    fixed = operator(
        lake,
        main=main,
        side_inputs={"rate": rates},
        routes=dsi.Routes(invalid=INVALID),
    )
    lake.run(fixed, Clock(NOW))
    accounted(lake, fixed, [1, 2])  # 1 waits for its side window, 2 is invalid
    assert fixed.buffer().rows() == 1


def test_identical_records_overflow_each_exactly_once(lake):
    """The overflow ranking orders by (first seen, batch, fingerprint): identical records
    tie, and each must still land exactly once (one overflows, one waits)."""
    put(lake, "transactions", [(5, 10, 1.0), (5, 10, 1.0), (6, 11, 1.0)], TX)
    limits = dsi.BufferLimits(max_rows=2, on_exceed="overflow")
    op = operator(
        lake,
        buffer=limits,
        routes=dsi.Routes(overflow=OVERFLOW),
    )  # no profiles: all wait
    clock = Clock(T0)
    lake.run(op, clock)
    placed(lake, op, {5: 2, 6: 1})
    put(lake, "transactions", [(7, 10, 1.0)], TX)
    lake.run(op, clock)
    placed(lake, op, {5: 2, 6: 1, 7: 1})
    assert op.buffer().rows() == 2
    assert len(lake.rows("overflow")) == 2


def test_sliding_window_records_routed_again_after_a_declaration_change_keep_their_rows(lake):
    """A declaration change re-routes the buffer. A sliding-window record waits once per
    window; assigning windows to each of those rows again gave it every window once per
    row: twice as many rows after each change. (Routing again is the read stage's; the
    records released at the end meet the function as any others do.)"""
    put(lake, "transactions", [(1, 10, 1.0, T0), (2, 10, 1.0, T0), (2, 10, 1.0, T0)], TXT)
    rates = dsi.SideInput.singleton(
        "rates", window=dsi.Window.tumbling(hours(1), time_column="rate_time")
    )
    main = dsi.MainInput("transactions", key="customer_id", event_time="ts")
    build = lambda **kw: operator(  # noqa: E731
        lake, main=main, side_inputs={"rate": rates}, window=SLIDING, fn=_window_start, **kw
    )
    lake.run(build(), Clock(NOW))
    placed(lake, build(), {1: 2, 2: 4})  # two windows each; 2 is there twice
    changed = build(routes=dsi.Routes(invalid=INVALID))
    assert "routed again" in lake.run(changed, Clock(NOW)).batches[0].notes[0]
    placed(lake, changed, {1: 2, 2: 4})
    put(
        lake,
        "rates",
        # the side windows holding each window's last instant, and a later row that closes them
        [(T0, 1.0), (T0 + hours(1), 1.0), (T0 + hours(2), 1.0)],
        "rate_time timestamp, rate double",
    )
    lake.run(changed, Clock(NOW))
    placed(lake, changed, {1: 2, 2: 4})
    assert changed.buffer().rows() == 0
    # Each row was released in its own window (the two holding T0), once per record.
    early, late = "2024-04-30 23:00", "2024-05-01 00:00"
    twice = [(2, early), (2, early), (2, late), (2, late)]
    assert lake.rows("enriched") == [(1, early), (1, late), *twice]

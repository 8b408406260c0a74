"""Bad-input catalogue, class 7: limits hold at their edges.

Zero (``max_rows=0``, ``max_age=0``), one (``max_versions_per_batch=1``,
``max_files_per_batch=1`` over empty slices), huge values (``timedelta.max``), and the
overflow of sliding windows: each either works as documented, without looping or
getting stuck, or is refused where it is declared, naming the fix. In frames mode alone:
limits act in the planner and the router, before the function (the one part that
differs by mode, core/batch/compute.py) runs on released records, if any.
"""

import datetime as dt
import os
from typing import Any

import dagster_sideinputs as dsi
from dagster_sideinputs.core.sideinputs.windows import MAX_WINDOW
from tests.core.catalogue import (
    OVERFLOW,
    PROFILES,
    T0,
    TX,
    TXT,
    UNMATCHED,
    accounted,
    hours,
    nothing_committed,
    operator,
    placed,
    put,
    refused,
)
from tests.core.conftest import Clock, Lake

"""The tests run under the engine users get (delta-spark); ``both_engines`` ones, whose
point is a difference between the engines, and all under ``DSI_BOTH_ENGINES=1``, run under
both (tests/core/conftest.py)."""


def waiting(lake: Lake, limits: dsi.BufferLimits, **kwargs: Any) -> dsi.SideInputOperator:
    """Records wait: the profiles side table does not exist yet."""
    if limits.on_exceed == "overflow":
        kwargs["routes"] = dsi.Routes(overflow=OVERFLOW)
    return operator(lake, buffer=limits, **kwargs)


def test_max_rows_zero_overflows_every_waiting_record_once_and_stops(lake):
    """Before: it overflowed nothing, and every rerun did the same."""
    put(lake, "transactions", [(1, 10, 1.0), (2, 11, 1.0)], TX)
    failing = waiting(lake, dsi.BufferLimits(max_rows=0))
    with (
        refused(
            dsi.errors.BufferLimitExceededError, "2 rows (limit 0)", fix="on_exceed='overflow'"
        ),
        nothing_committed(lake, failing),
    ):
        lake.run(failing)
    op = waiting(lake, dsi.BufferLimits(max_rows=0, on_exceed="overflow"))
    assert len(lake.run(op, max_batches=5).batches) == 1
    accounted(lake, op, [1, 2])
    assert op.buffer().rows() == 0
    put(lake, "transactions", [(3, 10, 1.0)], TX)
    lake.run(op)
    accounted(lake, op, [1, 2, 3])
    assert lake.rows("overflow", "tx_id") == [(1,), (2,), (3,)]


def test_max_age_zero_lets_a_record_wait_within_its_batch_only(lake):
    clock = Clock(T0)
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    failing = waiting(lake, dsi.BufferLimits(max_age=dt.timedelta(0)))
    lake.run(failing, clock)  # first seen now: not older than zero yet
    assert failing.buffer().rows() == 1
    clock.advance(dt.timedelta(seconds=1))
    put(lake, "transactions", [(2, 10, 1.0)], TX)
    with (
        refused(dsi.errors.BufferLimitExceededError, "max age 0s", fix="on_exceed='overflow'"),
        nothing_committed(lake, failing),
    ):
        lake.run(failing, clock)
    op = waiting(lake, dsi.BufferLimits(max_age=dt.timedelta(0), on_exceed="overflow"))
    lake.run(op, clock)
    accounted(lake, op, [1, 2])
    assert lake.rows("overflow", "tx_id") == [(1,)]  # 2 was first seen now: it waits
    clock.advance(dt.timedelta(seconds=1))
    lake.run(op, clock)
    accounted(lake, op, [1, 2])
    assert op.buffer().rows() == 0


def test_sliding_windows_overflow_instead_of_getting_stuck(lake):
    """A record waits once per sliding window: the planner's estimate of the rows coming
    in counted records, read too few slots, and the batch stopped with 'overflow' declared,
    on every rerun."""
    rates = dsi.SideInput.singleton(
        "rates", window=dsi.Window.tumbling(hours(1), time_column="rate_time")
    )
    kwargs: dict[str, Any] = {
        "main": dsi.MainInput("transactions", key="customer_id", event_time="ts"),
        "side_inputs": {"rate": rates},
        "window": dsi.Window.sliding(hours(2), slide=hours(1)),
    }
    limits = dsi.BufferLimits(max_rows=10, on_exceed="overflow")
    op = waiting(lake, limits, **kwargs)
    clock = Clock(T0 + hours(3))
    put(lake, "transactions", [(i, 10, 1.0, T0) for i in range(3)], TXT)
    lake.run(op, clock)
    assert op.buffer().rows() == 6
    put(lake, "transactions", [(i, 10, 1.0, T0) for i in range(3, 6)], TXT)
    lake.run(op, clock)
    assert op.buffer().rows() == 10
    placed(lake, op, {i: 2 for i in range(6)})  # one row per window, overflowed or waiting
    overflowed = lake.rows("overflow", "tx_id")
    assert len(overflowed) == 2
    assert len(set(overflowed)) == 1  # both windows of one of the oldest records
    assert overflowed[0][0] in range(3)


def test_a_batch_limit_below_one_is_refused_and_one_reads_everything_in_one_run(lake):
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    put(lake, "transactions", [], TX)  # a version adding no rows
    put(lake, "transactions", [(2, 10, 1.0)], TX)
    for limit in (0, -1, 1.5):
        with refused(dsi.DeclarationError, "max_versions_per_batch", repr(limit), fix="None"):
            dsi.MainInput("transactions", key="customer_id", max_versions_per_batch=limit)
    op = operator(
        lake, main=dsi.MainInput("transactions", key="customer_id", max_versions_per_batch=1)
    )
    result = lake.run(op)
    assert [b.main_range for b in result.batches] == [
        "versions (-1, 0]",
        "versions (0, 1]",
        "versions (1, 2]",
    ]
    accounted(lake, op, [1, 2])


def test_one_file_per_batch_reads_past_an_empty_file_in_one_run(lake, tmp_path):
    """Before: the batch reading the empty file looked idle and ended the run."""
    put(lake, "profiles", [(10, "ann")], PROFILES)
    folder = tmp_path / "landed"
    folder.mkdir()
    for index, text in enumerate(
        ['{"tx_id": 1, "customer_id": 10}', "", '{"tx_id": 2, "customer_id": 10}']
    ):
        path = folder / f"{index}.json"
        path.write_text(text)
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))

    def landed(limit: int) -> dsi.MainInput:
        return dsi.MainInput.files(
            str(folder), schema=TX, key="customer_id", max_files_per_batch=limit
        )

    with refused(dsi.DeclarationError, "max_files_per_batch", "0", fix=">= 1"):
        landed(0)
    op = operator(lake, main=landed(1))
    assert len(lake.run(op).batches) == 3
    accounted(lake, op, [1, 2])


def test_huge_limits_timeouts_and_tolerances_mean_never(lake):
    """Before: OverflowError from ``now - max_age`` and friends."""
    forever = dt.timedelta.max
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0, T0), (2, 11, 1.0, T0)], TXT)
    op = operator(
        lake,
        main=dsi.MainInput("transactions", key="customer_id", event_time="ts"),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id", missing=dsi.Wait(forever))
        },
        window=dsi.Window.tumbling(hours(1), watermark=MAX_WINDOW),
        buffer=dsi.BufferLimits(max_rows=10**15, max_age=forever),
        future_tolerance=forever,
        routes=dsi.Routes(unmatched=UNMATCHED),
    )
    clock = Clock(T0 + hours(3))
    lake.run(op, clock)
    clock.advance(dt.timedelta(days=365 * 50))
    put(lake, "transactions", [(3, 11, 1.0, T0 + hours(1))], TXT)
    lake.run(op, clock)
    accounted(lake, op, [1, 2, 3])
    assert op.buffer().rows() == 2  # 2 and 3 wait for customer 11, forever


TOO_LONG = {
    "size": lambda: dsi.Window.tumbling(dt.timedelta(days=10**6)),
    "watermark": lambda: dsi.Window.tumbling(hours(1), watermark=dt.timedelta.max),
    "offset": lambda: dsi.Window.tumbling(hours(1), offset=dt.timedelta.max),
}


def test_windows_too_long_for_timestamps_are_refused_where_declared(lake):
    for what, build in TOO_LONG.items():
        with refused(dsi.DeclarationError, f"Window {what}", fix="shorter"):
            build()
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0, T0)], TXT)
    op = operator(
        lake,
        main=dsi.MainInput("transactions", key="customer_id", event_time="ts"),
        window=dsi.Window.tumbling(dt.timedelta(days=365 * 100)),
    )
    lake.run(op, Clock(T0))
    accounted(lake, op, [1])

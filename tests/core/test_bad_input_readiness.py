"""Bad-input catalogue, issue 37 classes 6 and 11: readiness never finalizes a side table
that never existed, and sliding side windows map as Beam maps them.

Class 6: whatever the rule (``present``, ``complete``, a window final by ``grace=``, an
as-of horizon final by ``grace=``, ``missing="wait"`` past its timeout, a readiness
provider that answers "ready"), records that need a side table that has never existed
wait in the buffer, the batch metrics saying which table and what ends the wait. Once
the table is written, they are released with its view, each exactly once.

Class 11: with sliding side windows, a main window reads the earliest-starting side
window holding its last instant (Beam's ``default_window_mapping_fn``): equal windows
map one to one, and no record reads side rows from after its own window.
"""

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from dagster_sideinputs.core.sideinputs.readiness import Decision, SideFacts
from dagster_sideinputs.core.sideinputs.windows import GLOBAL, namespace_id
from tests.core.catalogue import (
    MODES,
    PROFILES,
    T0,
    TXT,
    accounted,
    hours,
    placed,
    put,
)
from tests.core.conftest import Clock, Lake

EVENTS = "name string, ts timestamp"
SEEN = dsi.OutputTag(
    "seen",
    schema=T.StructType(
        [
            T.StructField("tx_id", T.LongType()),
            T.StructField("names", T.ArrayType(T.StringType())),
        ]
    ),
)


def names_frames(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    return main.select("tx_id", F.transform(F.col("events"), lambda e: e["name"]).alias("names"))


def names_rows(record: dsi.Record, ctx: Any) -> Any:
    yield {"tx_id": record["tx_id"], "names": [e["name"] for e in ctx.side_input("events")]}


def windowed(lake: Lake, mode: str, **options: Any) -> dsi.SideInputOperator:
    """Hourly main windows reading the ``events`` list of their own side window."""
    options.setdefault("window", dsi.Window.tumbling(hours(1), time_column="ts"))
    return lake.operator(
        main=dsi.MainInput("transactions", event_time="ts"),
        side_inputs={"events": dsi.SideInput.list("events", **options)},
        fn=names_frames if mode == "frames" else names_rows,
        mode=mode,
        main_output=SEEN,
        window=dsi.Window.tumbling(hours(1)),
    )


def reasons(batch: dsi.BatchMetrics, side: str) -> str:
    return " ".join(str(d["reason"]) for d in batch.readiness[side].values())


def seen(lake: Lake) -> dict[int, list[str]]:
    return {row[0]: sorted(row[1]) for row in lake.rows("seen")}


# --- class 6: a side table that never existed is never ready ---------------------------------


def test_grace_does_not_finalize_the_windows_of_a_side_table_that_never_existed(lake):
    """Before: past the grace, the windows counted as final and the records were released
    without the ``events`` column: the function failed ("`events` cannot be resolved")
    with a fix that did not apply. (Frames mode only: the planner decides before any
    function runs; the release that follows, a window with a row and one final by grace
    and empty, is test_windowed_views.py's in both modes.)"""
    put(lake, "transactions", [(1, 10, 1.0, T0), (2, 11, 1.0, T0 + hours(1))], TXT)
    op = windowed(lake, "frames", grace=hours(1))
    clock = Clock(T0 + hours(24))  # far past every window's grace
    batch = lake.run(op, clock).batches[0]
    assert batch.routes["buffered"] == 2
    why = reasons(batch, "events")
    assert "side table 'events' does not exist yet" in why
    assert "grace= counts only once it exists" in why
    assert "materialize the side input asset" in why
    assert lake.run(op, clock).batches == []  # nothing new: nothing to do, nothing lost
    put(lake, "events", [("a", T0 + dt.timedelta(minutes=5))], EVENTS)
    lake.run(op, clock)
    assert seen(lake) == {1: ["a"], 2: []}  # hour 1 is final by grace, and empty
    accounted(lake, op, [1, 2])


class AlwaysReady:
    """A readiness provider that answers "ready" for everything, as a careless one would."""

    def decide(
        self, facts: SideFacts, windows: Sequence[tuple[dt.datetime, dt.datetime]] | None, now: Any
    ) -> Mapping[str, Decision]:
        keys = [GLOBAL] if windows is None else [namespace_id(start) for start, _ in windows]
        return {key: Decision(True, "the provider says so") for key in keys}


PROFILE_NAME = dsi.OutputTag(
    "named",
    schema=T.StructType(
        [T.StructField("tx_id", T.LongType()), T.StructField("name", T.StringType())]
    ),
)


def name_frames(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    return main.select("tx_id", F.col("profile.name").alias("name"))


# readiness= is the rule of the default provider (DeltaReadiness): under another one, a map
# declaring readiness="complete" is decided as the plain map is.
SIDES = {
    "map": lambda: dsi.SideInput.map("profiles", key="customer_id"),
    "map_waits_past_its_timeout": lambda: dsi.SideInput.map(
        "profiles",
        key="customer_id",
        missing=dsi.Wait(dt.timedelta(minutes=1), then="null"),
    ),
    "as_of_past_its_grace": lambda: dsi.SideInput.map(
        "profiles", key="customer_id", as_of="since", grace=dt.timedelta(minutes=1)
    ),
}


@pytest.mark.parametrize("case", list(SIDES))
def test_a_provider_answering_ready_does_not_release_records_without_the_side_table(lake, case):
    """Before: the provider's "ready" released the records with no view at all (the
    function failed on the missing ``profile`` column), whatever grace, timeout or as-of
    rule the side input declared."""
    put(lake, "transactions", [(1, 10, 1.0, T0), (2, 11, 2.0, T0)], TXT)
    op = lake.operator(
        main=dsi.MainInput("transactions", key="customer_id", event_time="ts"),
        side_inputs={"profile": SIDES[case]()},
        fn=name_frames,
        main_output=PROFILE_NAME,
        readiness=AlwaysReady(),
    )
    clock = Clock(T0 + hours(24))
    batch = lake.run(op, clock).batches[0]
    assert batch.routes["buffered"] == 2
    why = reasons(batch, "profile")
    assert "side table 'profiles' does not exist yet" in why
    assert "the readiness provider said: the provider says so" in why
    put(lake, "profiles", [(10, "ann", T0), (11, "bob", T0)], PROFILES + ", since timestamp")
    lake.run(op, clock)
    assert sorted(lake.rows("named")) == [(1, "ann"), (2, "bob")]
    accounted(lake, op, [1, 2])


# The one bound on that wait is the buffer's own (documented): records overflow to the
# declared tag, not out with an empty view. test_bad_input_limits.py's cases are such records
# (their side table never exists; the planner overrides any provider's answer for them alike).


# --- class 11: sliding side windows map as Beam maps them -------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_equal_sliding_windows_read_their_own_side_window_not_the_next(lake, mode):
    """Before: the main window [01:00, 03:00) read the side window [02:00, 04:00), so a
    record of 01:30 saw an event of 03:30, after its window."""
    put(lake, "transactions", [(1, 10, 1.0, T0 + hours(1.5))], TXT)
    put(
        lake,
        "events",
        [("early", T0 + hours(0.5)), ("inside", T0 + hours(1.25)), ("after", T0 + hours(3.5))],
        EVENTS,
    )
    sliding = dsi.Window.sliding(hours(2), slide=hours(1))
    op = lake.operator(
        main=dsi.MainInput("transactions", event_time="ts"),
        side_inputs={
            "events": dsi.SideInput.list(
                "events", window=sliding.with_time_column("ts"), grace=dt.timedelta(0)
            )
        },
        fn=names_frames if mode == "frames" else names_rows,
        mode=mode,
        main_output=SEEN,
        window=sliding,
    )
    lake.run(op, Clock(T0 + hours(24)))
    # Record 1 is in main windows [00:00, 02:00) and [01:00, 03:00): one row each.
    assert sorted(lake.rows("seen")) == [(1, ["early", "inside"]), (1, ["inside"])]
    placed(lake, op, {1: 2})

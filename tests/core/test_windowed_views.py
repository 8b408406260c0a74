"""Windowed side inputs, complete: each record sees the view of its own side window (the
operator's window mapping), side windows become final without Dagster (the side input's
watermark, a grace period by the batch clock), an empty final window gives the view's
empty value (or the unmatched tag), and singletons keep their one-row contract.

Rows mode has code of its own for windowed lists and maps (it looks a record's side
window up in tables the driver builds per side version and set of windows) and for a
global singleton (shipped with the function): those cases run in frames and rows modes
(a custom mapping's frames run is test_semantics.py's), the grace case's batches in rows
mode reading two windows of one side version. Finality, routing and the singletons'
checks are decided before the function runs, the same in both modes, and run in frames
mode. test_beam_equivalence.py compares every view with Beam's in both modes (smaller
and larger main windows, an empty side window)."""

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from dagster_sideinputs.core.batch import compute
from tests.core.accounting import assert_accounted
from tests.core.conftest import T0, Clock, hours

MODES = ["frames", "rows"]
TX = "tx_id long, ts timestamp"
EVENTS = "name string, ts timestamp"
HOUR = dsi.Window.tumbling(hours(1), time_column="ts")


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def minutes(n: float) -> dt.timedelta:
    return dt.timedelta(minutes=n)


def schema(**fields: T.DataType) -> T.StructType:
    return T.StructType([T.StructField(name, kind) for name, kind in fields.items()])


NAMES = dsi.OutputTag("seen", schema=schema(tx_id=T.LongType(), names=T.ArrayType(T.StringType())))


def names_frames(main, sides):
    return main.select("tx_id", F.transform(F.col("events"), lambda e: e["name"]).alias("names"))


def names_rows(record, ctx):
    yield {"tx_id": record.tx_id, "names": [e.name for e in ctx.side_input("events")]}


def operator(
    lake,
    mode: str,
    side_inputs: dict[str, dsi.SideInput],
    *,
    frames_fn: Callable[..., Any] = names_frames,
    rows_fn: Callable[..., Any] = names_rows,
    output: dsi.OutputTag = NAMES,
    **options: Any,
) -> dsi.SideInputOperator:
    options.setdefault("window", dsi.Window.tumbling(hours(1)))
    return lake.operator(
        main=dsi.MainInput("transactions", event_time="ts"),
        side_inputs=side_inputs,
        fn=frames_fn if mode == "frames" else rows_fn,
        mode=mode,
        main_output=output,
        **options,
    )


def events(**options: Any) -> dict[str, dsi.SideInput]:
    options.setdefault("window", HOUR)
    return {"events": dsi.SideInput.list("events", **options)}


def seen(lake) -> dict[int, Any]:
    return {row[0]: row[1] for row in lake.rows("seen")}


# --- per-window views ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_windowed_list_gives_each_record_the_rows_of_its_own_side_window(lake, mode):
    lake.append("transactions", [(1, at(10)), (2, at(70)), (3, at(75))], TX)
    lake.append(
        "events", [("b", at(30)), ("a", at(5)), ("c", at(65)), ("z", at(130))], EVENTS
    )  # the row at 130 makes hours 0 and 1 final
    lake.run(operator(lake, mode, events()))
    assert seen(lake) == {1: ["a", "b"], 2: ["c"], 3: ["c"]}


def test_windowed_list_follows_a_custom_window_mapping_in_rows_mode(lake):
    """Rows mode looks each record's mapped side window up (frames mode joins on it, as
    test_semantics.py's custom mapping shows)."""
    previous_hour = lambda start, end: (start - hours(1), end - hours(1))  # noqa: E731
    lake.append("transactions", [(1, at(70)), (2, at(130))], TX)
    lake.append("events", [("a", at(5)), ("c", at(65)), ("z", at(190))], EVENTS)
    lake.run(operator(lake, "rows", events(window_mapping=previous_hour)))
    assert seen(lake) == {1: ["a"], 2: ["c"]}


CARDS = "owner string, card string, ts timestamp"
OWNERS = dsi.OutputTag(
    "seen",
    schema=schema(tx_id=T.LongType(), owners=T.ArrayType(T.StringType()), ann=T.StringType()),
)


def owners_functions(multimap: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(frames fn, rows fn) giving each record's owners and ann's card(s) of its window."""

    def frames(main, sides):
        ann = F.col("cards")["ann"]
        first = F.array_join(F.transform(ann, lambda c: c["card"]), "+") if multimap else ann.card
        owners = F.array_sort(F.map_keys(F.col("cards")))
        return main.select("tx_id", owners.alias("owners"), first.alias("ann"))

    def rows(record, ctx):
        cards = ctx.side_input("cards")
        ann = cards.get("ann")
        if ann is None:
            yield {"tx_id": record.tx_id, "owners": sorted(cards), "ann": None}
            return
        first = "+".join(c.card for c in ann) if multimap else ann.card
        yield {"tx_id": record.tx_id, "owners": sorted(cards), "ann": first}

    return frames, rows


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("view", ["map", "multimap"])
def test_windowed_map_without_a_key_relation_gives_the_whole_map_of_the_window(lake, mode, view):
    lake.append("transactions", [(1, at(10)), (2, at(70))], TX)
    rows = [("ann", "v1", at(1)), ("bob", "m1", at(2)), ("ann", "v0", at(3)), ("cy", "x", at(61))]
    if view == "map":
        rows = [r for r in rows if r[1] != "v0"]
    lake.append("cards", [*rows, ("z", "-", at(125))], CARDS)
    factory = dsi.SideInput.map if view == "map" else dsi.SideInput.multimap
    frames_fn, rows_fn = owners_functions(view == "multimap")
    op = operator(
        lake,
        mode,
        {"cards": factory("cards", key="owner", window=HOUR)},
        frames_fn=frames_fn,
        rows_fn=rows_fn,
        output=OWNERS,
    )
    lake.run(op)
    ann = "v0+v1" if view == "multimap" else "v1"
    assert lake.rows("seen") == [(1, ["ann", "bob"], ann), (2, ["cy"], None)]


def test_a_windowed_maps_view_refuses_duplicate_keys_inside_spark_when_the_check_is_bypassed(
    lake, monkeypatch
):
    """The second line of a view aggregated per key (a windowed map's whole map, a map
    whose side data is checked while the batch is staged): it raises inside Spark on a
    key with two rows, so a batch whose check before staging did not run (a bug there)
    still writes nothing and names the side input, never keeps one of the rows at random."""
    monkeypatch.setattr(compute, "check_one_row_per_key", lambda *args, **kwargs: None)
    lake.append("transactions", [(1, at(10))], TX)
    rows = [("ann", "v1", at(1)), ("ann", "v0", at(3)), ("z", "-", at(125))]
    lake.append("cards", rows, CARDS)
    frames_fn, _ = owners_functions(False)
    op = operator(
        lake,
        "frames",
        {"cards": dsi.SideInput.map("cards", key="owner", window=HOUR)},
        frames_fn=frames_fn,
        output=OWNERS,
    )
    with pytest.raises(dsi.errors.DuplicateKeyError, match="cards"):
        lake.run(op)
    assert not lake.exists("seen")


# --- finality without Dagster -------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_newest_side_window_becomes_final_after_its_grace_by_the_batch_clock(lake, mode):
    lake.append("transactions", [(1, at(10)), (2, at(70))], TX)
    lake.append("events", [("a", at(5))], EVENTS)  # nothing later: no window is final yet
    op = operator(lake, mode, events(grace=hours(1)))
    clock = Clock(at(100))
    first = lake.run(op, clock).batches[0]
    assert first.routes["buffered"] == 2
    assert "final by grace at 2024-05-01T02:00:00+00:00" in str(first.readiness["events"])

    clock.now = at(125)  # hour 0 ended at 60, + 1 h grace = 120: final; hour 1 waits
    lake.run(op, clock)
    assert seen(lake) == {1: ["a"]}

    clock.now = at(185)  # hour 1 is final and empty: released with the empty list
    batch = lake.run(op, clock).batches[0]
    assert seen(lake) == {1: ["a"], 2: []}
    assert batch.released_from_buffer == 1
    plan = op.state.plan(batch.batch_id)
    assert "final by grace" in plan.decisions["events"]["2024-05-01T01:00:00Z"].reason
    assert_accounted(lake.spark, op, [1, 2])


def test_side_watermark_keeps_a_window_open_for_late_side_rows(lake):
    late_window = dsi.Window.tumbling(hours(1), time_column="ts", watermark=minutes(10))
    lake.append("transactions", [(1, at(10))], TX)
    lake.append("events", [("a", at(5)), ("c", at(65))], EVENTS)
    op = operator(lake, "frames", events(window=late_window))
    assert lake.run(op).batches[0].routes["buffered"] == 1  # watermark 55 < window end 60

    lake.append("events", [("b", at(58)), ("d", at(71))], EVENTS)  # a late row, then 71
    lake.run(op)  # watermark 61: hour 0 is final, with its late row
    assert seen(lake) == {1: ["a", "b"]}


def test_present_window_that_stays_empty_is_released_once_the_side_watermark_passes(lake):
    lake.append("transactions", [(1, at(10)), (2, at(70))], TX)
    lake.append("events", [("a", at(5))], EVENTS)
    op = operator(lake, "frames", events(readiness="present"))
    first = lake.run(op).batches[0]
    assert first.routes["buffered"] == 1  # hour 0 has a row; hour 1 has none yet
    lake.append("events", [("z", at(125))], EVENTS)
    batch = lake.run(op).batches[0]
    assert seen(lake) == {1: ["a"], 2: []}
    reason = batch.readiness["events"]["2024-05-01T01:00:00Z"]["reason"]
    assert "final" in reason
    assert "(empty)" in reason


def test_empty_final_side_window_can_send_its_records_to_unmatched(lake):
    unmatched = dsi.OutputTag("unmatched_tx")
    lake.append("transactions", [(1, at(10)), (2, at(70))], TX)
    lake.append("events", [("a", at(5)), ("z", at(125))], EVENTS)
    op = operator(
        lake,
        "frames",
        events(on_empty="unmatched"),
        routes=dsi.Routes(unmatched=unmatched),
    )
    batch = lake.run(op).batches[0]
    assert seen(lake) == {1: ["a"]}
    assert lake.rows("unmatched_tx", "tx_id", "reason") == [
        (2, "the side namespace holds no rows in: events")
    ]
    assert batch.routes["unmatched"] == 1
    assert_accounted(lake.spark, op, [1, 2])


def test_empty_side_window_routing_to_unmatched_needs_an_unmatched_tag(lake):
    with pytest.raises(dsi.DeclarationError, match="on_empty='unmatched'"):
        operator(lake, "frames", events(on_empty="unmatched"))


def test_a_window_waiting_without_grace_says_only_side_data_ends_the_wait(lake):
    lake.append("transactions", [(1, at(10))], TX)
    lake.append("events", [("a", at(5))], EVENTS)
    batch = lake.run(operator(lake, "frames", events()), Clock(at(10_000))).batches[0]
    assert batch.routes["buffered"] == 1
    reason = batch.readiness["events"]["2024-05-01T00:00:00Z"]["reason"]
    assert reason.endswith("no grace= declared: waits for the side data")


def test_grace_needs_a_window_or_as_of():
    with pytest.raises(dsi.DeclarationError, match="neither window= nor as_of="):
        dsi.SideInput.list("events", grace=hours(1))


# --- singletons ---------------------------------------------------------------------------------

LIMITS = "limit double, ts timestamp"
LIMIT = dsi.OutputTag("seen", schema=schema(tx_id=T.LongType(), limit=T.DoubleType()))


def limit_frames(main, sides):
    return main.select("tx_id", F.col("limits.limit").alias("limit"))


def limits_operator(lake, **options: Any) -> dsi.SideInputOperator:
    """A windowed singleton, joined to each record (in rows mode too: the same join)."""
    return operator(
        lake,
        "frames",
        {"limits": dsi.SideInput.singleton("limits", window=HOUR, **options)},
        frames_fn=limit_frames,
        output=LIMIT,
    )


def test_empty_singleton_side_window_gives_the_default(lake):
    lake.append("transactions", [(1, at(10)), (2, at(70))], TX)
    lake.append("limits", [(5.0, at(5)), (7.0, at(125))], LIMITS)  # hour 1: final, empty
    lake.run(limits_operator(lake, default={"limit": 0.0}))
    assert seen(lake) == {1: 5.0, 2: 0.0}


def test_empty_singleton_side_window_without_default_is_an_error(lake):
    lake.append("transactions", [(1, at(10)), (2, at(70))], TX)
    lake.append("limits", [(5.0, at(5)), (7.0, at(125))], LIMITS)
    op = limits_operator(lake)
    with pytest.raises(
        dsi.errors.EmptySingletonError,
        match=r"'limits'.*namespace\(s\) \['2024-05-01T01:00:00Z'\].*declares no default",
    ):
        lake.run(op)
    assert not lake.exists("seen")
    assert op.buffer().rows() == 0  # nothing was written, not even the buffer


def passthrough_frames(main, sides):
    return main.select("tx_id")


def passthrough_rows(record, ctx):
    yield {"tx_id": record.tx_id}


IDS = dsi.OutputTag("seen", schema=schema(tx_id=T.LongType()))


@pytest.mark.parametrize(
    ("mode", "windowed"),
    [("frames", False), ("rows", False), ("frames", True)],
    ids=["global-frames", "global-rows", "windowed"],
)
def test_singleton_with_two_rows_is_reported_even_when_the_function_does_not_read_it(
    lake, mode, windowed
):
    """Frames mode checks the cardinality before anything is staged; rows mode ships a
    global singleton with the function, reading it first. A windowed singleton is joined
    in either mode, and checked by the same code."""
    lake.append("transactions", [(1, at(10))], TX)
    lake.append("limits", [(5.0, at(5)), (6.0, at(6)), (7.0, at(125))], LIMITS)
    side = (
        dsi.SideInput.singleton("limits", window=HOUR)
        if windowed
        else dsi.SideInput.singleton("limits")
    )
    op = operator(
        lake,
        mode,
        {"limits": side},
        frames_fn=passthrough_frames,
        rows_fn=passthrough_rows,
        output=IDS,
    )
    where = "2024-05-01T00:00:00Z" if windowed else "global"
    with pytest.raises(dsi.errors.SingletonCardinalityError, match=f"more than one row.*{where}"):
        lake.run(op)
    assert not lake.exists("seen")

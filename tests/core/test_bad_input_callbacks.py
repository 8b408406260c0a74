"""Bad-input catalogue, issue 37 class 2 (and 9, names in row mode): user callbacks.

Every callable a user hands the operator (the function, ``window_mapping``,
``key_translator``, a readiness provider, ``clock``, ``on_batch``) is wrapped: what it
raises becomes a ``DeclarationError`` / ``FunctionError`` naming it by qualified name
(and what it was given), and what it returns is checked before use. Row-mode errors name
the operator, the function and the output; emitting to a route tag of the operator says
it is that route. Each case: the error (class, names, fix), nothing committed, then the
fix and the accounting (every main id exactly once).
"""

from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from tests.core.catalogue import (
    PROFILES,
    T0,
    TXT,
    accounted,
    hours,
    nothing_committed,
    operator,
    put,
    refused,
)
from tests.core.conftest import Clock, Lake

NOW = T0 + hours(3)
HOUR = dsi.Window.tumbling(hours(1))
EVENTS = "name string, ts timestamp"
MINUTE = hours(1 / 60)


# --- window_mapping ----------------------------------------------------------------------------


def _names(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    """Each record's id and the names of its side window's events, joined by '+'."""
    names = F.array_join(F.transform(F.col("events"), lambda e: e["name"]), "+")
    return main.select("tx_id", names.alias("name"))


def _windowed(lake: Lake, mapping: Any) -> dsi.SideInputOperator:
    side = dsi.SideInput.list(
        "events", window=dsi.Window.tumbling(hours(1), time_column="ts"), window_mapping=mapping
    )
    return operator(
        lake,
        main=dsi.MainInput("transactions", key="customer_id", event_time="ts"),
        side_inputs={"events": side},
        fn=_names,
        window=HOUR,
    )


@pytest.fixture
def events(lake: Lake) -> Lake:
    """One record at 00:10 and 01:20; events in hours 0 and 1, and one at 02:10 that
    makes both hours final."""
    put(lake, "transactions", [(1, 10, 1.0, T0 + 10 * MINUTE), (2, 10, 1.0, T0 + 80 * MINUTE)], TXT)
    put(
        lake,
        "events",
        [("a", T0 + 5 * MINUTE), ("b", T0 + 65 * MINUTE), ("z", T0 + 130 * MINUTE)],
        EVENTS,
    )
    return lake


def returns_none(start, end):
    return None


def raises_key_error(start, end):
    return {}["calendar"]


def reversed_span(start, end):
    return end, start


def half_hour_late(start, end):
    """Off the side grid: [00:30, 01:30) holds no side window's rows."""
    return start + 30 * MINUTE, end + 30 * MINUTE


def two_hours_long(start, end):
    """Starts on the side grid but spans two hourly windows: no side window either."""
    return start, end + 60 * MINUTE


def strings(start, end):
    return start.isoformat(), end.isoformat()


@pytest.mark.parametrize(
    ("mapping", "what"),
    [
        (returns_none, "returned None (NoneType), not a (start, end) pair"),
        (raises_key_error, "raised KeyError: 'calendar'"),
        (reversed_span, "empty or reversed"),
        (half_hour_late, "not one of the side input's windows"),
        (two_hours_long, "not one of the side input's windows"),
        (strings, "start and end must be datetimes"),
    ],
    ids=["none", "raises", "reversed", "off-grid", "too-long", "not-datetimes"],
)
def test_a_window_mapping_that_fails_or_returns_no_side_window_is_refused(events, mapping, what):
    """Before: a raw TypeError / the user's KeyError; a reversed or off-grid span was
    accepted and the records released with an empty view although hours 0 and 1 have
    events."""
    bad = _windowed(events, mapping)
    with (
        refused(
            dsi.DeclarationError,
            f"window_mapping {__name__}.{mapping.__qualname__}",
            "side input 'events'",
            "given the main window [2024-05-01T00:00:00Z, 2024-05-01T01:00:00Z)",
            what,
            fix=["side_end = side_start + its size 1:00:00", "[2024-05-01T00:00:00Z, "],
        ) as caught,
        nothing_committed(events, bad),
    ):
        events.run(bad, Clock(NOW))
    if mapping is raises_key_error:
        assert isinstance(caught.value.__cause__, KeyError)
    fixed = _windowed(events, lambda start, end: (start, end))
    events.run(fixed, Clock(NOW))
    accounted(events, fixed, [1, 2])
    assert events.rows("enriched") == [(1, "a"), (2, "b")]  # each its own hour's events


# --- readiness providers -----------------------------------------------------------------------


class RaisingProvider:
    def decide(self, facts, windows, now):
        raise LookupError("no such asset in the catalog")


class BoolProvider:
    def decide(self, facts, windows, now):
        return {"global": True}


@pytest.mark.parametrize(
    ("provider", "what"),
    [
        (RaisingProvider(), "raised LookupError: no such asset in the catalog"),
        (BoolProvider(), "returned True (bool) for 'global', not a Decision"),
    ],
    ids=["raises", "not-decisions"],
)
def test_a_readiness_provider_that_fails_or_answers_no_decisions_is_refused(lake, provider, what):
    """Before: the provider's own LookupError; a raw AttributeError ('bool' has no
    attribute 'ready') for an answer of bools."""
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0, T0), (2, 10, 2.0, T0)], TXT)
    bad = operator(lake, readiness=provider)
    with (
        refused(
            dsi.DeclarationError,
            f"readiness provider {__name__}.{type(provider).__qualname__}",
            "side input 'profile' (asset 'profiles')",
            what,
            fix="dsi.Decision(ready",
        ),
        nothing_committed(lake, bad),
    ):
        lake.run(bad)
    fixed = operator(lake, readiness=dsi.DeltaReadiness())
    lake.run(fixed)
    accounted(lake, fixed, [1, 2])
    assert lake.rows("enriched") == [(1, "ann"), (2, "ann")]


# --- key_translator ---------------------------------------------------------------------------


CURRENCIES: dict[str, str] = {}


def translate_by_table(main: DataFrame) -> Any:
    return F.col(CURRENCIES["customer"])


def translate_to_text(main: DataFrame) -> Any:
    return "customer_id"


@pytest.mark.parametrize(
    ("translator", "what"),
    [
        (translate_by_table, "raised KeyError: 'customer'"),
        (translate_to_text, "returned 'customer_id' (str), not a Column"),
    ],
    ids=["raises", "not-a-column"],
)
def test_a_key_translator_that_fails_is_named(lake, translator, what):
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0, T0), (2, 11, 2.0, T0)], TXT)

    def build(key_translator: Any) -> dsi.SideInputOperator:
        side = dsi.SideInput.map("profiles", key="customer_id", key_translator=key_translator)
        return operator(lake, side_inputs={"profile": side})

    with (
        refused(
            dsi.DeclarationError,
            f"key_translator {__name__}.{translator.__qualname__}",
            "side input 'profile' (asset 'profiles')",
            what,
            fix="a Column",
        ),
        nothing_committed(lake, build(translator)),
    ):
        lake.run(build(translator))
    fixed = build(lambda main: main.customer_id)
    lake.run(fixed)
    accounted(lake, fixed, [1, 2])
    assert lake.rows("enriched") == [(1, "ann"), (2, None)]


# --- clock and on_batch ------------------------------------------------------------------------


def clock_of_dates() -> Any:
    return T0.date()


def test_a_clock_that_returns_no_datetime_is_refused(lake):
    """Before: a raw TypeError from the planner's arithmetic."""
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0, T0)], TXT)
    op = operator(lake)
    with (
        refused(
            dsi.DeclarationError,
            f"clock {__name__}.clock_of_dates",
            "returned datetime.date(2024, 5, 1) (date), not a datetime",
            fix="datetime.now(timezone.utc)",
        ),
        nothing_committed(lake, op),
    ):
        lake.run(op, clock_of_dates)
    lake.run(op, Clock(NOW))
    accounted(lake, op, [1])


def test_an_on_batch_callback_that_raises_stops_the_run_with_its_batch_committed(lake):
    """Before: the callback's own ValueError, with no word on the committed batch."""
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0, T0)], TXT)
    op = operator(lake)

    def alert(metrics: dsi.BatchMetrics) -> None:
        raise ValueError("pager is down")

    with refused(
        dsi.errors.FunctionError,
        "on_batch callback",
        "alert",
        "raised ValueError: pager is down after batch 0 committed",
        fix="rerun",
    ):
        lake.run(op, on_batch=alert)
    accounted(lake, op, [1])  # the batch is committed: nothing lost ...
    put(lake, "transactions", [(2, 10, 1.0, T0)], TXT)
    seen: list[int] = []
    lake.run(op, on_batch=lambda m: seen.append(m.batch_id))
    accounted(lake, op, [1, 2])  # ... and nothing written twice on the rerun
    assert seen == [1]


# --- the function: what it returns names the operator, the function and the output ------------


def frames_returns_none(main: DataFrame, sides: dsi.SideInputs) -> None:
    main.count()  # forgot the return


def test_a_frames_function_returning_none_names_the_operator_and_function(lake):
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0, T0)], TXT)
    bad = operator(lake, fn=frames_returns_none)
    with (
        refused(
            dsi.DeclarationError,
            f"Operator {bad.operator_id!r}",
            f"function {__name__}.frames_returns_none",
            "returned NoneType",
            fix="return the main output as a Spark DataFrame",
        ),
        nothing_committed(lake, bad),
    ):
        lake.run(bad)
    fixed = operator(lake)
    lake.run(fixed)
    accounted(lake, fixed, [1])


def rows_yields_none(record: dsi.Record, ctx: Any) -> Iterator[Any]:
    yield None


def rows_returns_a_dict(record: dsi.Record, ctx: Any) -> Any:
    return {"tx_id": record.tx_id, "name": None}


def rows_enrich(record: dsi.Record, ctx: Any) -> Iterator[dict[str, Any]]:
    profile = ctx.side_input("profile")
    yield {"tx_id": record.tx_id, "name": profile.name if profile else None}


@pytest.mark.parametrize(
    ("fn", "what"),
    [
        (rows_yields_none, "yielded to output 'enriched' a record that is not a dict"),
        (rows_returns_a_dict, "returned {'tx_id': 1, 'name': None} (dict)"),
    ],
    ids=["yields-none", "returns-a-dict"],
)
def test_row_mode_errors_name_the_operator_function_and_output(lake, fn, what):
    """Before: 'Row functions must yield dicts...; got None' and 'The row function
    returned {...}', naming neither the operator nor the output."""
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0, T0)], TXT)
    bad = operator(lake, "rows", fn=fn)
    with (
        refused(
            dsi.errors.FunctionError,
            f"Operator {bad.operator_id!r}, row function {__name__}.{fn.__qualname__}",
            "'enriched'",
            what,
            fix="yield",
        ),
        nothing_committed(lake, bad),
    ):
        lake.run(bad)
    fixed = operator(lake, "rows", fn=rows_enrich)
    lake.run(fixed)
    accounted(lake, fixed, [1])


# --- emitting to the operator's own route tags --------------------------------------------------


UNMATCHED_SCHEMA = T.StructType(
    [
        T.StructField("tx_id", T.LongType()),
        T.StructField("customer_id", T.LongType()),
        T.StructField("amount", T.DoubleType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("reason", T.StringType()),
    ]
)


def rows_big_to_unmatched(record: dsi.Record, ctx: Any) -> Iterator[dict[str, Any]]:
    """Records over 100 go to the unmatched route themselves, the others are enriched."""
    if record.amount > 100:
        ctx.output("unmatched", {**record, "reason": "amount over 100"})
        return
    profile = ctx.side_input("profile")
    yield {"tx_id": record.tx_id, "name": profile.name if profile else None}


def test_row_mode_emitting_to_the_unmatched_route_tag_says_it_is_the_route(lake):
    """Before: UndeclaredOutputTagError 'unmatched' "is not declared" (it is, as
    unmatched=), with a fix (add it to side_outputs) that changes nothing."""
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0, T0), (2, 10, 500.0, T0), (3, 99, 1.0, T0)], TXT)

    def build(unmatched: dsi.OutputTag) -> dsi.SideInputOperator:
        side = dsi.SideInput.map("profiles", key="customer_id", missing="unmatched")
        return operator(
            lake,
            "rows",
            fn=rows_big_to_unmatched,
            side_inputs={"profile": side},
            routes=dsi.Routes(unmatched=unmatched),
            side_outputs=[unmatched],
        )

    bad = build(dsi.OutputTag("unmatched"))
    with (
        refused(
            dsi.DeclarationError,
            f"Operator {bad.operator_id!r}, row function",
            "output 'unmatched', the operator's own unmatched route",
            fix='unmatched=dsi.OutputTag("unmatched", schema=',
        ),
        nothing_committed(lake, bad),
    ):
        lake.run(bad)
    fixed = build(dsi.OutputTag("unmatched", schema=UNMATCHED_SCHEMA))
    lake.run(fixed)
    accounted(lake, fixed, [1, 2, 3])
    assert lake.rows("unmatched", "tx_id", "reason") == [
        (2, "amount over 100"),
        (3, "no side row in: profile"),
    ]


# --- what is not a callable at all: refused when declared ----------------------------------------


class NoDecide:
    """A provider object without decide()."""


def test_a_callable_option_given_something_else_is_refused_when_declared(events):
    """Before: a TypeError ('str' object is not callable) or AttributeError at the first
    batch."""
    side = dsi.Window.tumbling(hours(1), time_column="ts")
    with refused(dsi.DeclarationError, "SideInput.list('events')", "window_mapping=", "str"):
        dsi.SideInput.list("events", window=side, window_mapping="previous hour")
    with refused(dsi.DeclarationError, "SideInput.map('profiles')", "key_translator=", "int"):
        dsi.SideInput.map("profiles", key="customer_id", key_translator=10)
    put(events, "profiles", [(10, "ann")], PROFILES)
    with refused(dsi.DeclarationError, "readiness=", "NoDecide", fix="dsi.DeltaReadiness()"):
        operator(events, readiness=NoDecide())
    fixed = _windowed(events, lambda start, end: (start, end))
    events.run(fixed, Clock(NOW))
    accounted(events, fixed, [1, 2])
    assert events.rows("enriched") == [(1, "a"), (2, "b")]


def test_the_side_windows_a_batch_reads_are_the_ones_its_plan_recorded(events):
    """The mapping is called and checked when the batch is planned; the stages after read
    the side windows from the plan (as a replay does), not from a second call, which
    could answer otherwise (before: called again, here failing)."""
    asked: list[tuple] = []

    def once(start, end):
        if (start, end) in asked:
            raise RuntimeError("asked twice")
        asked.append((start, end))
        return start, end

    op = _windowed(events, once)
    events.run(op, Clock(NOW))
    accounted(events, op, [1, 2])
    assert events.rows("enriched") == [(1, "a"), (2, "b")]

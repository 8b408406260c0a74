"""The operator's pure logic, without Spark: window arithmetic, namespace ids, plan JSON
round trips, options and limits, state files. These run in milliseconds."""

import datetime as dt
import inspect
import pickle
import warnings

import pytest

import dagster_sideinputs as dsi
from dagster_sideinputs import deprecations
from dagster_sideinputs.core import options as options_module
from dagster_sideinputs.core.batch.buffer import (
    BufferState,
    is_keywait,
    keywait_slot,
    namespace_slot,
    slot_namespace,
)
from dagster_sideinputs.core.binding import build_spec, default_operator_id
from dagster_sideinputs.core.callbacks import map_to_side_window
from dagster_sideinputs.core.options import OperatorOptions
from dagster_sideinputs.core.sideinputs import declaration as dsi_declaration
from dagster_sideinputs.core.sideinputs.readiness import Decision
from dagster_sideinputs.core.sideinputs.windows import (
    GLOBAL,
    default_side_window,
    namespace_id,
    parse_namespace_id,
    window_start_containing,
    windows_between,
    windows_containing,
)
from dagster_sideinputs.core.spec import fingerprint
from dagster_sideinputs.core.state.folder import OperatorState, Unreadable
from dagster_sideinputs.core.state.plan import BatchPlan, MainRange, NamespacePlan
from dagster_sideinputs.delta.store.files import TableFiles

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


# --- windows -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instant", "start"),
    [(at(0), at(0)), (at(59.99), at(0)), (at(60), at(60)), (at(-0.01), at(-60))],
)
def test_a_tumbling_window_is_half_open(instant, start):
    assert window_start_containing(dsi.Window.tumbling(HOUR), instant) == start


def test_a_sliding_window_gives_every_window_holding_the_instant_oldest_first():
    window = dsi.Window.sliding(HOUR, slide=dt.timedelta(minutes=20))
    assert windows_containing(window, at(25)) == [
        (at(-20), at(40)),
        (at(0), at(60)),
        (at(20), at(80)),
    ]


def test_windows_before_the_epoch_align_like_after_it():
    window = dsi.Window.tumbling(HOUR)
    instant = dt.datetime(1969, 12, 31, 23, 30, tzinfo=UTC)
    assert window_start_containing(window, instant) == dt.datetime(1969, 12, 31, 23, tzinfo=UTC)


def test_an_offset_shifts_window_starts():
    window = dsi.Window.tumbling(HOUR, offset=dt.timedelta(minutes=15))
    assert window_start_containing(window, at(10)) == at(-45)


@pytest.mark.parametrize(
    ("side_size", "expected"),
    [
        (HOUR, (at(0), at(60))),  # equal windows map one to one
        (dt.timedelta(hours=2), (at(0), at(120))),  # a smaller main window: the one holding it
        (dt.timedelta(minutes=15), (at(45), at(60))),  # a larger one: its last side window
    ],
)
def test_the_default_mapping_takes_the_side_window_holding_the_main_windows_last_instant(
    side_size, expected
):
    side = dsi.Window.tumbling(side_size)
    assert default_side_window(side, at(0), at(60)) == expected


@pytest.mark.parametrize(
    ("side", "main", "expected"),
    [
        # Equal sliding windows map one to one: [08:00, 10:00) reads [08:00, 10:00), not
        # [09:00, 11:00), which also holds 09:59:59.999999.
        (dsi.Window.sliding(2 * HOUR, slide=HOUR), (at(480), at(600)), (at(480), at(600))),
        # A smaller main window: the earliest-starting side window holding its last instant.
        (dsi.Window.sliding(2 * HOUR, slide=HOUR), (at(480), at(540)), (at(420), at(540))),
        # A larger main window: the last side window inside it.
        (dsi.Window.sliding(2 * HOUR, slide=HOUR), (at(0), at(240)), (at(120), at(240))),
        (
            dsi.Window.sliding(HOUR, slide=dt.timedelta(minutes=20)),
            (at(0), at(60)),
            (at(0), at(60)),
        ),
    ],
)
def test_the_default_mapping_of_sliding_side_windows_is_beams_earliest_starting(
    side, main, expected
):
    """Beam's ``default_window_mapping_fn`` takes the last window ``SlidingWindows.assign``
    lists for the main window's last instant, the earliest-starting one
    (``test_beam_equivalence.py`` runs Beam beside the operator on the same cases)."""
    assert default_side_window(side, *main) == expected


def test_the_default_sliding_mapping_stays_within_the_representable_years():
    side = dsi.Window.sliding(dt.timedelta(days=2), slide=dt.timedelta(days=1))
    first = dt.datetime(1, 1, 1, tzinfo=UTC)
    assert default_side_window(side, first, first + HOUR) == (
        first,
        first + 2 * dt.timedelta(days=1),
    )


def test_a_custom_mapping_replaces_the_default():
    side = dsi.Window.tumbling(HOUR)
    previous = map_to_side_window(side, lambda s, e: (s - HOUR, s), at(0), at(60))
    assert previous == (at(-60), at(0))


def test_windows_between_enumerates_or_gives_up_past_the_limit():
    window = dsi.Window.tumbling(HOUR)
    assert windows_between(window, at(10), at(130), 10) == [
        (at(0), at(60)),
        (at(60), at(120)),
        (at(120), at(180)),
    ]
    assert windows_between(window, at(0), at(60 * 100), 10) is None


@pytest.mark.parametrize(
    "start", [None, T0, T0 + dt.timedelta(microseconds=5), dt.datetime(1960, 1, 1, tzinfo=UTC)]
)
def test_namespace_ids_round_trip(start):
    ns = namespace_id(start)
    assert (ns == GLOBAL) == (start is None)
    assert parse_namespace_id(ns) == start


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: dsi.Window.tumbling(dt.timedelta(0)), "positive"),
        (lambda: dsi.Window.sliding(HOUR, slide=2 * HOUR), "longer than its size"),
        (lambda: dsi.Window.sliding(HOUR, slide=dt.timedelta(minutes=25)), "multiple"),
        (lambda: dsi.Window.tumbling(HOUR, watermark=-HOUR), "watermark"),
    ],
)
def test_bad_windows_are_refused_where_they_are_declared(make, message):
    with pytest.raises(dsi.DeclarationError, match=message):
        make()


# --- buffer slots and limits -------------------------------------------------------------


def test_slots_name_their_namespace_and_kind():
    assert slot_namespace(namespace_slot("global")) == "global"
    assert is_keywait(keywait_slot("2024-05-01T10:00:00Z"))
    assert not is_keywait(namespace_slot("global"))


def test_an_absent_buffer_is_empty():
    state = BufferState(None)
    assert (state.version, state.slots(), state.rows(), state.oldest()) == (-1, [], 0, None)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (lambda: dsi.BufferLimits(max_rows=-1), ">= 0"),
        (lambda: dsi.BufferLimits(max_age=-HOUR), ">= 0"),
        (lambda: dsi.BufferLimits(on_exceed="drop"), "on_exceed"),
    ],
)
def test_bad_limits_are_refused(limits, message):
    with pytest.raises(dsi.DeclarationError, match=message):
        limits()


def test_zero_limits_are_valid():
    assert dsi.BufferLimits(max_rows=0, max_age=dt.timedelta(0), on_exceed="overflow")


# --- plans ----------------------------------------------------------------------------------


def plan(**changes) -> BatchPlan:
    values = {
        "operator_id": "op",
        "batch_id": 7,
        "now": T0,
        "main": MainRange("delta", 3, 5, table_id="t-1"),
        "side_versions": {"profile": 2, "rates": None},
        "decisions": {"profile": {"global": Decision(True, "materialized (version 2)")}},
        "namespaces": {
            "global": NamespacePlan(None, None, {"profile": "global"}, True),
            namespace_id(T0): NamespacePlan(T0, T0 + HOUR, {"rates": namespace_id(T0)}, False),
        },
        "read_slots": ("ns=global",),
        "buffer_version": 4,
        "watermark": T0 - HOUR,
        "max_event_time": T0,
        "reroute": True,
        "routing": "abc",
        "tables": ("/lake/out",),
    }
    values.update(changes)
    return BatchPlan(**values)


def test_a_plan_survives_its_json_round_trip_exactly():
    original = plan()
    assert BatchPlan.from_json(original.to_json()) == original


def test_a_files_plan_survives_its_json_round_trip():
    files = ({"path": "a.json", "size": 10, "mtime_ms": 1},)
    original = plan(main=MainRange("files", files=files))
    assert BatchPlan.from_json(original.to_json()) == original


def test_plans_are_frozen():
    with pytest.raises(AttributeError):
        plan().batch_id = 8  # type: ignore[misc]


def test_state_files_that_cannot_be_read_are_reported_not_raised(tmp_path):
    state = OperatorState(TableFiles(str(tmp_path)), "op")
    assert state.create_plan(plan(batch_id=0))
    assert not state.create_plan(plan(batch_id=0))  # created exclusively
    (tmp_path / "plans" / f"{1:020d}.json").write_text('{"operator_id": "op", "bat')
    assert isinstance(state.load_plan(1), Unreadable)
    assert isinstance(state.load_commit(0), Unreadable)  # missing
    state.commit(0, {"batch_id": 0})
    assert state.load_commit(0) == {"batch_id": 0}
    assert (state.last_planned(), state.last_committed()) == (1, 0)


def test_a_plan_set_aside_is_no_longer_pending(tmp_path):
    state = OperatorState(TableFiles(str(tmp_path)), "op")
    state.create_plan(plan(batch_id=0))
    state.discard_plan(0)
    assert state.last_planned() is None
    assert len(list((tmp_path / "plans" / "discarded").iterdir())) == 1


def test_pruning_keeps_the_newest_batches(tmp_path):
    state = OperatorState(TableFiles(str(tmp_path)), "op")
    for batch_id in range(30):
        state.create_plan(plan(batch_id=batch_id))
        state.commit(batch_id, {"batch_id": batch_id})
    state.prune(keep=5)
    assert sorted(p.name for p in (tmp_path / "commits").iterdir())[0] == f"{25:020d}.json"
    assert (state.last_planned(), state.last_committed()) == (29, 29)


# --- options and identities ------------------------------------------------------------------


def options(**changes) -> OperatorOptions:
    values = {
        "main": dsi.MainInput("transactions", key="customer_id"),
        "side_inputs": {"profile": dsi.SideInput.map("profiles", key="customer_id")},
        "fn": lambda main, sides: main,
        "main_output": "enriched",
    }
    values.update(changes)
    return OperatorOptions(**values)


def test_options_take_a_main_output_name_and_are_picklable():
    value = options()
    assert value.main_output == dsi.OutputTag("enriched")
    restored = pickle.loads(pickle.dumps(options(fn=len)))
    assert restored.side_inputs == value.side_inputs


def test_a_replay_derives_its_options_with_replace():
    import dataclasses

    replayed = dataclasses.replace(options(), operator_id="enriched__replay")
    assert replayed.operator_id == "enriched__replay"
    assert replayed.side_inputs == options().side_inputs


def test_default_operator_ids_come_from_the_main_output():
    assert default_operator_id(dsi.OutputTag("payments/enriched")) == "payments__enriched"


def test_the_routing_fingerprint_follows_the_declaration_not_the_function(tmp_path):
    storage = dsi.DeltaStorage(str(tmp_path))
    one = build_spec(options(), storage)
    other_fn = build_spec(options(fn=lambda main, sides: main.limit(1)), storage)
    waits = build_spec(
        options(
            side_inputs={
                "profile": dsi.SideInput.map("profiles", key="customer_id", missing=dsi.Wait(HOUR))
            },
            routes=dsi.Routes(unmatched=dsi.OutputTag("unmatched")),
        ),
        storage,
    )
    assert fingerprint(one.routing()) == fingerprint(other_fn.routing())
    assert fingerprint(one.routing()) != fingerprint(waits.routing())


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: dsi.SideInput.list("p", missing="wait"), "only applies to keyed"),
        (lambda: dsi.SideInput.map("p", key="k", timout=HOUR), 'Did you mean "timeout"'),
        (lambda: dsi.SideInput.singleton("p", pick="x"), "only applies to map"),
    ],
)
def test_a_view_factory_names_the_views_an_option_applies_to(factory, message):
    with pytest.raises(dsi.DeclarationError, match=message):
        factory()


def test_an_output_that_is_also_the_main_input_is_refused(tmp_path):
    with pytest.raises(dsi.DeclarationError, match="also its main input"):
        build_spec(options(main_output="transactions"), dsi.DeltaStorage(str(tmp_path)))


@pytest.mark.parametrize("name", ["bad*name", "bad?name", "bad[1]", "bad#x", "bad%20x"])
def test_names_special_to_spark_paths_are_refused_up_front(tmp_path, name):
    with pytest.raises(dsi.DeclarationError, match="glob patterns"):
        build_spec(options(main_output=name), dsi.DeltaStorage(str(tmp_path)))


# --- the public vocabulary: explicit keyword arguments ----------------------------------------


def keywords(function) -> list[str]:
    parameters = inspect.signature(function).parameters.values()
    assert all(p.kind is not p.VAR_KEYWORD for p in parameters), f"{function} takes **kwargs"
    return [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]


@pytest.mark.parametrize(
    ("old", "value", "grouped"),
    [
        ("late", dsi.OutputTag("late"), lambda o: o.routes.late),
        ("unmatched", "unmatched", lambda o: o.routes.unmatched),
        ("overflow", dsi.OutputTag("overflow"), lambda o: o.routes.overflow),
        ("invalid", dsi.OutputTag("invalid"), lambda o: o.routes.invalid),
        ("max_versions_per_batch", 3, lambda o: o.main.max_versions_per_batch),
    ],
)
def test_a_keyword_that_moved_into_a_group_still_works_and_warns_once(
    tmp_path, old, value, grouped
):
    """Before 0.2 these were the operator's own keywords; each now lives in one group
    (``Routes``, the main input), declared once for every entry point."""
    storage = dsi.DeltaStorage(str(tmp_path))
    deprecations.WARNED.discard(f"SideInputOperator({old}=...)")

    def declare() -> dsi.SideInputOperator:
        return dsi.SideInputOperator(
            main=dsi.MainInput("transactions", key="customer_id"),
            side_inputs={},
            fn=lambda main, sides: main,
            main_output="enriched",
            storage=storage,
            **{old: value},
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op = declare()
        declare()
    assert [w.category for w in caught] == [DeprecationWarning]
    assert f"SideInputOperator({old}=...)" in str(caught[0].message)
    assert options_module.MOVED_KEYWORDS[old] in str(caught[0].message)
    assert caught[0].filename == __file__
    assert grouped(op.spec.options) in (value, dsi.OutputTag(str(value)))


def test_an_unknown_keyword_is_a_type_error_naming_the_close_one(tmp_path):
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'unmached'.*unmatched"):
        dsi.SideInputOperator(
            main=dsi.MainInput("transactions"),
            side_inputs={},
            fn=lambda main, sides: main,
            main_output="enriched",
            storage=dsi.DeltaStorage(str(tmp_path)),
            unmached=dsi.OutputTag("x"),
        )


def test_routes_are_tags_and_a_batch_limit_is_the_main_inputs_own():
    assert dsi.Routes(late="late").declared() == {"late": dsi.OutputTag("late")}
    with pytest.raises(dsi.DeclarationError, match=r"Routes\(invalid=.*OutputTag"):
        dsi.Routes(invalid=3)
    with pytest.raises(dsi.DeclarationError, match="max_files_per_batch must be an integer >= 1"):
        dsi.MainInput.files("/x", schema="a int", max_files_per_batch=True)
    with pytest.raises(
        dsi.DeclarationError, match=r"(?s)\(delta\).*MainInput\(\.\.\., max_versions"
    ):
        dsi.MainInput("transactions", max_files_per_batch=1)


@pytest.mark.parametrize("view", ["singleton", "list", "map", "multimap"])
def test_side_input_factories_take_explicit_keywords(view):
    options = keywords(getattr(dsi.SideInput, view))
    assert {"readiness", "window", "max_age", "distribution"} <= set(options)
    assert ("key" in options) == (view in ("map", "multimap"))


# --- a side input's options in groups: Wait, a side window's grace and mapping, AsOf's grace --

HOUR = dt.timedelta(hours=1)


def to_previous_hour(start, end):
    return start - HOUR, start


@pytest.mark.parametrize(
    ("view", "grouped", "old"),
    [
        (
            "map",
            {"key": "k", "missing": dsi.Wait(HOUR, then="null")},
            {"key": "k", "missing": "wait", "timeout": HOUR, "on_timeout": "null"},
        ),
        (
            "multimap",
            {"key": "k", "missing": dsi.Wait(HOUR)},
            {"key": "k", "missing": "wait", "timeout": HOUR},
        ),
        (
            "list",
            {"window": dsi.Window.tumbling(HOUR, time_column="ts", grace=HOUR)},
            {"window": dsi.Window.tumbling(HOUR, time_column="ts"), "grace": HOUR},
        ),
        (
            "singleton",
            {"window": dsi.Window.tumbling(HOUR, time_column="ts", mapping=to_previous_hour)},
            {
                "window": dsi.Window.tumbling(HOUR, time_column="ts"),
                "window_mapping": to_previous_hour,
            },
        ),
        (
            "map",
            {"key": "k", "as_of": dsi.AsOf.column("valid_from", grace=HOUR)},
            {"key": "k", "as_of": "valid_from", "grace": HOUR},
        ),
    ],
)
def test_a_side_inputs_options_in_groups_and_their_old_keywords_declare_the_same(
    view, grouped, old
):
    """The grouped spelling and the one before 0.2 give equal side inputs, with equal
    identities (an operator's state outlives the change of spelling); the old keywords
    warn once per view, naming the new spelling, at the caller's line."""
    factory = getattr(dsi.SideInput, view)
    new = factory("side", **grouped)
    moved = [name for name in old if name not in grouped]
    for name in moved:
        deprecations.WARNED.discard(f"SideInput.{view}({name}=...)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = factory("side", **old)
        factory("side", **old)
    assert new == before
    assert new.window_mapping is before.window_mapping
    assert sorted(str(w.message).split("(")[1].split("=")[0] for w in caught) == sorted(moved)
    for warning in caught:
        assert warning.category is DeprecationWarning
        assert warning.filename == __file__
        name = str(warning.message).split("(")[1].split("=")[0]
        assert dsi_declaration.MOVED_OPTIONS[name] in str(warning.message)

    def identity(side):
        spec = build_spec(
            options(
                main=dsi.MainInput("transactions", key="k", event_time="ts"),
                side_inputs={"s": side},
                routes=dsi.Routes(unmatched="unmatched"),
            ),
            dsi.DeltaStorage("/tmp/identity-of-a-spelling"),
        )
        return spec.routing()

    assert identity(new) == identity(before)


def test_the_groups_refuse_what_does_not_belong_to_them():
    with pytest.raises(dsi.DeclarationError, match="timeout must be positive"):
        dsi.Wait(dt.timedelta(0))
    with pytest.raises(dsi.DeclarationError, match=r"Wait\(timeout=\) takes a timedelta"):
        dsi.Wait(None)
    with pytest.raises(dsi.DeclarationError, match="then"):
        dsi.Wait(HOUR, then="drop")
    with pytest.raises(dsi.DeclarationError, match="needs a timeout"):
        dsi.SideInput.map("side", key="k", missing="wait")
    with pytest.raises(dsi.DeclarationError, match="only applies to keyed"):
        dsi.SideInput.list("side", missing=dsi.Wait(HOUR))
    with pytest.raises(dsi.DeclarationError, match="Window grace must be >= 0"):
        dsi.Window.tumbling(HOUR, grace=-HOUR)
    with pytest.raises(dsi.DeclarationError, match=r"mapping=\) takes a function"):
        dsi.Window.tumbling(HOUR, mapping=3)
    with pytest.raises(dsi.DeclarationError, match="main input's windows take watermark"):
        options(window=dsi.Window.tumbling(HOUR, time_column="ts", grace=HOUR))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(dsi.DeclarationError, match="grace= is given twice"):
            dsi.SideInput.list(
                "side", window=dsi.Window.tumbling(HOUR, time_column="ts", grace=HOUR), grace=HOUR
            )
        with pytest.raises(dsi.DeclarationError, match="neither window= nor as_of="):
            dsi.SideInput.list("side", grace=HOUR)
    with pytest.raises(dsi.DeclarationError, match="Did you mean"):
        dsi.SideInput.map("side", key="k", timout=HOUR)
    waiting = dsi.SideInput.map("side", key="k", missing=dsi.Wait(HOUR))
    assert "missing=Wait(timeout=datetime.timedelta(seconds=3600)" in repr(waiting)
    assert (waiting.missing, waiting.timeout, waiting.on_timeout) == ("wait", HOUR, "unmatched")

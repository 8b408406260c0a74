"""Bad-input catalogue, class 6: every failure is the project's error, never a raw one.

Row and frames functions that return or yield the wrong things, raise, or read what is
not there; event-time columns of the wrong type; the project's own errors raised inside
Spark jobs; names that are special to Spark paths, globs and URIs, in tables, landed
files and columns. Each failure is a ``SideInputError`` of the right class naming the
asset / column / file with a fix, commits nothing, and the fixed rerun accounts for
every record.
"""

import shutil
from collections.abc import Callable

import pandas as pd
import pytest
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from tests.core.catalogue import (
    ENRICHED,
    INVALID,
    PROFILES,
    T0,
    TX,
    accounted,
    hours,
    nothing_committed,
    operator,
    put,
    refused,
    rows_enrich,
)
from tests.core.conftest import Clock, Lake

# Under the engine users get (delta-spark): these cases are about routing records (what
# Spark computes before any write), the same under both engines; test_bad_input_halfway.py,
# whose cases commit, runs under both.


@pytest.fixture
def ready(lake: Lake) -> Lake:
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0), (2, 10, 2.0)], TX)
    return lake


def failing_then_fixed(lake: Lake, op: dsi.SideInputOperator, fixed: dsi.SideInputOperator, error):
    with error, nothing_committed(lake, op):
        lake.run(op)
    lake.run(fixed)
    accounted(lake, fixed, [1, 2])


# --- event-time columns of the wrong type ------------------------------------------------------


@pytest.mark.parametrize("kind", ["string", "long"])
def test_an_event_time_column_of_the_wrong_type_is_a_declaration_error(lake, kind):
    """Before: an AttributeError after three outputs had committed, on every rerun."""
    value = "2024-05-01" if kind == "string" else 1_714_521_600
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(
        lake,
        "transactions",
        [(1, 10, value, T0), (2, 10, value, T0)],
        f"tx_id long, customer_id long, d {kind}, ts timestamp",
    )
    build = lambda column: operator(  # noqa: E731
        lake,
        main=dsi.MainInput("transactions", key="customer_id", event_time=column),
        window=dsi.Window.tumbling(hours(1)),
    )
    op = build("d")
    with (
        refused(
            dsi.DeclarationError,
            "'transactions'",
            "'d'",
            f"is {kind if kind == 'string' else 'bigint'}",
            fix=["to_timestamp", "event_time="],
        ),
        nothing_committed(lake, op),
    ):
        lake.run(op, Clock(T0 + hours(3)))
    fixed = build("ts")
    lake.run(fixed, Clock(T0 + hours(3)))
    accounted(lake, fixed, [1, 2])


# --- row functions ------------------------------------------------------------------------------


def _return_dict(record, ctx):
    return {"tx_id": record.tx_id, "name": None}


def _yield_none(record, ctx):
    yield None


def _yield_wrong_types(record, ctx):
    yield {"tx_id": "x", "name": 3}


def _yield_too_big(record, ctx):
    yield {"tx_id": 2**70, "name": None}


def _raise(record, ctx):
    raise KeyError("boom")
    yield


def _undeclared_side(record, ctx):
    ctx.side_input("profle")
    yield {"tx_id": record.tx_id, "name": None}


def _undeclared_tag(record, ctx):
    ctx.output("alert", {"tx_id": record.tx_id})
    yield {"tx_id": record.tx_id, "name": None}


def _our_error(record, ctx):
    raise dsi.errors.SideInputDataError(f"rates missing for {record.tx_id}", fix="load the rates")
    yield


ROW_FUNCTIONS = [
    (
        _return_dict,
        dsi.errors.FunctionError,
        ["returned {'tx_id'", "instead of yielding"],
        "yield record",
    ),
    # Anything else yielded that is no dict, Row or tuple (a str, an int) takes this path:
    (
        _yield_none,
        dsi.errors.FunctionError,
        ["got None (NoneType)"],
        ["yield None", "yield one dict"],
    ),
    (_yield_wrong_types, dsi.errors.FunctionError, ["output 'enriched'", "'x'"], "declared types"),
    (
        _yield_too_big,
        dsi.errors.FunctionError,
        ["output 'enriched'", "OverflowError"],
        "declared types",
    ),
    # Whatever the function raises takes this path (also the TypeError of a function taking
    # one argument, or of returning an int, which is no iterable of records):
    (
        _raise,
        dsi.errors.FunctionError,
        ["_raise", "KeyError: 'boom'", "on record"],
        ["fix the function", "must yield dicts"],
    ),
    (
        _undeclared_side,
        dsi.DeclarationError,
        ["'profle'", "['profile']", "Did you mean"],
        "side_inputs",
    ),
    (_undeclared_tag, dsi.errors.UndeclaredOutputTagError, ["'alert'"], "side_outputs=[...]"),
    (_our_error, dsi.errors.SideInputDataError, ["rates missing for"], "load the rates"),
]


@pytest.mark.parametrize(
    ("fn", "cls", "names", "fix"),
    ROW_FUNCTIONS,
    ids=[f[0].__name__.strip("_") for f in ROW_FUNCTIONS],
)
def test_a_misbehaving_row_function_is_a_side_input_error(ready, fn, cls, names, fix):
    failing_then_fixed(
        ready,
        operator(ready, "rows", fn=fn),
        operator(ready, "rows", fn=rows_enrich),
        refused(cls, *names, fix=fix),
    )


# --- frames functions ---------------------------------------------------------------------------


def _frames_raise(main, sides):
    raise RuntimeError("bug in the enrichment")


def _frames_none(main, sides):
    return None


def _frames_pandas(main, sides):
    return pd.DataFrame({"tx_id": [1]})


def _frames_list_value(main, sides):
    return {dsi.MAIN: [main]}


def _frames_duplicate_columns(main, sides):
    return main.select(
        "tx_id", F.col("profile.name").alias("name"), F.col("profile.name").alias("NAME")
    )


def _frames_missing_column(main, sides):
    return main.select("tx_id", F.col("nmae"))


def _raising_ours(tx_id: int) -> str:
    raise dsi.DeclarationError(f"tx {tx_id} has no region", fix="declare the region side input")


def _frames_udf_ours(main, sides):
    return main.select("tx_id", F.udf(_raising_ours, "string")("tx_id").alias("name"))


FRAMES_FUNCTIONS = [
    (
        _frames_raise,
        dsi.errors.FunctionError,
        ["_frames_raise", "RuntimeError: bug"],
        "fix the function",
    ),
    (
        _frames_none,
        dsi.DeclarationError,
        ["returned NoneType"],
        "return the main output as a Spark DataFrame",
    ),
    (
        _frames_pandas,
        dsi.DeclarationError,
        ["pandas.DataFrame"],
        "spark.createDataFrame",
    ),
    (_frames_list_value, dsi.DeclarationError, ["is a list"], "Spark DataFrames"),
    (
        _frames_duplicate_columns,
        dsi.errors.SchemaMismatchError,
        ["'enriched'", "['NAME']"],
        "rename",
    ),
    (_frames_missing_column, dsi.errors.FunctionError, ["`nmae`"], "check the columns"),
    (_frames_udf_ours, dsi.DeclarationError, ["has no region"], "declare the region"),
]


@pytest.mark.parametrize(
    ("fn", "cls", "names", "fix"),
    FRAMES_FUNCTIONS,
    ids=[f[0].__name__.strip("_") for f in FRAMES_FUNCTIONS],
)
def test_a_misbehaving_frames_function_is_a_side_input_error(ready, fn, cls, names, fix):
    main_output = "enriched" if fn is _frames_duplicate_columns else ENRICHED
    failing_then_fixed(
        ready,
        operator(ready, fn=fn, main_output=main_output),
        operator(ready, main_output=main_output),
        refused(cls, *names, fix=fix),
    )


# --- a side column the function reads disappears -------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "cls"),
    [("frames", dsi.errors.SideInputDataError), ("rows", dsi.errors.MissingSideColumnError)],
)
def test_a_side_column_the_function_reads_that_disappeared_is_named(lake, mode, cls):
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    op = operator(lake, mode)
    lake.run(op)
    put(lake, "profiles", [(10, "ann")], "customer_id long, nom string", mode="overwrite")
    put(lake, "transactions", [(2, 10, 1.0)], TX)
    with (
        refused(cls, "'name'", "side input 'profile'", "'profiles'", fix="restore column 'name'"),
        nothing_committed(lake, op),
    ):
        lake.run(op)
    put(lake, "profiles", [(10, "ann")], PROFILES, mode="overwrite")
    lake.run(op)
    accounted(lake, op, [1, 2])
    assert lake.rows("enriched") == [(1, "ann"), (2, "ann")]


# A key_translator that raises or returns no Column: test_bad_input_callbacks.py.


# --- names special to paths, globs and URIs ----------------------------------------------


def test_table_names_spark_would_read_as_another_path_are_refused_up_front(ready):
    def roles(bad: str) -> list[tuple[str, Callable[[], dsi.SideInputOperator]]]:
        return [
            ("Output", lambda: operator(ready, main_output=bad, operator_id="op")),
            ("Main input", lambda: operator(ready, main=dsi.MainInput(bad), operator_id="op")),
            (
                "side input 'profile'",
                lambda: operator(
                    ready,
                    side_inputs={"profile": dsi.SideInput.map(bad, key="customer_id")},
                    operator_id="op",
                ),
            ),
        ]

    for char in ["#", "%", "?", "[", "{", "*", "\\", "\t"]:  # each refused, nothing run
        bad = f"out{char}1"
        for role, build in roles(bad):
            with refused(
                dsi.DeclarationError, role, repr(bad), repr(char), fix="use letters, digits"
            ):
                build()
    fixed = operator(ready, main_output="out_1")
    ready.run(fixed)
    accounted(ready, fixed, [1, 2], outputs=["out_1"])


def test_landed_files_with_glob_characters_are_each_read_once(ready, tmp_path):
    """Spark globs the paths it is given: ``c*.json`` would also read ``c.json`` twice, and
    ``[1].json`` nothing at all, without the escaping."""
    folder = tmp_path / "landed"
    folder.mkdir()
    names = [
        "a[1].json",
        "b{x,y}.json",
        "c*.json",
        "c.json",
        "d?.json",
        "d1.json",
        "e#1.json",
        "f%41.json",
        "fA.json",
        "g h.json",
        "i\\j.json",
    ]
    for index, name in enumerate(names):
        (folder / name).write_text(f'{{"tx_id": {index}, "customer_id": 10, "amount": 1.0}}\n')
    op = operator(ready, main=dsi.MainInput.files(str(folder), schema=TX, key="customer_id"))
    ready.run(op)
    accounted(ready, op, range(len(names)))


@pytest.mark.parametrize("char", [":", "\t"])
def test_a_landed_file_name_spark_cannot_read_is_refused_naming_it(ready, tmp_path, char):
    folder = tmp_path / "landed"
    folder.mkdir()
    (folder / "a.json").write_text('{"tx_id": 1, "customer_id": 10, "amount": 1.0}\n')
    bad = folder / f"2024-05-01T10{char}00.json"
    bad.write_text('{"tx_id": 2, "customer_id": 10, "amount": 1.0}\n')
    op = operator(ready, main=dsi.MainInput.files(str(folder), schema=TX, key="customer_id"))
    with (
        refused(dsi.errors.MainInputDataError, repr(bad.name), "'landed'", fix="rename the file"),
        nothing_committed(ready, op),
    ):
        ready.run(op)
    shutil.move(bad, folder / "2024-05-01T10-00.json")
    ready.run(op)
    accounted(ready, op, [1, 2])


# --- dots, spaces and backticks in column names ------------------------------------------

# Spaces (and , ; { } ( ) =) are refused in output column names without column mapping
# (test_bad_input_values_names.py); routed records carry the main columns, so the main
# input's names here use the other odd characters. The side table keeps a space.
ODD = "`tx_id` long, `cust.id-x``y` long, `a.b` double, `event.time` timestamp"


def _odd_frames(main, sides):
    return main.select("tx_id", F.col("profile.`full name`").alias("name"))


def _odd_rows(record, ctx):
    profile = ctx.side_input("profile")
    yield {"tx_id": record["tx_id"], "name": profile["full name"] if profile else None}


@pytest.mark.parametrize("mode", ["frames", "rows"])
def test_dots_spaces_and_backticks_in_key_time_and_side_columns_are_supported(lake, mode):
    key = "cust.id-x`y"
    put(lake, "profiles", [(10, "ann")], "`cust.id-x``y` long, `full name` string")
    put(lake, "transactions", [(1, 10, 1.0, T0), (2, None, 1.0, T0), (3, 11, 1.0, None)], ODD)
    main = dsi.MainInput("transactions", key=key, event_time="event.time")
    op = operator(
        lake,
        mode,
        main=main,
        side_inputs={"profile": dsi.SideInput.map("profiles", key=key)},
        fn=_odd_frames if mode == "frames" else _odd_rows,
        window=dsi.Window.sliding(hours(2), slide=hours(1)),
    )
    with refused(
        dsi.errors.MainInputDataError,
        f"null key {key!r}",
        "null event time 'event.time'",
        fix="invalid=",
    ):
        lake.run(op, Clock(T0 + hours(3)))
    fixed = operator(
        lake,
        mode,
        main=main,
        side_inputs={"profile": dsi.SideInput.map("profiles", key=key)},
        fn=_odd_frames if mode == "frames" else _odd_rows,
        window=dsi.Window.tumbling(hours(1)),
        routes=dsi.Routes(invalid=INVALID),
    )
    lake.run(fixed, Clock(T0 + hours(3)))
    accounted(lake, fixed, [1, 2, 3])
    assert lake.rows("enriched") == [(1, "ann")]
    assert lake.rows("invalid", "tx_id", "`a.b`") == [(2, 1.0), (3, 1.0)]

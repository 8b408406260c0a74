"""Bad-input catalogue, class 5: nothing committed by a batch that ends in an error.

The write stage stages every table (running every Spark job of the batch) before it
commits any. An error that only a later output's job meets (``raise_error`` on some
rows, a UDF failing on some rows, an ANSI arithmetic error, a row function's side
record that does not fit) leaves every table at its version, the buffer included; the
fixed rerun then resumes exactly. Declared output schemas hold in frames mode too.
"""

import datetime as dt
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from tests.core.catalogue import (
    PROFILES,
    TX,
    accounted,
    nothing_committed,
    operator,
    put,
    refused,
)
from tests.core.conftest import Lake

DELTA_ENGINES = ("rs", "spark")
"""Every test runs under the delta-rs bridge and under delta-spark (tests/core/conftest.py)."""

BIG = dsi.OutputTag("big")
DAY = dt.timedelta(days=1)


@pytest.fixture
def started(lake: Lake) -> Lake:
    """A first batch committed: every output exists, one record waits in the buffer
    (customer 77 has no profile and waits for it)."""
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0), (2, 77, 1.0)], TX)
    lake.run(with_big(lake, lambda amount: amount))
    return lake


def with_big(lake: Lake, big_amount, **kwargs: Any) -> dsi.SideInputOperator:
    """Main output, then the side output ``big``: records over 2, with ``big_amount``."""

    def fn(main, sides):
        enriched = main.select("tx_id", F.col("profile.name").alias("name"))
        big = main.filter(F.col("amount") > 2).select("tx_id", big_amount(F.col("amount")))
        return {dsi.MAIN: enriched, BIG: big.toDF("tx_id", "amount")}

    wait = dsi.SideInput.map("profiles", key="customer_id", missing=dsi.Wait(DAY))
    kwargs.setdefault("side_inputs", {"profile": wait})
    return operator(
        lake,
        side_outputs=[BIG],
        fn=fn,
        routes=dsi.Routes(unmatched=dsi.OutputTag("unmatched")),
        **kwargs,
    )


@pytest.mark.parametrize(
    ("failing", "names", "fix"),
    [
        (
            lambda amount: F.when(amount > 4, F.raise_error(F.lit("amount too big"))).otherwise(
                amount
            ),
            ["output 'big'", "amount too big"],
            "fix the expression",
        ),
        (
            lambda amount: F.udf(lambda a: 1 / (a - 5.0), "double")(amount),
            ["output 'big'", "ZeroDivisionError"],
            "fix the function",
        ),
        (
            lambda amount: F.lit(1.0) / (amount - F.lit(5.0)).cast("int"),
            ["output 'big'", "DIVIDE_BY_ZERO"],
            "try_divide",
        ),
    ],
    ids=["raise_error", "udf", "ansi-divide-by-zero"],
)
def test_an_error_only_a_later_outputs_job_meets_commits_nothing(started, failing, names, fix):
    put(started, "transactions", [(3, 10, 3.0), (4, 10, 5.0)], TX)
    op = with_big(started, failing)
    with refused(dsi.errors.FunctionError, *names, fix=fix), nothing_committed(started, op):
        started.run(op)
    fixed = with_big(started, lambda amount: amount)
    started.run(fixed)
    accounted(started, fixed, [1, 2, 3, 4])
    assert started.rows("big") == [(3, 3.0), (4, 5.0)]
    assert fixed.buffer().rows() == 1


def test_a_row_side_record_that_does_not_fit_on_some_records_commits_nothing(lake):
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    alerts = dsi.OutputTag(
        "alerts",
        schema=T.StructType(
            [T.StructField("tx_id", T.LongType()), T.StructField("n", T.LongType())]
        ),
    )

    def build(bad: bool) -> dsi.SideInputOperator:
        def fn(record, ctx):
            if record.amount > 2:
                ctx.output(alerts, {"tx_id": record.tx_id, "n": "many" if bad else 2})
            yield {"tx_id": record.tx_id, "name": ctx.side_input("profile")["name"]}

        return operator(lake, "rows", fn=fn, side_outputs=[alerts])

    lake.run(build(False))
    put(lake, "transactions", [(2, 10, 1.0), (3, 10, 3.0)], TX)
    op = build(True)
    with (
        refused(dsi.errors.FunctionError, "output 'alerts'", "'many'", fix="declared types"),
        nothing_committed(lake, op),
    ):
        lake.run(op)
    fixed = build(False)
    lake.run(fixed)
    accounted(lake, fixed, [1, 2, 3])
    assert lake.rows("alerts") == [(3, 2)]


# --- declared output schemas in frames mode ---------------------------------------------------

SCHEMA = T.StructType(
    [T.StructField("tx_id", T.LongType()), T.StructField("amount", T.DoubleType())]
)


@pytest.mark.parametrize(
    ("select", "problem"),
    [
        (
            lambda m: m.select("tx_id", F.col("amount").cast("int").alias("amount")),
            "'amount' is int, declared double",
        ),
        (lambda m: m.select("tx_id"), "'amount' is missing"),
        (lambda m: m.select("tx_id", "amount", "customer_id"), "'customer_id' is not declared"),
    ],
    ids=["wrong-type", "missing", "undeclared"],
)
def test_a_frames_output_must_have_its_declared_schema(lake, select, problem):
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    tag = dsi.OutputTag("amounts", schema=SCHEMA)
    build = lambda fn: operator(lake, side_inputs={}, fn=fn, main_output=tag)  # noqa: E731
    op = build(lambda main, sides: select(main))
    with (
        refused(dsi.errors.SchemaMismatchError, "'amounts'", problem, fix="cast"),
        nothing_committed(lake, op),
    ):
        lake.run(op)
    fixed = build(lambda main, sides: main.select("amount", "tx_id"))  # any order will do
    lake.run(fixed)
    accounted(lake, fixed, [1])
    assert lake.rows("amounts") == [(1, 1.0)]


@pytest.mark.parametrize("mode", ["frames", "rows"])
def test_a_route_tag_with_a_schema_must_fit_the_records_routed_there(lake, mode):
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0), (2, None, 1.0)], TX)
    narrow = dsi.OutputTag("invalid", schema=T.StructType([T.StructField("tx_id", T.LongType())]))
    op = operator(
        lake,
        mode,
        routes=dsi.Routes(invalid=narrow),
    )
    with (
        refused(
            dsi.errors.SchemaMismatchError, "routed to 'invalid'", "'customer_id' is not declared"
        ),
        nothing_committed(lake, op),
    ):
        lake.run(op)
    fields = [
        T.StructField(c, t)
        for c, t in (
            ("tx_id", T.LongType()),
            ("customer_id", T.LongType()),
            ("amount", T.DoubleType()),
            ("reason", T.StringType()),
        )
    ]
    fixed = operator(
        lake,
        mode,
        routes=dsi.Routes(invalid=dsi.OutputTag("invalid", schema=T.StructType(fields))),
    )
    lake.run(fixed)
    accounted(lake, fixed, [1, 2])
    assert lake.rows("invalid", "tx_id") == [(2,)]

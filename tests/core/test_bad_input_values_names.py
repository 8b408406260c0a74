"""Bad-input catalogue, issue 37 class 9 (part): edges of values and names.

Window namespaces of every year Spark holds (0001-9999) agree between the driver and
Spark and round-trip; output column names Delta refuses are refused before any Spark job,
naming the column and both fixes; a batch Delta refuses (a CHECK constraint) leaves no
file of its own in the output table's folder.
"""

import datetime as dt
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from dagster_sideinputs.core.windows import namespace_id, namespace_id_column, parse_namespace_id
from tests.core.catalogue import (
    INVALID,
    PROFILES,
    T0,
    TX,
    TXT,
    UTC,
    accounted,
    hours,
    nothing_committed,
    operator,
    put,
    refused,
)
from tests.core.conftest import ALTERNATE, Clock, Lake

DELTA_ENGINES = ("rs", "spark")
ENGINE_MATRIX = ALTERNATE

EDGES = [
    dt.datetime(1, 1, 1, tzinfo=UTC),
    dt.datetime(999, 3, 4, 5, 6, 7, 8, tzinfo=UTC),
    dt.datetime(1000, 1, 1, tzinfo=UTC),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
]


def test_namespaces_of_every_year_agree_between_the_driver_and_spark(spark):
    frame = spark.createDataFrame([(t,) for t in EDGES], "t timestamp")
    found = [r[0] for r in frame.select(namespace_id_column(F.col("t"))).collect()]
    assert found == [namespace_id(t) for t in EDGES]
    assert [parse_namespace_id(ns) for ns in found] == EDGES
    assert sorted(found) == found  # namespaces sort as their instants


def test_a_late_record_of_year_999_goes_to_the_late_route(lake: Lake):
    """Before: buffered under '0999-...' while the plan's late windows said '999-...',
    so it was released as on time."""
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0, T0)], TXT)
    late = dsi.OutputTag("late")
    op = operator(
        lake,
        main=dsi.MainInput("transactions", key="customer_id", event_time="ts"),
        window=dsi.Window.tumbling(hours(1), watermark=hours(1)),
        late=late,
        invalid=INVALID,
    )
    clock = Clock(T0 + hours(3))
    lake.run(op, clock)
    put(lake, "transactions", [(2, 10, 1.0, dt.datetime(999, 6, 1, 12, tzinfo=UTC))], TXT)
    lake.run(op, clock)
    assert lake.rows("late", "tx_id") == [(2,)]
    accounted(lake, op, [1, 2])


# --- output column names Delta refuses ---------------------------------------------------


def _spaced(main, sides):
    return main.select(F.col("tx_id").alias("tx id"), F.col("profile.name").alias("name"))


def _nested(main, sides):
    return main.select("tx_id", F.struct(F.col("profile.name").alias("full=name")).alias("p"))


def _renamed(main, sides):
    return main.select("tx_id", F.col("profile.name").alias("name"))


SPACED_TAG = dsi.OutputTag("enriched", schema=T.StructType([T.StructField("tx id", T.LongType())]))


def _spaced_rows(record, ctx):
    yield {"tx id": record["tx_id"]}


@pytest.mark.both_engines
@pytest.mark.parametrize(
    ("fn", "main_output", "mode", "named"),
    [
        (_spaced, "enriched", "frames", "['tx id']"),
        (_nested, "enriched", "frames", "['p.full=name']"),
        (_spaced_rows, SPACED_TAG, "rows", "['tx id']"),
    ],
    ids=["space", "nested", "tag-schema"],
)
def test_an_output_column_name_delta_refuses_is_named_before_any_write(
    lake: Lake, fn: Any, main_output: Any, mode: str, named: str
):
    """Before: delta-spark failed the write ("Spark cannot plan the function's output",
    a FunctionError), the bridge wrote a table delta-spark cannot write to."""
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0), (2, 10, 2.0)], TX)
    op = operator(lake, mode, fn=fn, main_output=main_output)
    with (
        nothing_committed(lake, op),
        refused(
            dsi.SchemaMismatchError,
            "'enriched'",
            named,
            "unless the table maps column names",
            fix=["rename the column(s)", "'delta.columnMapping.mode' = 'name'"],
        ),
    ):
        lake.run(op)
    assert not lake.exists("enriched")
    fixed = operator(lake, "frames", fn=_renamed, main_output="enriched")
    lake.run(fixed)
    accounted(lake, fixed, [1, 2])


@pytest.mark.both_engines
def test_an_output_table_with_column_mapping_takes_names_delta_refuses_otherwise(lake: Lake):
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0), (2, 10, 2.0)], TX)
    uri = lake.storage.table_uri("enriched")
    if lake.engine_id == "rs":
        # The bridge cannot write a column-mapped table: the fix says to use delta-spark.
        with refused(
            dsi.SchemaMismatchError, "['tx id']", fix="DeltaStorage(engine='delta-spark')"
        ):
            lake.run(operator(lake, fn=_spaced, main_output="enriched"))
        return
    lake.spark.sql(
        f"CREATE TABLE delta.`{uri}` (`tx id` BIGINT, name STRING) USING delta "
        "TBLPROPERTIES ('delta.columnMapping.mode' = 'name')"
    )
    op = operator(lake, fn=_spaced, main_output="enriched")
    lake.run(op)
    assert lake.rows("enriched", "`tx id`") == [(1,), (2,)]

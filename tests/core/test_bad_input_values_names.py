"""Bad-input catalogue, issue 37 class 9 (part): edges of values and names.

Window namespaces of every year Spark holds (0001-9999) agree between the driver and
Spark and round-trip; output column names Delta refuses are refused before any Spark job,
naming the column and both fixes; a batch Delta refuses (a CHECK constraint) leaves no
file of its own in the output table's folder.
"""

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from dagster_sideinputs.core.sideinputs.windows import (
    namespace_id,
    namespace_id_column,
    parse_namespace_id,
)
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
from tests.core.conftest import Clock, Lake

"""The tests run under the engine users get (delta-spark); ``both_engines`` ones, whose
point is a difference between the engines, and all under ``DSI_BOTH_ENGINES=1``, run under
both (tests/core/conftest.py)."""

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
        routes=dsi.Routes(late=late, invalid=INVALID),
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
            dsi.errors.SchemaMismatchError,
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
            dsi.errors.SchemaMismatchError, "['tx id']", fix="DeltaStorage(engine='delta-spark')"
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


# --- a batch Delta refuses leaves nothing in the output's folder ---------------------------


def _amounts(main, sides):
    # Four tasks, so that the ones without the bad row finish and write their files.
    return main.repartition(4, "tx_id").select("tx_id", "amount")


def _capped(main, sides):
    return _amounts(main, sides).where(F.col("amount") < 100)


def _parquet_files(lake: Lake, name: str) -> set[str]:
    root = Path(lake.storage.table_uri(name).removeprefix("file://"))
    return {
        str(p.relative_to(root))
        for p in root.rglob("*.parquet")
        if not any(part.startswith("_") for part in p.relative_to(root).parts[:-1])
    }


def _logged_files(lake: Lake, name: str) -> set[str]:
    return {f.path for f in lake.engine.snapshot(lake.storage.table_uri(name)).files}


@pytest.mark.both_engines
def test_a_batch_refused_by_a_check_constraint_leaves_no_file_in_the_output(lake: Lake):
    """Before: delta-spark's writer left the files of the tasks that had finished in the
    output table's folder, referenced by no commit."""
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(i, 10, float(i)) for i in range(8)], TX)
    uri = lake.storage.table_uri("enriched")
    if lake.engine_id == "spark":
        lake.spark.sql(f"CREATE TABLE delta.`{uri}` (tx_id BIGINT, amount DOUBLE) USING delta")
        lake.spark.sql(f"ALTER TABLE delta.`{uri}` ADD CONSTRAINT small CHECK (amount < 100)")
    else:  # the bridge writes CHECK-constrained tables (delta-rs checks them)
        empty = pa.table({"tx_id": pa.array([], pa.int64()), "amount": pa.array([], pa.float64())})
        write_deltalake(uri, empty)
        DeltaTable(uri).alter.add_constraint({"small": "amount < 100"})
    op = operator(lake, fn=_amounts, main_output="enriched")
    lake.run(op)
    put(lake, "transactions", [(i, 10, 1000.0 if i == 13 else float(i)) for i in range(8, 16)], TX)
    with nothing_committed(lake, op), refused(dsi.errors.SchemaMismatchError, "enriched", "small"):
        lake.run(op)
    assert _parquet_files(lake, "enriched") == _logged_files(lake, "enriched")
    fixed = operator(
        lake,
        fn=_capped,
        main_output="enriched",
        routes=dsi.Routes(invalid=INVALID),
    )
    lake.run(fixed)
    assert _parquet_files(lake, "enriched") == _logged_files(lake, "enriched")
    assert sorted(r[0] for r in lake.rows("enriched", "tx_id")) == [*range(13), 14, 15]

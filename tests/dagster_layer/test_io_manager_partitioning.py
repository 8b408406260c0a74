"""DeltaIOManager refuses a partition key its table cannot hold (issue 37, class 8).

An asset's table and its partitions definition can disagree: the table was written
before the asset was partitioned, by another column, under another partitions definition
(hourly keys for a now-daily asset, plain days for a now multi-partitioned one), or with
a partition column of another type. A load of a partition would then read 0 rows without
a word, and a write fail in the writer with a fix meant for its own callers. Both are
refused with a ``SchemaMismatchError`` naming the asset, the table and a fix that works
(each case applies it and loads the rows). A partition simply absent from a table
partitioned the asset's way still loads as no rows (the documented behaviour).
"""

import datetime as dt
import os
import shutil
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from dagster_sideinputs.dagster_layer.resources import SparkResource
from dagster_sideinputs.errors import SchemaMismatchError
from tests.dagster_layer import test_io_manager as base
from tests.dagster_layer.test_io_manager import DAILY, DAY_1, DAY_2, HOUR_0, HOURLY, rows, run

# The fixtures of test_io_manager.py: a local lake root, the IO manager, a Dagster instance.
instance = base.instance
root = base.root
resources = base.resources

REGIONS = dg.StaticPartitionsDefinition(["eu", "us"])
DAILY_BY_REGION = dg.MultiPartitionsDefinition({"date": DAILY, "region": REGIONS})


def sales(partitions_def: dg.PartitionsDefinition | None = None, **kwargs: Any):
    """Asset ``sales`` (one row per run, naming its partition), under a partitioning."""

    @dg.asset(name="sales", partitions_def=partitions_def, **kwargs)
    def sales_asset(context: dg.AssetExecutionContext, spark: SparkResource) -> DataFrame:
        key = context.partition_key if context.has_partition_key else "all"
        return spark.spark_session.createDataFrame([(f"{key}/1", 10)], "id string, n int")

    return sales_asset


def counted(partitions_def: dg.PartitionsDefinition):
    """Asset ``sales_count`` (same partitions): the rows ``sales`` loads for its key."""

    @dg.asset(partitions_def=partitions_def)
    def sales_count(sales: DataFrame) -> DataFrame:
        return sales.agg(F.count("*").alias("n"))

    return sales_count


def load(resources, instance, upstream, partitions_def, key: str) -> list[dict[str, Any]]:
    run(
        [upstream, counted(partitions_def)],
        resources,
        instance,
        partition_key=key,
        selection=["sales_count"],
    )
    return rows(os.path.join(resources["io_manager"].root, "sales_count"))


def test_a_table_written_unpartitioned_refuses_loads_and_writes_of_a_day(resources, instance, root):
    """Before: loading 2024-05-01 read 0 rows without a word."""
    run([sales()], resources, instance)
    daily = sales(DAILY)
    table = os.path.join(root, "sales")
    with pytest.raises(SchemaMismatchError) as loading:
        load(resources, instance, daily, DAILY, DAY_1)
    for text in ("sales", table, "is not partitioned", DAY_1):
        assert text in loading.value.message
    assert "materialize the asset's partitions again" in str(loading.value.fix)
    with pytest.raises(SchemaMismatchError) as writing:
        run([daily], resources, instance, partition_key=DAY_1)
    assert "Writing partition(s) 2024-05-01 of asset sales" in writing.value.message
    assert table in writing.value.message
    assert rows(table) == [{"id": "all/1", "n": 10}]  # nothing written
    shutil.rmtree(table)  # the fix: a table written partition by partition
    run([daily], resources, instance, partition_key=DAY_1)
    assert load(resources, instance, daily, DAILY, DAY_1) == [{"n": 1, "partition": DAY_1}]


def test_a_table_partitioned_by_another_column_names_it_in_the_fix(resources, instance, root):
    by_day = sales(DAILY, metadata={"partition_column": "day"})
    run([by_day], resources, instance, partition_key=DAY_1)
    with pytest.raises(SchemaMismatchError) as loading:
        load(resources, instance, sales(DAILY), DAILY, DAY_1)
    assert "partitioned by ['day'], not by 'partition'" in loading.value.message
    assert os.path.join(root, "sales") in loading.value.message
    assert '{"partition_column": "day"}' in str(loading.value.fix)
    assert load(resources, instance, by_day, DAILY, DAY_1) == [{"n": 1, "partition": DAY_1}]


def test_a_table_of_hourly_keys_refuses_a_day_it_does_not_hold(resources, instance, root):
    """An hourly asset redeclared daily: loading a day read 0 rows, the hours unread."""
    run([sales(HOURLY)], resources, instance, partition_key=HOUR_0)
    daily = sales(DAILY)
    with pytest.raises(SchemaMismatchError) as loading:
        load(resources, instance, daily, DAILY, DAY_1)
    assert "holds no partition '2024-05-01'" in loading.value.message
    assert HOUR_0 in loading.value.message
    assert "declare the asset's partitions as they were" in str(loading.value.fix)
    run([daily], resources, instance, partition_key=DAY_1)  # the day written: it loads
    assert load(resources, instance, daily, DAILY, DAY_1) == [{"n": 1, "partition": DAY_1}]


def test_a_daily_table_refuses_a_multi_partition_key_it_does_not_hold(resources, instance):
    run([sales(DAILY)], resources, instance, partition_key=DAY_1)
    multi = sales(DAILY_BY_REGION)
    key = dg.MultiPartitionKey({"date": DAY_1, "region": "eu"})
    with pytest.raises(SchemaMismatchError, match=r"holds no partition '2024-05-01\|eu'"):
        load(resources, instance, multi, DAILY_BY_REGION, key)
    run([multi], resources, instance, partition_key=key)
    assert load(resources, instance, multi, DAILY_BY_REGION, key) == [
        {"n": 1, "partition": "2024-05-01|eu"}
    ]


def test_a_partition_column_of_another_type_is_refused_on_load_and_write(resources, instance, root):
    """A table made elsewhere, its ``partition`` column a date: an hourly key cannot be
    held there (before: the load read 0 rows)."""
    table = os.path.join(root, "sales")
    data = pa.table(
        {"id": ["x"], "n": pa.array([1], pa.int32()), "partition": pa.array([dt.date(2024, 5, 1)])}
    )
    write_deltalake(table, data, partition_by=["partition"])
    hourly = sales(HOURLY)
    with pytest.raises(SchemaMismatchError, match=r"column 'partition' of its table .* is date"):
        load(resources, instance, hourly, HOURLY, HOUR_0)
    with pytest.raises(SchemaMismatchError, match="is date"):
        run([hourly], resources, instance, partition_key=HOUR_0)
    assert DeltaTable(table).version() == 0


def test_an_absent_partition_of_a_daily_table_still_loads_as_no_rows(resources, instance):
    """The documented behaviour, kept: the table is the asset's, the day not written yet."""
    daily = sales(DAILY)
    run([daily], resources, instance, partition_key=DAY_1)
    assert load(resources, instance, daily, DAILY, DAY_2) == [{"n": 0, "partition": DAY_2}]


def test_an_unpartitioned_asset_does_not_write_rows_of_no_partition_to_a_partitioned_table(
    resources, instance, root
):
    run([sales(DAILY)], resources, instance, partition_key=DAY_1)
    with pytest.raises(SchemaMismatchError) as writing:
        run([sales()], resources, instance)
    assert "partitioned by ['partition']" in writing.value.message
    assert "declare the asset's partitions_def again" in str(writing.value.fix)
    assert rows(os.path.join(root, "sales")) == [{"id": f"{DAY_1}/1", "n": 10, "partition": DAY_1}]

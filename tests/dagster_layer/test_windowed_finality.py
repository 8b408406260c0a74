"""With Dagster, a side window is final when its partition is materialized: records wait
for their hour's partition and are released hour by hour as partitions materialize (the
run's readiness names the partition); a partition materialized with no rows is final and
empty, so its records go on with the view's empty value instead of waiting forever."""

import datetime as dt
from collections.abc import Iterator

import dagster as dg
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import dagster_sideinputs as dsi

T0 = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)
hourly = dg.HourlyPartitionsDefinition(start_date="2024-05-01-00:00")


@dg.asset(partitions_def=hourly)
def rates(context: dg.AssetExecutionContext, spark: dsi.SparkResource) -> DataFrame:
    """One EUR rate per hour, except hour 1, materialized empty."""
    start = context.partition_time_window.start
    rows = (
        [] if start.hour == 1 else [("EUR", 1.0 + start.hour / 10, start + dt.timedelta(minutes=1))]
    )
    return spark.spark_session.createDataFrame(rows, "currency string, rate double, ts timestamp")


@dsi.side_input_assets(
    main=dsi.MainInput("rate_tx", event_time="ts"),
    side_inputs={
        "rates": dsi.SideInput.list("rates", window=dsi.Window.tumbling(HOUR, time_column="ts"))
    },
    main_output="rated",
    operator_id="rated",
)
def rated(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    return main.select("tx_id", F.size("rates").alias("rates"))


@pytest.fixture
def env(tmp_path) -> Iterator[dict]:
    with dg.instance_for_test() as instance:
        spark = dsi.SparkResource(master="local[2]", ui_enabled=False)
        io = dsi.DeltaIOManager(root=str(tmp_path / "lake"), spark=spark)
        yield {"instance": instance, "resources": {"spark": spark, "io_manager": io}, "io": io}


def materialize(env: dict, **kwargs) -> dg.ExecuteInProcessResult:
    result = dg.materialize(
        [rates, rated], resources=env["resources"], instance=env["instance"], **kwargs
    )
    assert result.success
    return result


def rows(env: dict) -> list[tuple]:
    storage: dsi.DeltaStorage = env["io"].storage
    uri = storage.table_uri("rated")
    if not storage.delta.exists(uri):
        return []
    spark = env["resources"]["spark"].spark_session
    return sorted(tuple(r) for r in dsi.tables.read_table(spark, uri).collect())


def test_a_partition_materialized_with_no_rows_is_final_and_empty(env):
    spark = env["resources"]["spark"].spark_session
    frame = spark.createDataFrame(
        [(1, T0 + dt.timedelta(minutes=10)), (2, T0 + dt.timedelta(minutes=70))],
        "tx_id long, ts timestamp",
    )
    dsi.tables.write_dataframe(frame, env["io"].storage.table_uri("rate_tx"))
    materialize(env, selection=[dg.AssetKey("rated")])
    assert rows(env) == []  # neither partition is materialized: both records wait

    materialize(env, selection=[dg.AssetKey("rates")], partition_key="2024-05-01-00:00")
    materialize(env, selection=[dg.AssetKey("rated")])
    assert rows(env) == [(1, 1)]

    materialize(env, selection=[dg.AssetKey("rates")], partition_key="2024-05-01-01:00")
    result = materialize(env, selection=[dg.AssetKey("rated")])
    assert rows(env) == [(1, 1), (2, 0)]  # hour 1: materialized, no rows: the empty list
    [readiness] = [
        e.step_materialization_data.materialization.metadata["readiness"].value
        for e in result.get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key == dg.AssetKey("rated")
    ]
    assert "partition 2024-05-01-01:00 materialized" in readiness

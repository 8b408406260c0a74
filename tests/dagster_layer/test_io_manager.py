"""DeltaIOManager: Spark DataFrames stored as Delta tables, under real Dagster runs."""

import json
import logging
import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from dagster_sideinputs.dagster_layer.io_manager import DeltaIOManager
from dagster_sideinputs.dagster_layer.resources import SparkResource
from dagster_sideinputs.delta.store.files import normalize_uri
from dagster_sideinputs.errors import DeclarationError, SchemaMismatchError, TableNotFoundError

HOURLY = dg.HourlyPartitionsDefinition(start_date="2024-05-01-00:00", end_date="2024-05-02-00:00")
DAILY = dg.DailyPartitionsDefinition(start_date="2024-05-01", end_date="2024-05-04")
HOUR_0, HOUR_1, HOUR_2 = "2024-05-01-00:00", "2024-05-01-01:00", "2024-05-01-02:00"
DAY_1, DAY_2, DAY_3 = "2024-05-01", "2024-05-02", "2024-05-03"
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as test_instance:
        yield test_instance


@pytest.fixture
def root(request, storage_case, tmp_path, monkeypatch) -> str:
    """The lake root: a local folder, or (``each_storage`` tests) an ``s3a://`` prefix on
    the S3 test server configured the deployment way, by the ``AWS_*`` environment
    variables alone (the IO manager gets no storage options; delta-rs in ``rows`` reads
    the same variables). Under ``s3-native`` the IO manager's engine is delta-spark (by
    ``DSI_DELTA_ENGINE``, as a deployment would choose it)."""
    if storage_case.engine_name:
        monkeypatch.setenv("DSI_DELTA_ENGINE", storage_case.engine_name)
    if storage_case.store == "s3":
        server = request.getfixturevalue("s3_server")
        for name, value in server.storage_options.items():
            monkeypatch.setenv(name, value)
        return server.fresh_prefix("io").replace("s3://", "s3a://", 1)
    return str(tmp_path / "lake")


@pytest.fixture
def resources(spark, root) -> dict[str, Any]:
    """The resource reuses the shared test session (getOrCreate), as a deployment would."""
    spark_resource = SparkResource(master="local[2]", ui_enabled=False, log_level="ERROR")
    return {"spark": spark_resource, "io_manager": DeltaIOManager(root=root, spark=spark_resource)}


def run(
    assets: Sequence[dg.AssetsDefinition],
    resources: dict[str, Any],
    instance: dg.DagsterInstance,
    **kwargs: Any,
) -> dg.ExecuteInProcessResult:
    return dg.materialize(assets, resources=resources, instance=instance, **kwargs)


def rows(uri: str) -> list[dict[str, Any]]:
    """The table's live rows, read with delta-rs (not through the code under test)."""
    return sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=repr)


def partition_files(uri: str, key: str) -> set[str]:
    return set(DeltaTable(uri).file_uris(partition_filters=[("partition", "=", key)]))


def materialization_metadata(result: dg.ExecuteInProcessResult, node: str) -> dict[str, Any]:
    [materialization] = result.asset_materializations_for_node(node)
    return {key: value.value for key, value in materialization.metadata.items()}


def orders_asset(**asset_kwargs: Any) -> dg.AssetsDefinition:
    @dg.asset(name="orders", **asset_kwargs)
    def orders(spark: SparkResource) -> DataFrame:
        return spark.spark_session.createDataFrame([(1, "a"), (2, "b")], "id long, name string")

    return orders


@dg.asset(partitions_def=HOURLY)
def hourly_events(context: dg.AssetExecutionContext, spark: SparkResource) -> DataFrame:
    return spark.spark_session.createDataFrame(
        [(1, f"event of {context.partition_key}"), (2, f"event of {context.partition_key}")],
        "id long, what string",
    )


@dg.asset(partitions_def=DAILY)
def daily_sales(context: dg.AssetExecutionContext, spark: SparkResource) -> DataFrame:
    day = context.partition_key
    return spark.spark_session.createDataFrame(
        [(f"{day}/1", 10), (f"{day}/2", 20)], "id string, n int"
    )


# --- writing -------------------------------------------------------------------------


def test_asset_key_prefix_becomes_nested_table_folders(resources, instance, root):
    orders = orders_asset(key_prefix=["shop", "eu"])
    run([orders], resources, instance)
    assert rows(os.path.join(root, "shop", "eu", "orders")) == [
        {"id": 1, "name": "a"},
        {"id": 2, "name": "b"},
    ]


@pytest.mark.each_storage
def test_partitioned_asset_rewrites_only_its_partition(resources, instance, root, storage_case):
    uri = os.path.join(root, "hourly_events")
    run([hourly_events], resources, instance, partition_key=HOUR_0)
    run([hourly_events], resources, instance, partition_key=HOUR_1)
    untouched = partition_files(uri, HOUR_0)
    assert untouched
    result = run([hourly_events], resources, instance, partition_key=HOUR_1)
    if storage_case.native:
        assert materialization_metadata(result, "hourly_events")["delta_engine"] == "delta-spark"
    assert partition_files(uri, HOUR_0) == untouched
    # HOUR_1, materialized twice, holds its rows once; every row is its partition's.
    assert sorted((r["partition"], r["id"]) for r in rows(uri)) == [
        (HOUR_0, 1),
        (HOUR_0, 2),
        (HOUR_1, 1),
        (HOUR_1, 2),
    ]
    assert all(r["what"] == f"event of {r['partition']}" for r in rows(uri))
    assert DeltaTable(uri).metadata().partition_columns == ["partition"]


def test_partition_range_run_writes_every_partition_of_the_range(resources, instance, root):
    @dg.asset(name="hourly_events", partitions_def=HOURLY)
    def hourly_range(context: dg.AssetExecutionContext, spark: SparkResource) -> DataFrame:
        rows = [(1, "from a range", key) for key in context.partition_keys]
        return spark.spark_session.createDataFrame(rows, "id long, what string, partition string")

    uri = os.path.join(root, "hourly_events")
    run([hourly_events], resources, instance, partition_key=HOUR_2)
    run([hourly_range], resources, instance, tags={RANGE_START: HOUR_0, RANGE_END: HOUR_1})
    run([hourly_range], resources, instance, tags={RANGE_START: HOUR_0, RANGE_END: HOUR_1})
    assert sorted((r["partition"], r["id"]) for r in rows(uri)) == [
        (HOUR_0, 1),
        (HOUR_1, 1),
        (HOUR_2, 1),
        (HOUR_2, 2),
    ]


def test_partition_range_run_without_partition_column_names_the_column(resources, instance):
    @dg.asset(name="hourly_events", partitions_def=HOURLY)
    def hourly_range(spark: SparkResource) -> DataFrame:
        return spark.spark_session.createDataFrame([(1,)], "id long")

    with pytest.raises(SchemaMismatchError, match=r"2 partitions in one run.*'partition'"):
        run([hourly_range], resources, instance, tags={RANGE_START: HOUR_0, RANGE_END: HOUR_1})


def test_partition_by_metadata_partitions_an_unpartitioned_assets_table(resources, instance, root):
    orders = orders_asset(metadata={"partition_by": ["name"]})
    run([orders], resources, instance)
    table = DeltaTable(os.path.join(root, "orders"))
    assert table.metadata().partition_columns == ["name"]


def test_schema_mode_merge_adds_a_new_column_on_append(resources, instance, root):
    @dg.asset(name="orders", metadata={"write_mode": "append", "schema_mode": "merge"})
    def wider(spark: SparkResource) -> DataFrame:
        return spark.spark_session.createDataFrame(
            [(3, "c", 9.5)], "id long, name string, x double"
        )

    run([orders_asset()], resources, instance)
    run([wider], resources, instance)
    assert rows(os.path.join(root, "orders")) == [
        {"id": 1, "name": "a", "x": None},
        {"id": 2, "name": "b", "x": None},
        {"id": 3, "name": "c", "x": 9.5},
    ]


def test_new_column_without_schema_mode_is_rejected_and_table_unchanged(resources, instance, root):
    @dg.asset(name="orders", metadata={"write_mode": "append"})
    def wider(spark: SparkResource) -> DataFrame:
        return spark.spark_session.createDataFrame(
            [(3, "c", 9.5)], "id long, name string, x double"
        )

    run([orders_asset()], resources, instance)
    with pytest.raises(SchemaMismatchError):
        run([wider], resources, instance)
    assert DeltaTable(os.path.join(root, "orders")).version() == 0


def test_an_overwrite_with_another_schema_names_the_overwrite_and_its_fix(
    resources, instance, root
):
    """Before: "Cannot append to table ...; pass schema_mode="merge"" for an overwrite,
    whose fix is to replace the schema (the asset's schema_mode metadata)."""

    def renamed(**asset_kwargs: Any) -> dg.AssetsDefinition:
        @dg.asset(name="orders", **asset_kwargs)
        def orders(spark: SparkResource) -> DataFrame:
            return spark.spark_session.createDataFrame([(3, "c")], "id long, label string")

        return orders

    run([orders_asset()], resources, instance)
    with pytest.raises(SchemaMismatchError) as caught:
        run([renamed()], resources, instance)
    assert "Cannot overwrite table orders keeping its schema" in caught.value.message
    assert "'label'" in caught.value.message
    assert caught.value.fix is not None
    assert 'metadata={"schema_mode": "overwrite"} on the asset' in caught.value.fix
    assert "merge" not in caught.value.fix
    assert DeltaTable(os.path.join(root, "orders")).version() == 0
    run([renamed(metadata={"schema_mode": "overwrite"})], resources, instance)
    assert rows(os.path.join(root, "orders")) == [{"id": 3, "label": "c"}]


# --- materialization metadata ----------------------------------------------------------


def test_materialization_reports_version_rows_uri_and_column_schema(resources, instance, root):
    orders = orders_asset()
    first = materialization_metadata(run([orders], resources, instance), "orders")
    second = materialization_metadata(run([orders], resources, instance), "orders")
    uri = os.path.join(root, "orders")
    # Materialized twice, the unpartitioned asset's table holds its rows once.
    assert rows(uri) == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    assert DeltaTable(uri).version() == 1
    assert first["delta_version"] == 0
    assert second["delta_version"] == 1
    assert second["dagster/row_count"] == 2
    assert second["dagster/uri"] == normalize_uri(os.path.join(root, "orders"))
    assert second["dagster/column_schema"] == dg.TableSchema(
        columns=[dg.TableColumn("id", "bigint"), dg.TableColumn("name", "string")]
    )


def test_append_reports_rows_written_and_the_tables_total_row_count(resources, instance, root):
    orders = orders_asset(metadata={"write_mode": "append"})
    first = materialization_metadata(run([orders], resources, instance), "orders")
    second = materialization_metadata(run([orders], resources, instance), "orders")
    assert (first["rows_written"], first["dagster/row_count"]) == (2, 2)
    assert (second["rows_written"], second["dagster/row_count"]) == (2, 4)
    assert rows(os.path.join(root, "orders")) == [  # each materialization's rows, added
        {"id": 1, "name": "a"},
        {"id": 1, "name": "a"},
        {"id": 2, "name": "b"},
        {"id": 2, "name": "b"},
    ]


def test_partition_append_counts_the_rows_of_that_partition_only(resources, instance, root):
    @dg.asset(name="events", partitions_def=HOURLY, metadata={"write_mode": "append"})
    def events(context: dg.AssetExecutionContext, spark: SparkResource) -> DataFrame:
        return spark.spark_session.createDataFrame([(context.run.run_id,)], "run string")

    first = run([events], resources, instance, partition_key=HOUR_0)
    other = run([events], resources, instance, partition_key=HOUR_1)
    result = run([events], resources, instance, partition_key=HOUR_0)
    again = materialization_metadata(result, "events")
    assert (again["rows_written"], again["dagster/row_count"]) == (1, 2)
    # The append to HOUR_0 kept its earlier row (and HOUR_1 its own).
    assert sorted((r["partition"], r["run"]) for r in rows(os.path.join(root, "events"))) == sorted(
        [(HOUR_0, first.run_id), (HOUR_1, other.run_id), (HOUR_0, result.run_id)]
    )


def test_io_manager_without_spark_fails_where_it_is_made_naming_the_fix(root):
    with pytest.raises(DeclarationError, match="no SparkResource") as raised:
        DeltaIOManager(root=root)
    assert "spark=spark" in str(raised.value)


def test_partitioned_materialization_reports_the_partitions_rows_and_key_column(
    resources, instance
):
    result = run([hourly_events], resources, instance, partition_key=HOUR_0)
    metadata = materialization_metadata(result, "hourly_events")
    assert metadata["dagster/row_count"] == 2
    assert [c.name for c in metadata["dagster/column_schema"].columns] == [
        "id",
        "what",
        "partition",
    ]


def test_materialization_reports_files_and_bytes_added(resources, instance):
    metadata = materialization_metadata(run([orders_asset()], resources, instance), "orders")
    assert metadata["files_added"] >= 1
    assert metadata["bytes_added"] > 0


def test_commit_records_the_dagster_run_and_asset(resources, instance, root):
    result = run([orders_asset(key_prefix=["shop"])], resources, instance)
    [commit] = DeltaTable(os.path.join(root, "shop", "orders")).history(1)
    # The bridge commits the metadata as commitInfo fields; delta-spark as userMetadata
    # (JSON), the only commit metadata Delta's writer takes.
    recorded = json.loads(commit["userMetadata"]) if "userMetadata" in commit else commit
    assert recorded["dagster.run_id"] == result.run_id
    assert recorded["dagster.asset"] == "shop/orders"


# --- loading ---------------------------------------------------------------------------


def test_upstream_materialized_in_an_earlier_run_is_loaded_from_its_table(
    resources, instance, root
):
    @dg.asset
    def order_count(orders: DataFrame) -> DataFrame:
        return orders.agg(F.count("*").alias("n"))

    orders = orders_asset()
    run([orders], resources, instance)
    run([orders], resources, instance)
    result = run([orders, order_count], resources, instance, selection=[order_count])
    assert rows(os.path.join(root, "order_count")) == [{"n": 2}]
    [loaded] = [e for e in result.all_events if e.event_type_value == "LOADED_INPUT"]
    assert loaded.event_specific_data.metadata["delta_version"].value == 1


def test_daily_downstream_reads_only_its_upstream_partition(resources, instance, root):
    @dg.asset(partitions_def=DAILY)
    def daily_ids(daily_sales: DataFrame) -> DataFrame:
        return daily_sales.select("id", F.col("partition").alias("from_partition"))

    for day in (DAY_1, DAY_2, DAY_3):
        run([daily_sales], resources, instance, partition_key=day)
    run([daily_sales, daily_ids], resources, instance, partition_key=DAY_2, selection=[daily_ids])
    assert rows(os.path.join(root, "daily_ids")) == [
        {"id": f"{DAY_2}/1", "from_partition": DAY_2, "partition": DAY_2},
        {"id": f"{DAY_2}/2", "from_partition": DAY_2, "partition": DAY_2},
    ]


def test_daily_downstream_of_hourly_upstream_reads_the_hours_of_its_day(resources, instance, root):
    @dg.asset(partitions_def=DAILY)
    def daily_event_count(hourly_events: DataFrame) -> DataFrame:
        return hourly_events.agg(F.count("*").alias("n"))

    for hour in (HOUR_0, HOUR_2):
        run([hourly_events], resources, instance, partition_key=hour)
    run(
        [hourly_events, daily_event_count],
        resources,
        instance,
        partition_key=DAY_1,
        selection=[daily_event_count],
    )
    assert rows(os.path.join(root, "daily_event_count")) == [{"n": 4, "partition": DAY_1}]


def test_unpartitioned_downstream_reads_every_upstream_partition(resources, instance, root):
    @dg.asset
    def sales_per_day(daily_sales: DataFrame) -> DataFrame:
        return daily_sales.groupBy(F.col("partition").alias("day")).agg(F.sum("n").alias("n"))

    for day in (DAY_1, DAY_3):
        run([daily_sales], resources, instance, partition_key=day)
    run([daily_sales, sales_per_day], resources, instance, selection=[sales_per_day])
    assert rows(os.path.join(root, "sales_per_day")) == [
        {"day": DAY_1, "n": 30},
        {"day": DAY_3, "n": 30},
    ]


def test_partition_column_metadata_names_the_key_column_for_writes_and_reads(
    resources, instance, root
):
    @dg.asset(name="daily_sales", partitions_def=DAILY, metadata={"partition_column": "day"})
    def keyed_by_day(context: dg.AssetExecutionContext, spark: SparkResource) -> DataFrame:
        # Its own `partition` column is fine once the key goes to another column.
        day = context.partition_key
        return spark.spark_session.createDataFrame(
            [(f"{day}/1", "p")], "id string, partition string"
        )

    @dg.asset(partitions_def=DAILY)
    def daily_ids(daily_sales: DataFrame) -> DataFrame:
        return daily_sales.select("id", F.col("day").alias("from_day"))

    for day in (DAY_1, DAY_2):
        run([keyed_by_day], resources, instance, partition_key=day)
    run([keyed_by_day, daily_ids], resources, instance, partition_key=DAY_1, selection=[daily_ids])
    assert DeltaTable(os.path.join(root, "daily_sales")).metadata().partition_columns == ["day"]
    assert rows(os.path.join(root, "daily_ids")) == [
        {"id": f"{DAY_1}/1", "from_day": DAY_1, "partition": DAY_1}
    ]


def test_loading_an_upstream_that_was_never_materialized_names_it(resources, instance):
    @dg.asset
    def order_count(orders: DataFrame) -> DataFrame:
        return orders.agg(F.count("*").alias("n"))

    with pytest.raises(TableNotFoundError, match="orders"):
        run([orders_asset(), order_count], resources, instance, selection=[order_count])


# --- errors ----------------------------------------------------------------------------


def test_asset_returning_a_non_dataframe_raises_declaration_error_naming_it(
    resources, instance, root
):
    @dg.asset(key_prefix=["shop"])
    def not_a_frame() -> list[int]:
        return [1, 2]

    with pytest.raises(DeclarationError, match=r"Asset shop/not_a_frame returned a list") as info:
        run([not_a_frame], resources, instance)
    assert "io_manager_key" in str(info.value.fix)
    assert not os.path.exists(os.path.join(root, "shop", "not_a_frame"))


def test_invalid_write_mode_names_the_asset_and_the_allowed_modes(resources, instance, root):
    orders = orders_asset(metadata={"write_mode": "upsert"})
    with pytest.raises(DeclarationError, match=r"Asset orders has write_mode='upsert'") as info:
        run([orders], resources, instance)
    assert "'overwrite', 'append'" in info.value.message
    assert not os.path.exists(os.path.join(root, "orders"))


def test_invalid_schema_mode_names_the_asset_and_the_allowed_modes(resources, instance, root):
    orders = orders_asset(metadata={"schema_mode": "merged"})
    with pytest.raises(DeclarationError, match=r"Asset orders has schema_mode='merged'") as info:
        run([orders], resources, instance)
    assert "'merge', 'overwrite'" in info.value.message
    assert not os.path.exists(os.path.join(root, "orders"))


def test_partition_by_given_as_a_string_is_one_column(resources, instance, root):
    orders = orders_asset(metadata={"partition_by": "name"})
    run([orders], resources, instance)
    assert DeltaTable(os.path.join(root, "orders")).metadata().partition_columns == ["name"]


def test_partitioned_asset_with_its_own_partition_column_raises_schema_mismatch(
    resources, instance, root
):
    @dg.asset(partitions_def=DAILY)
    def clashing(spark: SparkResource) -> DataFrame:
        return spark.spark_session.createDataFrame([(1, "x")], "id long, partition string")

    with pytest.raises(
        SchemaMismatchError, match=r"Asset clashing already has a column 'partition'"
    ) as info:
        run([clashing], resources, instance, partition_key=DAY_1)
    assert "partition_column" in str(info.value.fix)
    assert not os.path.exists(os.path.join(root, "clashing"))


def test_engine_auto_writes_with_delta_spark_in_a_delta_session_and_says_so(spark, instance, root):
    spark_resource = SparkResource(master="local[2]", ui_enabled=False, log_level="ERROR")
    native = {
        "spark": spark_resource,
        "io_manager": DeltaIOManager(root=root, spark=spark_resource, engine="auto"),
    }

    @dg.asset
    def order_count(orders: DataFrame) -> DataFrame:
        return orders.groupBy().count()

    result = run([orders_asset(), order_count], native, instance)
    metadata = materialization_metadata(result, "orders")
    assert metadata["delta_engine"] == "delta-spark"
    history = spark.sql(f"DESCRIBE HISTORY delta.`{os.path.join(root, 'orders')}`").collect()
    assert "Delta-Lake/" in history[0].engineInfo
    assert rows(os.path.join(root, "order_count")) == [{"count": 2}]

    bridge = materialization_metadata(
        run([orders_asset()], resources_of(root, engine="delta-rs"), instance), "orders"
    )
    assert bridge["delta_engine"] == "delta-rs bridge"
    assert bridge["delta_version"] == 1  # the bridge continued the table delta-spark made


def resources_of(root: str, **io_manager: Any) -> dict[str, Any]:
    spark_resource = SparkResource(master="local[2]", ui_enabled=False, log_level="ERROR")
    return {
        "spark": spark_resource,
        "io_manager": DeltaIOManager(root=root, spark=spark_resource, **io_manager),
    }


# --- object store credentials ---------------------------------------------------------


@pytest.mark.s3
def test_s3_credentials_given_as_env_vars_stay_out_of_dagster_logs_and_the_lake(
    spark, s3_server, instance, monkeypatch, caplog, capfd
):
    """Known fake credentials (moto accepts any), given the Dagster way: they reach Spark
    and delta-rs, and appear nowhere else: not in the instance's storage (runs, events,
    metadata, compute logs), the logs, the error of a failed write, or the lake's objects.
    A bucket of its own, so that Spark builds its s3a client with these credentials."""
    bucket = f"secrets-{uuid.uuid4().hex[:8]}"
    s3_server.client().create_bucket(Bucket=bucket)
    fake = {
        "DSI_TEST_KEY": f"AKIAFAKE{uuid.uuid4().hex[:12].upper()}",
        "DSI_TEST_SECRET": f"fake-secret-{uuid.uuid4().hex}",
        "DSI_TEST_TOKEN": f"fake-token-{uuid.uuid4().hex}",
    }
    for name, value in fake.items():
        monkeypatch.setenv(name, value)
    caplog.set_level(logging.DEBUG)

    def io_manager(root: str, spark_resource: SparkResource) -> DeltaIOManager:
        return DeltaIOManager(
            root=root,
            storage_options={
                "AWS_ENDPOINT_URL": s3_server.endpoint_url,
                "AWS_ACCESS_KEY_ID": dg.EnvVar("DSI_TEST_KEY"),
                "AWS_SECRET_ACCESS_KEY": dg.EnvVar("DSI_TEST_SECRET"),
                "AWS_SESSION_TOKEN": dg.EnvVar("DSI_TEST_TOKEN"),
            },
            spark=spark_resource,
        )

    @dg.asset
    def order_names(orders: DataFrame) -> DataFrame:
        return orders.select(F.upper("name").alias("name"))

    spark_resource = SparkResource(master="local[2]", ui_enabled=False, log_level="ERROR")
    root = f"s3a://{bucket}/lake"
    good = {"spark": spark_resource, "io_manager": io_manager(root, spark_resource)}
    assert run([orders_asset(), order_names], good, instance).success
    missing = {
        "spark": spark_resource,
        "io_manager": io_manager("s3a://no-such-bucket/x", spark_resource),
    }
    failed = run([orders_asset()], missing, instance, raise_on_error=False)
    assert not failed.success
    [failure] = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
    error = str(failure.event_specific_data.error)
    assert "no-such-bucket" in error

    out, err = capfd.readouterr()
    texts = {"error": error, "stdout": out, "stderr": err, "log records": caplog.text}
    texts["events"] = "\n".join(
        repr(entry)
        for record in instance.get_run_records()
        for entry in instance.all_logs(record.dagster_run.run_id)
    )
    assert "STEP_FAILURE" in texts["events"]
    found = [
        f"{where}: {name}"
        for where, text in texts.items()
        for name, value in fake.items()
        if value in text
    ]
    for directory, _, names in os.walk(instance.root_directory):
        for file in names:
            data = (Path(directory) / file).read_bytes()
            found += [f"{file}: {name}" for name, value in fake.items() if value.encode() in data]
    lake_keys = s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]
    for item in lake_keys:
        body = s3_server.client().get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        found += [
            f"{item['Key']}: {name}" for name, value in fake.items() if value.encode() in body
        ]
    assert not found, found
    assert any(
        k["Key"].endswith("lake/orders/_delta_log/00000000000000000000.json") for k in lake_keys
    )
    # The credentials were used: Spark has them, for this bucket only (read last: py4j's
    # DEBUG log shows the answer).
    assert spark.conf.get(f"fs.s3a.bucket.{bucket}.secret.key") == fake["DSI_TEST_SECRET"]
    assert any(os.scandir(instance.root_directory))  # the instance did store things

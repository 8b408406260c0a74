"""The Dagster layer: operator assets, readiness from the instance, jobs, sensors, replays."""

import datetime as dt
import time
from collections.abc import Iterator

import dagster as dg
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import dagster_sideinputs as dsi

FLAGGED = dsi.OutputTag("flagged")
UNMATCHED = dsi.OutputTag("unmatched")
TX_SCHEMA = "tx_id long, customer_id long, amount double, ts timestamp"
T0 = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)


class Batch(dg.Config):
    rows: list[list[float]]  # tx_id, customer_id, amount, minutes after T0


def batch_config(*rows: tuple[int, int, float, float]) -> dict:
    return {"ops": {"tx": {"config": {"rows": [list(r) for r in rows]}}}}


@dg.asset(metadata={"write_mode": "append"})
def tx(config: Batch, spark: dsi.SparkResource) -> DataFrame:
    rows = [(int(t), int(c), float(a), T0 + dt.timedelta(minutes=m)) for t, c, a, m in config.rows]
    return spark.spark_session.createDataFrame(rows, TX_SCHEMA)


class Profiles(dg.Config):
    customers: list[int] = [10, 11]


@dg.asset
def profiles(config: Profiles, spark: dsi.SparkResource) -> DataFrame:
    return spark.spark_session.createDataFrame(
        [(c, f"customer {c}") for c in config.customers], "customer_id long, name string"
    )


@dg.asset(freshness_policy=dg.FreshnessPolicy.time_window(fail_window=dt.timedelta(minutes=1)))
def rules(spark: dsi.SparkResource) -> DataFrame:
    return spark.spark_session.createDataFrame([(100.0,)], "threshold double")


hourly = dg.HourlyPartitionsDefinition(start_date="2024-05-01-00:00")


@dg.asset(partitions_def=hourly)
def fx(context: dg.AssetExecutionContext, spark: dsi.SparkResource) -> DataFrame:
    start = context.partition_time_window.start
    return spark.spark_session.createDataFrame(
        [("EUR", 1.0 + start.hour / 10, start + dt.timedelta(minutes=1))],
        "currency string, rate double, ts timestamp",
    )


@dsi.side_input_assets(
    main=dsi.MainInput("tx", key="customer_id", event_time="ts"),
    side_inputs={
        "profile": dsi.SideInput.map("profiles", key="customer_id", missing="unmatched"),
        "rules": dsi.SideInput.singleton("rules"),
    },
    main_output="enriched",
    side_outputs=[FLAGGED],
    unmatched=UNMATCHED,
    group_name="test_payments",
)
def enrich(main: DataFrame, sides: dsi.SideInputs) -> dsi.Outputs:
    """Profiles and a fraud flag."""
    enriched = main.select("tx_id", "customer_id", "amount", F.col("profile.name").alias("name"))
    return {
        dsi.MAIN: enriched,
        FLAGGED: enriched.filter(F.col("amount") > sides["rules"].threshold),
    }


@dsi.side_input_assets(
    main=dsi.MainInput("fx_tx", event_time="ts"),
    side_inputs={
        "fx": dsi.SideInput.map(
            "fx",
            key="currency",
            window=dsi.Window.tumbling(dt.timedelta(hours=1), time_column="ts"),
        )
    },
    main_output="converted",
    operator_id="converted",
)
def convert(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    return main.select("tx_id", F.col("fx.rate").alias("rate"))


enrich_job = dsi.build_side_input_job(enrich)
replay_job = dsi.build_replay_job(enrich, UNMATCHED)
sensor = dsi.build_side_input_sensor(enrich, job=enrich_job)


@pytest.fixture
def env(tmp_path) -> Iterator[dict]:
    with dg.instance_for_test() as instance:
        spark = dsi.SparkResource(master="local[2]", ui_enabled=False)
        io = dsi.DeltaIOManager(root=str(tmp_path / "lake"), spark=spark)
        resources = {"spark": spark, "io_manager": io}
        defs = dg.Definitions(
            assets=[tx, profiles, rules, fx, enrich, convert],
            jobs=[enrich_job, replay_job],
            sensors=[sensor],
            resources=resources,
        )
        yield {"instance": instance, "resources": resources, "defs": defs, "storage": io.storage}


def run(env: dict, job: str = "enrich_job", **kwargs) -> dg.ExecuteInProcessResult:
    result = env["defs"].resolve_job_def(job).execute_in_process(instance=env["instance"], **kwargs)
    assert result.success
    return result


def materialize(env: dict, assets: list, **kwargs) -> None:
    assert dg.materialize(
        assets, resources=env["resources"], instance=env["instance"], **kwargs
    ).success


def rows(env: dict, table: str, *columns: str) -> list[tuple]:
    storage: dsi.DeltaStorage = env["storage"]
    uri = storage.table_uri(table)
    if not storage.delta.exists(uri):
        return []
    frame = dsi.read_table(env["resources"]["spark"].spark_session, uri)
    return sorted(tuple(r) for r in frame.select(*(columns or frame.columns)).collect())


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    events = [
        e.step_materialization_data.materialization
        for e in result.get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key == dg.AssetKey(asset)
    ]
    return {k: v.value for k, v in events[-1].metadata.items()}


def test_outputs_are_assets_depending_on_the_main_and_every_side_input():
    keys = {dg.AssetKey("enriched"), dg.AssetKey("flagged"), dg.AssetKey("unmatched")}
    assert set(enrich.keys) == keys
    for key in keys:
        assert enrich.asset_deps[key] == {
            dg.AssetKey("tx"),
            dg.AssetKey("profiles"),
            dg.AssetKey("rules"),
        }
        spec = enrich.specs_by_key[key]
        assert spec.kinds == {"spark", "delta"}
        assert spec.group_name == "test_payments"
        assert "side-input operator 'enrich'" in spec.description
    assert {c.name for c in enrich.check_specs} == {
        "buffer_within_limits",
        "side_inputs_ready",
        "records_accounted_for",
    }


def test_example_code_location_loads_with_its_lineage():
    from assets.definitions import defs

    dg.Definitions.validate_loadable(defs)
    graph = defs.get_repository_def().asset_graph
    parents = graph.get(dg.AssetKey("enriched_transactions")).parent_keys
    assert parents == {
        dg.AssetKey(k) for k in ("transactions", "customer_profiles", "fx_rates", "fraud_rules")
    }


def test_a_bad_declaration_fails_at_import_not_at_run():
    with pytest.raises(dsi.DeclarationError, match="unmatched tag"):

        @dsi.side_input_assets(
            main=dsi.MainInput("tx", key="customer_id"),
            side_inputs={
                "p": dsi.SideInput.map("profiles", key="customer_id", missing="unmatched")
            },
            main_output="out",
        )
        def broken(main, sides):
            return main


def test_job_run_reports_metadata_and_checks(env):
    materialize(env, [profiles, rules])
    materialize(
        env, [tx], run_config=batch_config((1, 10, 5.0, 0), (2, 11, 500.0, 1), (3, 99, 1.0, 2))
    )
    result = run(env)
    meta = metadata(result, "enriched")
    assert meta["rows_written"] == 2
    assert meta["records_in"] == 3
    assert meta["delta_version"] == 0
    assert meta["buffered_rows"] == 0
    assert meta["side_input_versions"] == {"profile": 0, "rules": 0}
    assert "| rules | global | yes |" in meta["readiness"]
    assert meta["throughput_records_per_s"] > 0
    assert [c.name for c in meta["dagster/column_schema"].columns] == [
        "tx_id",
        "customer_id",
        "amount",
        "name",
    ]
    assert metadata(result, "flagged")["rows_written"] == 1
    assert metadata(result, "unmatched")["rows_written"] == 1
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {
        "buffer_within_limits": True,
        "side_inputs_ready": True,
        "records_accounted_for": True,
    }
    run(env)  # a second run: nothing new, nothing written twice
    assert rows(env, "enriched", "tx_id") == [(1,), (2,)]


@pytest.mark.slow
def test_records_wait_while_a_side_input_is_stale_and_go_after_it_is_rematerialized(env):
    materialize(env, [profiles, rules])
    materialize(env, [tx], run_config=batch_config((1, 10, 5.0, 0)))
    run(env)
    time.sleep(62)  # the rules' freshness policy allows one minute
    materialize(env, [tx], run_config=batch_config((2, 11, 6.0, 5)))
    stale = run(env)
    assert rows(env, "enriched", "tx_id") == [(1,)]
    meta = metadata(stale, "enriched")
    assert meta["buffered_rows"] == 1
    assert "stale: materialized" in meta["readiness"]
    materialize(env, [rules])
    run(env)
    assert rows(env, "enriched", "tx_id") == [(1,), (2,)]


def test_windowed_side_input_releases_hour_by_hour_as_partitions_materialize(env, spark):
    frame = spark.createDataFrame(
        [(1, "EUR", T0 + dt.timedelta(minutes=10)), (2, "EUR", T0 + dt.timedelta(minutes=70))],
        "tx_id long, currency string, ts timestamp",
    )
    dsi.write_dataframe(frame, env["storage"].table_uri("fx_tx"))

    def convert_now() -> dg.ExecuteInProcessResult:
        result = dg.materialize(
            [fx, convert],
            selection=[dg.AssetKey("converted")],
            resources=env["resources"],
            instance=env["instance"],
        )
        assert result.success
        return result

    convert_now()
    assert rows(env, "converted") == []
    materialize(env, [fx], partition_key="2024-05-01-00:00")
    convert_now()
    assert rows(env, "converted") == [(1, 1.0)]
    materialize(env, [fx], partition_key="2024-05-01-01:00")
    result = convert_now()
    assert rows(env, "converted") == [(1, 1.0), (2, 1.1)]
    assert "partition 2024-05-01-01:00 materialized" in metadata(result, "converted")["readiness"]


def test_sensor_requests_each_piece_of_work_once_and_says_why_it_skips(env):
    repository = env["defs"].get_repository_def()
    io = {"io_manager": env["resources"]["io_manager"]}

    def tick(cursor):
        with dg.build_sensor_context(
            instance=env["instance"], cursor=cursor, repository_def=repository, resources=io
        ) as context:
            return sensor.evaluate_tick(context)

    first = tick(None)
    assert not first.run_requests
    assert "Nothing to process" in first.skip_message

    materialize(env, [rules])
    materialize(env, [tx], run_config=batch_config((1, 10, 5.0, 0)))
    second = tick(first.cursor)
    assert len(second.run_requests) == 1
    assert "versions (-1, 0]" in second.run_requests[0].tags["dsi/reason"]
    again = tick(second.cursor)
    assert not again.run_requests
    assert "already requested" in again.skip_message

    run(env)  # profiles missing: the record is routed to unmatched (missing="unmatched")
    idle = tick(again.cursor)
    assert not idle.run_requests
    assert "processed up to version 0" in idle.skip_message

    materialize(env, [tx], run_config=batch_config((2, 10, 5.0, 1)))
    new = tick(idle.cursor)
    assert len(new.run_requests) == 1
    assert new.run_requests[0].run_key != second.run_requests[0].run_key


def test_replay_job_feeds_unmatched_records_back_exactly_once(env):
    materialize(env, [rules])
    materialize(env, [profiles], run_config={"ops": {"profiles": {"config": {"customers": [10]}}}})
    materialize(env, [tx], run_config=batch_config((1, 10, 5.0, 0), (2, 11, 6.0, 1)))
    run(env)
    assert rows(env, "unmatched", "tx_id") == [(2,)]
    materialize(
        env, [profiles], run_config={"ops": {"profiles": {"config": {"customers": [10, 11]}}}}
    )
    run(env, replay_job.name)
    run(env, replay_job.name)
    assert rows(env, "enriched", "tx_id", "name") == [(1, "customer 10"), (2, "customer 11")]


def test_continuous_mode_materializes_every_micro_batch(env):
    materialize(env, [profiles, rules])
    materialize(env, [tx], run_config=batch_config((1, 10, 5.0, 0)))
    result = run(
        env,
        run_config={
            "ops": {
                "enrich": {
                    "config": {"trigger": "continuous", "interval_seconds": 0.2, "max_batches": 1}
                }
            }
        },
    )
    events = [
        e.step_materialization_data.materialization
        for e in result.get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key == dg.AssetKey("enriched")
    ]
    assert [e.description for e in events[:1]] == ["micro-batch 0"]
    assert events[0].metadata["rows_written"].value == 1

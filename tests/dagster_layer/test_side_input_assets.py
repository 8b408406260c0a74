"""The Dagster layer: operator assets, readiness from the instance, jobs, sensors, replays."""

import datetime as dt
import os
import signal
import threading
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


# Long enough for the tests that need the rules fresh to run on a loaded machine.
RULES_FRESH_FOR = dt.timedelta(minutes=2)
# The stale test's own rules: a window it can wait out (it materializes them right
# before the run that needs them fresh).
QUICK_FRESH_FOR = dt.timedelta(minutes=1)  # Dagster's shortest fail_window


@dg.asset(freshness_policy=dg.FreshnessPolicy.time_window(fail_window=RULES_FRESH_FOR))
def rules(spark: dsi.SparkResource) -> DataFrame:
    return spark.spark_session.createDataFrame([(100.0,)], "threshold double")


@dg.asset(freshness_policy=dg.FreshnessPolicy.time_window(fail_window=QUICK_FRESH_FOR))
def quick_rules(spark: dsi.SparkResource) -> DataFrame:
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
    routes=dsi.Routes(unmatched=UNMATCHED),
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


@dsi.side_input_assets(
    main=dsi.MainInput("tx", key="customer_id", event_time="ts"),
    side_inputs={"rules": dsi.SideInput.singleton("quick_rules")},
    main_output="enriched_quick",
)
def enrich_quick(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    return main.select("tx_id", "customer_id", "amount")


enrich_checks = dsi.build_side_input_checks(enrich)
enrich_job = dsi.build_side_input_job(enrich)
replay_job = dsi.build_replay_job(enrich, UNMATCHED)
quick_job = dsi.build_side_input_job(enrich_quick)
sensor = dsi.build_side_input_sensor(enrich, job=enrich_job)


@pytest.fixture
def env(tmp_path) -> Iterator[dict]:
    with dg.instance_for_test() as instance:
        spark = dsi.SparkResource(master="local[2]", ui_enabled=False)
        io = dsi.DeltaIOManager(root=str(tmp_path / "lake"), spark=spark)
        resources = {"spark": spark, "io_manager": io}
        defs = dg.Definitions(
            assets=[tx, profiles, rules, quick_rules, fx, enrich, enrich_quick, convert],
            asset_checks=[enrich_checks],
            jobs=[enrich_job, replay_job, quick_job],
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
    frame = dsi.tables.read_table(env["resources"]["spark"].spark_session, uri)
    return sorted(tuple(r) for r in frame.select(*(columns or frame.columns)).collect())


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    events = [
        e.step_materialization_data.materialization
        for e in result.get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key == dg.AssetKey(asset)
    ]
    return {k: v.value for k, v in events[-1].metadata.items()}


def materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {
        e.step_materialization_data.materialization.asset_key.to_user_string()
        for e in result.get_asset_materialization_events()
    }


def observed(result: dg.ExecuteInProcessResult) -> dict[str, dict]:
    """Observations of the run, by asset: their metadata."""
    found = {}
    for event in result.all_events:
        if event.event_type == dg.DagsterEventType.ASSET_OBSERVATION:
            data = event.asset_observation_data.asset_observation
            found[data.asset_key.to_user_string()] = {k: v.value for k, v in data.metadata.items()}
    return found


def checks(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


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
        assert "Main input: tx. Side inputs: profile (profiles), rules (rules)." in (
            spec.description
        )
        assert spec.skippable  # materialized only by runs that write to it
    roles = {key.to_user_string(): enrich.specs_by_key[key].tags["dsi/role"] for key in keys}
    assert roles == {
        "enriched": "main_output",
        "flagged": "side_output",
        "unmatched": "unmatched_output",
    }
    assert {c.name for c in enrich.check_specs} == {"records_accounted_for"}
    assert {c.name for c in enrich_checks.check_specs} == {
        "buffer_within_limits",
        "side_inputs_ready",
    }


def test_output_metadata_describes_main_and_side_inputs_in_words():
    meta = enrich.specs_by_key[dg.AssetKey("enriched")].metadata
    assert meta["dsi/main_input"] == (
        "tx: new Delta versions (appends) read incrementally; key customer_id; event time ts"
    )
    assert meta["dsi/side_input/profile"] == (
        "profile: map of profiles (one row per key); key customer_id joined on "
        "tx.customer_id; ready once materialized, and while its asset's FreshnessPolicy "
        "passes (if any); a record whose key has no row goes to unmatched"
    )
    assert meta["dsi/side_input/rules"].startswith("rules: singleton of rules (one row)")
    table = meta["dsi/inputs"].value
    assert "| main | main input | tx |" in table
    assert "| profile | side input | profiles |" in table
    windowed = convert.specs_by_key[dg.AssetKey("converted")].metadata["dsi/side_input/fx"]
    assert "ready per window" in windowed
    assert "tumbling windows of 1 hour on ts" in windowed
    for value in [*meta.values(), windowed]:
        assert "datetime.timedelta" not in str(value)
        assert "SideInput." not in str(value)


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
    assert meta["dagster/row_count"] == 2
    assert meta["new_records"] == 3
    assert meta["from_buffer"] == 0
    assert meta["records_processed"] == 3
    assert (meta["released"], meta["unmatched"], meta["buffered"]) == (2, 1, 0)
    assert meta["delta_version"] == 0
    assert meta["buffered_rows"] == 0
    assert meta["side_input_versions"] == {"profile": 0, "rules": 0}
    assert "| rules | global | yes |" in meta["readiness"]
    assert meta["throughput_records_per_s"] > 0
    # The inputs as this run declared them: a run made in another process (make demo,
    # with its own DSI_PROFILE_TIMEOUT_MINUTES) shows its own timeouts, whatever the
    # code location's definition says.
    declared = enrich.specs_by_key[dg.AssetKey("enriched")].metadata["dsi/inputs"].value
    assert meta["dsi/inputs"] == declared
    assert "a record whose key has no row goes to unmatched" in meta["dsi/inputs"]
    assert [c.name for c in meta["dagster/column_schema"].columns] == [
        "tx_id",
        "customer_id",
        "amount",
        "name",
    ]
    assert metadata(result, "flagged")["rows_written"] == 1
    assert metadata(result, "unmatched")["rows_written"] == 1
    evaluations = checks(result)
    assert {name: e.passed for name, e in evaluations.items()} == {
        "buffer_within_limits": True,
        "side_inputs_ready": True,
        "records_accounted_for": True,
    }
    # One figure, one meaning: the check reports what the materialization reports.
    accounted = {k: v.value for k, v in evaluations["records_accounted_for"].metadata.items()}
    for figure in ("new_records", "from_buffer", "records_processed", "released", "unmatched"):
        assert accounted[figure] == meta[figure], figure
    buffer = evaluations["buffer_within_limits"].metadata["buffered_rows"].value
    assert buffer == meta["buffered_rows"]
    run(env)  # a second run: nothing new, nothing written twice
    assert rows(env, "enriched", "tx_id") == [(1,), (2,)]


def test_a_run_that_writes_nothing_materializes_nothing_and_says_so(env):
    materialize(env, [profiles, rules])
    materialize(env, [tx], run_config=batch_config((1, 10, 5.0, 0)))
    first = run(env)
    assert materialized(first) == {"enriched", "flagged", "unmatched"}  # tables created
    materialize(env, [tx], run_config=batch_config((2, 10, 5.0, 1)))
    second = run(env)
    assert materialized(second) == {"enriched"}  # nothing flagged, nothing unmatched
    assert observed(second)["flagged"]["rows_written"] == 0
    assert observed(second)["unmatched"]["records_processed"] == 1

    idle = run(env)
    assert materialized(idle) == set()
    assert set(observed(idle)) == {"enriched", "flagged", "unmatched"}
    assert observed(idle)["enriched"]["batches"] == 0
    # The standalone checks need a materialization in the run; the run's own check does not.
    assert set(checks(idle)) == {"records_accounted_for"}
    assert checks(idle)["records_accounted_for"].passed


def test_buffer_and_readiness_checks_run_on_their_own(env):
    materialize(env, [profiles])  # rules never materialized: records wait
    materialize(env, [tx], run_config=batch_config((1, 10, 5.0, 0), (2, 11, 6.0, 1)))
    run(env)
    job = env["defs"].resolve_implicit_global_asset_job_def()
    keys = {
        dg.AssetCheckKey(dg.AssetKey("enriched"), name)
        for name in ("buffer_within_limits", "side_inputs_ready")
    }
    alone = job.get_subset(asset_selection=set(), asset_check_selection=keys)
    result = alone.execute_in_process(instance=env["instance"], resources=env["resources"])
    assert result.success
    assert materialized(result) == set()  # the operator did not run
    evaluations = checks(result)
    assert evaluations["buffer_within_limits"].passed
    assert evaluations["buffer_within_limits"].metadata["buffered_rows"].value == 2
    ready = evaluations["side_inputs_ready"]
    assert not ready.passed
    assert "rules/global: asset rules has no Delta table yet" in ready.description

    materialize(env, [rules])
    again = alone.execute_in_process(instance=env["instance"], resources=env["resources"])
    assert checks(again)["side_inputs_ready"].passed
    assert rows(env, "enriched") == []  # still nothing ran


@pytest.mark.slow
def test_records_wait_while_a_side_input_is_stale_and_go_after_it_is_rematerialized(env):
    job = "enrich_quick_job"
    materialize(env, [tx], run_config=batch_config((1, 10, 5.0, 0)))
    materialize(env, [quick_rules])
    run(env, job)
    assert rows(env, "enriched_quick", "tx_id") == [(1,)]
    # The rules' window passes: their latest materialization, as the instance records it,
    # is now older than it (the run's readiness reads this event's time).
    instance = env["instance"]
    latest = instance.get_latest_materialization_event(quick_rules.key)
    assert latest is not None
    gone_by = QUICK_FRESH_FOR.total_seconds() + 2
    instance.store_event(latest._replace(timestamp=latest.timestamp - gone_by))
    materialize(env, [tx], run_config=batch_config((2, 11, 6.0, 5)))
    stale = run(env, job)
    assert rows(env, "enriched_quick", "tx_id") == [(1,)]
    assert materialized(stale) == set()  # everything waited: no table changed
    meta = observed(stale)["enriched_quick"]
    assert (meta["new_records"], meta["buffered"], meta["buffered_rows"]) == (1, 1, 1)
    assert "stale: materialized" in meta["readiness"]
    materialize(env, [quick_rules])
    run(env, job)
    assert rows(env, "enriched_quick", "tx_id") == [(1,), (2,)]


def headline(skip_message: str | None) -> str:
    """A skip reason's first phrase, which must be short: the tick list shows its start."""
    first = (skip_message or "").split(":")[0]
    assert len(first.split()) <= 4, skip_message
    return first


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
    assert headline(first.skip_message) == "No main input yet"

    materialize(env, [tx], run_config=batch_config((1, 10, 5.0, 0)))
    second = tick(first.cursor)
    assert len(second.run_requests) == 1
    assert "versions (-1, 0]" in second.run_requests[0].tags["dsi/reason"]
    again = tick(second.cursor)
    assert not again.run_requests
    assert headline(again.skip_message) == "Already requested"

    run(env)  # no side input was ever materialized: the record waits for them
    waiting = tick(again.cursor)
    assert not waiting.run_requests
    assert headline(waiting.skip_message) == "Waiting for profile, rules"
    assert "1 record(s) buffered" in waiting.skip_message

    materialize(env, [profiles, rules])
    released = tick(waiting.cursor)
    assert len(released.run_requests) == 1
    run(env)  # the record is released
    idle = tick(released.cursor)
    assert not idle.run_requests
    assert headline(idle.skip_message) == "Up to date"
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
    replay = run(env, replay_job.name)
    # The replay writes the main output, never the output it replays.
    assert materialized(replay) == {"enriched"}
    assert set(observed(replay)) == {"flagged", "unmatched"}
    meta = metadata(replay, "enriched")
    accounted = checks(replay)["records_accounted_for"].metadata
    assert meta["new_records"] == accounted["new_records"].value == 1
    assert meta["released"] == accounted["released"].value == 1
    again = run(env, replay_job.name)
    assert materialized(again) == set()
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
    assert events[0].metadata["new_records"].value == 1
    # Each micro-batch shows its readiness table, as a run's materialization does.
    assert "| profile | global | yes |" in events[0].metadata["readiness"].value
    # And the inputs as the run declared them.
    assert "| profile | side input | profiles |" in events[0].metadata["dsi/inputs"].value
    # Nothing flagged or unmatched in that micro-batch, but the tables were created.
    assert materialized(result) == {"enriched", "flagged", "unmatched"}
    created = {
        e.step_materialization_data.materialization.description
        for e in result.get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key == dg.AssetKey("unmatched")
    }
    assert created == {"micro-batch 0: created (0 rows)"}


def test_an_interrupted_continuous_run_ends_as_a_clean_stop(env):
    """Dagster's Terminate is a SIGINT to the run's process: the run stops after its
    micro-batch and the step succeeds, with "Stopped after micro-batch N" (before: a
    failed step, KeyboardInterrupt raised from PySpark's signal handler)."""
    materialize(env, [profiles, rules])
    materialize(env, [tx], run_config=batch_config((1, 10, 5.0, 0)))
    instance = env["instance"]

    def interrupt_after_the_first_micro_batch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            event = instance.get_latest_materialization_event(dg.AssetKey("enriched"))
            if event is not None and event.asset_materialization.description == "micro-batch 0":
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.1)

    stopper = threading.Thread(target=interrupt_after_the_first_micro_batch, daemon=True)
    stopper.start()
    config = {"trigger": "continuous", "interval_seconds": 0.2}
    result = run(env, run_config={"ops": {"enrich": {"config": config}}})
    stopper.join()
    assert result.success
    assert not [e for e in result.all_events if e.is_step_failure]
    batches = [
        int(e.step_materialization_data.materialization.description.split()[1].rstrip(":"))
        for e in result.get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key == dg.AssetKey("enriched")
    ]
    logged = [e.user_message for e in instance.all_logs(result.run_id)]
    assert "Stop requested: stopping after the current micro-batch." in logged
    assert f"Stopped after micro-batch {max(batches)}." in logged

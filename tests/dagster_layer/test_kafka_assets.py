"""A Kafka main input in Dagster: the topic in the lineage, runs, the sensor, metadata."""

import itertools
from collections.abc import Iterator

import dagster as dg
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from tests.servers.kafka import KafkaBroker

pytestmark = pytest.mark.kafka

TX = "tx_id long, customer_id long, amount double"
_names = itertools.count()


@dg.asset(name="kafka_profiles")
def profiles(spark: dsi.SparkResource) -> DataFrame:
    return spark.spark_session.createDataFrame(
        [(c, f"customer {c}") for c in range(5)], "customer_id long, name string"
    )


def tx(ids) -> list[dict]:
    return [{"tx_id": i, "customer_id": i % 5, "amount": float(i)} for i in ids]


@pytest.fixture
def env(tmp_path, kafka_broker: KafkaBroker) -> Iterator[dict]:
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("dagster"), 2)
    name = f"kafka_enrich_{next(_names)}"

    @dsi.side_input_assets(
        main=dsi.MainInput.kafka(
            topic,
            bootstrap_servers=kafka_broker.bootstrap_servers,
            schema=TX,
            key="customer_id",
            asset=f"{name}_payments",
            options={"sasl.jaas.config": "not used on PLAINTEXT; secret"},
            admin_options={"client.id": "dsi-test"},
            max_records_per_batch=30,
        ),
        side_inputs={"profile": dsi.SideInput.map("kafka_profiles", key="customer_id")},
        main_output=f"{name}_enriched",
        name=name,
        group_name="kafka_test",
    )
    def enrich(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
        return main.select("tx_id", F.col("profile.name").alias("name"))

    job = dsi.build_side_input_job(enrich)
    continuous = dsi.build_side_input_job(enrich, name=f"{name}_continuous", trigger="continuous")
    sensor = dsi.build_side_input_sensor(enrich, job=job)
    with dg.instance_for_test() as instance:
        # The session must load Spark's Kafka connector (the shared test session does too).
        spark = dsi.SparkResource(
            master="local[2]",
            ui_enabled=False,
            packages=["kafka"],
        )
        io = dsi.DeltaIOManager(root=str(tmp_path / "lake"), spark=spark)
        resources = {"spark": spark, "io_manager": io}
        defs = dg.Definitions(
            assets=[profiles, enrich, dsi.kafka_topic_asset(enrich)],
            jobs=[job, continuous],
            sensors=[sensor],
            resources=resources,
        )
        dg.materialize([profiles], resources=resources, instance=instance)
        yield {
            "instance": instance,
            "defs": defs,
            "job": job,
            "continuous": continuous,
            "sensor": sensor,
            "io": io,
            "topic": topic,
            "name": name,
            "broker": kafka_broker,
        }


def materializations(result: dg.ExecuteInProcessResult, key: str) -> list[dg.AssetMaterialization]:
    return [
        e.step_materialization_data.materialization
        for e in result.get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key == dg.AssetKey(key)
    ]


def test_topic_is_an_external_kafka_asset_upstream_of_the_outputs(env):
    graph = env["defs"].resolve_asset_graph()
    topic_key = dg.AssetKey(f"{env['name']}_payments")
    node = graph.get(topic_key)
    assert not node.is_materializable
    assert "kafka" in node.kinds
    output = graph.get(dg.AssetKey(f"{env['name']}_enriched"))
    assert topic_key in output.parent_keys
    assert "secret" not in str(node.metadata)


def test_job_reads_the_topic_and_reports_offsets_and_lag(env):
    env["broker"].produce_json(env["topic"], tx(range(50)), key="customer_id")
    job = env["defs"].resolve_job_def(env["job"].name)

    result = job.execute_in_process(instance=env["instance"])

    assert result.success
    (done,) = materializations(result, f"{env['name']}_enriched")
    meta = done.metadata
    assert meta["new_records"].value == 50
    assert meta["batches"].value == 2  # max_records_per_batch=30
    assert meta["kafka/lag"].value == 0
    table = meta["kafka/offsets"].value
    assert f"| {env['topic']} | 0 | 0 |" in table
    assert f"| {env['topic']} | 1 | 0 |" in table
    assert meta["kafka/lost_offsets"].value == 0

    env["broker"].produce_json(env["topic"], tx(range(50, 55)), key="customer_id")
    again = job.execute_in_process(instance=env["instance"])
    (second,) = materializations(again, f"{env['name']}_enriched")
    assert second.metadata["new_records"].value == 5


def test_sensor_runs_on_new_offsets_and_says_why_it_skips(env):
    repository = env["defs"].get_repository_def()
    sensor = env["sensor"]

    def tick(cursor):
        with dg.build_sensor_context(
            instance=env["instance"],
            cursor=cursor,
            repository_def=repository,
            resources={"io_manager": env["io"]},
        ) as context:
            return sensor.evaluate_tick(context)

    first = tick(None)
    assert not first.run_requests
    assert first.skip_message.startswith("No main input yet:")

    env["broker"].produce_json(env["topic"], tx(range(10)), key="customer_id")
    second = tick(first.cursor)
    assert len(second.run_requests) == 1
    assert env["topic"] in second.run_requests[0].tags["dsi/reason"]
    again = tick(second.cursor)
    assert again.skip_message.startswith("Already requested:")

    job = env["defs"].resolve_job_def(env["job"].name)
    assert job.execute_in_process(instance=env["instance"]).success
    idle = tick(again.cursor)
    assert not idle.run_requests
    assert idle.skip_message.startswith(
        f"Up to date: Kafka main input read up to offsets {env['topic']}[0]"
    )

    env["broker"].recreate_topic(env["topic"], 2)
    broken = tick(idle.cursor)
    assert len(broken.run_requests) == 1
    assert "deleted and created again" in broken.run_requests[0].tags["dsi/reason"]
    waiting = tick(broken.cursor)
    assert "Waiting for a fix" in waiting.skip_message


def test_continuous_job_materializes_each_kafka_micro_batch_with_its_offsets(env):
    env["broker"].produce_json(env["topic"], tx(range(40)), key="customer_id")
    job = env["defs"].resolve_job_def(env["continuous"].name)
    config = {"trigger": "continuous", "interval_seconds": 0.2, "max_batches": 2}

    result = job.execute_in_process(
        instance=env["instance"], run_config={"ops": {env["name"]: {"config": config}}}
    )

    assert result.success
    events = [
        e
        for e in materializations(result, f"{env['name']}_enriched")
        if (e.description or "").startswith("micro-batch")
    ]
    assert [e.metadata["new_records"].value for e in events] == [30, 10]
    assert events[0].metadata["kafka/lag"].value == 10
    assert events[1].metadata["kafka/lag"].value == 0

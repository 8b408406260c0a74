"""Pre-keyed Kafka topics (seed 003): Kafka's partitioner in Spark, the promise checked,
and keyed side inputs joined without shuffling the main records."""

import random
import re
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core.sources.kafka.keyed import (
    buckets,
    kafka_partitions,
    murmur2_arrow,
    murmur2_partition,
    spark_hash_int,
)
from tests.core.accounting import assert_accounted
from tests.core.conftest import Clock, Lake, hours
from tests.servers.kafka import KafkaBroker
from tests.servers.partitioner import default_partition, murmur2

TX = "tx_id long, customer_id long, amount double"
PROFILES = "customer_id long, name string"
CUSTOMERS = 40


def random_keys(count: int, seed: int = 7) -> list[str | None]:
    rnd = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789é€"
    keys: list[str | None] = ["", "a", "ab", "abc", "abcd", "abcde", "21", "foobar", None]
    keys += ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 40))) for _ in range(count)]
    return keys


# --- the partitioner ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_vectorized_murmur2_matches_kafkas_reference_values(data, expected):
    (hashed,) = murmur2_arrow(pa.array([data]))
    assert int(hashed) - (1 << 32) if hashed & 0x80000000 else int(hashed) == expected


def test_vectorized_partitions_match_the_reference_partitioner_on_slices_and_chunks():
    keys = random_keys(3000)
    array = pa.array(keys)
    for partitions in (1, 3, 32):
        expected = [None if k is None else default_partition(k.encode(), partitions) for k in keys]
        assert kafka_partitions(array, partitions).to_pylist() == expected
        assert kafka_partitions(array.slice(5), partitions).to_pylist() == expected[5:]
        chunked = pa.chunked_array([array.slice(0, 100), array.slice(100)])
        assert kafka_partitions(chunked, partitions).to_pylist() == expected
    hashed = murmur2_arrow(pa.array([k.encode() for k in keys if k is not None]))
    assert [int(h) - (1 << 32) if h & 0x80000000 else int(h) for h in hashed] == [
        murmur2(k.encode()) for k in keys if k is not None
    ]


def test_murmur2_in_spark_matches_the_reference_partitioner(spark):
    keys = random_keys(2000)
    frame = spark.createDataFrame([(k,) for k in keys], "k string")
    got = frame.select(
        murmur2_partition(F.col("k"), 7).alias("s"),
        murmur2_partition(F.encode("k", "UTF-8"), 7).alias("b"),
    ).collect()
    expected = [None if k is None else default_partition(k.encode(), 7) for k in keys]
    assert [r.s for r in got] == expected
    assert [r.b for r in got] == expected


def test_buckets_are_values_sparks_hash_sends_to_each_partition(spark):
    values = list(range(-3, 3))
    hashed = spark.createDataFrame([(v,) for v in values], "v int").select(F.hash("v")).collect()
    assert [r[0] for r in hashed] == [spark_hash_int(v) for v in values]
    for partitions in (1, 4, 7, 64):
        chosen = buckets(partitions)
        frame = spark.createDataFrame([(v,) for v in chosen], "v int")
        placed = frame.select(F.expr(f"pmod(hash(v), {partitions})")).collect()
        assert [r[0] for r in placed] == list(range(partitions))


# --- the operator ---------------------------------------------------------------------


def tx(ids) -> list[dict]:
    return [{"tx_id": i, "customer_id": i % CUSTOMERS, "amount": float(i)} for i in ids]


def enrich(main, sides):
    return main.select("tx_id", "customer_id", F.col("profile.name").alias("name"))


@pytest.fixture
def no_broadcast(spark) -> Iterator[None]:
    """Small side tables would be broadcast (no shuffle either way): show the keyed path."""
    before = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    yield
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", before)


def keyed_operator(
    lake: Lake, broker: KafkaBroker, topic: str, *, pre_keyed: bool = True, **kwargs
) -> dsi.SideInputOperator:
    if not lake.exists("profiles"):
        lake.append("profiles", [(c, f"customer {c}") for c in range(CUSTOMERS)], PROFILES)
    side = kwargs.pop("side", dsi.SideInput.map("profiles", key="customer_id"))
    return lake.operator(
        main=dsi.MainInput.kafka(
            topic,
            bootstrap_servers=broker.bootstrap_servers,
            schema=TX,
            key="customer_id",
            pre_keyed=dsi.KeyGroups(max_key_groups=kwargs.pop("max_key_groups", 16))
            if pre_keyed
            else None,
        ),
        side_inputs={"profile": side},
        fn=enrich,
        main_output=kwargs.pop("main_output", "enriched"),
        **kwargs,
    )


def exchanges(plan: str) -> list[str]:
    return re.findall(r"Exchange (\w+\([^)]*\))", plan)


def executed_plans(spark) -> dict[int, str]:
    """The physical plan of every SQL execution so far (the counting job, the writes),
    from Spark's SQL status store, which Spark feeds without its UI: read once the
    listener bus has delivered every event."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    found = (executions.apply(i) for i in range(executions.size()))
    return {e.executionId(): e.physicalPlanDescription() for e in found}


MAIN_KEY_SHUFFLE = re.compile(r"hashpartitioning\(_dsi_mk_")
"""An Exchange of the main records by their join key (the operator's ``_dsi_mk_*``)."""


def main_shuffles_of(spark, run) -> list[str]:
    """The plans of the Spark jobs ``run()`` made that shuffle the main records."""
    before = set(executed_plans(spark))
    run()
    plans = executed_plans(spark)
    assert set(plans) - before, "no SQL execution recorded"
    return [plan for i, plan in plans.items() if i not in before and MAIN_KEY_SHUFFLE.search(plan)]


@pytest.mark.kafka
def test_keyed_side_input_is_joined_without_shuffling_the_main_records(
    lake, kafka_broker, no_broadcast
):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("keyed"), 4)
    kafka_broker.produce_json(topic, tx(range(400)), key="customer_id")
    op = keyed_operator(lake, kafka_broker, topic)

    batches: list = []
    # Every job of the batch (the routes' count, the writes), not only the routes' plan:
    # the pre-keyed check's Arrow UDF once hid the partitioning from the write's join.
    shuffling = main_shuffles_of(
        lake.spark, lambda: batches.extend(op.run(lake.spark, explain=True).batches)
    )
    assert shuffling == [], shuffling[0][:3000]
    [batch] = batches

    assert any("read in place" in note for note in batch.notes), batch.notes
    # The job writing the outputs checks the promise and counts the routes: one job.
    assert any("routes counted by the write job" in note for note in batch.notes), batch.notes
    shuffles = exchanges(batch.physical_plan or "")
    # The side rows are shuffled by their Kafka bucket; the main records not at all.
    assert shuffles, batch.physical_plan
    assert all("_dsi_bucket_profile" in s or "customer_id" in s for s in shuffles), shuffles
    assert not any("_dsi_kafka_bucket" in s or "kafka_partition" in s for s in shuffles), shuffles
    main_side = batch.physical_plan.split("Scan ExistingRDD")[0].splitlines()[-3:]  # type: ignore[union-attr]
    assert not any("Exchange" in line for line in main_side), batch.physical_plan
    # Same result as the shuffled join of the same records.
    shuffled = keyed_operator(lake, kafka_broker, topic, pre_keyed=False, main_output="plain")
    # The probe sees a write's shuffle where there is one.
    assert main_shuffles_of(lake.spark, lambda: shuffled.run(lake.spark))
    assert lake.rows("enriched") == lake.rows("plain")
    assert len(lake.rows("enriched")) == 400
    assert all(name == f"customer {c}" for _, c, name in lake.rows("enriched"))


@pytest.mark.kafka
def test_records_buffered_for_their_side_row_are_released_to_the_right_bucket(
    lake, kafka_broker, no_broadcast
):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("keyed"), 3)
    lake.append("profiles", [(c, f"customer {c}") for c in range(CUSTOMERS // 2)], PROFILES)
    kafka_broker.produce_json(topic, tx(range(200)), key="customer_id")
    clock = Clock()
    side = dsi.SideInput.map("profiles", key="customer_id", missing=dsi.Wait(hours(1), then="null"))
    op = keyed_operator(lake, kafka_broker, topic, side=side)
    first = op.run(lake.spark, clock=clock)
    assert first.batches[0].routes["key_wait"] == 100
    lake.append(
        "profiles", [(c, f"customer {c}") for c in range(CUSTOMERS // 2, CUSTOMERS)], PROFILES
    )
    kafka_broker.produce_json(topic, tx(range(200, 240)), key="customer_id")

    second = op.run(lake.spark, clock=clock)

    assert second.batches[0].released == 140
    assert_accounted(lake.spark, op, list(range(240)))
    assert all(name == f"customer {c}" for _, c, name in lake.rows("enriched"))


@pytest.mark.kafka
def test_a_record_on_another_partition_than_its_keys_is_an_error_before_any_write(
    lake, kafka_broker
):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("keyed"), 4)
    kafka_broker.produce_json(topic, tx(range(20)), key="customer_id")
    wrong = (default_partition(b"5", 4) + 1) % 4
    kafka_broker.produce_json(
        topic, [{"tx_id": 99, "customer_id": 5, "amount": 1.0}], key="customer_id", partition=wrong
    )
    op = keyed_operator(lake, kafka_broker, topic)

    with pytest.raises(dsi.errors.PreKeyedViolationError) as raised:
        op.run(lake.spark)

    message = str(raised.value)
    assert f"key 5 is in partition {topic}[{wrong}]" in message
    assert f"puts it in partition {default_partition(b'5', 4)} of 4" in message
    assert not lake.exists("enriched")


@pytest.mark.kafka
def test_a_misplaced_record_is_found_as_it_is_read_whatever_its_value(lake, kafka_broker):
    """The partition check runs on the connector's rows (the Kafka key's bytes, before
    any decoding): a record Kafka's partitioner would place elsewhere is a broken promise
    even when its value is corrupt, and it stops the batch when a job counts the routes
    first (a table takes invalid records) as when the write job does."""
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("keyed"), 4)
    kafka_broker.produce_json(topic, tx(range(20)), key="customer_id")
    wrong = (default_partition(b"7", 4) + 1) % 4
    kafka_broker.produce(topic, [(b"7", b"{not json")], partition=wrong)
    op = keyed_operator(
        lake, kafka_broker, topic, routes=dsi.Routes(invalid=dsi.OutputTag("bad_records"))
    )

    with pytest.raises(dsi.errors.PreKeyedViolationError) as raised:
        op.run(lake.spark)

    assert f"key 7 is in partition {topic}[{wrong}]" in str(raised.value)
    assert not lake.exists("enriched")
    assert not lake.exists("bad_records")


@pytest.mark.kafka
def test_a_topic_read_with_a_shuffle_checks_the_promise_with_the_routes(
    lake, kafka_broker, monkeypatch
):
    """A session that cannot read a topic in place (Spark Connect: no JVM in the
    client) reads it with a shuffle and checks every record's partition where the
    routes are counted; a lie still stops the batch before anything is written."""
    from dagster_sideinputs.core.sources.kafka import source

    monkeypatch.setattr(source, "partitioned_read", lambda spark, reads, partitions: None)
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("keyed"), 4)
    kafka_broker.produce_json(topic, tx(range(20)), key="customer_id")
    clean = keyed_operator(lake, kafka_broker, topic)
    result = clean.run(lake.spark)
    assert result.emitted("enriched") == 20
    assert any("read with a shuffle" in n for n in result.batches[0].notes)

    wrong = (default_partition(b"5", 4) + 1) % 4
    kafka_broker.produce_json(
        topic, [{"tx_id": 99, "customer_id": 5, "amount": 1.0}], key="customer_id", partition=wrong
    )
    with pytest.raises(dsi.errors.PreKeyedViolationError) as raised:
        keyed_operator(lake, kafka_broker, topic).run(lake.spark)
    assert f"puts it in partition {default_partition(b'5', 4)} of 4" in str(raised.value)
    assert len(lake.rows("enriched")) == 20


@pytest.mark.kafka
def test_a_key_column_that_is_not_the_kafka_key_is_an_error(lake, kafka_broker):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("keyed"), 2)
    kafka_broker.produce_json(topic, tx(range(5)), key=lambda r: f"c-{r['customer_id']}")
    op = keyed_operator(lake, kafka_broker, topic)
    with pytest.raises(
        dsi.errors.PreKeyedViolationError, match="must be the string form of the Kafka key"
    ):
        op.run(lake.spark)
    assert not lake.exists("enriched")


@pytest.mark.kafka
def test_more_partitions_than_key_groups_is_an_error_when_planning(lake, kafka_broker):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("keyed"), 4)
    kafka_broker.produce_json(topic, tx(range(5)), key="customer_id")
    op = keyed_operator(lake, kafka_broker, topic, max_key_groups=2)
    with pytest.raises(dsi.errors.PreKeyedViolationError, match=r"has 4 partitions") as raised:
        op.run(lake.spark)
    assert "max_key_groups=4" in str(raised.value)
    assert op.last_plan() is None

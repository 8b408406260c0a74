"""The test Kafka broker, its clients, and Spark's batch reads over exact offset ranges.

Everything runs against a real broker on 127.0.0.1 (``kafka_broker``) and, for the
Spark tests, the real ``spark-sql-kafka-0-10`` connector in the shared session
(``spark_kafka``). The Spark tests record the connector behaviours a pinned batch
plan depends on: what it does when offsets were deleted, when the topic was recreated
and when partitions were added.
"""

import json
import select
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from confluent_kafka import KafkaException

from tests.servers.kafka import KafkaBroker
from tests.servers.partitioner import default_partition, murmur2
from tests.servers.spark_kafka import REPO, SparkKafkaError, exact_range_options

pytestmark = pytest.mark.kafka

DATA_LOSS = "KAFKA_DATA_LOSS.COULD_NOT_READ_OFFSET_RANGE"
PARTITIONS_MISMATCH = "KAFKA_START_OFFSET_DOES_NOT_MATCH_ASSIGNED"


def accepting(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_gone(pid: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def records(broker: KafkaBroker, topic: str) -> list[tuple[int, int, str | None, str]]:
    """Every stored record as (partition, offset, key, value), decoded."""
    return [
        (p, offset, key.decode() if key is not None else None, value.decode())
        for p, offset, key, value in broker.consume(topic)
    ]


# -- the partitioner -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # Reference values of Kafka's own Utils.murmur2 tests.
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafka_reference_values(data, expected):
    assert murmur2(data) == expected


def test_default_partition_needs_a_partition():
    assert default_partition(b"21", 1) == 0
    with pytest.raises(ValueError, match="num_partitions must be at least 1"):
        default_partition(b"21", 0)


# -- the broker ----------------------------------------------------------------------


def test_broker_starts_quickly_and_stop_kills_it():
    broker = KafkaBroker().start()
    pid, port, workdir = broker.pid, broker.port, broker.workdir
    try:
        assert broker.startup_s < 30, broker.startup_s  # ~3-6 s; generous for a busy CI
        assert pid is not None
        assert psutil.Process(pid).is_running()
        assert broker.topics() == set()
    finally:
        broker.stop()
    assert pid is not None
    assert wait_gone(pid)
    assert not accepting(port)
    assert not workdir.exists()


def test_broker_dies_with_the_process_that_started_it(tmp_path):
    # A test process killed outright runs no teardown: the broker must not outlive it.
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from tests.servers.kafka import KafkaBroker\n"
        f"broker = KafkaBroker(Path({str(tmp_path)!r})).start()\n"
        "print(broker.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        ready, _, _ = select.select([parent.stdout], [], [], 120)
        assert ready, "the broker did not start in 120 s"
        assert parent.stdout is not None
        jvm = int(parent.stdout.readline())
        assert psutil.Process(jvm).is_running()
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert wait_gone(jvm), f"broker JVM {jvm} outlived its parent"


def test_auto_topic_creation_is_off(kafka_broker):
    with pytest.raises(KafkaException, match="Message timed out"):
        kafka_broker.produce("no-such-topic", [(None, "x")], **{"message.timeout.ms": 2000})
    assert "no-such-topic" not in kafka_broker.topics()


def test_keyed_json_records_land_where_the_java_partitioner_puts_them(kafka_broker):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("keyed"), 4)
    rows = [{"id": i, "customer": f"c{i % 37}"} for i in range(2000)]
    rows += [{"id": -1, "customer": ""}, {"id": -2, "customer": "é日本"}]

    assert kafka_broker.produce_json(topic, rows, key="customer") == len(rows)

    stored = records(kafka_broker, topic)
    assert len(stored) == len(rows)
    for partition, _, key, value in stored:
        assert key is not None
        assert partition == default_partition(key.encode(), 4)
        assert json.loads(value)["customer"] == key
    assert len({p for p, *_ in stored}) == 4  # 39 keys spread over every partition
    for p in range(4):  # offsets are dense from 0
        offsets = [o for q, o, *_ in stored if q == p]
        assert offsets == list(range(len(offsets)))


def test_an_explicit_partition_overrides_the_key(kafka_broker):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("pinned"), 3)
    kafka_broker.produce(topic, [(f"k{i}", str(i)) for i in range(50)], partition=2)
    assert kafka_broker.end_offsets(topic) == {0: 0, 1: 0, 2: 50}


def test_admin_grows_truncates_and_deletes_a_topic(kafka_broker):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("admin"), 2)
    for p in (0, 1):
        kafka_broker.produce(topic, [(None, f"{p}-{i}") for i in range(10)], partition=p)
    topic_id = kafka_broker.topic_id(topic)
    assert kafka_broker.start_offsets(topic) == {0: 0, 1: 0}
    assert kafka_broker.end_offsets(topic) == {0: 10, 1: 10}

    assert kafka_broker.delete_records(topic, {0: 4}) == {0: 4}
    assert kafka_broker.start_offsets(topic) == {0: 4, 1: 0}
    assert [o for p, o, *_ in records(kafka_broker, topic) if p == 0] == list(range(4, 10))

    kafka_broker.create_partitions(topic, 5)
    assert kafka_broker.partition_count(topic) == 5
    assert kafka_broker.end_offsets(topic) == {0: 10, 1: 10, 2: 0, 3: 0, 4: 0}
    assert kafka_broker.topic_id(topic) == topic_id  # growing keeps the topic's identity

    kafka_broker.delete_topic(topic)
    assert topic not in kafka_broker.topics()
    assert kafka_broker.partition_count(topic) == 0


def test_a_recreated_topic_has_a_new_id_and_offsets_from_zero(kafka_broker):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("again"), 2)
    kafka_broker.produce(topic, [(None, "old")] * 20)
    old_id = kafka_broker.topic_id(topic)

    kafka_broker.recreate_topic(topic, 2)

    assert kafka_broker.topic_id(topic) != old_id
    assert kafka_broker.end_offsets(topic) == {0: 0, 1: 0}


def test_retention_removes_old_offsets(kafka_broker):
    """Records older than the topic's retention go; newer ones stay. The old records carry
    an hour-old create time, so the check does not race the retention clock."""
    topic = kafka_broker.create_topic(
        kafka_broker.unique_topic("retention"),
        config={"retention.ms": "60000", "segment.ms": "200"},
    )
    an_hour_ago = int((time.time() - 3600) * 1000)
    kafka_broker.produce(topic, [(None, f"old-{i}") for i in range(10)], timestamp_ms=an_hour_ago)
    time.sleep(0.4)  # past segment.ms: the next record starts a new segment
    kafka_broker.produce(topic, [(None, f"new-{i}") for i in range(5)])

    deadline = time.monotonic() + 30
    while kafka_broker.start_offsets(topic) == {0: 0} and time.monotonic() < deadline:
        time.sleep(0.1)

    assert kafka_broker.start_offsets(topic) == {0: 10}
    assert kafka_broker.end_offsets(topic) == {0: 15}
    assert [v for *_, v in records(kafka_broker, topic)] == [f"new-{i}" for i in range(5)]


# -- Spark's connector ---------------------------------------------------------------


def spark_rows(rows):
    return [(r.partition, r.offset, r.key, r.value) for r in rows]


@pytest.mark.slow
def test_spark_reads_exactly_the_pinned_offset_ranges(kafka_broker, spark_kafka):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("exact"), 3)
    kafka_broker.produce_json(topic, [{"id": i} for i in range(300)], key="id")
    ends = kafka_broker.end_offsets(topic)
    start = {0: 2, 1: 0, 2: 5}
    end = {0: ends[0] - 1, 1: ends[1], 2: 5}  # partition 2: an empty range
    options = exact_range_options(kafka_broker.bootstrap_servers, topic, start, end)

    first = spark_rows(spark_kafka.read(options))

    expected = [r for r in records(kafka_broker, topic) if start[r[0]] <= r[1] < end[r[0]]]
    assert first == expected
    assert {r[0] for r in first} == {0, 1}
    # Records produced later do not change what a pinned plan reads.
    kafka_broker.produce_json(topic, [{"id": i} for i in range(300, 400)], key="id")
    assert spark_rows(spark_kafka.read(options)) == first


@pytest.mark.slow
def test_spark_writer_places_keys_where_default_partition_says(kafka_broker, spark_kafka):
    # The connector writes with the Java producer: an independent check of murmur2.
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("javakeys"), 5)
    spark_kafka.write(topic, kafka_broker.bootstrap_servers, [(f"k{i}", "v") for i in range(300)])

    stored = records(kafka_broker, topic)
    assert len(stored) == 300
    assert all(p == default_partition(key.encode(), 5) for p, _, key, _ in stored)


@pytest.mark.slow
def test_spark_fails_on_deleted_start_offsets_unless_told_not_to(kafka_broker, spark_kafka):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("lost"), 2)
    for p in (0, 1):
        kafka_broker.produce(topic, [(None, f"{p}-{i}") for i in range(20)], partition=p)
    plan = exact_range_options(kafka_broker.bootstrap_servers, topic, {0: 0, 1: 0}, {0: 20, 1: 20})
    kafka_broker.delete_records(topic, {0: 5})  # as retention would

    with pytest.raises(SparkKafkaError) as caught:
        spark_kafka.read(plan)
    assert caught.value.condition == DATA_LOSS
    assert caught.value.java_class == "org.apache.spark.sql.kafka010.KafkaIllegalStateException"
    assert f"Could not read records in offset [0, 20) for topic partition {topic}-0" in str(
        caught.value.message
    )

    # failOnDataLoss=false silently reads what is left.
    lenient = spark_rows(spark_kafka.read({**plan, "failOnDataLoss": "false"}))
    assert [(p, o) for p, o, *_ in lenient] == [(0, o) for o in range(5, 20)] + [
        (1, o) for o in range(20)
    ]


@pytest.mark.slow
def test_spark_waits_then_fails_on_end_offsets_past_the_log(kafka_broker, spark_kafka):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("short"))
    kafka_broker.produce(topic, [(None, str(i)) for i in range(10)])
    # The task polls for the missing records for kafkaConsumer.pollTimeoutMs
    # (default: spark.network.timeout, 120 s) before giving up.
    plan = exact_range_options(
        kafka_broker.bootstrap_servers,
        topic,
        {0: 0},
        {0: 15},
        **{"kafkaConsumer.pollTimeoutMs": "1500"},
    )

    started = time.monotonic()
    with pytest.raises(SparkKafkaError) as caught:
        spark_kafka.read(plan)
    assert time.monotonic() - started > 1.5
    assert caught.value.condition == DATA_LOSS
    assert f"Could not read records in offset [10, 15) for topic partition {topic}-0" in str(
        caught.value.message
    )

    lenient = spark_kafka.read({**plan, "failOnDataLoss": "false"})
    assert [r.offset for r in lenient] == list(range(10))


@pytest.mark.slow
def test_only_the_topic_id_tells_a_recreated_topic(kafka_broker, spark_kafka):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("reborn"))
    kafka_broker.produce(topic, [(None, f"old-{i}") for i in range(40)])
    old_id = kafka_broker.topic_id(topic)
    assert spark_kafka.topic_id(topic, kafka_broker.bootstrap_servers) == old_id
    plan = exact_range_options(kafka_broker.bootstrap_servers, topic, {0: 10}, {0: 40})

    kafka_broker.recreate_topic(topic)
    kafka_broker.produce(topic, [(None, f"new-{i}") for i in range(50)])

    new_id = kafka_broker.topic_id(topic)
    assert new_id != old_id
    assert spark_kafka.topic_id(topic, kafka_broker.bootstrap_servers) == new_id
    # The old plan's range exists in the new topic: Spark reads other records, no error.
    assert [r.value for r in spark_kafka.read(plan)] == [f"new-{i}" for i in range(10, 40)]
    # Past the new topic's end it is data loss, like deleted offsets.
    beyond = exact_range_options(
        kafka_broker.bootstrap_servers,
        topic,
        {0: 10},
        {0: 60},
        **{"kafkaConsumer.pollTimeoutMs": "1500"},
    )
    with pytest.raises(SparkKafkaError) as caught:
        spark_kafka.read(beyond)
    assert caught.value.condition == DATA_LOSS


@pytest.mark.slow
def test_added_partitions_need_assign_or_every_partition_named(kafka_broker, spark_kafka):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("grown"), 2)
    kafka_broker.produce_json(topic, [{"id": i} for i in range(40)], key="id")
    ends = kafka_broker.end_offsets(topic)
    plan = exact_range_options(kafka_broker.bootstrap_servers, topic, {0: 0, 1: 0}, ends)
    before = spark_rows(spark_kafka.read(plan))

    kafka_broker.create_partitions(topic, 3)
    kafka_broker.produce_json(topic, [{"id": i} for i in range(40, 80)], key="id")

    # assign: the plan's partitions only, the same records as before.
    assert spark_rows(spark_kafka.read(plan)) == before
    # subscribe: the offsets must name every partition the topic has now.
    subscribed = {k: v for k, v in plan.items() if k != "assign"} | {"subscribe": topic}
    with pytest.raises(SparkKafkaError) as caught:
        spark_kafka.read(subscribed)
    assert caught.value.condition == PARTITIONS_MISMATCH
    assert f"Assigned: Set({topic}-0, {topic}-1, {topic}-2)" in str(caught.value.message)
    # assign naming a partition the topic no longer has (recreated smaller): same error.
    kafka_broker.recreate_topic(topic, 1)
    with pytest.raises(SparkKafkaError) as caught:
        spark_kafka.read(plan)
    assert caught.value.condition == PARTITIONS_MISMATCH


@pytest.mark.slow
@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (2, 1, "The specified start offset 2 is greater than the end offset 1"),
        (0, -2, "can't be earliest for batch queries on Kafka"),
    ],
)
def test_spark_rejects_impossible_ranges_before_reading(
    kafka_broker, spark_kafka, start, end, message
):
    topic = kafka_broker.create_topic(kafka_broker.unique_topic("bad"))
    kafka_broker.produce(topic, [(None, "x")] * 3)
    plan = exact_range_options(kafka_broker.bootstrap_servers, topic, {0: start}, {0: end})
    with pytest.raises(SparkKafkaError, match="IllegalArgumentException") as caught:
        spark_kafka.read(plan)
    assert message in caught.value.message

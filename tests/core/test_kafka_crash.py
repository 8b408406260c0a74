"""SIGKILL in the middle of Kafka batches, then a rerun: the outputs equal those of a run
without faults (nothing lost, nothing twice), whatever the kill hit.

Each trial reads its own topic holding the same records (same keys, partitions and
offsets as the reference's); more records arrive between the kill and the rerun. The
worker (``tests/core/kafka_worker.py``) is a separate process with its own JVM, killed
with its whole process group.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine
from dagster_sideinputs.delta.bridge.read import read_table
from tests.cluster import spark_env
from tests.servers.kafka import KafkaBroker

# Extended (CI's time): the default suite's Kafka runs are tests/core/test_kafka.py, its
# SIGKILLed runs the crash harness's on S3 (tests/test_crash_harness.py).
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.extended]

REPO = Path(__file__).resolve().parents[2]
FIRST = 400  # records before the kill (3 batches of 150)
LATER = 120  # records produced between the kill and the rerun
CUSTOMERS = 30
KNOWN = 25  # customers with a profile: the others wait in the buffer
COLUMNS = {
    "enriched": ["tx_id", "customer_id", "amount", "kafka_partition", "kafka_offset", "name"],
    "suspicious": ["tx_id"],
    "invalid_tx": ["kafka_partition", "kafka_offset", "reason"],
}
WORKER_TIMEOUT_S = 900


def records(start: int, count: int) -> list[tuple[str, str]]:
    out = []
    for i in range(start, start + count):
        customer = i % CUSTOMERS
        if i % 97 == 0:  # malformed JSON: the invalid route
            out.append((str(customer), f'{{"tx_id": {i}, "customer_id": '))
        else:
            amount = float((i * 37) % 1000)
            value = {"tx_id": i, "customer_id": customer, "amount": amount}
            out.append((str(customer), json.dumps(value)))
    return out


def new_topic(broker: KafkaBroker, *batches: tuple[int, int]) -> str:
    name = broker.create_topic(broker.unique_topic("crash"), 3)
    for start, count in batches:
        broker.produce(name, records(start, count))
    return name


def prepare_lake(spark, root: Path) -> None:
    profiles = spark.createDataFrame(
        [(c, f"customer {c}") for c in range(KNOWN)], "customer_id long, name string"
    )
    dsi.tables.write_dataframe(profiles, str(root / "profiles"))


def run_worker(root: Path, broker: KafkaBroker, topic: str, kill_at: str | None) -> str:
    args = [sys.executable, "-m", "tests.core.kafka_worker", str(root), broker.bootstrap_servers]
    args += [topic, *([kill_at] if kill_at else [])]
    process = subprocess.Popen(
        args,
        cwd=REPO,
        env=spark_env(PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: the JVM dies with it
    )
    try:
        out, _ = process.communicate(timeout=WORKER_TIMEOUT_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if kill_at is not None:
        assert process.returncode == -signal.SIGKILL, out[-3000:]
    else:
        assert process.returncode == 0, out[-3000:]
    return out


def snapshot(spark, root: Path, topic: str) -> dict[str, list[tuple]]:
    """Every output's rows (the topic's name, different per trial, made neutral)."""
    tables = {}
    for name, columns in COLUMNS.items():
        uri = str(root / name)
        rows = (
            read_table(spark, uri).select(*columns).collect() if DeltaRsEngine().exists(uri) else []
        )
        neutral = [tuple(str(v).replace(topic, "<topic>") for v in r) for r in rows]
        tables[name] = sorted(neutral)
    buffer = root / "_sideinputs" / "enriched" / "buffer"
    rows = read_table(spark, str(buffer)).select("tx_id").collect()
    tables["buffer"] = sorted(tuple(r) for r in rows)
    return tables


@pytest.fixture(scope="module")
def reference(spark, kafka_broker, tmp_path_factory) -> dict[str, list[tuple]]:
    root = tmp_path_factory.mktemp("kafka-reference")
    prepare_lake(spark, root)
    topic = new_topic(kafka_broker, (0, FIRST), (FIRST, LATER))
    run_worker(root, kafka_broker, topic, None)
    return snapshot(spark, root, topic)


def test_reference_run_fills_every_output_and_the_buffer(reference):
    total = FIRST + LATER
    bad = len([i for i in range(total) if i % 97 == 0])
    waiting = len([i for i in range(total) if i % 97 and i % CUSTOMERS >= KNOWN])
    assert len(reference["invalid_tx"]) == bad
    assert len(reference["buffer"]) == waiting
    assert len(reference["enriched"]) == total - bad - waiting
    assert reference["suspicious"]


KILL_POINTS = [
    # between the first batch's table commits (some tables have it, others not)
    "dagster_sideinputs.delta.bridge.engine:DeltaRsEngine.commit:2",
    # while the next batch counts its routes (a Spark job reading Kafka), its plan written
    "dagster_sideinputs.core.batch.route:count_routes:2",
    # after every table of a batch, before its commit record
    "dagster_sideinputs.core.state.folder:OperatorState.commit:1",
]


def test_sigkill_mid_batch_again_and_again_then_rerun_gives_the_reference_outputs(
    spark, kafka_broker, tmp_path, reference
):
    prepare_lake(spark, tmp_path)
    topic = new_topic(kafka_broker, (0, FIRST))
    for number, kill_at in enumerate(KILL_POINTS):
        out = run_worker(tmp_path, kafka_broker, topic, kill_at)
        assert f"killed at {kill_at}" in out
        if number == 0:
            kafka_broker.produce(topic, records(FIRST, LATER))

    run_worker(tmp_path, kafka_broker, topic, None)

    assert snapshot(spark, tmp_path, topic) == reference


@pytest.mark.extended  # the kill points above cover each step of a batch
def test_sigkill_at_a_random_moment_then_rerun_gives_the_reference_outputs(
    spark, kafka_broker, tmp_path, reference
):
    prepare_lake(spark, tmp_path)
    topic = new_topic(kafka_broker, (0, FIRST))
    args = [sys.executable, "-m", "tests.core.kafka_worker", str(tmp_path)]
    args += [kafka_broker.bootstrap_servers, topic]
    process = subprocess.Popen(
        args, cwd=REPO, env=spark_env(PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    # Spark takes 15-40 s to start here; the batches follow within a minute.
    delay = random.Random(os.getpid()).uniform(25, 70)
    try:
        process.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    time.sleep(1)
    kafka_broker.produce(topic, records(FIRST, LATER))

    run_worker(tmp_path, kafka_broker, topic, None)

    assert snapshot(spark, tmp_path, topic) == reference

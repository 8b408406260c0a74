"""How a batch counts its routes (core/batch/route_counts.py): a batch whose every record
is released unless invalid, from a source whose statistics cannot rule out invalid
records (a Kafka topic), counts them in the job writing its outputs, not in a job of its
own; those counts hold only when that job saw every record once, else a job counts
again; invalid records still stop the batch with nothing committed. And a side input
that routes records ``unmatched`` (an empty one declaring ``on_empty="unmatched"``) is
never taken for a batch whose records are all released."""

import datetime as dt
import json
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core.batch import route as route_stage
from dagster_sideinputs.core.batch import write as write_stage
from dagster_sideinputs.core.batch.context import StageContext
from dagster_sideinputs.core.sideinputs.windows import as_utc
from dagster_sideinputs.delta.storage import DeltaRsEngine
from tests.core.catalogue import nothing_committed
from tests.core.conftest import Lake
from tests.core.test_crash_safety import CrashingEngine, InjectedCrash
from tests.servers.kafka import KafkaBroker

TX = "tx_id long, customer_id long, amount double"
PROFILES = "customer_id long, name string"
BIG = dsi.OutputTag("big")
WRITE_JOB = "routes counted by the write job"
COUNTED_AGAIN = "the write job did not see every record once: routes counted by a job"


def enrich(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    return main.withColumn("name", F.col("profile.name")).drop("profile")


def with_big(main: DataFrame, sides: dsi.SideInputs) -> dict[Any, DataFrame]:
    enriched = enrich(main, sides)
    return {dsi.MAIN: enriched, BIG: enriched.filter(F.col("amount") > 5)}


def kafka_operator(lake: Lake, broker: KafkaBroker, topic: str, fn=with_big, **kwargs: Any):
    if not lake.exists("profiles"):
        lake.append("profiles", [(c, f"customer {c}") for c in range(3)], PROFILES)
    return lake.operator(
        main=dsi.MainInput.kafka(
            topic, bootstrap_servers=broker.bootstrap_servers, schema=TX, key="customer_id"
        ),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=fn,
        main_output="enriched",
        side_outputs=[BIG],
        **kwargs,
    )


def new_topic(broker: KafkaBroker, values: list[str]) -> str:
    name = broker.create_topic(broker.unique_topic("counts"), 2)
    broker.produce(name, [(f"k{i}", v) for i, v in enumerate(values)])  # type: ignore[misc]
    return name


def tx(tx_id: int) -> str:
    return json.dumps({"tx_id": tx_id, "customer_id": tx_id % 3, "amount": float(tx_id)})


def counted_by_jobs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which stages ran a job of their own to count the routes."""
    calls: list[str] = []
    for module in (route_stage, write_stage):
        original = module.count_routes

        def counting(*args: Any, _original=original, _name=module.__name__) -> Any:
            calls.append(_name.rsplit(".", 1)[-1])
            return _original(*args)

        monkeypatch.setattr(module, "count_routes", counting)
    return calls


@pytest.mark.kafka
def test_a_kafka_batch_counts_its_routes_in_the_job_writing_its_outputs(
    lake, kafka_broker, monkeypatch
):
    calls = counted_by_jobs(monkeypatch)
    name = new_topic(kafka_broker, [tx(i) for i in range(10)])
    op = kafka_operator(lake, kafka_broker, name)
    [batch] = op.run(lake.spark).batches
    assert calls == []
    assert any(WRITE_JOB in note for note in batch.notes), batch.notes
    assert batch.rows_in == 10
    assert batch.routes["released"] == 10
    assert batch.routes["invalid"] == 0
    assert lake.rows("enriched", "tx_id") == [(i,) for i in range(10)]
    assert lake.rows("big", "tx_id") == [(i,) for i in range(6, 10)]
    newest = (
        lake.spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
        .option("subscribe", name)
        .load()
        .agg(F.max("timestamp"))
        .first()[0]  # type: ignore[index]
    )
    assert batch.max_event_time == as_utc(newest)  # the Kafka timestamp, the event time


@pytest.mark.kafka
def test_an_invalid_record_counted_by_the_write_job_still_stops_the_batch(
    lake, kafka_broker, monkeypatch
):
    """The outputs are staged, then the counts find the corrupt record: nothing commits,
    the error names the record, and the next run (with the route declared) places every
    record once."""
    calls = counted_by_jobs(monkeypatch)
    name = new_topic(kafka_broker, [tx(0), "{not json", tx(2)])
    op = kafka_operator(lake, kafka_broker, name)
    with (
        nothing_committed(lake, op),
        pytest.raises(dsi.errors.MainInputDataError, match="1 record"),
    ):
        op.run(lake.spark)
    assert calls == []
    invalid = dsi.OutputTag("invalid_tx")
    fixed = kafka_operator(lake, kafka_broker, name, routes=dsi.Routes(invalid=invalid))
    [batch] = fixed.run(lake.spark).batches
    assert (batch.routes["released"], batch.routes["invalid"]) == (2, 1)
    assert lake.rows("enriched", "tx_id") == [(0,), (2,)]
    assert len(lake.rows("invalid_tx")) == 1


@pytest.mark.kafka
def test_a_topic_with_transaction_markers_counts_first_once_a_batch_missed(
    lake, kafka_broker, monkeypatch
):
    """Transactional producers' commit markers take offsets: the first batch's write job
    sees fewer records than its offsets and a job counts again after it (reading the
    topic twice); the run's later batches of that topic count first, with the records
    cached for the writes, instead of missing every time."""
    calls = counted_by_jobs(monkeypatch)
    name = kafka_broker.create_topic(kafka_broker.unique_topic("txn"), 1)
    producer = kafka_broker.producer(**{"transactional.id": name})
    producer.init_transactions(30)
    for first in (0, 6):  # 6 records, then a commit marker: 7 offsets per transaction
        producer.begin_transaction()
        for i in range(first, first + 6):
            producer.produce(name, tx(i).encode(), f"k{i}".encode())
        producer.commit_transaction(30)
    op = lake.operator(
        main=dsi.MainInput.kafka(
            name,
            bootstrap_servers=kafka_broker.bootstrap_servers,
            schema=TX,
            key="customer_id",
            max_records_per_batch=7,
        ),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=with_big,
        main_output="enriched",
        side_outputs=[BIG],
    )
    lake.append("profiles", [(c, f"customer {c}") for c in range(3)], PROFILES)

    first, second = op.run(lake.spark).batches

    assert calls == ["write", "route"]
    assert COUNTED_AGAIN in first.notes
    assert COUNTED_AGAIN not in second.notes
    assert (first.routes["released"], second.routes["released"]) == (6, 6)
    assert sorted(tx_id for (tx_id,) in lake.rows("enriched", "tx_id")) == list(range(12))


@pytest.mark.kafka
def test_counts_a_user_action_saw_first_are_counted_again(lake, kafka_broker, monkeypatch):
    """A function that takes one record before returning its frames completes the batch's
    observation with that one record: the total is not the slice's, so a job counts."""
    calls = counted_by_jobs(monkeypatch)

    def peeking(main: DataFrame, sides: dsi.SideInputs) -> dict[Any, DataFrame]:
        main.take(1)
        return with_big(main, sides)

    name = new_topic(kafka_broker, [tx(i) for i in range(8)])
    op = kafka_operator(lake, kafka_broker, name, fn=peeking)
    [batch] = op.run(lake.spark).batches
    assert calls == ["write"]
    assert COUNTED_AGAIN in batch.notes
    assert (batch.rows_in, batch.routes["released"]) == (8, 8)
    assert lake.rows("enriched", "tx_id") == [(i,) for i in range(8)]


@pytest.mark.both_engines
def test_an_empty_side_input_routing_unmatched_is_counted_batch_after_batch(lake):
    """A ready (fresh), empty map declaring ``on_empty="unmatched"`` sends every record to
    the unmatched tag: the batch is not one whose records are all released, even when the
    main input's statistics count them (before, the second batch, its unmatched table
    existing and counted empty, skipped it and lost the records)."""
    unmatched = dsi.OutputTag("unmatched_tx")
    lake.append("profiles", [], PROFILES)
    op = lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "profile": dsi.SideInput.map(
                "profiles", key="customer_id", on_empty="unmatched", max_age=dt.timedelta(days=1)
            )
        },
        fn=enrich,
        main_output="enriched",
        routes=dsi.Routes(unmatched=unmatched),
    )
    for first, last in ((1, 3), (4, 5)):
        lake.append("transactions", [(i, i % 3, 1.0) for i in range(first, last + 1)], TX)
        [batch] = lake.run(op).batches
        assert batch.routes["unmatched"] == last - first + 1
        assert batch.routes["released"] == 0
    assert lake.rows("unmatched_tx", "tx_id") == [(i,) for i in range(1, 6)]
    assert lake.rows("enriched") == []


@pytest.mark.kafka
def test_kafka_records_are_cached_only_when_a_second_job_reads_them(
    lake, kafka_broker, monkeypatch
):
    """A fetch from the brokers is costly, so records that two jobs read (the routes'
    count, then the writes) are cached; a batch that one job reads whole (the outputs in
    one pass, its routes observed there) reads the topic once, uncached."""
    cached: list[list[str]] = []
    persist = StageContext.persist

    def recording(self: StageContext, frame: DataFrame) -> DataFrame:
        cached.append(frame.columns)
        return persist(self, frame)

    monkeypatch.setattr(StageContext, "persist", recording)
    one_job = kafka_operator(lake, kafka_broker, new_topic(kafka_broker, [tx(0), tx(1)]))
    one_job.run(lake.spark)
    assert cached == []
    invalid = dsi.OutputTag("invalid_tx")
    name = new_topic(kafka_broker, [tx(0), "{", tx(2)])
    routes = dsi.Routes(invalid=invalid)
    two_jobs = kafka_operator(lake, kafka_broker, name, routes=routes, operator_id="checked")
    [batch] = two_jobs.run(lake.spark).batches
    [columns] = cached
    assert "kafka_offset" in columns
    assert (batch.routes["released"], batch.routes["invalid"]) == (2, 1)


@pytest.mark.kafka
@pytest.mark.parametrize("crash_after", [0, 1])
def test_a_batch_whose_write_job_counted_its_routes_replays_exactly_once(
    lake, kafka_broker, crash_after
):
    """Cut off before any commit, or between its two tables' commits: the rerun replays
    the batch (the second table's staging job then counts its routes) and every record
    is in each table once, with the batch's counts."""
    name = new_topic(kafka_broker, [tx(i) for i in range(12)])
    engine = CrashingEngine(DeltaRsEngine(), crash_after=crash_after)
    storage = dsi.DeltaStorage(lake.storage.root, engine=engine)
    crashing = kafka_operator(lake, kafka_broker, name, storage=storage)
    with pytest.raises(InjectedCrash):
        crashing.run(lake.spark)
    [batch] = kafka_operator(lake, kafka_broker, name).run(lake.spark).batches
    assert batch.replayed
    assert (batch.rows_in, batch.routes["released"]) == (12, 12)
    assert sorted(lake.rows("enriched", "tx_id")) == [(i,) for i in range(12)]
    assert sorted(lake.rows("big", "tx_id")) == [(i,) for i in range(6, 12)]


@pytest.mark.kafka
def test_a_compacted_topic_counts_its_routes_in_a_job_of_its_own(lake, kafka_broker, monkeypatch):
    """A compacted log numbers more offsets than records, so the write job's counts would
    never match them and the batch would read the topic twice: its routes are counted
    first, from the records cached for the writes, as before."""
    calls = counted_by_jobs(monkeypatch)
    name = kafka_broker.create_topic(
        kafka_broker.unique_topic("compacted"), 2, config={"cleanup.policy": "compact"}
    )
    kafka_broker.produce(name, [(f"k{i}", tx(i)) for i in range(6)])  # type: ignore[misc]
    [batch] = kafka_operator(lake, kafka_broker, name).run(lake.spark).batches
    assert calls == ["route"]
    assert not any(WRITE_JOB in note for note in batch.notes), batch.notes
    assert (batch.rows_in, batch.routes["released"]) == (6, 6)

"""A Kafka main input, against a real broker: exact offsets, exactly once, bad input.

Every test creates its own topics on the session's broker (``kafka_broker``) and reads
them through Spark's Kafka connector in the shared session (``spark``).
"""

import datetime as dt
import json
import os
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from dagster_sideinputs.core.sources.kafka.admin import (
    LEADERSHIP_IN_FLUX,
    KafkaMetadata,
    admin_config,
    leadership_in_flux,
)
from dagster_sideinputs.core.sources.kafka.declaration import REDACTED
from dagster_sideinputs.core.sources.kafka.offsets import share_out
from dagster_sideinputs.core.sources.kafka.source import KafkaSource
from dagster_sideinputs.core.state.plan import BatchPlan, MainRange, OffsetRange
from dagster_sideinputs.delta.storage import DeltaRsEngine
from tests.core.accounting import assert_accounted
from tests.core.conftest import Lake
from tests.core.test_crash_safety import CrashingEngine, InjectedCrash
from tests.servers.kafka import KafkaBroker

pytestmark = pytest.mark.kafka

TX = "tx_id long, customer_id long, amount double"
PROFILES = "customer_id long, name string"
INVALID = dsi.OutputTag("invalid_tx")
CUSTOMERS = 7


def tx(ids: range | list[int]) -> list[dict[str, Any]]:
    return [{"tx_id": i, "customer_id": i % CUSTOMERS, "amount": float(i)} for i in ids]


def enrich(main, sides):
    return main.withColumn("name", F.col("profile.name")).drop("profile")


def topic(broker: KafkaBroker, partitions: int = 3, **config: str) -> str:
    return broker.create_topic(broker.unique_topic("tx"), partitions, config=config)


def kafka_main(broker: KafkaBroker, name: str, **options: Any) -> dsi.MainInput:
    options.setdefault("schema", TX)
    options.setdefault("key", "customer_id")
    return dsi.MainInput.kafka(name, bootstrap_servers=broker.bootstrap_servers, **options)


def operator(lake: Lake, main: dsi.MainInput, **kwargs: Any) -> dsi.SideInputOperator:
    if not lake.exists("profiles"):
        lake.append("profiles", [(c, f"customer {c}") for c in range(CUSTOMERS)], PROFILES)
    kwargs.setdefault("routes", dsi.Routes(invalid=INVALID))
    return lake.operator(
        main=main,
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=enrich,
        main_output="enriched",
        **kwargs,
    )


def plan_files(op: dsi.SideInputOperator) -> list[str]:
    folder = op.state_uri
    found = []
    for directory, _, names in os.walk(folder):
        found += [os.path.join(directory, n) for n in names if n.endswith(".json")]
    return found


# --- declarations and plans (no broker) ------------------------------------------------


def test_declaration_needs_topics_or_a_pattern_and_a_json_schema():
    with pytest.raises(dsi.DeclarationError, match="name the topic"):
        dsi.MainInput.kafka(bootstrap_servers="b:9092", schema=TX)
    with pytest.raises(dsi.DeclarationError, match="JSON values need a schema"):
        dsi.MainInput.kafka("tx", bootstrap_servers="b:9092")
    with pytest.raises(dsi.DeclarationError, match="Avro values need the writer's schema"):
        dsi.MainInput.kafka("tx", bootstrap_servers="b:9092", format="avro")
    with pytest.raises(dsi.DeclarationError, match="reader option 'startingOffsets'"):
        dsi.MainInput.kafka(
            "tx", bootstrap_servers="b:9092", schema=TX, reader_options={"startingOffsets": "0"}
        )
    with pytest.raises(dsi.DeclarationError, match=r"client option 'group\.id'"):
        dsi.MainInput.kafka("tx", bootstrap_servers="b:9092", schema=TX, options={"group.id": "g"})
    with pytest.raises(dsi.DeclarationError, match="pre_keyed needs exactly one topic"):
        dsi.MainInput.kafka(
            pattern="tx-.*", bootstrap_servers="b:9092", schema=TX, key="customer_id",
            pre_keyed=dsi.KeyGroups(8),
        )  # fmt: skip


def test_kafka_timestamp_is_the_default_event_time_and_the_topic_the_asset():
    main = dsi.MainInput.kafka("payments", bootstrap_servers="b:9092", schema=TX)
    assert main.event_time == "kafka_timestamp"
    assert main.asset == "payments"
    assert main.kind == "kafka"


def test_a_json_field_named_like_a_kafka_coordinate_is_refused_where_it_is_declared():
    schema = T.StructType([T.StructField("kafka_offset", T.LongType())])
    with pytest.raises(dsi.DeclarationError, match=r"(?s)\['kafka_offset'\].*rename"):
        dsi.MainInput.kafka("payments", bootstrap_servers="b:9092", schema=schema)


def test_secrets_are_redacted_in_reprs():
    main = dsi.MainInput.kafka(
        "payments",
        bootstrap_servers="b:9092",
        schema=TX,
        options={
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
            'required username="svc" password="hunter2";',
        },
    )
    assert "hunter2" not in repr(main)
    assert REDACTED in repr(main)
    config = admin_config(main.kafka_input, "x")  # type: ignore[arg-type]
    assert config["sasl.username"] == "svc"
    assert config["sasl.password"] == "hunter2"


def test_untranslatable_security_settings_name_the_option_and_the_fix():
    main = dsi.MainInput.kafka(
        "payments",
        bootstrap_servers="b:9092",
        schema=TX,
        options={"security.protocol": "SSL", "ssl.truststore.location": "/x/trust.jks"},
    )
    with pytest.raises(dsi.DeclarationError, match=r"ssl\.truststore\.location") as raised:
        admin_config(main.kafka_input, "x")  # type: ignore[arg-type]
    assert "ssl.ca.location" in str(raised.value)
    fixed = dsi.MainInput.kafka(
        "payments",
        bootstrap_servers="b:9092",
        schema=TX,
        options={"security.protocol": "SSL", "ssl.truststore.location": "/x/trust.jks"},
        admin_options={"ssl.ca.location": "/x/ca.pem"},
    )
    assert admin_config(fixed.kafka_input, "x")["ssl.ca.location"] == "/x/ca.pem"  # type: ignore[arg-type]


def test_leadership_errors_are_retried_and_others_are_not():
    """A partition just recreated can answer UNKNOWN_LEADER_EPOCH for a moment (seen in CI:
    the broker's metadata named the new leader epoch before the leader served it)."""
    from confluent_kafka import KafkaError

    for name in LEADERSHIP_IN_FLUX:
        assert isinstance(getattr(KafkaError, name), int), f"librdkafka has no {name}"
        assert leadership_in_flux(KafkaError(getattr(KafkaError, name)))
    for code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.OFFSET_OUT_OF_RANGE):
        assert not leadership_in_flux(KafkaError(code))


def test_kafka_range_has_an_exact_json_round_trip():
    main = MainRange(
        "kafka",
        offsets=(
            OffsetRange("a", 0, 5, 9, 12),
            OffsetRange("a", 1, 7, 7, 7),
            OffsetRange("b", 0, 0, 3, None),
        ),
        topic_ids={"a": "Qf1gzD_qSKiacD955nCwRg", "b": "R3jRNsK2Qf64NBFBc_fHKw"},
        lost=(OffsetRange("a", 0, 2, 5),),
    )
    plan = BatchPlan(
        operator_id="op",
        batch_id=3,
        now=dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc),
        main=main,
        side_versions={},
        decisions={},
        namespaces={},
        read_slots=(),
        buffer_version=-1,
        watermark=None,
        max_event_time=None,
    )
    again = BatchPlan.from_json(plan.to_json())
    assert again == plan
    assert again.to_json() == plan.to_json()
    assert main.records == 7
    assert main.lost_offsets == 3
    assert main.detail()["lag"] == 3


def test_a_capped_batch_shares_offsets_by_backlog_and_deterministically():
    ranges = [
        OffsetRange("t", 0, 0, 14, 14),
        OffsetRange("t", 1, 0, 14, 14),
        OffsetRange("t", 2, 0, 23, 23),
    ]
    capped = share_out(ranges, 30)
    assert sum(r.size for r in capped) == 30
    assert [r.size for r in capped] == [8, 8, 14]
    assert share_out(ranges, 30) == capped
    assert share_out(ranges, 1000) == ranges


# --- exactly once over real offsets ---------------------------------------------------------


def test_each_record_is_read_once_across_capped_batches(lake, kafka_broker):
    name = topic(kafka_broker)
    kafka_broker.produce_json(name, tx(range(100)), key="customer_id")
    op = operator(lake, kafka_main(kafka_broker, name, max_records_per_batch=40))

    result = op.run(lake.spark)

    assert [b.rows_in for b in result.batches] == [40, 40, 20]
    assert_accounted(lake.spark, op, list(range(100)))
    first, last = result.batches[0].main_detail, result.batches[-1].main_detail
    assert first["lag"] == 60
    assert last["lag"] == 0
    # Consecutive batches continue exactly where the previous one ended.
    for before, after in zip(result.batches, result.batches[1:], strict=False):
        ends = {(r["topic"], r["partition"]): r["end"] for r in before.main_detail["offsets"]}
        starts = {(r["topic"], r["partition"]): r["start"] for r in after.main_detail["offsets"]}
        assert ends == starts
    assert set(lake.rows("enriched", "name")) == {(f"customer {c}",) for c in range(CUSTOMERS)}
    # Records carry their coordinates.
    rows = lake.spark.read.parquet(op.output_tables["enriched"]).select(
        "kafka_topic", "kafka_partition", "kafka_offset", "kafka_key", "tx_id"
    )
    assert rows.select("kafka_topic").distinct().collect()[0][0] == name
    assert rows.filter(F.col("kafka_key") != F.col("tx_id") % CUSTOMERS).count() == 0


def test_new_records_and_an_idle_topic(lake, kafka_broker):
    name = topic(kafka_broker)
    op = operator(lake, kafka_main(kafka_broker, name))
    assert op.peek() is None
    assert op.run(lake.spark).batches == []
    kafka_broker.produce_json(name, tx(range(10)), key="customer_id")
    assert op.peek() is not None
    assert op.run(lake.spark).rows_in == 10
    assert op.peek() is None
    kafka_broker.produce_json(name, tx(range(10, 15)), key="customer_id")
    assert op.run(lake.spark).rows_in == 5
    assert_accounted(lake.spark, op, list(range(15)))


def test_starting_offsets_latest_skips_what_the_topic_held_before_the_first_batch(
    lake, kafka_broker
):
    name = topic(kafka_broker)
    kafka_broker.produce_json(name, tx(range(10)), key="customer_id")
    op = operator(lake, kafka_main(kafka_broker, name, starting_offsets="latest"))
    first = op.run(lake.spark).batches  # one batch writes the position down
    assert [b.rows_in for b in first] == [0]
    assert "starting at the log end" in first[0].main_range
    assert op.run(lake.spark).batches == []
    kafka_broker.produce_json(name, tx(range(10, 13)), key="customer_id")
    assert op.run(lake.spark).rows_in == 3
    assert_accounted(lake.spark, op, [10, 11, 12])


def test_replayed_batch_reads_exactly_its_pinned_offsets(lake, kafka_broker):
    name = topic(kafka_broker)
    kafka_broker.produce_json(name, tx(range(30)), key="customer_id")
    engine = CrashingEngine(DeltaRsEngine(), crash_after=1)  # after the first table commit
    crashing = operator(
        lake,
        kafka_main(kafka_broker, name),
        storage=dsi.DeltaStorage(lake.storage.root, engine=engine),
    )
    with pytest.raises(InjectedCrash):
        crashing.run(lake.spark)
    pinned = crashing.last_plan()
    assert pinned is not None
    assert pinned.main.records == 30
    kafka_broker.produce_json(name, tx(range(30, 50)), key="customer_id")

    op = operator(lake, kafka_main(kafka_broker, name))
    result = op.run(lake.spark)

    assert result.batches[0].replayed
    assert result.batches[0].rows_in == 30
    assert result.batches[0].main_detail["offsets"] == pinned.main.detail()["offsets"]
    assert result.batches[1].rows_in == 20
    assert_accounted(lake.spark, op, list(range(50)))


def test_new_partitions_are_read_from_their_first_offset(lake, kafka_broker):
    name = topic(kafka_broker, partitions=2)
    kafka_broker.produce_json(name, tx(range(20)), key="customer_id")
    op = operator(lake, kafka_main(kafka_broker, name))
    assert op.run(lake.spark).rows_in == 20

    kafka_broker.create_partitions(name, 4)
    kafka_broker.produce_json(name, tx(range(20, 30)), partition=3)
    kafka_broker.produce_json(name, tx(range(30, 35)), partition=0)
    result = op.run(lake.spark)

    assert result.rows_in == 15
    partitions = {r["partition"]: r for r in result.batches[0].main_detail["offsets"]}
    assert sorted(partitions) == [0, 1, 2, 3]
    assert (partitions[3]["start"], partitions[3]["end"]) == (0, 10)
    assert partitions[2]["start"] == partitions[2]["end"] == 0
    assert_accounted(lake.spark, op, list(range(35)))


def test_a_pattern_picks_up_topics_that_appear(lake, kafka_broker):
    prefix = kafka_broker.unique_topic("pat")
    first = kafka_broker.create_topic(f"{prefix}-a", 1)
    kafka_broker.create_topic(f"{prefix}-other-x", 1)  # does not match the whole pattern
    kafka_broker.produce_json(first, tx(range(5)), key="customer_id")
    kafka_broker.produce_json(f"{prefix}-other-x", tx(range(100, 103)), key="customer_id")
    op = operator(
        lake, kafka_main(kafka_broker, None, pattern=f"{prefix}-[a-z]", asset="tx_pattern")
    )
    assert op.run(lake.spark).rows_in == 5
    second = kafka_broker.create_topic(f"{prefix}-b", 2)
    kafka_broker.produce_json(second, tx(range(5, 9)), key="customer_id")
    result = op.run(lake.spark)
    assert result.rows_in == 4
    assert set(result.batches[0].main_detail["offsets"][0]) >= {"topic", "partition", "lag"}
    assert_accounted(lake.spark, op, list(range(9)))


# --- lost offsets, recreated topics, shrunk partitions ------------------------------------


def test_offsets_deleted_before_they_were_read_are_an_error_naming_them(lake, kafka_broker):
    name = topic(kafka_broker, partitions=2)
    kafka_broker.produce_json(name, tx(range(10)), partition=0)
    op = operator(lake, kafka_main(kafka_broker, name))
    assert op.run(lake.spark).rows_in == 10
    kafka_broker.produce_json(name, tx(range(10, 20)), partition=0)
    kafka_broker.delete_records(name, {0: 15})  # retention took offsets 10..14 unread

    with pytest.raises(dsi.errors.KafkaOffsetsLostError) as raised:
        op.run(lake.spark)

    message = str(raised.value)
    assert f"{name}[0] offsets 10..15" in message
    assert 'on_data_loss="skip"' in message
    assert op.last_committed_batch() == 0
    assert_accounted(lake.spark, op, list(range(10)))


def test_on_data_loss_skip_skips_counts_and_reports_the_lost_offsets(lake, kafka_broker):
    name = topic(kafka_broker, partitions=2)
    kafka_broker.produce_json(name, tx(range(10)), partition=0)
    op = operator(lake, kafka_main(kafka_broker, name, on_data_loss="skip"))
    op.run(lake.spark)
    kafka_broker.produce_json(name, tx(range(10, 20)), partition=0)
    kafka_broker.delete_records(name, {0: 15})

    result = op.run(lake.spark)

    batch = result.batches[0]
    assert batch.rows_in == 5
    assert batch.lost_offsets == 5
    assert batch.main_detail["lost"] == [
        {"topic": name, "partition": 0, "start": 10, "end": 15, "log_end": None}
    ]
    assert "5 lost offset(s) skipped" in batch.summary()
    assert_accounted(lake.spark, op, [*range(10), *range(15, 20)])


def test_a_recreated_topic_is_an_error_until_reset(lake, kafka_broker):
    name = topic(kafka_broker, partitions=2)
    kafka_broker.produce_json(name, tx(range(10)), key="customer_id")
    op = operator(lake, kafka_main(kafka_broker, name))
    op.run(lake.spark)
    kafka_broker.recreate_topic(name, 2)
    kafka_broker.produce_json(name, tx(range(100, 104)), key="customer_id")

    with pytest.raises(dsi.errors.OperatorStateError, match="deleted and created again") as raised:
        op.run(lake.spark)
    assert "topic id" in str(raised.value)
    assert name in str(raised.value)

    op.reset(main_from="beginning")
    assert op.run(lake.spark).rows_in == 4
    assert_accounted(lake.spark, op, [*range(10), *range(100, 104)])


def test_a_partition_that_disappeared_is_an_error_naming_it(lake, kafka_broker):
    name = topic(kafka_broker, partitions=2)
    op = operator(lake, kafka_main(kafka_broker, name))
    source = KafkaSource(op.spec)
    ids = {name: KafkaMetadata(op.spec.main.kafka_input, "x").describe([name])[name].topic_id}  # type: ignore[arg-type]
    # A position in partition 5 of a topic (same id) that has 2: the count shrank.
    position = MainRange(
        "kafka",
        offsets=(OffsetRange(name, 0, 0, 0), OffsetRange(name, 5, 0, 42)),
        topic_ids=ids,
    )
    with pytest.raises(dsi.errors.OperatorStateError, match=r"partition count shrank") as raised:
        source.next_range(position)
    assert "[5] at 42" in str(raised.value)


def test_a_pending_batch_whose_offsets_are_gone_cannot_be_replayed(lake, kafka_broker):
    name = topic(kafka_broker, partitions=1)
    kafka_broker.produce_json(name, tx(range(10)), key="customer_id")
    engine = CrashingEngine(DeltaRsEngine(), crash_after=1)
    crashing = operator(
        lake,
        kafka_main(kafka_broker, name),
        storage=dsi.DeltaStorage(lake.storage.root, engine=engine),
    )
    with pytest.raises(InjectedCrash):
        crashing.run(lake.spark)
    kafka_broker.delete_records(name, {0: 4})

    with pytest.raises(dsi.errors.KafkaOffsetsLostError, match=rf"{name}\[0\] 0..10"):
        operator(lake, kafka_main(kafka_broker, name)).run(lake.spark)


# --- bad records --------------------------------------------------------------------------


def test_malformed_json_and_tombstones_go_to_the_invalid_route(lake, kafka_broker):
    name = topic(kafka_broker, partitions=1)
    kafka_broker.produce_json(name, tx(range(3)), key="customer_id")
    kafka_broker.produce(name, [("1", '{"tx_id": 7, "customer_id": '), ("2", '{"tx_id": "x"}')])
    producer = kafka_broker.producer()
    producer.produce(name, None, b"3")  # a tombstone
    producer.flush(30)
    op = operator(lake, kafka_main(kafka_broker, name))

    result = op.run(lake.spark)

    assert result.batches[0].routes["invalid"] == 3
    reasons = [r[0] for r in lake.rows("invalid_tx", "reason")]
    assert any(f"{name}[0]@3: " in r and "customer_id" in r for r in reasons)
    assert any("null value (a tombstone)" in r for r in reasons)
    assert len(lake.rows("enriched")) == 3


def test_malformed_json_without_an_invalid_route_stops_the_batch(lake, kafka_broker):
    name = topic(kafka_broker, partitions=1)
    kafka_broker.produce_json(name, tx(range(3)), key="customer_id")
    kafka_broker.produce(name, [("1", "{not json")])
    op = operator(
        lake,
        kafka_main(kafka_broker, name),
        routes=dsi.Routes(invalid=None),
    )

    with pytest.raises(dsi.errors.MainInputDataError, match=rf"{name}\[0\]@3: {{not json"):
        op.run(lake.spark)
    assert not lake.exists("enriched")


def test_string_bytes_and_avro_values(lake, kafka_broker):
    from pyspark.sql.avro.functions import to_avro

    name = topic(kafka_broker, partitions=1)
    kafka_broker.produce(name, [("k1", "hello"), ("k2", "world")])
    for fmt, expected in (("string", ["hello", "world"]), ("bytes", [b"hello", b"world"])):
        op = lake.operator(
            main=dsi.MainInput.kafka(
                name, bootstrap_servers=kafka_broker.bootstrap_servers, format=fmt
            ),
            side_inputs={},
            fn=lambda main, sides: main,
            main_output=f"out_{fmt}",
        )
        op.run(lake.spark)
        values = sorted(lake.rows(f"out_{fmt}", "value"))
        assert [bytes(v[0]) if fmt == "bytes" else v[0] for v in values] == expected

    avro_topic = topic(kafka_broker, partitions=1)
    schema = json.dumps(
        {
            "type": "record",
            "name": "Tx",
            "fields": [{"name": "tx_id", "type": "long"}, {"name": "amount", "type": "double"}],
        }
    )
    encoded = lake.spark.range(4).select(
        F.col("id").cast("string").alias("key"),
        to_avro(
            F.struct(F.col("id").alias("tx_id"), (F.col("id") * 2.5).alias("amount")), schema
        ).alias("value"),
    )
    encoded.write.format("kafka").option(
        "kafka.bootstrap.servers", kafka_broker.bootstrap_servers
    ).option("topic", avro_topic).save()
    op = lake.operator(
        main=dsi.MainInput.kafka(
            avro_topic,
            bootstrap_servers=kafka_broker.bootstrap_servers,
            format="avro",
            avro_schema=schema,
        ),
        side_inputs={},
        fn=lambda main, sides: main,
        main_output="out_avro",
    )
    op.run(lake.spark)
    assert lake.rows("out_avro", "tx_id", "amount") == [(i, i * 2.5) for i in range(4)]


# --- secrets --------------------------------------------------------------------------------


def test_client_secrets_are_never_written_to_plans_records_or_metrics(lake, kafka_broker):
    name = topic(kafka_broker, partitions=1)
    kafka_broker.produce_json(name, tx(range(3)), key="customer_id")
    secret = "s3cr3t-key-password"
    # Unused on a PLAINTEXT connection, but passed to both clients like any setting.
    main = kafka_main(kafka_broker, name, options={"ssl.key.password": secret})
    op = operator(lake, main)
    result = op.run(lake.spark)
    assert result.rows_in == 3
    assert secret not in repr(op)
    assert secret not in repr(op.spec.options)
    assert secret not in json.dumps(result.batches[0].as_dict(), default=str)
    files = plan_files(op)
    assert files
    for path in files:
        with open(path) as f:
            assert secret not in f.read(), path


def test_a_batch_no_table_committed_is_planned_again_with_the_offsets_there_are_now(
    lake, kafka_broker
):
    name = topic(kafka_broker, partitions=1)
    kafka_broker.produce_json(name, tx(range(5)), key="customer_id")
    operator(lake, kafka_main(kafka_broker, name))  # the profiles

    def broken(main, sides):
        raise ValueError("a bug, fixed before the rerun")

    # The function fails while the batch stages its tables: no table committed, and no
    # run claimed the plan for commit (a claimed plan is replayed from its pinned
    # offsets instead: test_replayed_batch_reads_exactly_its_pinned_offsets).
    failing = lake.operator(
        main=kafka_main(kafka_broker, name),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=broken,
        main_output="enriched",
        routes=dsi.Routes(invalid=INVALID),
    )
    with pytest.raises(dsi.errors.FunctionError):
        failing.run(lake.spark)
    kafka_broker.produce_json(name, tx(range(5, 8)), key="customer_id")
    op = operator(lake, kafka_main(kafka_broker, name))
    result = op.run(lake.spark)
    assert not result.batches[0].replayed
    assert result.batches[0].rows_in == 8
    assert_accounted(lake.spark, op, list(range(8)))


def test_peek_names_the_new_offsets_without_spark(lake, kafka_broker):
    name = topic(kafka_broker, partitions=2)
    op = operator(
        lake, kafka_main(kafka_broker, name), window=dsi.Window.tumbling(dt.timedelta(hours=1))
    )
    kafka_broker.produce_json(name, tx(range(4)), key="customer_id")
    plan = op.peek()
    assert plan is not None
    assert plan.main.records == 4
    assert name in plan.main.describe()


def test_reset_latest_starts_at_the_log_end(lake, kafka_broker):
    name = topic(kafka_broker, partitions=2)
    kafka_broker.produce_json(name, tx(range(6)), key="customer_id")
    op = operator(lake, kafka_main(kafka_broker, name))
    op.reset(main_from="latest")
    kafka_broker.produce_json(name, tx(range(6, 9)), key="customer_id")
    assert op.run(lake.spark).rows_in == 3
    assert_accounted(lake.spark, op, [6, 7, 8])
    # Keep: the position stays; nothing is read twice.
    op.reset(main_from="keep")
    assert op.run(lake.spark).batches == []

"""Bad-input catalogue, issue 37 class 7: every state error offers a reset that is exact.

A state error (a vanished or recreated topic, a partition gone, offsets deleted unread, a
main table created again) names the change and offers at least one reset after which
every record the inputs still hold is placed exactly once. Each case takes that path.
"""

import shutil
from typing import Any

import pytest

import dagster_sideinputs as dsi
from dagster_sideinputs.core.sources.kafka.source import KafkaSource
from dagster_sideinputs.core.state.plan import MainRange, OffsetRange
from tests.core.catalogue import PROFILES, TX, accounted, nothing_committed, operator, put, refused
from tests.core.conftest import Lake
from tests.core.test_kafka import kafka_main, tx
from tests.core.test_kafka import operator as kafka_operator
from tests.servers.kafka import KafkaBroker

KEEP = "reset(main_from='keep')"


def _pattern(broker: KafkaBroker, **topics: int) -> tuple[str, dict[str, str]]:
    prefix = broker.unique_topic("rst")
    names = {k: broker.create_topic(f"{prefix}-{k}", n) for k, n in topics.items()}
    return f"{prefix}-[a-z]", names


def _kafka_op(lake: Lake, broker: KafkaBroker, **options: Any) -> dsi.SideInputOperator:
    return kafka_operator(lake, kafka_main(broker, None, asset="tx_rst", **options))


@pytest.mark.kafka
def test_a_deleted_pattern_topic_keeps_the_other_topics_unread_records(lake, kafka_broker):
    pattern, names = _pattern(kafka_broker, a=1, b=1)
    kafka_broker.produce_json(names["a"], tx(range(0, 3)), key="customer_id")
    kafka_broker.produce_json(names["b"], tx(range(10, 13)), key="customer_id")
    op = _kafka_op(lake, kafka_broker, pattern=pattern)
    op.run(lake.spark)
    kafka_broker.produce_json(names["b"], tx(range(13, 16)), key="customer_id")  # unread
    kafka_broker.delete_topic(names["a"])

    with nothing_committed(lake, op), refused(dsi.errors.OperatorStateError, names["a"], fix=KEEP):
        op.run(lake.spark)

    op.reset(main_from="keep")
    assert op.run(lake.spark).rows_in == 3
    accounted(lake, op, [*range(0, 3), *range(10, 16)])


@pytest.mark.kafka
def test_a_recreated_pattern_topic_is_read_from_its_beginning_and_the_others_kept(
    lake, kafka_broker
):
    pattern, names = _pattern(kafka_broker, a=1, b=1)
    kafka_broker.produce_json(names["a"], tx(range(0, 3)), key="customer_id")
    kafka_broker.produce_json(names["b"], tx(range(10, 13)), key="customer_id")
    op = _kafka_op(lake, kafka_broker, pattern=pattern)
    op.run(lake.spark)
    kafka_broker.produce_json(names["b"], tx(range(13, 15)), key="customer_id")
    kafka_broker.recreate_topic(names["a"], 1)
    kafka_broker.produce_json(names["a"], tx(range(20, 22)), key="customer_id")

    with nothing_committed(lake, op), refused(dsi.errors.OperatorStateError, names["a"], fix=KEEP):
        op.run(lake.spark)

    op.reset(main_from="keep")
    assert op.run(lake.spark).rows_in == 4
    accounted(lake, op, [*range(0, 3), *range(10, 15), 20, 21])


@pytest.mark.kafka
def test_offsets_deleted_unread_are_skipped_once_by_keep_and_nothing_else(lake, kafka_broker):
    name = kafka_broker.create_topic(kafka_broker.unique_topic("rst"), 2)
    kafka_broker.produce_json(name, tx(range(4)), partition=0)
    kafka_broker.produce_json(name, tx(range(100, 104)), partition=1)
    op = kafka_operator(lake, kafka_main(kafka_broker, name))
    op.run(lake.spark)
    kafka_broker.produce_json(name, tx(range(4, 10)), partition=0)
    kafka_broker.produce_json(name, tx(range(104, 106)), partition=1)
    kafka_broker.delete_records(name, {0: 7})  # offsets 4..6 deleted unread

    with (
        nothing_committed(lake, op),
        refused(dsi.errors.KafkaOffsetsLostError, f"{name}[0] offsets 4..7", fix=KEEP),
    ):
        op.run(lake.spark)

    op.reset(main_from="keep")
    assert op.run(lake.spark).rows_in == 5
    accounted(lake, op, [*range(4), *range(7, 10), *range(100, 106)])


@pytest.mark.kafka
def test_keep_drops_only_a_vanished_partitions_position(lake, kafka_broker):
    name = kafka_broker.create_topic(kafka_broker.unique_topic("rst"), 2)
    kafka_broker.produce_json(name, tx(range(3)), partition=1)
    op = kafka_operator(lake, kafka_main(kafka_broker, name))
    source = KafkaSource(op.spec)
    topic_id = kafka_broker.topic_id(name)
    # A position in partition 5 of the same topic (it has 2): the count shrank.
    position = MainRange(
        "kafka",
        offsets=(
            OffsetRange(name, 0, 0, 0),
            OffsetRange(name, 1, 0, 2),
            OffsetRange(name, 5, 0, 9),
        ),
        topic_ids={name: topic_id},
    )
    with refused(dsi.errors.OperatorStateError, f"{name}", "[5] at 9", fix=KEEP):
        source.next_range(position)

    from dagster_sideinputs.core.sources.kafka.offsets import keep_position

    kept, notes = keep_position(source.metadata, source.label, position)

    assert [(r.partition, r.start, r.end) for r in kept.offsets] == [(0, 0, 0), (1, 2, 2)]
    assert kept.topic_ids == {name: topic_id}
    assert any(f"{name}[5]" in note for note in notes)
    following = source.next_range(kept).range
    assert [(r.partition, r.start, r.end) for r in following.offsets] == [(0, 0, 0), (1, 2, 3)]


def test_a_recreated_main_table_holding_a_copy_is_read_after_the_copy(lake: Lake):
    put(lake, "profiles", [(c, f"c{c}") for c in range(3)], PROFILES)
    put(lake, "transactions", [(i, i % 3, float(i)) for i in range(4)], TX)
    op = operator(lake)
    op.run(lake.spark)
    # The table is deleted and written again: a copy of the rows read (version 0), then
    # new rows (version 1).
    shutil.rmtree(lake.storage.table_uri("transactions").removeprefix("file://"))
    put(lake, "transactions", [(i, i % 3, float(i)) for i in range(4)], TX)
    put(lake, "transactions", [(i, i % 3, float(i)) for i in range(4, 6)], TX)

    with (
        nothing_committed(lake, op),
        refused(
            dsi.errors.OperatorStateError,
            "transactions",
            "deleted and created again",
            fix=["reset(main_from='beginning')", "reset(main_from=<version>)"],
        ),
    ):
        op.run(lake.spark)

    op.reset(main_from=0)
    assert op.run(lake.spark).rows_in == 2
    accounted(lake, op, range(6))

"""Pre-keyed main inputs: keyed steps without a shuffle of the main input; the promise checked."""

import contextlib
import os
import re

import pytest
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core.keyed import key_group
from tests.core.conftest import Lake

GROUPS = 4
PROFILES = "customer_id long, name string"


@contextlib.contextmanager
def no_broadcast(spark):
    """Make Spark shuffle-join the side input, as it would a large one."""
    previous = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    try:
        yield
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", previous)


def write_pre_keyed(lake: Lake, rows: int, *, groups: int = GROUPS) -> None:
    frame = lake.spark.range(rows).select(
        F.col("id").alias("tx_id"),
        (F.col("id") % 37).alias("customer_id"),
        F.lit(1.0).alias("amount"),
    )
    frame = frame.withColumn("key_group", key_group("customer_id", groups))
    dsi.write_dataframe(frame, lake.storage.table_uri("transactions"), partition_by=["key_group"])


def keyed_operator(lake: Lake, pre_keyed: dsi.KeyGroups | None) -> dsi.SideInputOperator:
    return lake.operator(
        main=dsi.MainInput("transactions", key="customer_id", pre_keyed=pre_keyed),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id", distribution="keyed")
        },
        fn=lambda main, sides: main.select(
            "tx_id", "customer_id", F.col("profile.name").alias("name")
        ),
        main_output="enriched",
    )


def ancestors_of_scan(plan: str, marker: str) -> list[str]:
    """Operator names on the path from the scan line containing ``marker`` to the plan's root."""
    lines = [line for line in plan.splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if "FileScan" in line and marker in line)

    def depth(line: str) -> int:
        return len(line) - len(line.lstrip(" :+-"))

    path, level = [], depth(lines[start])
    for line in reversed(lines[:start]):
        if depth(line) < level:
            path.append(line.strip(" :+-*()0123456789"))
            level = depth(line)
    return path


def test_key_group_is_sparks_murmur3_bucket_of_the_key(spark):
    frame = spark.range(100).select(F.col("id").alias("k"))
    expected = frame.select(F.expr("pmod(hash(k), 16)").alias("g"))
    assert frame.select(key_group("k", 16).alias("g")).collect() == expected.collect()


def test_pre_keyed_main_input_has_no_exchange_on_the_main_side(lake):
    write_pre_keyed(lake, 400)
    lake.append("profiles", [(k, f"n{k}") for k in range(37)], PROFILES)
    with no_broadcast(lake.spark):
        batch = (
            keyed_operator(lake, dsi.KeyGroups(GROUPS, "key_group"))
            .run(lake.spark, explain=True)
            .batches[0]
        )
    assert "no shuffle" in batch.notes[0]
    plan = batch.physical_plan
    assert "Bucketed: true" in plan
    main_path = ancestors_of_scan(plan, "Bucketed: true")
    join_at = next(i for i, name in enumerate(main_path) if "Join" in name)
    assert not [name for name in main_path[:join_at] if name.startswith("Exchange")]
    # One exchange, the side input's (a cached batch's plan text shows the adaptive plan
    # and its initial plan, so the same exchange may be printed twice).
    assert len(set(re.findall(r"Exchange hashpartitioning\(([^)]*)\)", plan))) == 1
    assert lake.rows("enriched") == sorted(
        [(i, i % 37, f"n{i % 37}") for i in range(400)], key=repr
    )


def test_the_same_input_not_declared_pre_keyed_is_shuffled(lake):
    write_pre_keyed(lake, 400)
    lake.append("profiles", [(k, f"n{k}") for k in range(37)], PROFILES)
    with no_broadcast(lake.spark):
        batch = keyed_operator(lake, None).run(lake.spark, explain=True).batches[0]
    main_path = ancestors_of_scan(batch.physical_plan, "tx_id")
    assert any(name.startswith("Exchange") for name in main_path)


def test_input_breaking_the_pre_keyed_promise_is_refused_before_anything_is_written(lake):
    frame = lake.spark.range(40).select(
        F.col("id").alias("tx_id"),
        (F.col("id") % 37).alias("customer_id"),
        F.lit(1.0).alias("amount"),
    )
    mixed = frame.withColumn("key_group", key_group("customer_id", GROUPS)).coalesce(1)
    dsi.write_dataframe(mixed, lake.storage.table_uri("transactions"))  # one file, four key groups
    lake.append("profiles", [(1, "a")], PROFILES)
    op = keyed_operator(lake, dsi.KeyGroups(GROUPS, "key_group"))
    with pytest.raises(
        dsi.PreKeyedViolationError,
        match=r"(?s)part-.*holds key groups 0..3 \(keys 0..36\).*Nothing was written",
    ):
        op.run(lake.spark)
    assert not lake.exists("enriched")
    assert not os.path.exists(os.path.join(op.state_uri, "plans"))


def test_a_key_group_column_that_lies_fails_the_batch_before_writing(lake):
    frame = lake.spark.range(20).select(
        F.col("id").alias("tx_id"),
        F.col("id").alias("customer_id"),
        F.lit(1.0).alias("amount"),
        F.lit(0).alias("key_group"),
    )
    dsi.write_dataframe(frame.coalesce(1), lake.storage.table_uri("transactions"))
    lake.append("profiles", [(1, "a")], PROFILES)
    with pytest.raises(dsi.PreKeyedViolationError, match=r"hashes to"):
        keyed_operator(lake, dsi.KeyGroups(GROUPS, "key_group")).run(lake.spark)
    assert not lake.exists("enriched")


def test_more_splits_than_key_groups_is_refused(lake):
    write_pre_keyed(lake, 200, groups=8)
    lake.append("profiles", [(1, "a")], PROFILES)
    with pytest.raises(dsi.PreKeyedViolationError, match=r"outside 0\.\.3"):
        keyed_operator(lake, dsi.KeyGroups(GROUPS, "key_group")).run(lake.spark)

"""Pre-keyed main inputs: keyed steps without a shuffle of the main input; the promise checked."""

import contextlib
import os
import re

import pytest
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core import keyed
from dagster_sideinputs.core.keyed import key_group, scan_buckets
from dagster_sideinputs.delta.session import session_setting
from tests.conftest import stage_names
from tests.core.catalogue import operator as catalogue_operator
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
    dsi.tables.write_dataframe(
        frame, lake.storage.table_uri("transactions"), partition_by=["key_group"]
    )


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
    dsi.tables.write_dataframe(
        mixed, lake.storage.table_uri("transactions")
    )  # one file, four key groups
    lake.append("profiles", [(1, "a")], PROFILES)
    op = keyed_operator(lake, dsi.KeyGroups(GROUPS, "key_group"))
    with pytest.raises(
        dsi.errors.PreKeyedViolationError,
        match=r"(?s)part-.*holds key groups 0..3 \(keys 0..36\).*Nothing was written",
    ):
        op.run(lake.spark)
    assert not lake.exists("enriched")
    assert not os.path.exists(os.path.join(op.state_uri, "plans"))


@pytest.mark.parametrize(
    ("value", "partitioned"), [("'x'", True), ("'1.5'", True), ("'x'", False), ("1.5D", False)]
)
def test_a_key_group_that_is_no_whole_number_is_refused_naming_it(lake, value, partitioned):
    """A string or fractional key-group value, as a partition value or in the column's
    statistics, is a broken promise named as such (it was a bare ValueError)."""
    frame = lake.spark.range(4).select(
        F.col("id").alias("tx_id"),
        F.col("id").alias("customer_id"),
        F.lit(1.0).alias("amount"),
        F.expr(value).alias("key_group"),
    )
    dsi.tables.write_dataframe(
        frame.coalesce(1),
        lake.storage.table_uri("transactions"),
        partition_by=["key_group"] if partitioned else None,
    )
    lake.append("profiles", [(1, "a")], PROFILES)
    shown = re.escape(repr(lake.spark.range(1).select(F.expr(value)).first()[0]))
    with pytest.raises(
        dsi.errors.PreKeyedViolationError,
        match=rf"(?s)has key-group value {shown}, not a whole number.*Nothing was written",
    ):
        keyed_operator(lake, dsi.KeyGroups(GROUPS, "key_group")).run(lake.spark)
    assert not lake.exists("enriched")


def test_a_key_group_column_that_lies_fails_the_batch_before_writing(lake):
    frame = lake.spark.range(20).select(
        F.col("id").alias("tx_id"),
        F.col("id").alias("customer_id"),
        F.lit(1.0).alias("amount"),
        F.lit(0).alias("key_group"),
    )
    dsi.tables.write_dataframe(frame.coalesce(1), lake.storage.table_uri("transactions"))
    lake.append("profiles", [(1, "a")], PROFILES)
    with pytest.raises(dsi.errors.PreKeyedViolationError, match=r"hashes to"):
        keyed_operator(lake, dsi.KeyGroups(GROUPS, "key_group")).run(lake.spark)
    assert not lake.exists("enriched")


def test_more_splits_than_key_groups_is_refused(lake):
    write_pre_keyed(lake, 200, groups=8)
    lake.append("profiles", [(1, "a")], PROFILES)
    with pytest.raises(dsi.errors.PreKeyedViolationError, match=r"outside 0\.\.3"):
        keyed_operator(lake, dsi.KeyGroups(GROUPS, "key_group")).run(lake.spark)


def test_a_key_group_partition_value_that_lies_fails_the_batch_before_writing(lake):
    """Every row sits in partition key_group=0: each file holds one group, as the log says,
    but the rows' keys hash to other groups."""
    frame = lake.spark.range(20).select(
        F.col("id").alias("tx_id"),
        F.col("id").alias("customer_id"),
        F.lit(1.0).alias("amount"),
        F.lit(0).alias("key_group"),
    )
    uri = lake.storage.table_uri("transactions")
    dsi.tables.write_dataframe(frame, uri, partition_by=["key_group"])
    lake.append("profiles", [(1, "a")], PROFILES)
    with pytest.raises(
        dsi.errors.PreKeyedViolationError,
        match=r"column lies: key \d+ in key group 0 hashes to [1-3]\b.*Nothing was written",
    ) as raised:
        keyed_operator(lake, dsi.KeyGroups(GROUPS, "key_group")).run(lake.spark)
    assert "SQLSTATE" not in str(raised.value)  # Spark's suffix to raise_error, not ours
    assert not lake.exists("enriched")


@pytest.mark.parametrize("way", ["jvm", "catalog"])
def test_the_key_group_column_keeps_the_tables_own_values(lake, monkeypatch, way):
    """A string key-group column written with a leading zero: the function sees the
    table's values ('01', not 1), the declared group (a partition folder per file) is
    still checked against the key, and the catalog table taken where the JVM relation is
    not available (Spark Connect) reads the same."""
    if way == "catalog":
        monkeypatch.setattr(keyed, "_jvm_relation", lambda *args: None)
    frame = lake.spark.range(40).select(
        F.col("id").alias("tx_id"), (F.col("id") % 37).alias("customer_id")
    )
    frame = frame.withColumn(
        "key_group", F.lpad(key_group("customer_id", GROUPS).cast("string"), 2, "0")
    )
    uri = lake.storage.table_uri("transactions")
    dsi.tables.write_dataframe(frame, uri, partition_by=["key_group"])
    lake.append("profiles", [(k, f"n{k}") for k in range(37)], PROFILES)
    op = lake.operator(
        main=dsi.MainInput(
            "transactions", key="customer_id", pre_keyed=dsi.KeyGroups(GROUPS, "key_group")
        ),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id", distribution="keyed")
        },
        fn=lambda main, sides: main.select("tx_id", "key_group", F.col("profile.name")),
        main_output="enriched",
    )
    with no_broadcast(lake.spark):
        batch = op.run(lake.spark, explain=True).batches[0]
    assert "pre-keyed: main files read as buckets (no shuffle)" in batch.notes
    assert "Bucketed: true" in batch.physical_plan
    hashes = {
        r["k"]: r["g"]
        for r in lake.spark.range(37)
        .select(F.col("id").alias("k"), key_group("id", GROUPS).alias("g"))
        .collect()
    }
    assert lake.rows("enriched") == sorted(
        [(i, f"{hashes[i % 37]:02d}", f"n{i % 37}") for i in range(40)], key=repr
    )
    # A file whose folder says group 02 holding a key of another group: caught.
    other = next(k for k, g in hashes.items() if g != 2)
    lie = lake.spark.createDataFrame(
        [(1000, other, "02")], "tx_id long, customer_id long, key_group string"
    )
    dsi.tables.write_dataframe(lie, uri, mode="append", partition_by=["key_group"])
    with (
        no_broadcast(lake.spark),
        pytest.raises(
            dsi.errors.PreKeyedViolationError,
            match=rf"key {other} in key group 02 hashes to {hashes[other]}\b",
        ),
    ):
        op.run(lake.spark)


# --- side inputs partitioned by the same key groups ---------------------------------------------


def write_profiles(
    lake: Lake, *, group_of=None, partition_by=("key_group",), groups: int = GROUPS
) -> None:
    """Profiles of the 37 customers, partitioned by a key-group column (``group_of``: the
    column's expression; by default the customer's true key group)."""
    frame = lake.spark.createDataFrame([(k, f"n{k}") for k in range(37)], PROFILES)
    frame = frame.withColumn(
        "key_group", group_of if group_of is not None else key_group("customer_id", groups)
    )
    dsi.tables.write_dataframe(
        frame.repartition(groups, "key_group"),
        lake.storage.table_uri("profiles"),
        partition_by=list(partition_by),
    )


EXPECTED = sorted([(i, i % 37, f"n{i % 37}") for i in range(400)], key=repr)


@pytest.mark.both_engines
def test_a_side_input_partitioned_by_the_same_key_groups_joins_without_any_exchange(lake):
    """Under the bridge, the side rows' key groups are checked on the driver (delta-rs reads
    the two columns, Spark's Murmur3 in numpy): no Spark job of its own."""
    write_pre_keyed(lake, 400)
    write_profiles(lake)
    op = keyed_operator(lake, dsi.KeyGroups(GROUPS, "key_group"))
    with no_broadcast(lake.spark):
        result, stages = stage_names(lake.spark, lambda: op.run(lake.spark, explain=True))
    batch = result.batches[0]
    assert "side input 'profile': read as key-group buckets (no shuffle)" in batch.notes
    checks = [name for name in stages if "keyed.py" in name]
    assert (checks == []) == (lake.engine_id == "rs"), stages  # delta-spark: a Spark job
    plan = batch.physical_plan
    assert plan.count("Bucketed: true") == 2
    assert "Exchange" not in plan  # neither side shuffled, nor the side's aggregation
    assert lake.rows("enriched") == EXPECTED


@pytest.mark.parametrize(
    ("groups", "partitions", "buckets"),
    [(16, 4, 4), (16, 5, 8), (16, 200, 16), (12, 5, 6), (7, 4, 7), (4, 1, 1)],
)
def test_key_groups_are_read_as_the_fewest_buckets_a_shuffle_would_have(
    spark, groups, partitions, buckets
):
    with session_setting(spark, "spark.sql.shuffle.partitions", str(partitions)):
        assert scan_buckets(spark, dsi.KeyGroups(groups, "key_group")) == buckets


@pytest.mark.both_engines
def test_sixteen_key_groups_join_as_four_buckets_without_any_exchange(lake):
    """Groups g and g + 4k share bucket g % 4 on both sides; still no shuffle, the same rows,
    and a key-group column that lies about a coalesced group is still caught."""
    write_pre_keyed(lake, 400, groups=16)
    write_profiles(lake, groups=16)
    op = keyed_operator(lake, dsi.KeyGroups(16, "key_group"))
    with no_broadcast(lake.spark), session_setting(lake.spark, "spark.sql.shuffle.partitions", "4"):
        batch = op.run(lake.spark, explain=True).batches[0]
    assert "side input 'profile': read as key-group buckets (no shuffle)" in batch.notes
    plan = batch.physical_plan
    assert plan.count("SelectedBucketsCount: 4 out of 4") == 2, plan
    assert "Exchange" not in plan
    assert lake.rows("enriched") == EXPECTED
    # A file of key group 1 holding a key of group 5 sits in bucket 1 either way: the
    # declared group, not the bucket, is what the check compares.
    groups = lake.spark.range(100).select("id", F.expr("pmod(hash(id), 16)").alias("g"))
    key5 = groups.filter("g = 5").first()["id"]
    lie = lake.spark.createDataFrame(
        [(1000, key5, 1.0, 1)], "tx_id long, customer_id long, amount double, key_group int"
    )
    uri = lake.storage.table_uri("transactions")
    dsi.tables.write_dataframe(lie, uri, mode="append", partition_by=["key_group"])
    lies = rf"key {key5} in key group 1 hashes to 5\b"
    with (
        no_broadcast(lake.spark),
        session_setting(lake.spark, "spark.sql.shuffle.partitions", "4"),
        pytest.raises(dsi.errors.PreKeyedViolationError, match=lies),
    ):
        op.run(lake.spark)


@pytest.mark.parametrize(
    ("group_of", "partition_by", "why"),
    [
        (f"pmod(customer_id, {GROUPS})", ("key_group",), "not every row sits"),
        ("pmod(hash(customer_id), 8)", ("key_group",), "not partitioned by 'key_group' alone"),
        (f"pmod(hash(customer_id), {GROUPS})", ("key_group", "name"), "not partitioned by"),
        (f"pmod(hash(cast(customer_id as int)), {GROUPS})", ("key_group",), "is int, the main"),
    ],
    ids=["other-function", "more-groups", "more-partition-columns", "int-key"],
)
@pytest.mark.both_engines
def test_a_side_input_not_in_the_main_inputs_key_groups_is_joined_with_a_shuffle(
    lake, group_of, partition_by, why
):
    """Nothing was promised of a side table: whatever its key-group column holds, every
    record meets its side row."""
    write_pre_keyed(lake, 400)
    write_profiles(lake, group_of=F.expr(group_of), partition_by=partition_by)
    if "int" in group_of:  # the side key as an int: its hash differs from the long's
        side = lake.frame("profiles").withColumn("customer_id", F.col("customer_id").cast("int"))
        dsi.tables.write_dataframe(
            side.repartition(GROUPS, "key_group"),
            lake.storage.table_uri("profiles"),
            mode="overwrite",
            schema_mode="overwrite",
            partition_by=["key_group"],
        )
    with no_broadcast(lake.spark):
        batch = (
            keyed_operator(lake, dsi.KeyGroups(GROUPS, "key_group"))
            .run(lake.spark, explain=True)
            .batches[0]
        )
    assert any(note.startswith("side input 'profile'") and why in note for note in batch.notes)
    assert "Exchange hashpartitioning" in batch.physical_plan
    assert lake.rows("enriched") == EXPECTED


@pytest.mark.both_engines
def test_a_new_side_version_is_checked_again(lake):
    """The rows' key groups are checked per side version: a version that breaks them is
    joined with a shuffle, and every record still meets its side row."""
    write_pre_keyed(lake, 400)
    write_profiles(lake)
    op = keyed_operator(lake, dsi.KeyGroups(GROUPS, "key_group"))
    with no_broadcast(lake.spark):
        first = op.run(lake.spark).batches[0]
        frame = lake.spark.createDataFrame([(k, f"m{k}") for k in range(37)], PROFILES)
        dsi.tables.write_dataframe(
            frame.withColumn("key_group", F.lit(1)),
            lake.storage.table_uri("profiles"),
            mode="overwrite",
            partition_by=["key_group"],
        )
        more = lake.spark.range(400, 480).select(
            F.col("id").alias("tx_id"),
            (F.col("id") % 37).alias("customer_id"),
            F.lit(1.0).alias("amount"),
        )
        dsi.tables.write_dataframe(
            more.withColumn("key_group", key_group("customer_id", GROUPS)),
            lake.storage.table_uri("transactions"),
            mode="append",
            partition_by=["key_group"],
        )
        second = op.run(lake.spark).batches[0]
    assert "side input 'profile': read as key-group buckets (no shuffle)" in first.notes
    assert any("not every row sits" in note for note in second.notes)
    assert lake.rows("enriched") == sorted(
        EXPECTED + [(i, i % 37, f"m{i % 37}") for i in range(400, 480)], key=repr
    )


def test_a_row_function_reads_a_side_input_joined_from_key_group_buckets(lake):
    write_pre_keyed(lake, 400)
    write_profiles(lake)
    op = catalogue_operator(
        lake,
        "rows",
        main=dsi.MainInput(
            "transactions", key="customer_id", pre_keyed=dsi.KeyGroups(GROUPS, "key_group")
        ),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id", distribution="keyed")
        },
    )
    with no_broadcast(lake.spark):
        batch = op.run(lake.spark, explain=True).batches[0]
    assert "side input 'profile': read as key-group buckets (no shuffle)" in batch.notes
    assert "Exchange" not in batch.physical_plan
    assert lake.rows("enriched") == sorted([(i, f"n{i % 37}") for i in range(400)], key=repr)


def test_pre_keyed_inputs_whose_column_names_hold_backticks_and_dots_join_in_place(lake):
    key, value = "cust`id", "na.me"  # names Spark SQL must quote (a backtick is doubled)
    spark = lake.spark
    main = spark.range(400).select(
        F.col("id").alias("tx_id"), (F.col("id") % 37).alias(key), F.lit(1.0).alias("amt.usd")
    )
    profiles = spark.createDataFrame([(k, f"n{k}") for k in range(37)], "k long, v string")
    profiles = profiles.toDF(key, value)
    for name, frame in (("transactions", main), ("profiles", profiles)):
        frame = frame.withColumn("key_group", key_group(key, GROUPS)).repartition(
            GROUPS, "key_group"
        )
        dsi.tables.write_dataframe(frame, lake.storage.table_uri(name), partition_by=["key_group"])
    op = lake.operator(
        main=dsi.MainInput("transactions", key=key, pre_keyed=dsi.KeyGroups(GROUPS, "key_group")),
        side_inputs={"profile": dsi.SideInput.map("profiles", key=key, distribution="keyed")},
        fn=lambda main, sides: main.select(
            "tx_id", F.col("`cust``id`"), F.col("profile")[value].alias(value)
        ),
        main_output="enriched",
    )
    with no_broadcast(spark):
        batch = op.run(spark, explain=True).batches[0]
    assert "pre-keyed: main files read as buckets (no shuffle)" in batch.notes
    assert "side input 'profile': read as key-group buckets (no shuffle)" in batch.notes
    assert "Exchange" not in batch.physical_plan
    assert lake.rows("enriched") == sorted(
        [(i, i % 37, f"n{i % 37}") for i in range(400)], key=repr
    )
    more = main.where("tx_id < 5").withColumn("tx_id", F.col("tx_id") + 1000)
    more = more.withColumn("key_group", key_group(key, GROUPS))
    dsi.tables.write_dataframe(
        more, lake.storage.table_uri("transactions"), partition_by=["key_group"]
    )
    assert op.run(spark).emitted("enriched") == 5  # appended to the existing table
    assert len(lake.rows("enriched")) == 405


@pytest.mark.parametrize(
    ("kind", "values"),
    [
        ("long", [0, 1, -1, 2**63 - 1, -(2**63), 2**31, -(2**31) - 1, 42]),
        ("int", [0, 1, -1, 2**31 - 1, -(2**31), 7]),
        ("short", [0, -1, 32767, -32768]),
        ("tinyint", [0, -1, 127, -128]),
        ("date", ["1970-01-01", "1900-01-01", "2024-05-06", "9999-12-31"]),
        ("timestamp", ["2024-01-01 00:00:00", "1960-01-01 01:02:03.000004"]),
        ("timestamp_ntz", ["2024-01-01 00:00:00", "1960-01-01 01:02:03.000004"]),
    ],
)
def test_the_driver_computes_sparks_hash_of_integer_keys(spark, kind, values):
    """The side rows' key-group check on the driver agrees with Spark's own ``hash``, and
    with Spark's key groups (random keys too)."""
    import numpy as np

    from dagster_sideinputs.core.keyed import hashable_on_driver, spark_hash

    literals = ", ".join(f"(cast('{v}' as {kind}))" for v in values)
    frame = spark.sql(f"SELECT * FROM VALUES {literals} AS t(k)")
    if kind in ("long", "int"):
        scale = 2**62 if kind == "long" else 2**30
        signed = F.rand(7) * scale * F.when(F.col("id") % 2 == 0, 1).otherwise(-1)
        randoms = spark.range(5000).select(signed.cast(kind).alias("k"))
        frame = frame.unionByName(randoms)
    kind_type = frame.schema["k"].dataType
    assert hashable_on_driver(kind_type)
    want = frame.select(F.hash("k").alias("h"), key_group("k", 16).alias("g")).toArrow()
    got = spark_hash(frame.toArrow()["k"], kind_type)
    assert got.tolist() == want["h"].to_pylist()
    assert np.mod(got.astype(np.int64), 16).tolist() == want["g"].to_pylist()

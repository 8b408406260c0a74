"""The two Delta engines side by side: choice, commits, interoperability, table features.

The shared test session has Delta configured (tests/conftest.py), so ``engine="auto"``
resolves to delta-spark here; ``delta-rs`` names the bridge.
"""

import datetime as dt
import json
import logging
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine
from dagster_sideinputs.delta.engine import AppTransaction
from dagster_sideinputs.delta.spark.engine import DeltaSparkEngine
from dagster_sideinputs.delta.spark.predicates import sql_table
from dagster_sideinputs.delta.storage import DeltaStorage
from tests.core.accounting import assert_accounted

DAY = dt.timedelta(days=1)
TX = "tx_id long, customer_id long, amount double"
PROFILES = "customer_id long, name string"


def commits(path: str | Path) -> list[list[dict]]:
    """Every commit file of a table, parsed, oldest first."""
    log = Path(path) / "_delta_log"
    return [
        [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
        for file in sorted(log.glob("*.json"))
    ]


def storage(root: Path, engine: str, spark) -> DeltaStorage:
    return DeltaStorage(str(root), engine=engine).bind(spark)  # type: ignore[arg-type]


def append(spark, store: DeltaStorage, name: str, rows: list[tuple], ddl: str) -> None:
    store.delta.write(spark.createDataFrame(rows, ddl), store.table_uri(name))


def enrich(main, sides):
    return main.select("tx_id", "customer_id", F.col("profile.name").alias("name"))


def operator(store: DeltaStorage) -> dsi.SideInputOperator:
    """Transactions enriched with profiles; a record without its profile waits a day."""
    profile = dsi.SideInput.map("profiles", key="customer_id", missing=dsi.Wait(DAY, then="null"))
    return dsi.SideInputOperator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": profile},
        fn=enrich,
        main_output="enriched",
        storage=store,
    )


def sorted_rows(frame) -> list[tuple]:
    return sorted(tuple(r) for r in frame.collect())


# --- choice ---------------------------------------------------------------------------------


def test_auto_picks_delta_spark_in_a_delta_session_and_logs_it(spark, tmp_path, caplog):
    from dagster_sideinputs.delta import storage as storage_module

    storage_module._logged.clear()  # the choice is logged once per process
    with caplog.at_level(logging.INFO, logger="dagster_sideinputs"):
        bound = DeltaStorage(str(tmp_path), engine="auto").bind(spark)
    assert isinstance(bound.delta, DeltaSparkEngine)
    assert bound.delta.name == "delta-spark"
    assert "Delta engine: delta-spark (the Spark session has Delta Lake configured)" in (
        caplog.text
    )
    assert isinstance(storage(tmp_path, "delta-rs", spark).delta, DeltaRsEngine)


def test_an_unknown_engine_is_refused_naming_the_choices(tmp_path, monkeypatch):
    with pytest.raises(dsi.DeclarationError, match="delta-spark"):
        DeltaStorage(str(tmp_path), engine="spark")  # type: ignore[arg-type]
    monkeypatch.setenv("DSI_DELTA_ENGINE", "nope")
    with pytest.raises(dsi.DeclarationError, match="DSI_DELTA_ENGINE"):
        DeltaStorage(str(tmp_path))


def test_storage_without_engine_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DSI_DELTA_ENGINE", "delta-spark")
    assert DeltaStorage(str(tmp_path)).choice == "delta-spark"
    monkeypatch.delenv("DSI_DELTA_ENGINE")
    assert DeltaStorage(str(tmp_path)).choice == "auto"


# --- the operator's commits under delta-spark ---------------------------------------------------


def test_operator_commits_show_delta_spark_and_carry_application_transactions(spark, tmp_path):
    store = storage(tmp_path, "auto", spark)
    append(spark, store, "profiles", [(10, "ann")], PROFILES)
    append(spark, store, "transactions", [(1, 10, 1.0), (2, 10, 2.0)], TX)
    op = operator(DeltaStorage(str(tmp_path), engine="auto"))
    first = op.run(spark)
    append(spark, store, "transactions", [(3, 10, 3.0)], TX)
    second = op.run(spark)

    assert first.batches[0].engine == "delta-spark" == second.batches[0].engine
    output = store.table_uri("enriched")
    written = [c for c in commits(output) if any("add" in a for a in c)]
    assert len(written) == 2
    for commit, batch in zip(written, [first.batches[0], second.batches[0]], strict=True):
        info = next(a["commitInfo"] for a in commit if "commitInfo" in a)
        assert "Delta-Lake/" in info["engineInfo"], info["engineInfo"]
        assert info["engineInfo"].startswith("Apache-Spark/")
        [txn] = [a["txn"] for a in commit if "txn" in a]
        assert (txn["appId"], txn["version"]) == (op.operator_id, batch.batch_id)
    assert store.delta.transaction_version(output, op.operator_id) == second.batches[0].batch_id


def test_a_commit_whose_transaction_the_table_holds_is_skipped_by_delta_spark(spark, tmp_path):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "t")
    data = spark.createDataFrame([(1, 10, 1.0)], TX)
    first = engine.write(data, uri, app_transaction=AppTransaction("app", 3))
    again = engine.write(data, uri, app_transaction=AppTransaction("app", 3))
    staged = engine.stage(data, uri)
    replayed = engine.commit(staged, app_transaction=AppTransaction("app", 2))

    assert (first.skipped, again.skipped, replayed.skipped) == (False, True, True)
    assert engine.snapshot(uri).version == 0
    assert sorted_rows(spark.read.format("delta").load(uri)) == [(1, 10, 1.0)]


# --- interoperability -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("writer", "reader"), [("delta-rs", "delta-spark"), ("delta-spark", "delta-rs")]
)
def test_a_table_written_by_one_engine_is_read_by_the_other(spark, tmp_path, writer, reader):
    written, read = storage(tmp_path, writer, spark), storage(tmp_path, reader, spark)
    uri = written.table_uri("t")
    frame = spark.createDataFrame([(1, 10, 1.0), (2, 11, 2.0)], TX)
    written.delta.write(frame, uri, partition_by=["customer_id"])
    written.delta.write(spark.createDataFrame([(3, 10, 3.0)], TX), uri)

    snapshot = read.delta.snapshot(uri)
    assert snapshot.version == 1
    assert snapshot.partition_columns == ("customer_id",)
    assert snapshot.num_records == 3
    every = read.delta.read_snapshot(spark, snapshot)
    assert sorted_rows(every.select("tx_id", "customer_id", "amount")) == [
        (1, 10, 1.0),
        (2, 11, 2.0),
        (3, 10, 3.0),
    ]
    new, version = read.delta.read_changes(spark, uri, start_version=0)
    assert version == 1
    assert sorted_rows(new.select("tx_id")) == [(3,)]
    assert [f.path for f in read.delta.added_files(uri, 0, 1)] == [
        f.path for f in written.delta.added_files(uri, 0, 1)
    ]


@pytest.mark.parametrize(
    ("before", "after"), [("delta-rs", "delta-spark"), ("delta-spark", "delta-rs")]
)
def test_an_operator_built_under_one_engine_continues_under_the_other(
    spark, tmp_path, before, after
):
    first, second = storage(tmp_path, before, spark), storage(tmp_path, after, spark)
    append(spark, first, "profiles", [(10, "ann")], PROFILES)
    append(spark, first, "transactions", [(1, 10, 1.0), (2, 11, 1.0)], TX)
    op = operator(first)
    op.run(spark)
    assert op.buffer().rows() == 1  # customer 11 waits for its profile

    append(spark, second, "profiles", [(11, "bob")], PROFILES)
    append(spark, second, "transactions", [(3, 10, 1.0)], TX)
    continued = operator(second)
    result = continued.run(spark)
    assert result.batches[0].engine == second.delta.name
    assert result.batches[0].released_from_buffer == 1
    enriched = second.table_uri("enriched")
    assert sorted_rows(spark.read.format("delta").load(enriched)) == [
        (1, 10, "ann"),
        (2, 11, "bob"),
        (3, 10, "ann"),
    ]
    assert continued.buffer().rows() == 0
    assert_accounted(spark, continued, [1, 2, 3])
    # The application transactions carried on across engines: a rerun commits nothing.
    assert continued.run(spark).batches == []


def test_operator_outputs_are_queryable_by_every_reader(spark, tmp_path):
    store = storage(tmp_path, "auto", spark)
    append(spark, store, "profiles", [(10, "ann")], PROFILES)
    append(spark, store, "transactions", [(1, 10, 1.0)], TX)
    op = operator(store)
    op.run(spark)
    uri = store.table_uri("enriched")

    expected = [(1, 10, "ann")]
    assert sorted_rows(spark.read.format("delta").load(uri)) == expected
    assert sorted_rows(spark.sql(f"SELECT * FROM {sql_table(uri)}")) == expected
    history = spark.sql(f"DESCRIBE HISTORY {sql_table(uri)}").collect()
    assert [row.operation for row in history] == ["WRITE"]
    assert "Delta-Lake/" in history[0].engineInfo
    table = deltalake.DeltaTable(uri)
    assert sorted(zip(*table.to_pyarrow_table().to_pydict().values(), strict=True)) == expected
    assert table.history()[0]["operation"] == "WRITE"


# --- table features the bridge refuses -----------------------------------------------------------


def side_with_deletion_vectors(spark, path: str) -> None:
    """A side table whose DELETE left a deletion vector (delta-spark's default for it)."""
    (
        spark.createDataFrame([(10, "ann"), (11, "old"), (12, "cy")], PROFILES)
        .coalesce(1)
        .write.format("delta")
        .option("delta.enableDeletionVectors", "true")
        .save(path)
    )
    spark.sql(f"DELETE FROM {sql_table(path)} WHERE customer_id = 11")
    removed = [a for c in commits(path) for a in c if "add" in a and a["add"].get("deletionVector")]
    assert removed, "the DELETE should have written a deletion vector, not rewritten the file"


def main_with_column_mapping(spark, path: str) -> None:
    """A main table with column mapping, whose column was renamed after the first write."""
    (
        spark.createDataFrame([(1, 10, 1.0)], "tx_id long, customer long, amount double")
        .write.format("delta")
        .option("delta.columnMapping.mode", "name")
        .save(path)
    )
    spark.sql(f"ALTER TABLE {sql_table(path)} RENAME COLUMN customer TO customer_id")
    spark.createDataFrame([(2, 12, 2.0), (3, 11, 3.0)], TX).write.format("delta").mode(
        "append"
    ).save(path)


def test_pre_keyed_tables_are_not_read_as_buckets_past_column_mapping_or_deletion_vectors(
    spark, tmp_path
):
    """A pre-keyed main input with column mapping (its key column renamed: the files store
    another name) and a side table in the same key groups whose DELETE left a deletion
    vector: Spark's parquet reader alone would read null keys and the deleted row, so both
    are read through Delta, with a shuffle, and the notes say why."""
    native = storage(tmp_path, "delta-spark", spark)
    groups = "pmod(hash(customer), 4)"
    main = spark.createDataFrame(
        [(i, i % 37, 1.0) for i in range(80)], "tx_id long, customer long, amount double"
    )
    (
        main.withColumn("key_group", F.expr(groups))
        .write.format("delta")
        .option("delta.columnMapping.mode", "name")
        .partitionBy("key_group")
        .save(native.table_uri("transactions"))
    )
    spark.sql(
        f"ALTER TABLE {sql_table(native.table_uri('transactions'))} "
        "RENAME COLUMN customer TO customer_id"
    )
    profiles = spark.createDataFrame(
        [(k, f"n{k}") for k in range(37)], "customer long, name string"
    )
    (
        profiles.coalesce(1)
        .withColumn("key_group", F.expr(groups))
        .withColumnRenamed("customer", "customer_id")
        .write.format("delta")
        .option("delta.enableDeletionVectors", "true")
        .partitionBy("key_group")
        .save(native.table_uri("profiles"))
    )
    spark.sql(f"DELETE FROM {sql_table(native.table_uri('profiles'))} WHERE customer_id = 3")
    assert any(
        a["add"].get("deletionVector")
        for c in commits(native.table_uri("profiles"))
        for a in c
        if "add" in a
    ), "the DELETE should have written a deletion vector"
    op = dsi.SideInputOperator(
        main=dsi.MainInput(
            "transactions", key="customer_id", pre_keyed=dsi.KeyGroups(4, "key_group")
        ),
        side_inputs={
            "profile": dsi.SideInput.map(
                "profiles", key="customer_id", missing="unmatched", distribution="keyed"
            )
        },
        fn=enrich,
        main_output="enriched",
        routes=dsi.Routes(unmatched=dsi.OutputTag("unmatched")),
        storage=native,
    )
    previous = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    try:
        notes = op.run(spark).batches[0].notes
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", previous)
    assert (
        "pre-keyed: the table maps column names (delta.columnMapping.mode); read with a "
        "shuffle" in notes
    )
    assert "side input 'profile': files carry deletion vectors; joined with a shuffle" in notes
    enriched = spark.read.format("delta").load(native.table_uri("enriched"))
    assert sorted_rows(enriched) == [(i, i % 37, f"n{i % 37}") for i in range(80) if i % 37 != 3]
    unmatched = spark.read.format("delta").load(native.table_uri("unmatched"))
    assert sorted_rows(unmatched.select("tx_id")) == [(i,) for i in range(80) if i % 37 == 3]


def test_delta_spark_reads_deletion_vectors_and_column_mapping_the_bridge_refuses(spark, tmp_path):
    native = storage(tmp_path, "delta-spark", spark)
    side_with_deletion_vectors(spark, native.table_uri("profiles"))
    main_with_column_mapping(spark, native.table_uri("transactions"))

    op = dsi.SideInputOperator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id", missing="unmatched")
        },
        fn=enrich,
        main_output="enriched",
        routes=dsi.Routes(unmatched=dsi.OutputTag("unmatched")),
        storage=native,
    )
    op.run(spark)
    enriched = spark.read.format("delta").load(native.table_uri("enriched"))
    # Customer 11's profile was deleted (a deletion vector): its record is unmatched, not "old".
    assert sorted_rows(enriched) == [(1, 10, "ann"), (2, 12, "cy")]
    unmatched = spark.read.format("delta").load(native.table_uri("unmatched"))
    assert sorted_rows(unmatched.select("tx_id")) == [(3,)]

    bridge = storage(tmp_path, "delta-rs", spark)
    with pytest.raises(dsi.errors.UnsupportedTableFeatureError, match="deletion vectors"):
        bridge.delta.read_snapshot(spark, bridge.delta.snapshot(bridge.table_uri("profiles")))
    with pytest.raises(dsi.errors.UnsupportedTableFeatureError, match="columnMapping"):
        bridge.delta.snapshot(bridge.table_uri("transactions"))


def test_delta_spark_reads_new_files_of_a_column_mapped_main_table_incrementally(spark, tmp_path):
    native = storage(tmp_path, "delta-spark", spark)
    uri = native.table_uri("transactions")
    main_with_column_mapping(spark, uri)
    frame, version = native.delta.read_changes(spark, uri, start_version=1)
    assert version == 2
    assert sorted_rows(frame.select("tx_id", "customer_id")) == [(2, 12), (3, 11)]


def test_plain_deltalake_reads_what_delta_spark_wrote_with_removals(spark, tmp_path):
    engine = DeltaSparkEngine(spark)
    uri = str(tmp_path / "buffer")
    engine.write(
        spark.createDataFrame([(1, "a"), (2, "b")], "id long, slot string"),
        uri,
        partition_by=["slot"],
    )
    slot_a = [f for f in engine.snapshot(uri).files if f.partition_values["slot"] == "a"]
    result = engine.commit_removals(uri, slot_a, app_transaction=AppTransaction("op", 1))
    assert not result.skipped
    again = engine.commit_removals(uri, slot_a, app_transaction=AppTransaction("op", 1))
    assert again.skipped
    rows = deltalake.DeltaTable(uri).to_pyarrow_table().to_pydict()
    assert rows == {"id": [2], "slot": ["b"]}
    assert engine.read_rows(uri).equals(pa.table({"id": [2], "slot": ["b"]}))


# --- whole-version reads under delta-spark -------------------------------------------------


def _read_both_ways(spark, engine, uri: str, **kwargs):
    """The engine's read of the latest version, and Delta's own reader of it."""
    snapshot = engine.snapshot(uri)
    ours = engine.read_snapshot(spark, snapshot, **kwargs)
    theirs = spark.read.format("delta").option("versionAsOf", snapshot.version).load(uri)
    return ours, theirs.select(*ours.columns)


def _file_index(frame) -> str:
    """The file index of the read's scan: Spark's own, or one of Delta's."""
    plan = frame._jdf.queryExecution().executedPlan().toString()
    return "delta" if "DeltaFileIndex" in plan or "Tahoe" in plan else "spark"


def test_delta_spark_reads_a_whole_version_from_the_files_its_log_lists(spark, tmp_path):
    """A side input's version (the whole table, or whole partitions) is read with Spark's
    parquet reader from the files the engine's log reader lists, not by Delta's reader
    (which rebuilds the version's snapshot with Spark jobs): the same rows, null and
    odd partition values, a removed file and a later column included."""
    uri = str(tmp_path / "profiles")
    rows = [(1, "a=b c", "ann"), (2, None, "bob"), (3, "x/y", None), (4, "a=b c", "dee")]
    frame = spark.createDataFrame(rows, "customer_id long, segment string, name string")
    frame.write.format("delta").partitionBy("segment").save(uri)
    spark.sql(f"DELETE FROM {sql_table(uri)} WHERE customer_id = 4")  # rewrites a partition
    later = spark.createDataFrame(
        [(5, "x/y", "eve", 0.5)], "customer_id long, segment string, name string, risk double"
    )
    later.write.format("delta").mode("append").option("mergeSchema", "true").save(uri)
    engine = storage(tmp_path, "delta-spark", spark).delta

    ours, theirs = _read_both_ways(spark, engine, uri)
    assert sorted_rows(ours) == sorted_rows(theirs)
    assert len(ours.collect()) == 4
    assert _file_index(ours) == "spark"
    assert _file_index(theirs) == "delta"

    some, theirs = _read_both_ways(spark, engine, uri, partition_filter={"segment": [None, "x/y"]})
    assert sorted_rows(some) == sorted_rows(theirs.where("segment IS NULL OR segment = 'x/y'"))
    assert len(some.collect()) == 3


def test_delta_spark_reads_renamed_and_widened_columns_of_a_whole_version(spark, tmp_path):
    """Column mapping (a renamed column: files hold physical names) and type widening
    (older files hold the narrower type) read as Delta's reader reads them."""
    uri = str(tmp_path / "profiles")
    spark.createDataFrame(
        [(1, 10, "ann")], "customer_id long, score int, name string"
    ).write.format("delta").option("delta.columnMapping.mode", "name").option(
        "delta.enableTypeWidening", "true"
    ).save(uri)
    spark.sql(f"ALTER TABLE {sql_table(uri)} RENAME COLUMN name TO full_name")
    spark.sql(f"ALTER TABLE {sql_table(uri)} ALTER COLUMN score TYPE BIGINT")
    spark.createDataFrame(
        [(2, 2**40, "bob")], "customer_id long, score long, full_name string"
    ).write.format("delta").mode("append").save(uri)
    engine = storage(tmp_path, "delta-spark", spark).delta

    ours, theirs = _read_both_ways(spark, engine, uri)
    assert ours.schema.simpleString() == theirs.schema.simpleString()
    assert sorted_rows(ours) == sorted_rows(theirs) == [(1, 10, "ann"), (2, 2**40, "bob")]


def test_delta_spark_reads_a_version_with_deletion_vectors_through_deltas_reader(spark, tmp_path):
    uri = str(tmp_path / "profiles")
    side_with_deletion_vectors(spark, uri)
    engine = storage(tmp_path, "delta-spark", spark).delta
    ours, theirs = _read_both_ways(spark, engine, uri)
    assert _file_index(ours) == "delta"  # Delta's reader applies the deletion vector
    assert sorted_rows(ours) == sorted_rows(theirs)
    assert 11 not in [r.customer_id for r in ours.collect()]


def test_delta_spark_reads_partitions_without_deletion_vectors_from_their_files(spark, tmp_path):
    """Only the files read decide: a deletion vector in another partition leaves the
    chosen partition to Spark's parquet reader; reading the partition with it goes
    through Delta's reader, which applies it."""
    uri = str(tmp_path / "profiles")
    rows = [(10, "a", "ann"), (11, "a", "old"), (12, "b", "cy")]
    spark.createDataFrame(rows, "customer_id long, segment string, name string").coalesce(
        1
    ).write.format("delta").partitionBy("segment").option(
        "delta.enableDeletionVectors", "true"
    ).save(uri)
    spark.sql(f"DELETE FROM {sql_table(uri)} WHERE customer_id = 11")
    assert any(a["add"].get("deletionVector") for c in commits(uri) for a in c if "add" in a)
    engine = storage(tmp_path, "delta-spark", spark).delta

    other, _ = _read_both_ways(spark, engine, uri, partition_filter={"segment": ["b"]})
    assert _file_index(other) == "spark"
    assert sorted_rows(other) == [(12, "b", "cy")]
    deleted, _ = _read_both_ways(spark, engine, uri, partition_filter={"segment": ["a"]})
    assert _file_index(deleted) == "delta"
    assert sorted_rows(deleted) == [(10, "a", "ann")]


# --- writing to tables with writer features ------------------------------------------------------

ENRICHED = "tx_id long, customer_id long, name string"


def output_table(spark, path: str, features: str) -> None:
    """An existing output table made by delta-spark with ``features`` (a CREATE clause)."""
    spark.sql(f"CREATE TABLE {sql_table(path)} ({ENRICHED}) USING delta {features}")


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_an_output_tables_check_constraint_stops_the_batch_under_both_engines(
    spark, tmp_path, engine
):
    store = storage(tmp_path, engine, spark)
    path = store.table_uri("enriched")
    output_table(spark, path, "")
    spark.sql(f"ALTER TABLE {sql_table(path)} ADD CONSTRAINT known CHECK (name IS NOT NULL)")
    append(spark, store, "profiles", [(10, "ann")], PROFILES)
    append(spark, store, "transactions", [(1, 10, 1.0), (2, 10, 2.0)], TX)
    op = operator(store)
    assert op.run(spark).emitted("enriched") == 2
    # Record 3 waits for its profile a day, then joins with a null name (on_timeout="null").
    append(spark, store, "transactions", [(3, 99, 3.0)], TX)
    assert op.run(spark).batches[0].routes["key_wait"] == 1
    before = store.delta.snapshot(path).version

    later = dt.datetime.now(dt.timezone.utc) + 2 * DAY
    with pytest.raises(dsi.errors.SchemaMismatchError) as caught:
        op.run(spark, clock=lambda: later)
    message = str(caught.value)
    assert "CHECK constraint known" in message
    assert "enriched" in message
    assert "null" in message  # the offending value
    assert "unchanged" in message
    assert store.delta.snapshot(path).version == before  # nothing committed
    assert op.buffer().rows() == 1  # the record still waits: nothing lost

    spark.sql(f"ALTER TABLE {sql_table(path)} DROP CONSTRAINT known")
    assert op.run(spark, clock=lambda: later).emitted("enriched") == 1
    rows = sorted_rows(spark.read.format("delta").load(path))
    assert rows == [(1, 10, "ann"), (2, 10, "ann"), (3, 99, None)]


@pytest.mark.parametrize(
    ("features", "refused"),
    [
        ("CLUSTER BY (customer_id)", "clustering"),
        ("TBLPROPERTIES ('delta.enableRowTracking' = 'true')", "rowTracking"),
        ("TBLPROPERTIES ('delta.enableInCommitTimestamps' = 'true')", "inCommitTimestamp"),
        (
            "TBLPROPERTIES ('delta.feature.vacuumProtocolCheck' = 'supported')",
            "vacuumProtocolCheck",
        ),
        ("", "identityColumns"),
        ("", "generatedColumns"),
    ],
)
def test_the_bridge_refuses_writer_features_it_cannot_honour_before_writing(
    spark, tmp_path, features, refused
):
    store = storage(tmp_path, "delta-rs", spark)
    path = store.table_uri("enriched")
    if refused == "identityColumns":
        spark.sql(
            f"CREATE TABLE {sql_table(path)} ({ENRICHED}, "
            "id BIGINT GENERATED ALWAYS AS IDENTITY) USING delta"
        )
    elif refused == "generatedColumns":
        spark.sql(
            f"CREATE TABLE {sql_table(path)} ({ENRICHED}, "
            "tx2 BIGINT GENERATED ALWAYS AS (tx_id * 2)) USING delta"
        )
    else:
        output_table(spark, path, features)
    before = sorted(p.name for p in Path(path).rglob("*") if p.is_file())

    frame = spark.createDataFrame([(1, 10, "ann")], ENRICHED)
    if refused == "generatedColumns":
        frame = frame.withColumn("tx2", F.lit(5).cast("long"))  # not tx_id * 2
    with pytest.raises(dsi.errors.UnsupportedTableFeatureError) as caught:
        store.delta.write(frame, path)
    assert refused in str(caught.value)
    assert "delta-spark" in caught.value.fix
    assert sorted(p.name for p in Path(path).rglob("*") if p.is_file()) == before


@pytest.mark.parametrize(
    "features",
    [
        "TBLPROPERTIES ('delta.appendOnly' = 'true', 'delta.enableChangeDataFeed' = 'true')",
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')",
        "TBLPROPERTIES ('delta.checkpointPolicy' = 'v2')",
    ],
)
def test_the_bridge_appends_to_tables_with_writer_features_it_honours(spark, tmp_path, features):
    store = storage(tmp_path, "delta-rs", spark)
    path = store.table_uri("enriched")
    output_table(spark, path, features)
    spark.sql(f"ALTER TABLE {sql_table(path)} ADD CONSTRAINT positive CHECK (tx_id > 0)")
    for tx in range(1, 12):  # past a checkpoint (every 10 versions)
        store.delta.write(spark.createDataFrame([(tx, 10, "ann")], ENRICHED), path)
    spark.sql(f"INSERT INTO {sql_table(path)} VALUES (12, 10, 'ann')")  # delta-spark goes on
    assert sorted_rows(spark.read.format("delta").load(path).select("tx_id")) == [
        (tx,) for tx in range(1, 13)
    ]
    with pytest.raises(dsi.errors.SchemaMismatchError, match="CHECK constraint positive"):
        store.delta.write(spark.createDataFrame([(0, 10, "ann")], ENRICHED), path)


def test_delta_spark_fills_an_output_tables_identity_and_generated_columns(spark, tmp_path):
    store = storage(tmp_path, "delta-spark", spark)
    path = store.table_uri("enriched")
    spark.sql(
        f"CREATE TABLE {sql_table(path)} ({ENRICHED}, id BIGINT GENERATED ALWAYS AS IDENTITY, "
        "tx2 BIGINT GENERATED ALWAYS AS (tx_id * 2)) USING delta"
    )
    append(spark, store, "profiles", [(10, "ann")], PROFILES)
    append(spark, store, "transactions", [(1, 10, 1.0), (2, 10, 2.0)], TX)
    op = operator(store)
    assert op.run(spark).emitted("enriched") == 2
    append(spark, store, "transactions", [(3, 10, 3.0)], TX)
    assert op.run(spark).emitted("enriched") == 1
    assert op.run(spark).batches == []  # nothing new: nothing written twice
    rows = spark.read.format("delta").load(path).select("tx_id", "tx2", "id").collect()
    assert sorted((r.tx_id, r.tx2) for r in rows) == [(1, 2), (2, 4), (3, 6)]
    assert len({r.id for r in rows}) == 3
    assert None not in {r.id for r in rows}

    # A value the function gives for a generated column must be the generated one.
    wrong = dsi.SideInputOperator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=lambda main, sides: enrich(main, sides).withColumn("tx2", F.lit(0).cast("long")),
        main_output="enriched",
        storage=store,
        operator_id="wrong",
    )
    with pytest.raises(
        dsi.errors.SchemaMismatchError, match=r"Generated Column \(tx2 <=> \(tx_id \* 2\)\)"
    ):
        wrong.run(spark)
    assert spark.read.format("delta").load(path).count() == 3


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_a_nested_not_null_field_is_enforced_by_both_engines(spark, tmp_path, engine):
    # Delta's rule: a NOT NULL field nested in a struct, and the structs above it, must
    # be non-null (the bridge used to check top-level columns only).
    store = storage(tmp_path, engine, spark)
    path = store.table_uri("people")
    spark.sql(
        f"CREATE TABLE {sql_table(path)} (id INT, s STRUCT<a: INT NOT NULL, b: INT>) USING delta"
    )
    ddl = "id int, s struct<a: int, b: int>"
    before = store.delta.snapshot(path).version
    for bad in [(1, None), (2, (None, 1))]:
        with pytest.raises(dsi.errors.SchemaMismatchError, match="NOT NULL"):
            store.delta.write(spark.createDataFrame([(0, (5, 5)), bad], ddl), path)
    assert store.delta.snapshot(path).version == before
    store.delta.write(spark.createDataFrame([(3, (1, None))], ddl), path)
    assert sorted_rows(spark.read.format("delta").load(path)) == [(3, (1, None))]

"""Reading Delta tables (snapshots and increments) into Spark DataFrames."""

import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import Row

from dagster_sideinputs.delta.bridge.read import read_changes, read_table
from dagster_sideinputs.delta.bridge.writer import write_dataframe
from dagster_sideinputs.errors import (
    CorruptDataFileError,
    NonAppendOnlyChangeError,
    NotADeltaTableError,
    TableNotFoundError,
    UnsupportedTableFeatureError,
)
from tests.conftest import stage_names


def ids(df) -> list[int]:
    return sorted(row.id for row in df.collect())


def test_reading_a_missing_table_names_it_and_the_fix(spark, tmp_path):
    with pytest.raises(TableNotFoundError, match=r"(?s)No Delta table at .*nowhere.*materialize"):
        read_table(spark, str(tmp_path / "nowhere"))


def test_reading_a_parquet_folder_says_it_is_not_a_delta_table(spark, tmp_path):
    folder = str(tmp_path / "parquet_only")
    spark.range(3).write.parquet(folder)
    with pytest.raises(NotADeltaTableError, match="convert_to_deltalake"):
        read_table(spark, folder, name="raw_events")


def test_column_mapping_tables_are_refused_not_misread(spark, tmp_path):
    uri = str(tmp_path / "mapped")
    write_deltalake(
        uri, pa.table({"x": [1, 2]}), configuration={"delta.columnMapping.mode": "name"}
    )
    with pytest.raises(UnsupportedTableFeatureError, match=r"columnMapping"):
        read_table(spark, uri)


def test_unknown_reader_features_are_refused(spark, tmp_path):
    uri = str(tmp_path / "future")
    write_deltalake(uri, pa.table({"x": [1]}))
    with open(os.path.join(uri, "_delta_log", "00000000000000000001.json"), "w") as log:
        log.write('{"commitInfo":{"timestamp":1,"operation":"UPGRADE"}}\n')
        log.write(
            '{"protocol":{"minReaderVersion":3,"minWriterVersion":7,'
            '"readerFeatures":["timestampNtz","variantType"],"writerFeatures":["timestampNtz","variantType"]}}\n'
        )
    with pytest.raises(UnsupportedTableFeatureError, match="variantType"):
        read_table(spark, uri)


def test_a_truncated_data_file_is_reported_before_reading(spark, tmp_path):
    uri = str(tmp_path / "corrupt")
    write_dataframe(spark.range(100).coalesce(1), uri)
    data_file = DeltaTable(uri).file_uris()[0]
    with open(data_file, "r+b") as handle:
        handle.truncate(10)
    with pytest.raises(
        CorruptDataFileError, match=r"(?s)has 10 bytes but the Delta log recorded .*restore"
    ):
        read_table(spark, uri, name="orders")


def test_a_missing_data_file_is_reported_with_repair_hint(spark, tmp_path):
    uri = str(tmp_path / "missing_file")
    write_dataframe(spark.range(10).coalesce(1), uri)
    os.remove(DeltaTable(uri).file_uris()[0])
    with pytest.raises(CorruptDataFileError, match=r"(?s)is missing.*repair\(\)"):
        read_table(spark, uri)


def test_time_travel_reads_a_given_version(spark, tmp_path):
    uri = str(tmp_path / "versions")
    write_dataframe(spark.range(0, 2), uri)
    write_dataframe(spark.range(2, 4), uri)
    assert ids(read_table(spark, uri, version=0)) == [0, 1]
    assert ids(read_table(spark, uri)) == [0, 1, 2, 3]
    with pytest.raises(TableNotFoundError, match="no version 9"):
        read_table(spark, uri, version=9)


def test_partition_filter_reads_only_those_partitions(spark, tmp_path):
    uri = str(tmp_path / "by_day")
    df = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id long, day string")
    write_dataframe(df, uri, partition_by=["day"])
    picked = read_table(spark, uri, partition_filter={"day": ["a", "c"]})
    assert ids(picked) == [1, 3]
    assert len(picked.inputFiles()) == 2


def test_incremental_reads_across_many_versions_return_each_row_once(spark, tmp_path):
    uri = str(tmp_path / "stream")
    for version in range(25):
        write_dataframe(spark.range(version * 10, version * 10 + 10), uri)
    seen: list[int] = []
    start = -1
    for end in (0, 3, 4, 10, 17, 24):
        rows, reached = read_changes(spark, uri, start_version=start, end_version=end)
        assert reached == end
        seen.extend(ids(rows))
        start = end
    assert seen == list(range(250))
    latest, reached = read_changes(spark, uri, start_version=24)
    assert reached == 24
    assert latest.count() == 0


def test_incremental_read_skips_compaction_commits(spark, tmp_path):
    uri = str(tmp_path / "compacted")
    for version in range(5):
        write_dataframe(spark.range(version * 3, version * 3 + 3), uri)
    DeltaTable(uri).optimize.compact()
    assert DeltaTable(uri).version() == 5
    rows, _ = read_changes(spark, uri, start_version=4, end_version=5)
    assert rows.count() == 0
    assert ids(read_table(spark, uri)) == list(range(15))


def test_incremental_read_refuses_a_version_that_deleted_rows(spark, tmp_path):
    uri = str(tmp_path / "deleted")
    write_dataframe(spark.range(10), uri)
    DeltaTable(uri).delete("id < 3")
    with pytest.raises(
        NonAppendOnlyChangeError, match=r"(?s)Version 1 of table .* removed data \(DELETE"
    ):
        read_changes(spark, uri, start_version=0, end_version=1)


def test_incremental_read_after_schema_evolution_fills_new_columns_with_nulls(spark, tmp_path):
    uri = str(tmp_path / "evolving")
    write_dataframe(spark.createDataFrame([(1,)], "id long"), uri)
    write_dataframe(
        spark.createDataFrame([(2, "x")], "id long, tag string"), uri, schema_mode="merge"
    )
    rows, _ = read_changes(spark, uri, start_version=-1)
    assert sorted(rows.collect()) == [Row(id=1, tag=None), Row(id=2, tag="x")]


# --- small tables read on the driver (singletons, a map's keys): no Spark job ------------

DRIVER_SCHEMA = (
    "i INT, l LONG, s STRING, b BINARY, d DECIMAL(10,2), ts TIMESTAMP, tn TIMESTAMP_NTZ, "
    "dt DATE, f DOUBLE, arr ARRAY<STRING>, m MAP<STRING,INT>, st STRUCT<a:INT,b:STRING>, p STRING"
)


def driver_rows(spark):
    import datetime as dt
    from decimal import Decimal

    return spark.createDataFrame(
        [
            (1, 2, "x", bytearray(b"ab"), Decimal("1.50"), dt.datetime(2024, 1, 2, 3, 4, 5, 6),
             dt.datetime(2024, 1, 2, 3, 4, 5), dt.date(2024, 1, 2), 1.5, ["a", None], {"k": 1},
             (1, "z"), "P"),
            (None, None, None, None, None, None, None, None, None, None, None, None, None),
        ],
        DRIVER_SCHEMA,
    )  # fmt: skip


@pytest.mark.parametrize("partitioned", [False, True], ids=["flat", "partitioned"])
def test_the_bridge_reads_a_small_table_on_the_driver_as_spark_collects_it(
    spark, tmp_path, partitioned
):
    from dagster_sideinputs.core.sideinputs.side_data import arrow_rows
    from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine

    uri = str(tmp_path / "small")
    write_dataframe(driver_rows(spark), uri, partition_by=["p"] if partitioned else None)
    engine = DeltaRsEngine()
    snapshot = engine.snapshot(uri)
    table, stages = stage_names(spark, lambda: engine.read_on_driver(snapshot))
    assert table is not None
    assert stages == []
    key = lambda row: repr(row)  # noqa: E731 - rows with None sort by their text
    for as_bytes in ("true", "false"):
        spark.conf.set("spark.sql.execution.pyspark.binaryAsBytes", as_bytes)
        try:
            got = arrow_rows(spark, table, snapshot.schema)
            want = engine.read_snapshot(spark, snapshot).collect()
        finally:
            spark.conf.unset("spark.sql.execution.pyspark.binaryAsBytes")
        assert len(want) == 2
        assert sorted(got, key=key) == sorted(want, key=key)
        assert {type(r.b) for r in got if r.b is not None} == {type(r.b) for r in want if r.b}
    some = engine.read_on_driver(snapshot, columns=["l", "p"], limit=1)
    assert some is not None
    assert (some.column_names, some.num_rows) == (["l", "p"], 1)


def test_a_small_table_the_driver_cannot_read_exactly_is_left_to_spark(spark, tmp_path):
    from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine
    from dagster_sideinputs.delta.spark.engine import DeltaSparkEngine

    uri = str(tmp_path / "small")
    write_dataframe(spark.range(3), uri)
    engine = DeltaRsEngine()
    snapshot = engine.snapshot(uri)
    assert engine.read_on_driver(snapshot, columns=["nope"]) is None
    # A snapshot of another table than the one now at its location (deleted, created again).
    import dataclasses

    assert engine.read_on_driver(dataclasses.replace(snapshot, table_id="another")) is None
    assert engine.read_on_driver(snapshot) is not None
    assert DeltaSparkEngine().read_on_driver(snapshot) is None
    # A timestamp partition value: Spark reads it in the session's time zone.
    stamped = str(tmp_path / "stamped")
    import datetime as dt

    at = pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)], pa.timestamp("us", "UTC"))
    write_deltalake(stamped, pa.table({"x": [1], "at": at}), partition_by=["at"])
    stamped_snapshot = engine.snapshot(stamped)
    assert engine.read_on_driver(stamped_snapshot) is None
    assert engine.read_on_driver(stamped_snapshot, columns=["x"]) is not None


def test_a_missing_file_of_a_small_table_is_named_as_when_spark_reads_it(spark, tmp_path):
    from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine

    uri = str(tmp_path / "small")
    write_dataframe(spark.range(3).coalesce(1), uri)
    engine = DeltaRsEngine()
    snapshot = engine.snapshot(uri)
    os.remove(snapshot.files[0].uri.removeprefix("file://"))
    with pytest.raises(CorruptDataFileError, match="is missing"):
        engine.read_on_driver(snapshot)

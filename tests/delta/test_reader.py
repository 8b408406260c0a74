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

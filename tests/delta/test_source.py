"""The dsi_delta Spark data source: batch reads and Structured Streaming over versions."""

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import Row

from dagster_sideinputs.delta.bridge.source import register_delta_source
from dagster_sideinputs.delta.bridge.writer import write_dataframe


def test_batch_read_through_the_data_source_matches_the_table(spark, tmp_path):
    register_delta_source(spark)
    uri = str(tmp_path / "t")
    df = spark.createDataFrame(
        [(1, "a", "x"), (2, None, "y")], "id long, label string, part string"
    )
    write_dataframe(df, uri, partition_by=["part"])
    back = spark.read.format("dsi_delta").load(uri)
    assert back.schema == spark.read.format("dsi_delta").load(uri).schema
    assert sorted(back.collect()) == [
        Row(id=1, label="a", part="x"),
        Row(id=2, label=None, part="y"),
    ]


def test_streaming_reads_each_version_once_across_restarts(spark, tmp_path):
    register_delta_source(spark)
    uri = str(tmp_path / "events")
    checkpoint = str(tmp_path / "checkpoint")
    seen: list[int] = []

    def collect(batch, _batch_id):
        seen.extend(row.id for row in batch.collect())

    def run_available_now():
        query = (
            spark.readStream.format("dsi_delta")
            .load(uri)
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)

    for version in range(3):
        write_deltalake(uri, pa.table({"id": [version * 2, version * 2 + 1]}), mode="append")
    run_available_now()
    assert sorted(seen) == [0, 1, 2, 3, 4, 5]
    write_deltalake(uri, pa.table({"id": [6]}), mode="append")
    run_available_now()
    assert sorted(seen) == [0, 1, 2, 3, 4, 5, 6]

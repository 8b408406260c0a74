"""The statistics our commits record are the columns Delta's writer records: the table's
``delta.dataSkippingNumIndexedCols`` (default 32) or ``delta.dataSkippingStatsColumns``.
Our own checks still read every column's statistics from the footers."""

import glob
import json
from pathlib import Path

import pytest
from pyspark.sql import types as T

from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine
from dagster_sideinputs.delta.engine import AppTransaction
from dagster_sideinputs.delta.spark.engine import DeltaSparkEngine
from dagster_sideinputs.delta.stats import indexed_columns

DDL = (
    "a long, s struct<x: long, y: string>, b string, tags array<string>, "
    "m map<string, long>, c long"
)
ROWS = [(1, (2, "q"), "z", ["t"], {"k": 1}, 5), (3, None, None, None, None, 6)]
PROPERTIES = [
    {},
    {"delta.dataSkippingNumIndexedCols": "2"},
    {"delta.dataSkippingNumIndexedCols": "3"},
    {"delta.dataSkippingNumIndexedCols": "0"},
    {"delta.dataSkippingNumIndexedCols": "-1"},
    {"delta.dataSkippingStatsColumns": "c,s.y"},
    {"delta.dataSkippingStatsColumns": "S"},
    {"delta.dataSkippingStatsColumns": "`b`, a"},
]


def last_stats(uri):
    """The statistics of the last commit's added files (one file each here)."""
    last = sorted(glob.glob(f"{uri}/_delta_log/*.json"))[-1]
    lines = Path(last).read_text().splitlines()
    adds = [json.loads(line)["add"] for line in lines if '"add"' in line]
    return [json.loads(add["stats"]) for add in adds if add.get("stats")]


def without_collections(stats):
    """Delta counts null arrays and maps; footers cannot tell them from null elements, so
    ours leave those counts out (no skipping on them, never a wrong one)."""
    nulls = {k: v for k, v in stats.get("nullCount", {}).items() if k not in ("tags", "m")}
    return (
        {**stats, "nullCount": nulls}
        if nulls
        else {k: v for k, v in stats.items() if k != "nullCount"}
    )


@pytest.mark.parametrize("engine_name", ["delta-spark", "delta-rs"])
@pytest.mark.parametrize(
    "properties",
    PROPERTIES,
    ids=lambda p: ",".join(f"{k[21:]}={v}" for k, v in p.items()) or "defaults",
)
def test_an_append_records_the_statistics_delta_writer_records(
    spark, tmp_path, engine_name, properties
):
    engine = DeltaSparkEngine(spark) if engine_name == "delta-spark" else DeltaRsEngine()
    frame = spark.createDataFrame(ROWS, DDL).coalesce(1)
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    for uri in (ours, theirs):
        writer = spark.createDataFrame([], DDL).write.format("delta")
        for key, value in properties.items():
            writer = writer.option(key, value)
        writer.save(uri)
    frame.write.format("delta").mode("append").save(theirs)
    staged = engine.stage(frame, ours, name="ours")
    engine.commit(staged, app_transaction=AppTransaction("op", 1))

    [expected] = last_stats(theirs)
    [recorded] = last_stats(ours)
    assert recorded == without_collections(expected)
    assert sorted(r.a for r in spark.read.format("delta").load(ours).collect()) == [1, 3]


def test_indexed_columns_count_leaves_as_delta_does(spark):  # (fromDDL needs a session)
    schema = T.StructType.fromDDL(DDL)
    assert indexed_columns(schema, {}) is None  # fewer than 32 leaves: all
    assert indexed_columns(schema, {"delta.dataSkippingNumIndexedCols": "4"}) == {
        ("a",),
        ("s", "x"),
        ("s", "y"),
        ("b",),
    }
    assert indexed_columns(schema, {"delta.dataSkippingNumIndexedCols": "5"}) == {
        ("a",),
        ("s", "x"),
        ("s", "y"),
        ("b",),
        ("tags",),
    }
    named = {
        "delta.dataSkippingStatsColumns": "`s`.`y`, C",
        "delta.dataSkippingNumIndexedCols": "1",
    }
    assert indexed_columns(schema, named) == {("s", "y"), ("c",)}
    wide = T.StructType([T.StructField(f"c{i}", T.LongType()) for i in range(40)])
    assert indexed_columns(wide, {}) == {(f"c{i}",) for i in range(32)}

"""Spark reaches the test S3 server through s3a:// (hadoop-aws from Maven Central).

The shared test session loads the s3a jars; the settings of the server (endpoint,
credentials) are set on it at run time, per bucket, by ``DeltaStorage.configure_spark``
(what the engine and the operator do before Spark touches a lake). Spark writes and
reads parquet, reads the files of tables delta-rs wrote, and meets special characters in
paths and partition values.
"""

import pickle
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

import dagster_sideinputs as dsi

pytestmark = pytest.mark.s3

CHARS = {
    "space": " ",
    "percent": "%",
    "pct20": "%20",
    "hash": "#",
    "question": "?",
    "bracket": "[",
    "colon": ":",
    "plus": "+",
}
# Table paths delta-rs itself stores where asked (see test_object_store.py).
DELTA_RS_PATHS = ("space", "percent", "colon", "plus")


def attempt(action: Any) -> Any:
    try:
        return {"ok": action()}
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {"error": f"{type(exc).__name__}: {first[:300]}"}


@pytest.fixture(scope="module")
def where(spark: SparkSession, s3_server) -> dict[str, str]:
    """A fresh prefix, as delta-rs (``s3://``) and Spark (``s3a://``) name it."""
    base = s3_server.fresh_prefix("s3a")
    dsi.DeltaStorage(base, s3_server.storage_options).configure_spark(spark)
    return {"base": base, "spark": "s3a://" + base.removeprefix("s3://")}


def test_spark_writes_and_reads_parquet_on_s3a(spark, where):
    target = f"{where['spark']}/parquet"
    spark.range(1000).selectExpr("id", "id % 7 AS k").write.partitionBy("k").parquet(target)
    assert spark.read.parquet(target).count() == 1000
    total = spark.read.parquet(target).selectExpr("sum(id + k)").first()
    assert total is not None
    assert total[0] == sum(i + i % 7 for i in range(1000))


def test_spark_reads_the_files_of_a_table_delta_rs_wrote(spark, where, s3_server):
    for name in DELTA_RS_PATHS:
        path = f"delta-path-{name}-a{CHARS[name]}b"
        write_deltalake(
            f"{where['base']}/{path}",
            pa.table({"x": [1]}),
            storage_options=s3_server.storage_options,
        )
        read = attempt(
            lambda path=path: [
                list(r) for r in spark.read.parquet(f"{where['spark']}/{path}").collect()
            ]
        )
        assert read == {"ok": [[1]]}, name


def test_spark_reads_delta_rs_partition_values_with_special_characters(spark, where, s3_server):
    """delta-rs escapes the folder names (``p=a%20b``); Spark decodes them back."""
    for name, char in CHARS.items():
        path = f"delta-part-{name}"
        data = pa.table({"x": [1, 2], "p": [f"a{char}b", "plain"]})
        write_deltalake(
            f"{where['base']}/{path}",
            data,
            partition_by=["p"],
            storage_options=s3_server.storage_options,
        )
        rows = spark.read.parquet(f"{where['spark']}/{path}").collect()
        assert sorted([list(r) for r in rows], key=str) == [[1, f"a{char}b"], [2, "plain"]], name


def test_special_characters_in_spark_paths_and_partitions(spark, where, s3_server):
    """Recorded truth: partition values all round-trip; ``?`` and ``[`` in a path do not.

    Hadoop reads a path as a glob: ``?`` matches any character (here the listing of the
    parent also met a sibling ``...a:b`` and failed to parse it; elsewhere it could read
    a neighbour's files), and ``[`` opens a character class that never closes.
    """
    prefix = f"{where['spark']}/special"
    paths, partitions = {}, {}
    for name, char in CHARS.items():
        value = f"a{char}b"

        def write_path(path_uri: str = f"{prefix}/path-{name}-{value}") -> int:
            spark.range(3).write.parquet(path_uri)
            return spark.read.parquet(path_uri).count()

        def write_partition(part_uri: str = f"{prefix}/part-{name}", value: str = value) -> Any:
            frame = spark.createDataFrame([(1, value), (2, "plain")], "x int, p string")
            frame.write.partitionBy("p").parquet(part_uri)
            return sorted(row.p for row in spark.read.parquet(part_uri).collect())

        paths[name] = "ok" if "ok" in attempt(write_path) else "error"
        partitions[name] = attempt(write_partition)
    assert partitions == {
        name: {"ok": sorted([f"a{char}b", "plain"])} for name, char in CHARS.items()
    }
    assert paths == {
        "space": "ok",
        "percent": "ok",
        "pct20": "ok",  # not decoded by Spark, unlike delta-rs: two different folders
        "hash": "ok",
        "bracket": "error",
        "colon": "ok",
        "plus": "ok",
    } | {"question": paths["question"]}
    # ``?`` is a glob: whether its own path reads back depends on its neighbours; with one
    # that matches, the read takes the neighbour's rows too.
    spark.range(3).write.parquet(f"{prefix}/glob-aZb")
    spark.range(5).write.parquet(f"{prefix}/glob-a?b")
    assert attempt(lambda: spark.read.parquet(f"{prefix}/glob-a?b").count()) != {"ok": 5}
    # Spark keeps the characters literally in the object keys.
    folders = {key.split("/")[2] for key in s3_server.keys(f"{where['base']}/special")}
    assert {"path-pct20-a%20b", "path-hash-a#b", "path-space-a b"} <= folders


# --- the native engine's log reads on S3 -------------------------------------------------------


def test_delta_spark_logs_on_s3_read_with_obstore_equal_those_read_through_spark(
    spark, where, s3_server
):
    """With the lake's storage options, the native engine reads ``_delta_log`` on S3 with
    obstore (a listing and a GET per file) instead of Spark jobs: the same listing, the
    same replayed state (checkpoint included), at every version."""
    from dagster_sideinputs.delta.log.files import ObjectStoreLogFiles, SparkLogFiles
    from dagster_sideinputs.delta.log.reader import LogReader

    uri = f"{where['base']}/native-log"
    target = uri.replace("s3://", "s3a://", 1)
    frame = spark.range(10).selectExpr("id", "id % 3 AS k")
    frame.write.format("delta").partitionBy("k").option("delta.checkpointInterval", "2").save(
        target
    )
    for step in range(2):
        spark.range(step * 10, step * 10 + 10).selectExpr("id", "id % 3 AS k").write.format(
            "delta"
        ).mode("append").option("txnAppId", "app").option("txnVersion", step).save(target)
    direct = ObjectStoreLogFiles(uri, s3_server.storage_options)
    through_spark = SparkLogFiles(uri, spark)

    def listed(files: Any) -> list[tuple[str, int, int]]:
        # Spark's listing skips hidden names (_last_checkpoint); the replay ignores them.
        entries = files.list_log() or []
        return sorted((e.name, e.size, e.mtime_ms) for e in entries if e.name[0] not in "_.")

    assert listed(direct) == listed(through_spark)
    names = {e.name for e in direct.list_log() or []}
    assert any(n.endswith(".checkpoint.parquet") for n in names), names
    for version in (1, None):  # the latest last: checked below
        mine = LogReader().state(direct, version, table="native-log")
        theirs = LogReader().state(through_spark, version, table="native-log")
        assert mine == theirs
    assert mine.version == 2
    assert mine.txns == {"app": 1}
    assert direct.holds_files()
    missing = ObjectStoreLogFiles(f"{where['base']}/no-such-table", s3_server.storage_options)
    assert missing.list_log() is None
    assert not missing.holds_files()
    with pytest.raises(FileNotFoundError):
        direct.read_json_lines(["00000000000000000099.json"])


def test_the_native_engine_reads_s3_logs_with_the_lakes_options_else_through_spark(
    spark, where, s3_server
):
    from dagster_sideinputs.delta.log.files import ObjectStoreLogFiles, SparkLogFiles
    from dagster_sideinputs.delta.spark.engine import DeltaSparkEngine

    uri = f"{where['base']}/any"
    with_options = dsi.DeltaStorage(
        where["base"], s3_server.storage_options, engine="delta-spark"
    ).bind(spark)
    assert isinstance(with_options.delta._files(uri), ObjectStoreLogFiles)  # type: ignore[attr-defined]
    assert "secret" not in repr(with_options.delta).lower()
    # An engine sent to another process (pickled) keeps reading logs the same way.
    copied = pickle.loads(pickle.dumps(with_options.delta))
    assert copied.storage_options == s3_server.storage_options
    assert isinstance(copied._files(uri), ObjectStoreLogFiles)
    bare = DeltaSparkEngine(spark)
    assert isinstance(bare._files(uri), SparkLogFiles)

"""Writing DataFrames to Delta tables through Spark + delta-rs."""

import datetime as dt
import decimal
import json
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.delta.bridge.read import read_table
from dagster_sideinputs.delta.bridge.writer import AppTransaction, write_dataframe
from dagster_sideinputs.errors import (
    NotADeltaTableError,
    SchemaMismatchError,
)
from tests.conftest import table_files

ALL_TYPES = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("i8", T.ByteType()),
        T.StructField("i16", T.ShortType()),
        T.StructField("i32", T.IntegerType()),
        T.StructField("f32", T.FloatType()),
        T.StructField("f64", T.DoubleType()),
        T.StructField("dec", T.DecimalType(10, 2)),
        T.StructField("wide_dec", T.DecimalType(38, 6)),
        T.StructField("s", T.StringType()),
        T.StructField("flag", T.BooleanType()),
        T.StructField("day", T.DateType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("ntz", T.TimestampNTZType()),
        T.StructField("raw", T.BinaryType()),
        T.StructField(
            "nested",
            T.StructType(
                [
                    T.StructField("a", T.IntegerType()),
                    T.StructField("inner", T.StructType([T.StructField("b", T.StringType())])),
                ]
            ),
        ),
        T.StructField("tags", T.ArrayType(T.StringType())),
        T.StructField("attrs", T.MapType(T.StringType(), T.LongType())),
    ]
)

UTC = dt.timezone.utc


def all_type_rows() -> list[tuple]:
    return [
        (
            1,
            -8,
            1600,
            -32000,
            1.5,
            -2.25,
            decimal.Decimal("12345678.91"),
            decimal.Decimal("12345678901234567890123456789012.123456"),
            "héllo, wörld ✓",
            True,
            dt.date(2024, 2, 29),
            dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
            dt.datetime(2024, 2, 29, 12, 0, 0, 123456),
            b"\x00\x01\xff",
            (7, ("deep",)),
            ["x", None, "z"],
            {"k": 1, "n": None},
        ),
        (
            2,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        ),
        (
            3,
            127,
            -1,
            0,
            float("inf"),
            float("nan"),
            decimal.Decimal("-0.01"),
            decimal.Decimal("0.000001"),
            "",
            False,
            dt.date(1970, 1, 1),
            dt.datetime(1999, 12, 31, 23, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
            dt.datetime(1900, 1, 1),
            b"",
            (None, None),
            [],
            {},
        ),
    ]


def normalized(rows: list[Row]) -> list[dict]:
    """Rows as comparable dicts (NaN compared as a string)."""
    result = []
    for row in rows:
        as_dict = row.asDict(recursive=True)
        result.append(
            {k: ("nan" if isinstance(v, float) and v != v else v) for k, v in as_dict.items()}
        )
    return sorted(result, key=lambda r: r["id"])


def test_round_trip_keeps_every_type_and_null(spark, tmp_path):
    uri = str(tmp_path / "types")
    df = spark.createDataFrame(all_type_rows(), ALL_TYPES)
    result = write_dataframe(df, uri)
    back = read_table(spark, uri)
    assert result.num_rows == 3
    assert back.schema == ALL_TYPES
    assert normalized(back.collect()) == normalized(df.collect())


def test_timestamps_with_zone_are_stored_in_utc(spark, tmp_path):
    uri = str(tmp_path / "ts")
    df = spark.createDataFrame(all_type_rows()[2:], ALL_TYPES).select("id", "ts")
    write_dataframe(df, uri)
    stored = DeltaTable(uri).to_pyarrow_table().column("ts")[0].as_py()
    assert stored == dt.datetime(2000, 1, 1, 4, 0, tzinfo=UTC)


def test_table_written_by_the_bridge_reads_with_plain_deltalake(spark, tmp_path):
    uri = str(tmp_path / "interop")
    df = spark.createDataFrame(all_type_rows(), ALL_TYPES)
    write_dataframe(df, uri, partition_by=["flag"])
    table = DeltaTable(uri).to_pyarrow_table()
    assert table.num_rows == 3
    by_id = {row["id"]: row for row in table.to_pylist()}
    assert by_id[1]["nested"] == {"a": 7, "inner": {"b": "deep"}}
    assert by_id[1]["wide_dec"] == decimal.Decimal("12345678901234567890123456789012.123456")
    assert by_id[2]["flag"] is None
    assert by_id[3]["s"] == ""


def test_table_written_by_deltalake_reads_with_the_bridge(spark, tmp_path):
    uri = str(tmp_path / "from_rs")
    data = pa.table(
        {
            "region": ["eu:west 1%", None, "us/east", "eu:west 1%"],
            "day": pa.array([dt.date(2024, 1, 1), dt.date(2024, 1, 2), None, dt.date(2024, 1, 1)]),
            "amount": pa.array(
                [decimal.Decimal("1.10"), None, decimal.Decimal("3.30"), None], pa.decimal128(9, 2)
            ),
            "at": pa.array([dt.datetime(2024, 1, 1, tzinfo=UTC)] * 4, pa.timestamp("us", tz="UTC")),
        }
    )
    write_deltalake(uri, data, partition_by=["region", "day"])
    write_deltalake(uri, data.slice(0, 1), mode="append", partition_by=["region", "day"])
    back = read_table(spark, uri)
    assert [f.name for f in back.schema] == ["region", "day", "amount", "at"]
    assert isinstance(back.schema["day"].dataType, T.DateType)
    rows = sorted(back.collect(), key=lambda r: (str(r.region), str(r.day), str(r.amount)))
    # PySpark hands timestamps back as naive datetimes in the (UTC) session zone.
    arrow_rows = DeltaTable(uri).to_pyarrow_table().to_pylist()
    expected = sorted(
        [Row(**{**r, "at": r["at"].replace(tzinfo=None)}) for r in arrow_rows],
        key=lambda r: (str(r.region), str(r.day), str(r.amount)),
    )
    assert rows == expected
    assert len(rows) == 5


def test_partitioned_write_round_trips_special_characters_and_nulls(spark, tmp_path):
    uri = str(tmp_path / "parts")
    df = spark.createDataFrame(
        [
            ("a:b c%/x", 1, dt.date(2024, 1, 1), 1),
            (None, None, None, 2),
            ("plain", 7, dt.date(2024, 5, 5), 3),
        ],
        "k string, n int, d date, v int",
    )
    write_dataframe(df, uri, partition_by=["k", "n", "d"])
    assert sorted(read_table(spark, uri).collect(), key=lambda r: r.v) == sorted(
        df.collect(), key=lambda r: r.v
    )
    partitions = {
        json.dumps(p, sort_keys=True, default=str)
        for p in pa.table(DeltaTable(uri).get_add_actions()).column("partition").to_pylist()
    }
    assert json.dumps({"d": None, "k": None, "n": None}, sort_keys=True) in partitions
    assert DeltaTable(uri).to_pyarrow_table(filters=[("k", "=", "a:b c%/x")]).num_rows == 1


def test_add_actions_carry_statistics_readers_can_skip_files_with(spark, tmp_path):
    uri = str(tmp_path / "stats")
    df = spark.range(0, 1000, numPartitions=4).select(
        F.col("id"),
        F.expr("timestamp_seconds(1700000000 + id)").alias("ts"),
        F.when(F.col("id") % 10 == 0, None).otherwise(F.concat(F.lit("v"), F.col("id"))).alias("s"),
        F.struct((F.col("id") * 2).alias("twice")).alias("st"),
    )
    result = write_dataframe(df, uri)
    actions = pa.table(DeltaTable(uri).get_add_actions()).to_pylist()
    assert result.num_files == len(actions) == 4
    assert sum(a["num_records"] for a in actions) == 1000
    first = min(actions, key=lambda a: a["min"]["id"])
    assert first["min"]["id"] == 0
    assert first["max"]["id"] == 249
    assert first["null_count"]["s"] == 25
    assert first["max"]["st"]["twice"] == 498
    assert first["min"]["ts"] == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    # delta-rs prunes files with those statistics: the scan touches one file only.
    dataset = DeltaTable(uri).to_pyarrow_dataset()
    fragments = list(dataset.get_fragments(filter=pa.compute.field("id") >= 900))
    assert len(fragments) == 1


def test_timestamp_bounds_are_rounded_outward_to_milliseconds(spark, tmp_path):
    uri = str(tmp_path / "ts_bounds")
    df = spark.createDataFrame(
        [
            (dt.datetime(2024, 1, 1, 0, 0, 0, 1500, tzinfo=UTC),),
            (dt.datetime(2024, 1, 1, 0, 0, 0, 2500, tzinfo=UTC),),
        ],
        "ts timestamp",
    ).coalesce(1)
    write_dataframe(df, uri)
    action = pa.table(DeltaTable(uri).get_add_actions()).to_pylist()[0]
    assert action["min"]["ts"] <= dt.datetime(2024, 1, 1, 0, 0, 0, 1500, tzinfo=UTC)
    assert action["max"]["ts"] >= dt.datetime(2024, 1, 1, 0, 0, 0, 2500, tzinfo=UTC)


def test_append_and_full_overwrite(spark, tmp_path):
    uri = str(tmp_path / "modes")
    write_dataframe(spark.range(3), uri)
    write_dataframe(spark.range(3, 5), uri, mode="append")
    assert read_table(spark, uri).count() == 5
    write_dataframe(spark.range(10, 12), uri, mode="overwrite")
    assert sorted(r.id for r in read_table(spark, uri).collect()) == [10, 11]
    assert DeltaTable(uri).version() == 2


def test_overwrite_of_one_partition_keeps_the_others(spark, tmp_path):
    uri = str(tmp_path / "hourly")
    df = spark.createDataFrame(
        [("2024-01-01-00:00", 1), ("2024-01-01-01:00", 2)], "partition string, v int"
    )
    write_dataframe(df, uri, partition_by=["partition"])
    replacement = spark.createDataFrame(
        [("2024-01-01-01:00", 20), ("2024-01-01-01:00", 21)], "partition string, v int"
    )
    write_dataframe(
        replacement, uri, mode="overwrite", replace_partition={"partition": "2024-01-01-01:00"}
    )
    rows = sorted((r.partition, r.v) for r in read_table(spark, uri).collect())
    assert rows == [("2024-01-01-00:00", 1), ("2024-01-01-01:00", 20), ("2024-01-01-01:00", 21)]


def test_partition_overwrite_refuses_rows_of_other_partitions(spark, tmp_path):
    uri = str(tmp_path / "hourly")
    df = spark.createDataFrame([("a", 1), ("b", 2)], "partition string, v int")
    write_dataframe(df, uri, partition_by=["partition"])
    before = (DeltaTable(uri).version(), table_files(uri))
    with pytest.raises(SchemaMismatchError, match="also holds rows of partition"):
        write_dataframe(df, uri, mode="overwrite", replace_partition={"partition": "a"})
    assert (DeltaTable(uri).version(), table_files(uri)) == before


def test_write_with_an_already_committed_app_transaction_writes_nothing(spark, tmp_path):
    uri = str(tmp_path / "idem")
    first = write_dataframe(spark.range(5), uri, app_transaction=AppTransaction("op", 3))
    files_after_first = table_files(uri)
    again = write_dataframe(spark.range(5), uri, app_transaction=AppTransaction("op", 3))
    older = write_dataframe(spark.range(5), uri, app_transaction=AppTransaction("op", 2))
    assert not first.skipped
    assert again.skipped
    assert older.skipped
    assert DeltaTable(uri).version() == 0
    assert table_files(uri) == files_after_first
    assert read_table(spark, uri).count() == 5
    other_app = write_dataframe(spark.range(5), uri, app_transaction=AppTransaction("other", 3))
    newer = write_dataframe(spark.range(5), uri, app_transaction=AppTransaction("op", 4))
    assert not other_app.skipped
    assert not newer.skipped
    assert DeltaTable(uri).transaction_version("op") == 4
    assert read_table(spark, uri).count() == 15


def test_empty_write_still_commits_its_transaction(spark, tmp_path):
    uri = str(tmp_path / "empty")
    result = write_dataframe(spark.range(0), uri, app_transaction=AppTransaction("op", 0))
    assert result.num_rows == 0
    assert result.version == 0
    assert DeltaTable(uri).transaction_version("op") == 0
    assert read_table(spark, uri).count() == 0


def test_append_with_a_mismatching_schema_is_an_error_and_changes_nothing(spark, tmp_path):
    uri = str(tmp_path / "strict")
    write_dataframe(spark.createDataFrame([(1, "a")], "id long, name string"), uri)
    before = (DeltaTable(uri).version(), table_files(uri))
    wrong_type = spark.createDataFrame([("x", "a")], "id string, name string")
    with pytest.raises(
        SchemaMismatchError, match=r"column 'id' is string in the data but bigint in the table"
    ):
        write_dataframe(wrong_type, uri)
    extra = spark.createDataFrame([(1, "a", 2.0)], "id long, name string, score double")
    with pytest.raises(
        SchemaMismatchError,
        match=r"(?s)'score' \(double\) is not in the table.*schema_mode=\"merge\"",
    ):
        write_dataframe(extra, uri)
    missing = spark.createDataFrame([(1,)], "id long")
    with pytest.raises(SchemaMismatchError, match=r"'name' \(string\) is missing"):
        write_dataframe(missing, uri)
    assert (DeltaTable(uri).version(), table_files(uri)) == before


def test_safe_widening_and_column_order_are_accepted_on_append(spark, tmp_path):
    uri = str(tmp_path / "widen")
    write_dataframe(spark.createDataFrame([(1, 1.0, "a")], "id long, x double, name string"), uri)
    write_dataframe(spark.createDataFrame([("b", 2, 2.0)], "name string, id int, x float"), uri)
    rows = sorted(read_table(spark, uri).collect())
    assert rows == [Row(id=1, x=1.0, name="a"), Row(id=2, x=2.0, name="b")]


def test_schema_merge_adds_new_columns(spark, tmp_path):
    uri = str(tmp_path / "merge")
    write_dataframe(spark.createDataFrame([(1,)], "id long"), uri)
    write_dataframe(
        spark.createDataFrame([(2, "new")], "id long, label string"), uri, schema_mode="merge"
    )
    rows = sorted(read_table(spark, uri).collect())
    assert rows == [Row(id=1, label=None), Row(id=2, label="new")]
    assert DeltaTable(uri).to_pyarrow_table().schema.names == ["id", "label"]


def test_schema_overwrite_replaces_the_table_schema(spark, tmp_path):
    uri = str(tmp_path / "reschema")
    write_dataframe(spark.createDataFrame([(1,)], "id long"), uri)
    write_dataframe(
        spark.createDataFrame([("x",)], "code string"),
        uri,
        mode="overwrite",
        schema_mode="overwrite",
    )
    assert read_table(spark, uri).collect() == [Row(code="x")]


def test_writing_into_a_folder_that_is_not_a_delta_table_is_refused(spark, tmp_path):
    folder = tmp_path / "plain_parquet"
    spark.range(3).write.parquet(str(folder))
    before = table_files(str(folder))
    with pytest.raises(NotADeltaTableError, match="not a Delta table"):
        write_dataframe(spark.range(3), str(folder))
    assert table_files(str(folder)) == before


def test_first_write_killed_after_moving_its_files_is_redone_by_the_rerun(
    spark, tmp_path, monkeypatch
):
    # A SIGKILL between moving a new table's files into its folder and the commit that
    # creates the table leaves files without a log; the rerun must not take the folder
    # for a foreign dataset. (The crash harness does this with a real SIGKILL.)
    from dagster_sideinputs.delta import staging
    from dagster_sideinputs.delta.bridge import writer

    uri = str(tmp_path / "created")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed before the commit")

    with monkeypatch.context() as patch:
        patch.setattr(staging.Staging, "discard", lambda self, published_too: None)
        patch.setattr(writer, "commit_files", killed)
        with pytest.raises(KeyboardInterrupt):
            write_dataframe(spark.range(3), uri, app_transaction=AppTransaction("op", 0))
    assert not DeltaTable.is_deltatable(uri)
    assert any(name.endswith(".parquet") for name in os.listdir(uri))

    write_dataframe(spark.range(3), uri, app_transaction=AppTransaction("op", 0))
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2]
    assert DeltaTable(uri).version() == 0
    assert not os.path.exists(os.path.join(uri, "_dsi_staging", "_creating"))


def test_a_failed_spark_job_leaves_no_data_visible_and_no_files(spark, tmp_path):
    uri = str(tmp_path / "failing")
    write_dataframe(spark.range(3), uri)
    before = (DeltaTable(uri).version(), table_files(uri))
    boom = spark.range(100).select(
        F.when(F.col("id") == 42, F.raise_error(F.lit("boom"))).otherwise(F.col("id")).alias("id")
    )
    with pytest.raises(Exception, match="boom"):
        write_dataframe(boom, uri)
    assert (DeltaTable(uri).version(), table_files(uri)) == before
    assert not os.path.exists(os.path.join(uri, "_dsi_staging")) or not os.listdir(
        os.path.join(uri, "_dsi_staging")
    )


def test_void_columns_are_refused_with_the_cast_to_use(spark, tmp_path):
    with pytest.raises(SchemaMismatchError, match=r'cast\("string"\)'):
        write_dataframe(spark.range(1).select(F.lit(None).alias("nothing")), str(tmp_path / "void"))


def test_partitioning_by_a_timestamp_is_refused_with_an_alternative(spark, tmp_path):
    df = spark.range(1).select(F.current_timestamp().alias("at"))
    with pytest.raises(SchemaMismatchError, match="date_format"):
        write_dataframe(df, str(tmp_path / "bad_part"), partition_by=["at"])


def test_remove_files_and_add_in_one_commit(spark, tmp_path):
    from dagster_sideinputs.delta.bridge.table import load_snapshot

    uri = str(tmp_path / "swap")
    write_dataframe(spark.range(0, 3), uri)
    write_dataframe(spark.range(3, 6), uri)
    snapshot = load_snapshot(uri)
    first_files = [f for f in snapshot.files if f.max_values["id"] < 3]
    write_dataframe(
        spark.range(100, 101),
        uri,
        remove_files=first_files,
        app_transaction=AppTransaction("buf", 0),
    )
    assert sorted(r.id for r in read_table(spark, uri).collect()) == [3, 4, 5, 100]
    assert DeltaTable(uri).version() == 2


def test_a_table_created_by_another_writer_during_our_write_is_joined_not_an_error(spark, tmp_path):
    uri = str(tmp_path / "raced")

    @F.udf("string")
    def create_meanwhile(partition: str) -> str:
        # Runs inside our write's Spark job: the table appears between check and commit.
        if not DeltaTable.is_deltatable(uri):
            write_deltalake(
                uri, pa.table({"v": [1], "partition": ["a"]}), partition_by=["partition"]
            )
        return partition

    ours = spark.createDataFrame([(2, "b")], "v long, partition string")
    ours = ours.withColumn("partition", create_meanwhile("partition"))
    write_dataframe(
        ours,
        uri,
        partition_by=["partition"],
        mode="overwrite",
        replace_partition={"partition": "b"},
    )
    assert sorted(read_table(spark, uri).collect()) == [
        Row(v=1, partition="a"),
        Row(v=2, partition="b"),
    ]

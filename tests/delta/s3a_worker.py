"""Spark on s3a:// against the test S3 server, in its own process (see test_s3a_spark.py).

    python -m tests.delta.s3a_worker <request.json>

The request names the server's Spark settings, a fresh prefix, and delta-rs tables the
test wrote; the answer (one JSON line on stdout) says what Spark saw. A separate process
because hadoop-aws must be on the JVM's class path from the start, and the test session
shares one SparkSession built without it.
"""

import json
import sys
import time
from typing import Any

from pyspark.sql import SparkSession


def _attempt(action: Any) -> Any:
    try:
        return {"ok": action()}
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {"error": f"{type(exc).__name__}: {first[:300]}"}


def _run_operator(spark: SparkSession, request: dict[str, Any]) -> dict[str, Any]:
    """The operator end to end on the object store: Spark stages on s3a, delta-rs commits,
    plans, commit records and the lock go through the object store."""
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    import dagster_sideinputs as dsi

    options = request["storage_options"]
    storage = dsi.DeltaStorage(root=request["operator_root"], storage_options=options)
    profiles = spark.createDataFrame([(10, "ann"), (11, "bob")], "customer_id long, name string")
    storage.delta.write(profiles, storage.table_uri("profiles"))
    transactions = spark.createDataFrame(
        [(i, 10 + i % 3, 1.0) for i in range(50)], "tx_id long, customer_id long, amount double"
    )
    storage.delta.write(transactions, storage.table_uri("transactions"))

    def enrich(main: Any, sides: Any) -> Any:
        return main.select("tx_id", F.col("profile.name").alias("name"))

    operator = dsi.SideInputOperator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=enrich,
        main_output="enriched",
        storage=storage,
    )
    started = time.perf_counter()
    first = operator.run(spark)
    seconds = round(time.perf_counter() - started, 2)
    again = operator.run(spark)
    output = DeltaTable(storage.table_uri("enriched"), storage_options=options)
    return {
        "batches": len(first.batches),
        "routes": first.batches[0].routes if first.batches else {},
        "rerun_batches": len(again.batches),
        "output_rows": output.to_pyarrow_table().num_rows,
        "buffered": operator.buffer().rows(),
        "run_s": seconds,
    }


def main(request_path: str) -> None:
    with open(request_path) as handle:
        request = json.load(handle)
    started = time.perf_counter()
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("s3a-worker")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.jars.packages", request["packages"])
    )
    for key, value in request["spark_conf"].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    answer: dict[str, Any] = {"startup_s": round(time.perf_counter() - started, 2)}

    prefix = request["prefix"]
    target = f"{prefix}/parquet"
    started = time.perf_counter()
    spark.range(1000).selectExpr("id", "id % 7 AS k").write.partitionBy("k").parquet(target)
    answer["parquet_write_s"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    answer["parquet_rows"] = spark.read.parquet(target).count()
    answer["parquet_sum"] = spark.read.parquet(target).selectExpr("sum(id + k)").first()[0]
    answer["parquet_read_s"] = round(time.perf_counter() - started, 2)

    # Files of tables delta-rs wrote: Spark reads the parquet files (no Delta reader here).
    answer["delta_rs_tables"] = {
        name: _attempt(
            lambda uri=uri: sorted(
                [list(row) for row in spark.read.parquet(uri).collect()], key=str
            )
        )
        for name, uri in request["delta_rs_tables"].items()
    }

    # Special characters, written and read back by Spark itself.
    special: dict[str, Any] = {}
    for name, char in request["chars"].items():
        value = f"a{char}b"
        path_uri = f"{prefix}/path-{name}-{value}"

        def write_path(path_uri: str = path_uri) -> int:
            spark.range(3).write.parquet(path_uri)
            return spark.read.parquet(path_uri).count()

        part_uri = f"{prefix}/part-{name}"

        def write_partition(part_uri: str = part_uri, value: str = value) -> list[str]:
            frame = spark.createDataFrame([(1, value), (2, "plain")], "x int, p string")
            frame.write.partitionBy("p").parquet(part_uri)
            return sorted(row.p for row in spark.read.parquet(part_uri).collect())

        special[name] = {"path": _attempt(write_path), "partition": _attempt(write_partition)}
    answer["special"] = special
    if request.get("operator_root"):
        answer["operator"] = _attempt(lambda: _run_operator(spark, request))
    spark.stop()
    print(json.dumps(answer))


if __name__ == "__main__":
    main(sys.argv[1])

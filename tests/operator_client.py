"""A Spark client that exercises the operator's features; run by the cluster and Connect tests.

    python -m tests.operator_client --remote sc://127.0.0.1:15002 --work DIR --out report.json
    python -m tests.operator_client --master spark://127.0.0.1:7077 --work DIR --out report.json

Each check runs on its own and reports ``{"ok": true, "value": ...}`` or the error's type
and message, so one run shows everything that works on a deployment and everything
that does not. Over Spark Connect the process runs no JVM (Spark runs in the server),
and two more checks ask for what Connect lacks.
"""

import argparse
import json
import os
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from dagster_sideinputs.core.keyed import key_group
from dagster_sideinputs.core.spark.session import REQUIRED_CONFIGS

BIG = dsi.OutputTag("big_transactions")
NAMED = T.StructType([T.StructField("tx_id", T.LongType()), T.StructField("name", T.StringType())])
ROWS_OUT = dsi.OutputTag("named_transactions", schema=NAMED)
ROWS_BIG = dsi.OutputTag("big_named_transactions", schema=NAMED)  # the same fields
ROWS = 200
CUSTOMERS = 37
GROUPS = 4


def enrich(main: DataFrame, sides: dsi.SideInputs) -> dsi.Outputs:
    enriched = main.select("tx_id", "customer_id", "amount", F.col("profile.name").alias("name"))
    return {dsi.MAIN: enriched, BIG: enriched.filter(F.col("amount") > sides["rules"].threshold)}


def name_row(record: dsi.Record, ctx: dsi.RowContext) -> Iterator[dict[str, Any]]:
    profile = ctx.side_input("profile")
    yield {"tx_id": record["tx_id"], "name": None if profile is None else profile["name"]}


def name_and_flag_row(record: dsi.Record, ctx: dsi.RowContext) -> Iterator[dict[str, Any]]:
    profile = ctx.side_input("profile")
    named = {"tx_id": record["tx_id"], "name": None if profile is None else profile["name"]}
    if record["amount"] > 100.0:
        ctx.output(ROWS_BIG, named)
    yield named


def write_inputs(spark: SparkSession, storage: dsi.DeltaStorage) -> dict[str, int]:
    transactions = spark.range(ROWS).select(
        F.col("id").alias("tx_id"),
        (F.col("id") % CUSTOMERS).alias("customer_id"),
        (F.col("id") * 1.5).alias("amount"),
    )
    dsi.tables.write_dataframe(transactions, storage.table_uri("transactions"))
    keyed = transactions.withColumn("key_group", key_group("customer_id", GROUPS))
    dsi.tables.write_dataframe(keyed, storage.table_uri("keyed"), partition_by=["key_group"])
    profiles = spark.createDataFrame(
        [(k, f"customer {k}") for k in range(CUSTOMERS - 2)], "customer_id long, name string"
    )
    dsi.tables.write_dataframe(profiles, storage.table_uri("profiles"))
    dsi.tables.write_dataframe(
        profiles.withColumn("key_group", key_group("customer_id", GROUPS)),
        storage.table_uri("keyed_profiles"),
        partition_by=["key_group"],
    )
    rules = spark.createDataFrame([(100.0,)], "threshold double")
    dsi.tables.write_dataframe(rules, storage.table_uri("rules"))
    return {
        "big": sum(1 for i in range(ROWS) if i * 1.5 > 100.0),
        "named": sum(1 for i in range(ROWS) if i % CUSTOMERS < CUSTOMERS - 2),
    }


def frames_mode(spark: SparkSession, storage: dsi.DeltaStorage) -> dict[str, Any]:
    op = dsi.SideInputOperator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id"),
            "rules": dsi.SideInput.singleton("rules"),
        },
        fn=enrich,
        main_output="enriched",
        side_outputs=[BIG],
        storage=storage,
    )
    result = op.run(spark, explain=True)
    again = op.run(spark)
    named = dsi.tables.read_table(spark, op.output_tables["enriched"]).filter("name IS NOT NULL")
    return {
        "engine": result.batches[0].engine,
        "enriched": result.emitted("enriched"),
        "big": result.emitted(BIG.name),
        "named": named.count(),
        "plan_recorded": "Join" in (result.batches[0].physical_plan or ""),
        "second_run_batches": len(again.batches),
    }


def rows_mode(spark: SparkSession, storage: dsi.DeltaStorage) -> dict[str, Any]:
    op = dsi.SideInputOperator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=name_and_flag_row,
        mode="rows",
        main_output=ROWS_OUT,
        side_outputs=[ROWS_BIG],
        storage=storage,
    )
    result = op.run(spark)
    named = dsi.tables.read_table(spark, op.output_tables[ROWS_OUT.name]).filter("name IS NOT NULL")
    big = dsi.tables.read_table(spark, op.output_tables[ROWS_BIG.name])
    return {
        "rows": result.emitted(ROWS_OUT.name),
        "named": named.count(),
        "big": big.count(),
        "one_pass": any("written in one pass" in note for note in result.batches[0].notes),
    }


def rows_mode_bridge(spark: SparkSession, work: Path) -> dict[str, Any]:
    """:func:`rows_mode` in a lake of its own under the delta-rs bridge, whatever the
    session's Delta: the engine that writes outputs of the same fields in one pass."""
    storage = dsi.DeltaStorage(str(work / "bridge_lake"), engine="delta-rs").bind(spark)
    write_inputs(spark, storage)
    return rows_mode(spark, storage)


def rows_mode_module_function(spark: SparkSession, storage: dsi.DeltaStorage) -> dict[str, Any]:
    """Rows mode with a row function of a module that only the driver can import.

    Run as a script, this file is ``__main__`` and cloudpickle ships its functions by
    value; imported as ``tests.operator_client`` it is a module of this repository, which
    executors (other processes, in other working directories) cannot import.
    """
    from tests import operator_client

    op = dsi.SideInputOperator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=operator_client.name_row,
        mode="rows",
        main_output=ROWS_OUT,
        storage=storage,
        operator_id="rows_module_function",
    )
    return {"rows": op.run(spark).emitted(ROWS_OUT.name)}


def pre_keyed(spark: SparkSession, storage: dsi.DeltaStorage) -> dict[str, Any]:
    """A pre-keyed main input joined with a keyed side input, then with the same side
    input in the main input's key groups (``both_*``: neither side shuffled)."""

    def run(profiles: str, output: str) -> tuple[int, list[str]]:
        op = dsi.SideInputOperator(
            main=dsi.MainInput(
                "keyed", key="customer_id", pre_keyed=dsi.KeyGroups(GROUPS, "key_group")
            ),
            side_inputs={
                "profile": dsi.SideInput.map(profiles, key="customer_id", distribution="keyed")
            },
            fn=lambda main, sides: main.select("tx_id", F.col("profile.name").alias("name")),
            main_output=output,
            storage=storage,
        )
        result = op.run(spark)
        return result.emitted(output), result.batches[0].notes

    rows, notes = run("profiles", "keyed_enriched")
    both_rows, both_notes = run("keyed_profiles", "both_keyed_enriched")
    return {"rows": rows, "notes": notes, "both_rows": both_rows, "both_notes": both_notes}


def delta_source(spark: SparkSession, storage: dsi.DeltaStorage) -> dict[str, Any]:
    dsi.tables.register_delta_source(spark)
    uri = storage.table_uri("transactions")
    batch = spark.read.format("dsi_delta").load(uri).count()
    out = os.path.join(storage.root, "_stream_out")
    query = (
        spark.readStream.format("dsi_delta")
        .load(uri)
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", out + "_checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return {"batch": batch, "stream": spark.read.parquet(out).count()}


def resource_spark_context(remote: str) -> Any:
    resource = dsi.SparkResource(remote=remote)
    resource.spark_session.range(1).count()
    return str(resource.spark_context)


def static_setting(remote: str) -> Any:
    spark = dsi.build_spark_session(remote=remote, configs={"spark.executor.memory": "3g"})
    return spark.conf.get("spark.executor.memory", None)


def native_commits(spark: SparkSession, storage: dsi.DeltaStorage) -> dict[str, Any]:
    """What the frames-mode operator's output commits say, read back over this session."""
    table = f"delta.`{storage.table_uri('enriched')}`"
    history = spark.sql(f"DESCRIBE HISTORY {table}").collect()
    return {
        "operations": [row.operation for row in history],
        "engine_info": history[0].engineInfo,
        "rows": spark.read.format("delta").load(storage.table_uri("enriched")).count(),
        "transaction": storage.delta.transaction_version(storage.table_uri("enriched"), "enriched"),
    }


def run_checks(work: Path, *, master: str | None, remote: str | None) -> dict[str, Any]:
    spark = dsi.build_spark_session(
        master=master or "local[*]",
        remote=remote,
        shuffle_partitions=3,
        ui_enabled=False,
        log_level="ERROR",
    )
    storage = dsi.DeltaStorage(str(work / "lake")).bind(spark)
    checks: dict[str, Callable[[], Any]] = {
        "inputs": lambda: write_inputs(spark, storage),
        "frames_mode": lambda: frames_mode(spark, storage),
        "rows_mode": lambda: rows_mode(spark, storage),
        "rows_mode_bridge": lambda: rows_mode_bridge(spark, work),
        "rows_mode_module_function": lambda: rows_mode_module_function(spark, storage),
        "pre_keyed": lambda: pre_keyed(spark, storage),
        "delta_source": lambda: delta_source(spark, storage),
    }
    if storage.delta.name == "delta-spark":
        checks["native_commits"] = lambda: native_commits(spark, storage)
    if remote is not None:
        checks["resource_spark_context"] = lambda: resource_spark_context(remote)
        checks["static_setting"] = lambda: static_setting(remote)
    report: dict[str, Any] = {
        "engine": storage.delta.name,
        "session": type(spark).__module__,
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "required": {key: spark.conf.get(key) for key in REQUIRED_CONFIGS},
    }
    for name, check in checks.items():
        started = time.monotonic()
        try:
            report[name] = {"ok": True, "value": check()}
        except Exception as exc:
            report[name] = {
                "ok": False,
                "error": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc(limit=-3),
            }
        report[name]["seconds"] = round(time.monotonic() - started, 2)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--master", help="a classic driver in this process on this master")
    target.add_argument("--remote", help="a Spark Connect client of this server")
    parser.add_argument("--work", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    report = run_checks(Path(args.work), master=args.master, remote=args.remote)
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()

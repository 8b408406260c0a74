"""Benchmark: scale. Up to 50M main records and a 10M-row keyed side input, on this machine.

    python bench/scale.py                      # the full run (about half an hour)
    python bench/scale.py --main 5000000 --side 1000000 --curve-main 1000000 --curve-side 10000
    python bench/scale.py --engine delta-rs --curve-main --curve-side   # full size, the bridge

For each size the operator (frames mode, keyed map side input, a main and a side output)
processes the whole main table in one ``available_now`` run, and a hand-written Spark job
does the same work in the same session (read, sort-merge join with the side table, persist,
write both outputs as parquet). Printed: records/s of both and their ratio, the peak RSS
of the Python driver and of the whole run (driver + its JVM), sampled every 0.2 s, and
how the cost grows with the main input and with the side input.
"""

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psutil
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import dagster_sideinputs as dsi

SUSPICIOUS = dsi.OutputTag("suspicious")


class PeakMemory:
    """Peak resident memory of this process and of it plus its children (the JVM)."""

    def __init__(self) -> None:
        self.driver = 0
        self.total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            try:
                own = me.memory_info().rss
                children = sum(c.memory_info().rss for c in me.children(recursive=True))
            except psutil.Error:
                continue
            self.driver = max(self.driver, own)
            self.total = max(self.total, own + children)
            self._stop.wait(0.2)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def make_main(spark: SparkSession, rows: int, customers: int, uri: str) -> None:
    frame = spark.range(rows).select(
        F.col("id").alias("tx_id"),
        (F.xxhash64("id") % customers).alias("customer_id").cast("long"),
        (F.rand(11) * 1000).alias("amount"),
        F.expr("timestamp_seconds(1714521600 + id % 86400)").alias("ts"),
    )
    dsi.tables.write_dataframe(frame.withColumn("customer_id", F.abs("customer_id")), uri)


def make_side(spark: SparkSession, rows: int, uri: str) -> None:
    frame = spark.range(rows).select(
        F.col("id").alias("customer_id"),
        F.concat(F.lit("customer "), F.col("id").cast("string")).alias("name"),
        (F.col("id") % 5).cast("string").alias("segment"),
        ((F.col("id") * 7919) % 1000 / 1000).alias("risk_score"),
    )
    dsi.tables.write_dataframe(frame, uri)


def enrich(main: DataFrame, sides: dsi.SideInputs) -> dsi.Outputs:
    enriched = main.select(
        "tx_id",
        "customer_id",
        "amount",
        F.col("profile.name").alias("name"),
        F.col("profile.risk_score").alias("risk_score"),
    )
    return {dsi.MAIN: enriched, SUSPICIOUS: enriched.filter(F.col("risk_score") > 0.99)}


def run_operator(spark: SparkSession, root: str, engine: str = "auto") -> float:
    op = dsi.SideInputOperator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id", distribution="keyed")
        },
        fn=enrich,
        main_output="enriched",
        side_outputs=[SUSPICIOUS],
        storage=dsi.DeltaStorage(root, engine=engine),  # type: ignore[arg-type]
        operator_id=f"scale_{time.monotonic_ns()}",
    )
    started = time.perf_counter()
    result = op.run(spark, trigger="available_now")
    assert result.batches, "the operator found no work"
    assert all(b.accounted for b in result.batches)
    return time.perf_counter() - started


def run_baseline(spark: SparkSession, root: str, out: str) -> float:
    """What a competent engineer writes by hand: read, join, persist, write both outputs."""
    started = time.perf_counter()
    main = dsi.tables.read_table(spark, f"{root}/transactions")
    side = dsi.tables.read_table(spark, f"{root}/profiles").select(
        "customer_id", F.struct("customer_id", "name", "segment", "risk_score").alias("profile")
    )
    joined = main.join(side, "customer_id", "left").persist()
    enriched = enrich(joined, None)  # type: ignore[arg-type]
    assert isinstance(enriched, dict)
    enriched[dsi.MAIN].write.mode("overwrite").parquet(f"{out}/enriched")
    enriched[SUSPICIOUS].write.mode("overwrite").parquet(f"{out}/suspicious")
    joined.unpersist()
    return time.perf_counter() - started


def measure(
    spark: SparkSession, work: Path, main_rows: int, side_rows: int, engine: str = "auto"
) -> dict:
    root = work / f"m{main_rows}_s{side_rows}"
    make_main(spark, main_rows, max(side_rows, 1), f"{root}/transactions")
    make_side(spark, side_rows, f"{root}/profiles")
    with PeakMemory() as baseline_memory:
        baseline_s = run_baseline(spark, str(root), str(work / "baseline_out"))
    with PeakMemory() as operator_memory:
        operator_s = run_operator(spark, str(root), engine)
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(work / "baseline_out", ignore_errors=True)
    return {
        "main_rows": main_rows,
        "side_rows": side_rows,
        "operator_rec_s": main_rows / operator_s,
        "baseline_rec_s": main_rows / baseline_s,
        "ratio": baseline_s / operator_s,
        "operator_s": operator_s,
        "driver_peak_mb": operator_memory.driver / 2**20,
        "run_peak_mb": operator_memory.total / 2**20,
        "baseline_run_peak_mb": baseline_memory.total / 2**20,
    }


def line(result: dict) -> str:
    return (
        f"main={result['main_rows']:>10,} side={result['side_rows']:>10,}  "
        f"operator {result['operator_rec_s'] / 1e6:5.2f} M rec/s ({result['operator_s']:6.1f}s)  "
        f"baseline {result['baseline_rec_s'] / 1e6:5.2f} M rec/s  ratio {result['ratio']:4.2f}  "
        f"driver peak {result['driver_peak_mb']:6.0f} MB  run peak {result['run_peak_mb']:6.0f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main", type=int, default=50_000_000)
    parser.add_argument("--side", type=int, default=10_000_000)
    parser.add_argument(
        "--curve-main", type=int, nargs="*", default=[1_000_000, 5_000_000, 20_000_000]
    )
    parser.add_argument("--curve-side", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--curve-fixed-main", type=int, default=5_000_000)
    parser.add_argument(
        "--engine",
        choices=["auto", "delta-spark", "delta-rs"],
        default="auto",
        help="the operator's Delta engine (auto: delta-spark where the session has Delta)",
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--json")
    args = parser.parse_args()

    spark = dsi.build_spark_session(
        master=args.master,
        ui_enabled=False,
        driver_memory=args.driver_memory,
        log_level="ERROR",
        configs={"spark.sql.autoBroadcastJoinThreshold": "-1"},
    )
    work = Path(tempfile.mkdtemp(prefix="dsi-bench-scale-"))
    results: dict[str, list[dict]] = {"main_curve": [], "side_curve": [], "full": []}

    def report(kind: str, result: dict) -> None:
        results[kind].append(result)
        print(line(result), flush=True)

    engine = dsi.DeltaStorage(str(work), engine=args.engine).bind(spark).delta.name
    print(f"operator engine: {engine}")
    try:
        print(f"growth with the main input (side {args.side:,} rows):")
        for rows in args.curve_main:
            report("main_curve", measure(spark, work, rows, args.side, args.engine))
        print(f"growth with the side input (main {args.curve_fixed_main:,} rows):")
        for rows in args.curve_side:
            report("side_curve", measure(spark, work, args.curve_fixed_main, rows, args.engine))
        print("full size:")
        report("full", measure(spark, work, args.main, args.side, args.engine))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""Benchmark: latency of the continuous trigger, from an append to committed outputs.

    python bench/latency.py --appends 30 --rows 10000 --every 3 --interval 1

A writer thread appends ``--rows`` records to the main Delta table every ``--every``
seconds (delta-rs ``write_deltalake``); the operator runs with ``trigger="continuous"``
(polling every ``--interval`` seconds) joining a broadcast map side input and writing a
main output and a side output. An append's latency is the time from the end of its
commit to the end of the batch that read it (``on_batch``: every output committed and the
batch recorded). Prints p50 / p95 / max per polling interval given (``--interval`` may be
repeated: the intervals run in turn, each on a fresh operator over the same appends
pattern), plus where a batch's time goes (the stage durations of the batch metrics, and
the planning and bookkeeping between batches).

The machine may be shared with other Spark users: the figures are noisy; each run
prints the spread.
"""

import argparse
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import deltalake
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core.spark.session import build_spark_session

CUSTOMERS = 10_000
BIG_TAG = dsi.OutputTag("big")


def enrich(main: DataFrame, sides: dsi.SideInputs) -> dsi.Outputs:
    joined = main.select("id", "customer_id", "amount", F.col("profile.name").alias("name"))
    return {dsi.MAIN: joined, BIG_TAG: joined.where(F.col("amount") > 900.0)}


def records(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "customer_id": pa.array([i % CUSTOMERS for i in ids], pa.int64()),
            "amount": pa.array([float((i * 37) % 1000) for i in ids], pa.float64()),
        }
    )


@dataclass
class Run:
    """One continuous run: append times by version, batch end times, stage durations."""

    appended: dict[int, float] = field(default_factory=dict)
    done: dict[int, float] = field(default_factory=dict)
    stages: list[dict[str, float]] = field(default_factory=list)
    between: list[float] = field(default_factory=list)


def run_once(spark: SparkSession, root: Path, args: argparse.Namespace, interval: float) -> Run:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    main_uri, side_uri = str(root / "events"), str(root / "profiles")
    deltalake.write_deltalake(
        side_uri,
        pa.table(
            {
                "customer_id": pa.array(range(CUSTOMERS), pa.int64()),
                "name": [f"c{i}" for i in range(CUSTOMERS)],
            }
        ),
    )
    deltalake.write_deltalake(main_uri, records(0, args.rows))
    op = dsi.SideInputOperator(
        main=dsi.MainInput("events", key="customer_id", path=main_uri),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id", path=side_uri)},
        fn=enrich,
        main_output="enriched",
        side_outputs=[BIG_TAG],
        storage=dsi.DeltaStorage(str(root / "lake"), engine=args.engine),
    )
    op.run(spark, trigger="available_now")  # warm up: table creation, first version
    run = Run()
    stop = threading.Event()
    last_end = [time.monotonic()]

    def on_batch(metrics: dsi.BatchMetrics) -> None:
        now = time.monotonic()
        plan = op.last_plan()
        assert plan is not None
        for version in range(plan.main.start_version + 1, plan.main.end_version + 1):
            run.done[version] = now
        total = metrics.durations.get("total", 0.0)
        run.stages.append(dict(metrics.durations))
        run.between.append(max(0.0, now - last_end[0] - total))
        last_end[0] = now

    def writer() -> None:
        try:
            for i in range(args.appends):
                time.sleep(args.every)
                deltalake.write_deltalake(
                    main_uri, records((i + 1) * args.rows, args.rows), mode="append"
                )
                version = deltalake.DeltaTable(main_uri).version()
                run.appended[version] = time.monotonic()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not set(run.appended) <= set(run.done):
                time.sleep(0.1)
        finally:
            stop.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    op.run(
        spark,
        trigger="continuous",
        interval=dt.timedelta(seconds=interval),
        stop=stop,
        on_batch=on_batch,
    )
    thread.join()
    return run


def report(interval: float, run: Run) -> None:
    latencies = sorted(run.done[v] - t for v, t in run.appended.items() if v in run.done)
    missing = len(run.appended) - len(latencies)
    if not latencies:
        print(f"interval {interval}s: no append was processed")
        return
    q = statistics.quantiles(latencies, n=20) if len(latencies) > 1 else [latencies[0]] * 19
    print(
        f"interval {interval:>4}s: {len(latencies)} appends, latency p50 "
        f"{statistics.median(latencies):.2f} s, p95 {q[18]:.2f} s, min {latencies[0]:.2f} s, "
        f"max {latencies[-1]:.2f} s" + (f", {missing} not processed" if missing else "")
    )
    stages = sorted({k for s in run.stages for k in s})
    medians = {k: statistics.median(s.get(k, 0.0) for s in run.stages) for k in stages}
    print(
        "    batch stages (median s): "
        + ", ".join(f"{k} {v:.2f}" for k, v in medians.items())
        + f"; between batches (plan, record, wait) median {statistics.median(run.between):.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=30)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--every", type=float, default=3.0, help="seconds between appends")
    parser.add_argument("--interval", type=float, action="append", help="polling interval (s)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--engine",
        choices=("auto", "delta-spark", "delta-rs"),
        default="auto",
        help="the Delta engine (auto: delta-spark where its jars are)",
    )
    args = parser.parse_args()
    intervals = args.interval or [10.0, 1.0]
    work = Path(tempfile.mkdtemp(prefix="dsi-latency-"))
    spark = build_spark_session(master=args.master, ui_enabled=False, app_name="bench-latency")
    print(
        f"{args.appends} appends of {args.rows} records every {args.every}s, {args.master}, "
        f"engine {args.engine} "
        "(shared machine: figures are noisy)"
    )
    try:
        for index, interval in enumerate(intervals):
            report(interval, run_once(spark, work / f"run{index}", args, interval))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

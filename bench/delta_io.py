"""Benchmark: the two Delta engines against Spark's plain parquet I/O, measured in one run.

    python bench/delta_io.py --rows 4000000 --repeats 5

Writes: the same DataFrame (a parquet scan) written with ``df.write.parquet``, with the
bridge (native Spark write + footer statistics + delta-rs commit) and with the native
engine (delta-spark's ``format("delta")`` write through ``DeltaSparkEngine.write``).
Reads: a full scan (``format("noop")`` sink) of a plain parquet folder, of the same
data as a Delta table through each engine, and through the ``dsi_delta`` Python data
source (Arrow batches from a Python worker).

The session has Delta configured (``delta=True``), so both engines run in one JVM and
are interleaved repeat by repeat. Prints records/second, medians over ``--repeats``
runs, and ratios (native / bridge, each / plain parquet).

``--s3`` also measures the plain and bridge writes and reads against an S3-compatible
server (the test suite's moto server, started on 127.0.0.1; Spark through s3a, delta-rs
through its storage options), interleaved with the local runs, and prints each
action's S3 / local ratio. Every figure is a median; ``spread`` gives the fastest and
slowest repeat, because the machine may be shared (the load average is printed).
"""

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dagster_sideinputs.core.spark.packages import S3A_PACKAGES
from dagster_sideinputs.core.spark.session import build_spark_session
from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine
from dagster_sideinputs.delta.bridge.read import read_table
from dagster_sideinputs.delta.bridge.source import register_delta_source
from dagster_sideinputs.delta.bridge.writer import write_dataframe
from dagster_sideinputs.delta.spark.engine import DeltaSparkEngine
from dagster_sideinputs.delta.store.files import join_uri, spark_uri
from dagster_sideinputs.delta.store.s3 import configure_spark

REPO = Path(__file__).resolve().parents[1]


def make_source(spark: SparkSession, rows: int, path: str) -> DataFrame:
    data = spark.range(rows).select(
        F.col("id").alias("tx_id"),
        (F.col("id") % 200_000).alias("customer_id"),
        (F.rand(7) * 1000).alias("amount"),
        F.expr("element_at(array('USD','EUR','GBP','JPY'), cast(id % 4 as int) + 1)").alias(
            "currency"
        ),
        F.expr("timestamp_seconds(1700000000 + id)").alias("ts"),
        F.expr("date_add(date'2024-01-01', cast(id % 30 as int))").alias("day"),
    )
    data.write.mode("overwrite").parquet(path)
    return spark.read.parquet(path)


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


SPREAD: dict[str, tuple[float, float]] = {}
"""Records/s of the slowest and the fastest repeat, by action."""


def interleaved_rates(
    rows: int, actions: dict[str, Callable[[int], object]], repeats: int
) -> dict[str, float]:
    """Median records/s of each action, running them in turn so drift hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in actions}
    for i in range(repeats):
        for name, action in actions.items():
            times[name].append(timed(functools.partial(action, i)))
    for name, values in times.items():
        SPREAD[name] = (rows / max(values), rows / min(values))
    return {name: rows / statistics.median(values) for name, values in times.items()}


@contextlib.contextmanager
def s3_server() -> Iterator[Any]:
    """The test suite's S3-compatible server (moto on 127.0.0.1), for this run only."""
    sys.path.insert(0, str(REPO))
    from tests.servers.s3 import S3Server

    with S3Server() as server:
        yield server


def storage_actions(
    spark: SparkSession,
    source: DataFrame,
    root: str,
    options: dict[str, str],
    suffix: str,
) -> tuple[dict[str, Callable[[int], object]], dict[str, Callable[[int], object]]]:
    """(writes, reads) of plain parquet and of the bridge under ``root``, names + suffix."""
    configure_spark(spark, root, options)

    def at(name: str) -> str:
        return spark_uri(join_uri(root, name))

    writes: dict[str, Callable[[int], object]] = {
        f"write_plain_parquet{suffix}": lambda i: source.write.mode("overwrite").parquet(
            at(f"plain_{i}")
        ),
        f"write_bridge{suffix}": lambda i: write_dataframe(
            source, join_uri(root, f"delta_{i}"), storage_options=options
        ),
    }
    reads: dict[str, Callable[[int], object]] = {
        f"read_plain_parquet{suffix}": lambda _: scan(spark.read.parquet(at("plain_0"))),
        f"read_bridge{suffix}": lambda _: scan(
            read_table(spark, join_uri(root, "delta_0"), storage_options=options)
        ),
    }
    return writes, reads


def scan(df: DataFrame) -> None:
    df.write.format("noop").mode("overwrite").save()


def compare_storages(spark: SparkSession, work: Path, args: argparse.Namespace) -> dict[str, float]:
    """Plain and bridge writes and reads on the local filesystem and on S3, interleaved."""
    source = make_source(spark, args.s3_rows, str(work / "s3_source"))
    figures: dict[str, float] = {}
    with s3_server() as server:
        local = storage_actions(spark, source, str(work / "local"), {}, "@local")
        s3 = storage_actions(
            spark, source, server.fresh_prefix("bench"), server.storage_options, "@s3"
        )
        writes = {**local[0], **s3[0]}
        for action in writes.values():  # warm up: the s3a client, the first table
            action(99)
        figures.update(interleaved_rates(args.s3_rows, writes, args.repeats))
        figures.update(interleaved_rates(args.s3_rows, {**local[1], **s3[1]}, args.repeats))
    return figures


# (name, numerator, denominator) of the throughput ratios printed after the figures.
RATIOS = (
    ("write native / bridge", "write_native", "write_bridge"),
    ("partitioned write native / bridge", "write_native_partitioned", "write_bridge_partitioned"),
    ("read native / bridge", "read_native", "read_bridge"),
    ("partitioned read native / bridge", "read_native_partitioned", "read_bridge_partitioned"),
    ("write native / plain parquet", "write_native", "write_plain_parquet"),
    ("write bridge / plain parquet", "write_bridge", "write_plain_parquet"),
    (
        "partitioned write bridge / plain parquet",
        "write_bridge_partitioned",
        "write_plain_parquet_partitioned",
    ),
    ("read bridge / plain parquet", "read_bridge", "read_plain_parquet"),
    (
        "partitioned read bridge / plain parquet",
        "read_bridge_partitioned",
        "read_plain_parquet_partitioned",
    ),
    ("read python data source / plain parquet", "read_python_data_source", "read_plain_parquet"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--s3",
        action="store_true",
        help="also measure against an S3-compatible server (moto on 127.0.0.1), interleaved",
    )
    parser.add_argument(
        "--s3-rows", type=int, default=1_000_000, help="rows of the local / S3 comparison"
    )
    args = parser.parse_args()

    spark = build_spark_session(
        master=args.master,
        ui_enabled=False,
        log_level="ERROR",
        delta=True,
        packages=S3A_PACKAGES if args.s3 else (),
    )
    register_delta_source(spark)
    bridge, native = DeltaRsEngine(), DeltaSparkEngine(spark)

    def read(engine: DeltaRsEngine | DeltaSparkEngine, uri: str) -> DataFrame:
        return engine.read_snapshot(spark, engine.snapshot(uri))

    work = Path(tempfile.mkdtemp(prefix="dsi-bench-io-"))
    try:
        source = make_source(spark, args.rows, str(work / "source"))
        rows = args.rows

        def plain_write(i: int) -> None:
            source.write.mode("overwrite").parquet(str(work / f"plain_{i}"))

        def bridge_write(i: int) -> None:
            bridge.write(source, str(work / f"delta_{i}"))

        def native_write(i: int) -> None:
            native.write(source, str(work / f"native_{i}"))

        def bridge_partitioned_write(i: int) -> None:
            bridge.write(source, str(work / f"delta_part_{i}"), partition_by=["day"])

        def native_partitioned_write(i: int) -> None:
            native.write(source, str(work / f"native_part_{i}"), partition_by=["day"])

        def plain_partitioned_write(i: int) -> None:
            source.write.mode("overwrite").partitionBy("day").parquet(str(work / f"plain_part_{i}"))

        # Warm up the JVM and the Python workers once, then alternate baseline / bridge.
        plain_write(99)
        bridge_write(99)
        native_write(99)
        figures: dict[str, float] = {}
        figures.update(
            interleaved_rates(
                rows,
                {
                    "write_plain_parquet": plain_write,
                    "write_bridge": bridge_write,
                    "write_native": native_write,
                },
                args.repeats,
            )
        )
        figures.update(
            interleaved_rates(
                rows,
                {
                    "write_plain_parquet_partitioned": plain_partitioned_write,
                    "write_bridge_partitioned": bridge_partitioned_write,
                    "write_native_partitioned": native_partitioned_write,
                },
                args.repeats,
            )
        )
        plain_dir, delta_dir = str(work / "plain_0"), str(work / "delta_0")
        native_dir, native_part = str(work / "native_0"), str(work / "native_part_0")
        plain_part, delta_part = str(work / "plain_part_0"), str(work / "delta_part_0")
        figures.update(
            interleaved_rates(
                rows,
                {
                    "read_plain_parquet": lambda _: scan(spark.read.parquet(plain_dir)),
                    "read_bridge": lambda _: scan(read(bridge, delta_dir)),
                    "read_native": lambda _: scan(read(native, native_dir)),
                    "read_plain_parquet_partitioned": lambda _: scan(
                        spark.read.parquet(plain_part)
                    ),
                    "read_bridge_partitioned": lambda _: scan(read(bridge, delta_part)),
                    "read_native_partitioned": lambda _: scan(read(native, native_part)),
                    "read_python_data_source": lambda _: scan(
                        spark.read.format("dsi_delta").load(delta_dir)
                    ),
                },
                args.repeats,
            )
        )
        if args.s3:
            figures.update(compare_storages(spark, work, args))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    ratios = {name: figures[top] / figures[bottom] for name, top, bottom in RATIOS}
    if args.s3:
        for action in ("write_plain_parquet", "write_bridge", "read_plain_parquet", "read_bridge"):
            ratios[f"{action}: s3 / local"] = figures[f"{action}@s3"] / figures[f"{action}@local"]
        ratios["write bridge / plain parquet, on s3"] = (
            figures["write_bridge@s3"] / figures["write_plain_parquet@s3"]
        )
        ratios["read bridge / plain parquet, on s3"] = (
            figures["read_bridge@s3"] / figures["read_plain_parquet@s3"]
        )
    load = "/".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"rows={args.rows} repeats={args.repeats} master={args.master} "
        f"(s3 comparison: rows={args.s3_rows if args.s3 else '-'}) load average {load}"
    )
    for name, rate in figures.items():
        slow, fast = SPREAD.get(name, (rate, rate))
        print(f"  {name:<36} {rate / 1e6:6.2f} M rec/s   spread {slow / 1e6:.2f}-{fast / 1e6:.2f}")
    for name, ratio in ratios.items():
        print(f"  {name:<44} {ratio:5.2f}x")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"figures": figures, "spread": SPREAD, "ratios": ratios}, indent=2)
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()

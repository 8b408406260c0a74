"""Benchmark: as-of (temporal) map side inputs against the plain map join, on the same data.

    python bench/temporal.py --rows 4000000 --keys 200000 --versions 5 --repeats 3

The side table holds ``keys x versions`` rows (``sku, price, valid_from``), each key
changing once a day. Variants, each a ``SideInputOperator`` in frames mode writing the
same main output (the order and the price it sees), run in turn within each repeat:

- ``map``: the plain map a user without as-of would write: the newest row per key
  (``pick="valid_from"``) joined by key;
- ``as_of``: ``as_of="valid_from"``: the row valid at each order's time;
- ``as_of_history`` (with ``--history``): ``AsOf.history()`` over a table overwritten
  once per version, orders spread over the versions' commit times.

Both distributions are measured (``broadcast`` and ``keyed``). Prints medians and the
ratio of each as-of variant's time to the plain map's with the same distribution (and per
repeat: a pair runs back to back, so a noisy neighbour slows both alike).
"""

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import dagster_sideinputs as dsi

BASE_EPOCH = 1_704_067_200  # 2024-01-01T00:00:00Z
DAY = 86_400


def priced(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    return main.select("order_id", "sku", "amount", "ts", F.col("price.price").alias("price"))


def orders(spark: SparkSession, rows: int, keys: int, start: int, span: int) -> DataFrame:
    """``rows`` orders over ``keys`` skus, event times spread over ``[start, start + span)``."""
    return spark.range(rows).select(
        F.col("id").alias("order_id"),
        ((F.col("id") * 7919) % keys).alias("sku"),
        (F.rand(7) * 100).alias("amount"),
        F.expr(f"timestamp_seconds({start} + (id * 104729) % {span})").alias("ts"),
    )


def prices(spark: SparkSession, keys: int, versions: int) -> DataFrame:
    """Every sku changes price once a day (at a time of day of its own)."""
    return (
        spark.range(keys * versions)
        .select(
            (F.col("id") % keys).alias("sku"),
            F.floor(F.col("id") / keys).cast("long").alias("version"),
        )
        .select(
            "sku",
            (F.lit(1.0) + F.col("version") + F.col("sku") / keys).alias("price"),
            F.expr(f"timestamp_seconds({BASE_EPOCH} + version * {DAY} + sku % {DAY})").alias(
                "valid_from"
            ),
        )
    )


def operator(
    root: Path, main_uri: str, side_uri: str, *, distribution: str, **side: Any
) -> dsi.SideInputOperator:
    return dsi.SideInputOperator(
        main=dsi.MainInput("orders", event_time="ts", path=main_uri),
        side_inputs={
            "price": dsi.SideInput.map(
                "prices",
                key="sku",
                distribution=distribution,  # type: ignore[arg-type]
                path=side_uri,
                **side,
            )
        },
        fn=priced,
        main_output="priced",
        storage=dsi.DeltaStorage(str(root)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--versions", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--history", action="store_true", help="also AsOf.history()")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    args = parser.parse_args()

    spark = dsi.build_spark_session(
        master=args.master, log_level="ERROR", driver_memory=args.driver_memory
    )
    work = Path(tempfile.mkdtemp(prefix="dsi-bench-temporal-"))
    runs = 0
    try:
        # Orders fall before the newest version starts, so none waits for the horizon.
        span = max(1, args.versions - 2) * DAY
        main_uri = str(work / "orders")
        frame = orders(spark, args.rows, args.keys, BASE_EPOCH + DAY, span)
        dsi.tables.write_dataframe(frame.repartition(max(2, args.rows // 500_000)), main_uri)
        side_uri = str(work / "prices")
        dsi.tables.write_dataframe(prices(spark, args.keys, args.versions), side_uri)
        variants: dict[str, Callable[[Path], dsi.SideInputOperator]] = {}
        for distribution in ("broadcast", "keyed"):
            variants[f"map/{distribution}"] = functools.partial(
                operator, main_uri=main_uri, side_uri=side_uri, distribution=distribution,
                pick="valid_from",
            )  # fmt: skip
            variants[f"as_of/{distribution}"] = functools.partial(
                operator, main_uri=main_uri, side_uri=side_uri, distribution=distribution,
                as_of="valid_from",
            )  # fmt: skip
        if args.history:
            history_uri = str(work / "prices_history")
            for version in range(args.versions):
                current = prices(spark, args.keys, 1).withColumn("price", F.col("price") + version)
                dsi.tables.write_dataframe(current, history_uri, mode="overwrite")
                time.sleep(1)
            stamps = dsi.DeltaStorage(history_uri, engine="delta-rs").delta.commit_timestamps(
                history_uri
            )
            first, last = stamps[0][1], stamps[-1][1]
            history_main = str(work / "orders_history")
            start = int(first.timestamp())
            frame = orders(spark, args.rows, args.keys, start, int(last.timestamp()) - start + 1)
            dsi.tables.write_dataframe(
                frame.repartition(max(2, args.rows // 500_000)), history_main
            )
            for distribution in ("broadcast", "keyed"):
                variants[f"as_of_history/{distribution}"] = functools.partial(
                    operator, main_uri=history_main, side_uri=history_uri,
                    distribution=distribution, as_of=dsi.AsOf.history(),
                )  # fmt: skip

        def run(name: str) -> tuple[float, int]:
            nonlocal runs
            runs += 1
            root = work / "runs" / f"{runs}"
            op = variants[name](root)
            started = time.perf_counter()
            result = op.run(spark)
            seconds = time.perf_counter() - started
            shutil.rmtree(root, ignore_errors=True)
            return seconds, result.emitted("priced")

        print(
            f"rows={args.rows} keys={args.keys} versions={args.versions} "
            f"side_rows={args.keys * args.versions} repeats={args.repeats} master={args.master} "
            f"load={os.getloadavg()}"
        )
        sys.stdout.flush()
        for name in variants:  # warm up the JVM, the workers and the file caches
            run(name)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name in variants:
                seconds, emitted = run(name)
                assert emitted == args.rows, (name, emitted)
                times[name].append(seconds)
        for name, values in times.items():
            median = statistics.median(values)
            print(
                f"  {name:28s} median {median:6.2f} s  {args.rows / median / 1e6:5.2f}M rec/s  "
                f"repeats {' '.join(f'{v:.1f}' for v in values)}"
            )
        for name, values in times.items():
            kind, distribution = name.split("/")
            if kind == "map":
                continue
            base = times[f"map/{distribution}"]
            pairs = [v / b for v, b in zip(values, base, strict=True)]
            ratio = statistics.median(values) / statistics.median(base)
            print(
                f"  {name} / map/{distribution}: {ratio:.2f}x the time (per repeat "
                f"{' '.join(f'{p:.2f}' for p in pairs)})"
            )
        print(f"load average at the end: {os.getloadavg()}")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

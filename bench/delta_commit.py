"""Benchmark: what one delta-spark commit of a small append costs, by how it is made.

    python bench/delta_commit.py --rows 10000 --commits 12 --repeats 2

The same persisted rows are appended ``--commits`` times to a fresh table, each way in
turn, ``--repeats`` times:

- ``writer``: ``df.write.format("delta").mode("append").save(uri)``, no transaction: the
  floor for a commit of these rows;
- ``writer+txn``: the same with ``txnAppId`` / ``txnVersion``: how the engine committed
  before delta/spark/direct.py (Delta reconstructs the table's state to look the
  transaction up, every commit);
- ``engine``: ``DeltaSparkEngine.write`` with an ``AppTransaction``: the engine's commit,
  through Delta's transaction when the append qualifies (the same commit contents as
  ``writer+txn``), plus the engine's own log reads and checks.
- ``stage+commit``: ``DeltaSparkEngine.stage`` then ``commit``, as a batch stages and
  commits each output: Spark writes the files at staging, their statistics come from the
  footers, and Delta's transaction commits them (delta/spark/split.py);
- ``stage(writeFiles)+commit``: the same through Delta's ``writeFiles`` (how a plain
  append was staged before, and how a table with CHECK constraints or NOT NULL fields
  still is): Delta computes the statistics from the rows as it writes them;
- ``stage(cached)+commit``: the same, staged the way the engine stages a write whose
  commit also removes files (``removes_files=True``, the buffer's): the rows computed into
  Spark's cache and counted, then written from it at commit;
- ``new table``: ``stage+commit`` creating a new table every commit (a first batch);
  ``new table(writer)``: the same the way it was before delta/spark/split.py staged
  single appends: the rows persisted and checked at staging, written by Delta's writer at
  commit.

The staged ways compute their rows from ``spark.range`` each time (nothing persisted),
as a batch computes its outputs; the first three append the persisted rows.

Prints the median and spread of each way's commits (the first two of a table left out:
its creation and the first read of its log), and each way's ratio to ``writer``, all
measured in this run. Every 10th commit also writes a checkpoint, for every way alike.
"""

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from dagster_sideinputs.core.spark.session import build_spark_session
from dagster_sideinputs.delta.engine import AppTransaction
from dagster_sideinputs.delta.spark import engine as spark_engine
from dagster_sideinputs.delta.spark.engine import DeltaSparkEngine


def writer(frame: DataFrame, uri: str, batch: int) -> None:
    frame.write.format("delta").mode("append").save(uri)


def writer_txn(frame: DataFrame, uri: str, batch: int) -> None:
    (
        frame.write.format("delta")
        .mode("append")
        .option("txnAppId", "bench")
        .option("txnVersion", str(batch))
        .save(uri)
    )


def engine_write(spark: SparkSession) -> Callable[[DataFrame, str, int], None]:
    engine = DeltaSparkEngine(spark)

    def write(frame: DataFrame, uri: str, batch: int) -> None:
        engine.write(frame, uri, app_transaction=AppTransaction("bench", batch))

    return write


@contextlib.contextmanager
def through_delta_writer() -> Iterator[None]:
    """Stage as before delta/spark/split.py staged single appends: Delta's writeFiles for
    an existing table, the rows persisted and checked for a new one."""
    native = spark_engine.stage_append_native
    spark_engine.stage_append_native = lambda *args, **kwargs: None
    try:
        yield
    finally:
        spark_engine.stage_append_native = native


def engine_stage(
    spark: SparkSession, *, cached: bool = False, writer: bool = False, new: bool = False
) -> Callable[[DataFrame, str, int], None]:
    engine = DeltaSparkEngine(spark)

    def write(frame: DataFrame, uri: str, batch: int) -> None:
        if new:
            uri = os.path.join(uri, str(batch))  # a table of its own
        elif batch == 0:  # the table's creation, left out of the figures like every way's
            engine.write(frame, uri, app_transaction=AppTransaction("bench", batch))
            return
        with through_delta_writer() if writer else contextlib.nullcontext():
            staged = engine.stage(frame, uri, removes_files=cached)
        engine.commit(staged, app_transaction=AppTransaction("bench", batch))

    return write


def commits(
    way: Callable[[DataFrame, str, int], None], frame: DataFrame, uri: str, n: int
) -> list[float]:
    shutil.rmtree(uri, ignore_errors=True)
    times = []
    for batch in range(n):
        started = time.perf_counter()
        way(frame, uri, batch)
        times.append(time.perf_counter() - started)
    return times[2:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--commits", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    spark = build_spark_session(master=args.master, ui_enabled=False, delta=True)
    computed = spark.range(args.rows).selectExpr(
        "id", "id % 1000 AS customer_id", "CAST(id AS DOUBLE) AS amount"
    )
    frame = computed.persist(StorageLevel.MEMORY_AND_DISK)
    frame.count()
    ways = {
        "writer": writer,
        "writer+txn": writer_txn,
        "engine": engine_write(spark),
        "stage+commit": engine_stage(spark),
        "stage(writeFiles)+commit": engine_stage(spark, writer=True),
        "stage(cached)+commit": engine_stage(spark, cached=True),
        "new table": engine_stage(spark, new=True),
        "new table(writer)": engine_stage(spark, new=True, writer=True),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    root = tempfile.mkdtemp(prefix="bench-delta-commit-")
    try:
        for _ in range(args.repeats):
            for name, way in ways.items():
                rows = computed if name.startswith(("stage", "new")) else frame
                times[name] += commits(way, rows, os.path.join(root, name), args.commits)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    floor = statistics.median(times["writer"])
    print(f"{args.rows} rows a commit, {args.commits} commits x {args.repeats}, {args.master}")
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"  {name:24s} median {median:.3f} s  (min {min(values):.3f}, max {max(values):.3f})"
            f"  {median / floor:.2f}x the plain writer"
        )


if __name__ == "__main__":
    main()

"""Benchmark: the fixed cost of a batch as the operator's history grows.

    python bench/batches.py --batches 1000 --rows 5

A main input gains a few rows at a time (``--rows`` per append, a Delta table written
with delta-rs, or with ``--main files`` a landing folder of JSON files), and after each
append the operator runs once (``trigger="available_now"``: one batch, then one idle
step that finds nothing). The data of every batch is the same size, so whatever grows
from batch 10 to batch N is bookkeeping: planning, listing, Delta log reads, commit
records, the landed-files ledger, the buffer's state.

Per batch it records the wall time of the run, and the *bookkeeping time*: the time
spent in the Delta engine's metadata and commit calls (everything but the Spark jobs:
``exists``, ``snapshot``, ``added_files``, ``transaction_version``, ``commit``,
``append_rows``, ``read_rows``, ...) and in the state folder's file operations,
counted once where calls nest. It also counts the Delta tables opened and the state
files read, listed and written.

``--engine delta-spark`` runs the same under Delta's own library (the session gets
Delta's jars); its engine calls include Delta's own commits in the JVM (the transaction
that adds the staged files, removes released ones and records the batch's application
transaction), which the bridge makes by writing the log itself.

It prints, per bucket of batches, the median and spread of each figure, and the ratio of
the last bucket to the bucket around batch 10 (both measured in this run; the machine
may be shared, so single batches are noisy: read the medians).

``--fixed-cost`` measures what a batch costs when it carries (almost) no data, under both
engines in one session (Delta's jars loaded; the bridge's lake beside delta-spark's),
rounds alternating between them after ``--batches`` batches of history each:

    python bench/batches.py --fixed-cost --batches 10 --repeats 7

per round and engine: an *idle* run (nothing new: the run plans nothing), an *empty*
batch (the main table gained a version adding no rows) and a *10-row* batch, each an
``available_now`` run timed whole, with the batch's own time (its stages) beside it.

Batch 10,000 is hours away at a batch a second, so history can also be deepened:

    python bench/batches.py --batches 12 --save-at 10 --keep --work /tmp/b
    python bench/batches.py --probe /tmp/b-at10 --deepen 10000 --batches-after 10

probes the saved folder and a copy whose Delta logs got 10,000 more (empty) commits, in
turn, then runs real batches on both in turn, reporting each one's bookkeeping.
"""

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import deltalake
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core.spark.packages import DeltaMode
from dagster_sideinputs.core.spark.session import build_spark_session
from dagster_sideinputs.core.state import identity
from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine
from dagster_sideinputs.delta.spark.engine import DeltaSparkEngine
from dagster_sideinputs.delta.store.files import TableFiles

ENGINE_CALLS = (
    "exists",
    "snapshot",
    "added_files",
    "transaction_version",
    "commit_timestamps",
    "read_rows",
    "validate_append",
    "commit",
    "commit_removals",
    "append_rows",
    "discard",
    "vacuum",
)
FILE_CALLS = ("exists", "list_files", "read_bytes", "write_bytes_atomic", "delete_file", "move")
CUSTOMERS = 100
BIG = 900.0
BIG_TAG = dsi.OutputTag("big")


@dataclass
class Meter:
    """Time spent in instrumented calls (outermost call only) and counts, per batch."""

    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    _depth: threading.local = field(default_factory=threading.local)

    def reset(self) -> tuple[float, dict[str, int]]:
        taken = (self.seconds, dict(self.counts))
        self.seconds, self.counts = 0.0, {}
        return taken

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    @contextmanager
    def timing(self) -> Iterator[None]:
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        started = time.perf_counter()
        try:
            yield
        finally:
            self._depth.n = depth
            if depth == 0:
                self.seconds += time.perf_counter() - started


def instrument(meter: Meter) -> None:
    """Wrap the engine's metadata calls and the file operations with the meter."""

    def wrap(owner: type, name: str, label: str, counter: Callable[[Any], int] | None = None):
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            meter.count(label)
            with meter.timing():
                result = original(*args, **kwargs)
                if counter is not None:
                    result = list(result)
                    meter.count(label + ".entries", counter(result))
                return result

        setattr(owner, name, timed)

    for engine in (DeltaRsEngine, DeltaSparkEngine):
        for name in ENGINE_CALLS:
            if hasattr(engine, name):
                wrap(engine, name, f"engine.{name}")
    for name in FILE_CALLS:
        wrap(TableFiles, name, f"files.{name}", len if name == "list_files" else None)
    original_init = deltalake.DeltaTable.__init__

    @functools.wraps(original_init)
    def counted_init(self: Any, *args: Any, **kwargs: Any) -> None:
        uri = str(kwargs.get("table_uri", args[0] if args else ""))
        meter.count("deltalake.open")
        meter.count(f"deltalake.open[{os.path.basename(uri.rstrip('/'))}]")
        mark = time.perf_counter()
        original_init(self, *args, **kwargs)
        meter.count("deltalake.open.us", int((time.perf_counter() - mark) * 1e6))

    deltalake.DeltaTable.__init__ = counted_init  # type: ignore[method-assign]


def enrich(main: DataFrame, sides: dsi.SideInputs) -> dsi.Outputs:
    joined = main.select("id", "customer_id", "amount", F.col("profile.name").alias("name"))
    return {dsi.MAIN: joined, BIG_TAG: joined.where(F.col("amount") > BIG)}


@dataclass
class Setup:
    root: Path
    args: argparse.Namespace
    next_id: int = 0

    @property
    def main_uri(self) -> str:
        return str(self.root / "events")

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    def rows(self, n: int | None = None) -> pa.Table:
        n = self.args.rows if n is None else n
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "customer_id": pa.array([i % CUSTOMERS for i in ids], pa.int64()),
                "amount": pa.array([float((i * 37) % 1000) for i in ids], pa.float64()),
            }
        )

    def append(self, rows: pa.Table | None = None) -> None:
        rows = self.rows() if rows is None else rows
        if self.args.main == "delta":
            interval = str(self.args.main_checkpoint_interval)
            deltalake.write_deltalake(
                self.main_uri,
                rows,
                mode="append",
                configuration={"delta.checkpointInterval": interval},
            )
            return
        self.landing.mkdir(exist_ok=True)
        lines = [
            f'{{"id": {r["id"]}, "customer_id": {r["customer_id"]}, "amount": {r["amount"]}}}'
            for r in rows.to_pylist()
        ]
        name = f"part-{self.next_id:09d}.json"
        (self.landing / f".{name}").write_text("\n".join(lines) + "\n")
        os.replace(self.landing / f".{name}", self.landing / name)

    def operator(self) -> dsi.SideInputOperator:
        side = str(self.root / "profiles")
        if not os.path.exists(side):
            deltalake.write_deltalake(
                side,
                pa.table(
                    {
                        "customer_id": pa.array(range(CUSTOMERS), pa.int64()),
                        "name": [f"c{i}" for i in range(CUSTOMERS)],
                    }
                ),
            )
        if self.args.main == "delta":
            main = dsi.MainInput("events", key="customer_id", path=self.main_uri)
        else:
            main = dsi.MainInput.files(
                str(self.landing),
                format="json",
                schema="id long, customer_id long, amount double",
                key="customer_id",
            )
        return dsi.SideInputOperator(
            main=main,
            side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id", path=side)},
            fn=enrich,
            main_output="enriched",
            side_outputs=[BIG_TAG],
            storage=dsi.DeltaStorage(str(self.root / "lake"), engine=self.args.engine),
        )


def session(args: argparse.Namespace, name: str) -> SparkSession:
    """The benchmark's session (with Delta's jars where they are: ``auto``; required when
    the lake's engine is delta-spark)."""
    delta: DeltaMode = True if args.engine == "delta-spark" else "auto"
    configs = dict(item.split("=", 1) for item in args.conf or ())
    return build_spark_session(
        master=args.master,
        ui_enabled=False,
        app_name=name,
        delta=delta,
        log_level="ERROR",
        configs=configs,
    )


def fixed_cost(args: argparse.Namespace) -> int:
    """The cost of an idle run, an empty batch and a 10-row batch, both engines in turn."""
    work = Path(args.work or tempfile.mkdtemp(prefix="dsi-fixed-"))
    shutil.rmtree(work, ignore_errors=True)
    engines = ("delta-rs", "delta-spark")
    setups: dict[str, Setup] = {}
    operators: dict[str, dsi.SideInputOperator] = {}
    spark = session(argparse.Namespace(**{**vars(args), "engine": "delta-spark"}), "fixed")
    kinds = ("idle", "empty", "10 rows")
    walls: dict[tuple[str, str], list[float]] = {}
    stages: dict[tuple[str, str, str], list[float]] = {}
    try:
        for engine in engines:
            setup = Setup(work / engine, argparse.Namespace(**{**vars(args), "engine": engine}))
            setups[engine], operators[engine] = setup, setup.operator()
            for _ in range(max(args.batches, 1)):  # history, and the JVM's warm-up
                setup.append()
                operators[engine].run(spark, trigger="available_now")
        print(f"{args.batches} batches of history per engine; {args.repeats} rounds")
        for round_ in range(args.repeats):
            for engine in engines if round_ % 2 == 0 else reversed(engines):
                setup, op = setups[engine], operators[engine]
                for kind in kinds:
                    if kind == "empty":
                        setup.append(setup.rows(0))
                    elif kind == "10 rows":
                        setup.append(setup.rows(10))
                    mark = time.perf_counter()
                    result = op.run(spark, trigger="available_now")
                    walls.setdefault((engine, kind), []).append(time.perf_counter() - mark)
                    expected = {"idle": 0, "empty": 1, "10 rows": 1}[kind]
                    if len(result.batches) != expected:
                        print(f"{engine} {kind}: {len(result.batches)} batches", file=sys.stderr)
                        return 1
                    if result.batches:
                        for stage, seconds in result.batches[0].durations.items():
                            stages.setdefault((engine, kind, stage), []).append(seconds)
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nfixed cost of a run, {args.master}, medians of {args.repeats} alternating rounds:")
    for kind in kinds:
        cells = []
        for engine in engines:
            wall = statistics.median(walls[(engine, kind)])
            own = stages.get((engine, kind, "total"))
            batch = f" (batch {statistics.median(own) * 1e3:4.0f} ms)" if own else ""
            cells.append(f"{engine} {wall * 1e3:5.0f} ms{batch}")
        ratio = statistics.median(walls[("delta-spark", kind)]) / statistics.median(
            walls[("delta-rs", kind)]
        )
        print(f"  {kind:<8} " + ";  ".join(cells) + f";  delta-spark / bridge {ratio:.2f}x")
        for engine in engines:
            parts = {
                stage: statistics.median(values)
                for (e, k, stage), values in stages.items()
                if e == engine and k == kind and stage != "total"
            }
            if parts:
                shown = ", ".join(
                    f"{stage} {seconds * 1e3:.0f}" for stage, seconds in parts.items()
                )
                print(f"           {engine} stages (ms): {shown}")
    return 0


def probe(op: dsi.SideInputOperator) -> float:
    """The fixed cost of a step without its Spark jobs: the run-start checks, planning the
    next batch (``peek``: listing, Delta logs of main/side/buffer, state files), and
    opening every table the batch commits to (as staging and committing do)."""
    engine = op.spec.engine
    started = time.perf_counter()
    identity.check(op.spec, op.state)
    op.peek()
    for uri in op.spec.written_tables():
        if engine.exists(uri):
            engine.snapshot(uri)
            engine.transaction_version(uri, op.operator_id)
    return time.perf_counter() - started


def probe_copies(copies: dict[int, dsi.SideInputOperator], repeats: int) -> dict[int, list[float]]:
    """Probe each saved history depth in turn, ``repeats`` rounds (drift hits all alike)."""
    times: dict[int, list[float]] = {depth: [] for depth in copies}
    for _ in range(repeats):
        for depth, op in copies.items():
            times[depth].append(probe(op))
    return times


def relocate(root: Path) -> None:
    """Make a copied working folder's operator state refer to the copy: ``operator.json``
    records the main input's absolute location (nothing else in the state does; Delta
    tables hold relative paths)."""
    for identity_file in root.glob("lake/_sideinputs/*/operator.json"):
        recorded = json.loads(identity_file.read_text())
        old_root = os.path.dirname(recorded["main_input"]["uri"].rstrip("/"))
        identity_file.write_text(identity_file.read_text().replace(old_root, str(root)))


def deepen_logs(root: Path, commits: int) -> list[str]:
    """Give every Delta table under ``root`` ``commits`` more versions, each an empty
    commit (a ``commitInfo`` only: no rows, no files), then a checkpoint at the newest
    version: the log folders as long as after that many more batches, in seconds rather
    than hours. (Real batches would also add a data file per output per batch; the probe
    does not read live files.)"""
    deepened = []
    for log in sorted(root.rglob("_delta_log")):
        latest = max(int(p.name[:20]) for p in log.glob("*.json") if p.name[:20].isdigit())
        now_ms = int(time.time() * 1000)
        info = {"timestamp": now_ms, "operation": "WRITE", "engineInfo": "bench-deepen"}
        line = json.dumps({"commitInfo": info}) + "\n"
        for version in range(latest + 1, latest + 1 + commits):
            (log / f"{version:020d}.json").write_text(line)
        deltalake.DeltaTable(str(log.parent)).create_checkpoint()
        deepened.append(log.parent.name)
    return deepened


def probe_only(args: argparse.Namespace) -> int:
    """Probe saved working folders in turn (no Spark: the probe plans without it; with
    ``--deepen``, one Spark run catches the deepened copy's main input up first)."""
    folders = [Path(p) for p in args.probe]
    if args.deepen:
        deep = folders[0].parent / f"{folders[0].name}-deepened{args.deepen}"
        shutil.rmtree(deep, ignore_errors=True)
        shutil.copytree(folders[0], deep)
        relocate(deep)
        started = time.perf_counter()
        tables = deepen_logs(deep, args.deepen)
        seconds = time.perf_counter() - started
        print(f"deepened {tables} by {args.deepen} commits in {seconds:.0f} s")
        spark = session(args, "bench-deepen")
        caught_up = Setup(deep, args).operator().run(spark, trigger="available_now")
        print(f"catch-up run over the deepened main input: {len(caught_up.batches)} batch(es)")
        spark.stop()
        folders.append(deep)
    operators = {}
    for index, folder in enumerate(folders):
        relocate(folder)
        setup = Setup(folder, args, next_id=10**9 + index * 10**6)
        setup.append()
        operators[index] = setup.operator()
    probed = probe_copies(operators, args.repeats)
    base = statistics.median(probed[0])
    print(f"fixed-cost probe, folders in turn, {args.repeats} rounds (shared machine: noisy):")
    for index, times in probed.items():
        print(
            "  "
            + summarize(f"{folders[index].name}:", times)
            + f"  = {statistics.median(times) / base:.2f}x {folders[0].name}"
        )
    if args.batches_after:
        run_in_turn(folders, args)
    return 0


def run_in_turn(folders: list[Path], args: argparse.Namespace) -> None:
    """Real batches on each folder in turn (an append, then one ``available_now`` run):
    the wall time, and the bookkeeping time (Delta metadata and commit calls, state
    files) of each, per folder."""
    spark = session(args, "bench-in-turn")
    setups = [Setup(f, args, next_id=2 * 10**9 + i * 10**6) for i, f in enumerate(folders)]
    operators = [setup.operator() for setup in setups]
    meter = Meter()
    instrument(meter)
    walls: list[list[float]] = [[] for _ in folders]
    books: list[list[float]] = [[] for _ in folders]
    for round_ in range(args.batches_after + 1):
        for index, (setup, op) in enumerate(zip(setups, operators, strict=True)):
            setup.append()
            meter.reset()
            started = time.perf_counter()
            result = op.run(spark, trigger="available_now")
            wall = time.perf_counter() - started
            seconds, _ = meter.reset()
            if round_:  # the first round warms each folder's caches up (and catches up)
                assert [b.rows_in for b in result.batches] == [args.rows], result.batches
                walls[index].append(wall)
                books[index].append(seconds)
    print(f"real batches, folders in turn, {args.batches_after} rounds:")
    for index, folder in enumerate(folders):
        ratio = statistics.median(books[index]) / statistics.median(books[0])
        print(
            f"  {folder.name}: "
            + summarize("wall", walls[index])
            + "  "
            + summarize("bookkeeping", books[index])
            + f"  = {ratio:.2f}x the bookkeeping of {folders[0].name}"
        )
    spark.stop()


def bucket_edges(batches: int, size: int) -> list[tuple[int, int]]:
    """[start, end) buckets: one around batch 10, then ``size``-wide buckets to the end."""
    edges = [(5, 25)]
    start = size
    while start < batches:
        edges.append((start, min(start + size, batches)))
        start += size
    return edges


def summarize(label: str, values: list[float]) -> str:
    """Median [quartiles] and the slowest: a stall every few batches (housekeeping, a
    checkpoint) moves no median."""
    if not values:
        return f"{label} -"
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return (
        f"{label} {statistics.median(values) * 1e3:7.1f} ms [{q[0] * 1e3:.0f}-{q[2] * 1e3:.0f}]"
        f" max {max(values) * 1e3:.0f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batches",
        type=int,
        default=None,
        help="batches of history (default: 1000; 10 with --fixed-cost)",
    )
    parser.add_argument("--rows", type=int, default=5, help="rows per append")
    parser.add_argument("--main", choices=("delta", "files"), default="delta")
    parser.add_argument(
        "--main-checkpoint-interval",
        type=int,
        default=10,
        help="delta.checkpointInterval of the main table (the writer's choice: delta-spark's "
        "default is 10, delta-rs's 100)",
    )
    parser.add_argument("--bucket", type=int, default=100, help="batches per reported bucket")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--conf", action="append", metavar="KEY=VALUE", help="a Spark setting (repeatable)"
    )
    parser.add_argument("--work", default=None, help="working folder (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the working folder")
    parser.add_argument(
        "--save-at",
        type=int,
        action="append",
        help="batches after which to save a copy of the lake, probed at the end "
        "(default: 10, and the last batch)",
    )
    parser.add_argument("--repeats", type=int, default=15, help="probe rounds at the end")
    parser.add_argument(
        "--deepen",
        type=int,
        default=0,
        help="with --probe: also probe a copy of the first folder whose Delta logs got this "
        "many more (empty) commits",
    )
    parser.add_argument(
        "--engine",
        choices=("delta-rs", "delta-spark", "auto"),
        default="delta-rs",
        help="the lake's Delta engine (auto: delta-spark where the session has Delta)",
    )
    parser.add_argument(
        "--batches-after",
        type=int,
        default=0,
        help="with --probe: then run this many real batches on each folder in turn",
    )
    parser.add_argument(
        "--probe",
        action="append",
        help="only probe these working folders (copies of a run's folder, made while it ran "
        "or kept with --keep), in turn, after one append each; the first is the baseline",
    )
    parser.add_argument(
        "--fixed-cost",
        action="store_true",
        help="time an idle run, an empty batch and a 10-row batch under both engines, "
        "alternating (after --batches batches of history each)",
    )
    args = parser.parse_args()
    if args.batches is None:
        args.batches = 10 if args.fixed_cost else 1000
    if args.probe:
        return probe_only(args)
    if args.fixed_cost:
        return fixed_cost(args)

    work = Path(args.work or tempfile.mkdtemp(prefix="dsi-batches-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spark = session(args, "bench-batches")
    setup = Setup(work, args)
    setup.append()
    op = setup.operator()
    meter = Meter()
    instrument(meter)
    save_at = set(args.save_at or [10])
    copies: dict[int, Setup] = {}
    walls: list[float] = []
    books: list[float] = []
    counts: list[dict[str, int]] = []
    started = time.perf_counter()
    try:
        for index in range(args.batches):
            if index:
                setup.append()
            meter.reset()
            mark = time.perf_counter()
            result = op.run(spark, trigger="available_now")
            walls.append(time.perf_counter() - mark)
            seconds, counted = meter.reset()
            books.append(seconds)
            counts.append(counted)
            if len(result.batches) != 1 or result.batches[0].rows_in != args.rows:
                print(f"batch {index}: unexpected result {result.batches}", file=sys.stderr)
                return 1
            if index + 1 in save_at:
                saved = Setup(work.parent / f"{work.name}-at{index + 1}", args, setup.next_id)
                shutil.rmtree(saved.root, ignore_errors=True)
                shutil.copytree(work, saved.root)
                relocate(saved.root)
                copies[index + 1] = saved
            if index % 50 == 0:
                print(
                    f"batch {index}: wall {walls[-1] * 1e3:.0f} ms, bookkeeping "
                    f"{books[-1] * 1e3:.0f} ms ({time.perf_counter() - started:.0f} s so far)",
                    flush=True,
                )
        copies[args.batches] = setup
        for saved in copies.values():  # the probed step plans one new append
            saved.append()
        operators = {depth: saved.operator() for depth, saved in sorted(copies.items())}
        meter.reset()
        probed = probe_copies(operators, args.repeats)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            for saved in copies.values():
                shutil.rmtree(saved.root, ignore_errors=True)
    print(
        f"\n{args.batches} batches of {args.rows} rows, main input {args.main}, "
        f"{op.spec.engine.name}, {args.master}"
    )
    print("(shared machine: per-batch figures are noisy; medians and [quartiles] per bucket)\n")
    edges = bucket_edges(len(walls), args.bucket)
    keys = sorted({k for c in counts for k in c})
    for start, end in edges:
        bucket_counts = {k: statistics.median(c.get(k, 0) for c in counts[start:end]) for k in keys}
        print(
            f"batches {start:>5}-{end - 1:<5} "
            + summarize("wall", walls[start:end])
            + "  "
            + summarize("bookkeeping", books[start:end])
        )
        print("      " + ", ".join(f"{k}={v:g}" for k, v in bucket_counts.items() if v))
    first, last = edges[0], edges[-1]
    for label, series in (("wall", walls), ("bookkeeping", books)):
        ratio = statistics.median(series[last[0] : last[1]]) / statistics.median(
            series[first[0] : first[1]]
        )
        print(f"{label}: batches {last[0]}-{last[1] - 1} / batches 5-24 = {ratio:.2f}x")
    first_depth = min(probed)
    base = statistics.median(probed[first_depth])
    print(
        f"\nfixed-cost probe (identity check + plan of the next batch + opening every written "
        f"table; no Spark), the saved histories probed in turn, {args.repeats} rounds:"
    )
    for depth, times in sorted(probed.items()):
        print(
            "  after "
            + summarize(f"{depth:>5} batches:", times)
            + f"  = {statistics.median(times) / base:.2f}x the probe after {first_depth}"
        )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

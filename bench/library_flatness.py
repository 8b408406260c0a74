"""Benchmark: does delta-rs's own API keep a batch's bookkeeping flat as a table's history
grows? The measured reason we keep our own log reader and local commits
(docs/DECISIONS.md, "A batch's Delta bookkeeping at any history depth"); rerun it when
deltalake is upgraded, and delete our code when it says the library caught up.

    python bench/library_flatness.py --commits 1000 --checkpoint-every 100

One local table; each step does what a bridge batch asks of delta-rs with one kept
handle: ``update_incremental`` + ``transaction_version`` (the replay check), then
``write_deltalake`` of a few rows with the batch's application transaction (post-commit
hooks off, a checkpoint every ``--checkpoint-every`` commits, as the bridge writes them).
It prints the medians around commit 10 and at each mark, and the ratio of the last mark
to commit 10 for each figure, and for a fresh ``DeltaTable`` open. The issue's bound is
1.2x; above it the library is not flat yet. (tests/delta/test_library_limits.py checks a
coarser bound, 3x at 10,000 log files, in every test run.)
"""

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.transaction import PostCommitHookProperties

BOUND = 1.2
APP = "bench-flatness"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--window", type=int, default=10, help="commits per median")
    args = parser.parse_args()
    marks = sorted({10, *(m for m in (100, 500, 1000, 2000, 5000, 10000) if m <= args.commits)})
    work = Path(tempfile.mkdtemp(prefix="library-flatness-"))
    try:
        return run(work / "table", args, marks)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(path: Path, args: argparse.Namespace, marks: list[int]) -> int:
    rows = pa.table({"k": pa.array(range(args.rows), pa.int64()), "v": [1.0] * args.rows})
    write_deltalake(str(path), rows)
    table = DeltaTable(str(path))
    hooks = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
    reads: list[float] = []
    writes: list[float] = []
    figures: dict[int, tuple[float, float, float]] = {}
    for batch in range(1, args.commits + 1):
        started = time.perf_counter()
        table.update_incremental()
        table.transaction_version(APP)
        read = time.perf_counter()
        write_deltalake(
            table,
            rows,
            mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction(APP, batch)]),
            post_commithook_properties=hooks,
        )
        reads.append(read - started)
        writes.append(time.perf_counter() - read)
        if args.checkpoint_every and batch % args.checkpoint_every == 0:
            table.update_incremental()
            table.create_checkpoint()
        if batch in marks:
            opened = time.perf_counter()
            DeltaTable(str(path))
            fresh = time.perf_counter() - opened
            figures[batch] = (
                statistics.median(reads[-args.window :]),
                statistics.median(writes[-args.window :]),
                fresh,
            )
            read_ms, write_ms, open_ms = (1000 * f for f in figures[batch])
            print(
                f"commit {batch:>6}: read {read_ms:7.1f} ms  write {write_ms:7.1f} ms  "
                f"fresh open {open_ms:7.1f} ms",
                flush=True,
            )
    first, last = figures[min(figures)], figures[max(figures)]
    ratios = [b / a if a else float("inf") for a, b in zip(first, last, strict=True)]
    names = ("read (update + txn)", "write with txn", "fresh open")
    print(f"ratio commit {max(figures)} / commit {min(figures)} (bound {BOUND}x):")
    for name, ratio in zip(names, ratios, strict=True):
        print(f"  {name:<20} {ratio:6.2f}x {'flat' if ratio <= BOUND else 'grows'}")
    flat = all(r <= BOUND for r in ratios[:2])
    print("delta-rs keeps a batch's bookkeeping flat" if flat else "delta-rs is not flat yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())

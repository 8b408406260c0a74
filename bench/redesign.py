"""Benchmark: the operator now against the operator before a revision, in one run.

    python bench/redesign.py --before 899165f^ --rows 1000000 --rounds 3

Issue 11 asks that the core's redesign (commit 899165f: a batch as a pipeline of stages)
be no slower than the code before it. This script extracts the ``--before`` revision
(``git archive``, nothing checked out in place) and runs ``bench/operator.py --only
<section>`` from each tree in turn, in separate processes whose ``PYTHONPATH`` points at
that tree, so each imports its own ``dagster_sideinputs``. The order alternates from
round to round, so load drift on the machine hits both alike.

Each process also times its hand-written baseline (the ``foreachBatch`` job for frames,
``mapInPandas`` for rows) next to the operator. Two figures come out per section:

- **speed**: now / before, operator records per second (medians over the rounds);
- **against its baseline**: now / before, of each process's operator/baseline ratio,
  which cancels what the machine's load did to that process.

Both trees get the same arguments; flags only the newer ``bench/operator.py`` knows
(``--engines``) pin it to the same work as the older one (the delta-rs bridge only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def extract(revision: str, into: Path) -> Path:
    """The tree of ``revision`` under ``into`` (``git archive``)."""
    tree = into / "before"
    tree.mkdir()
    archive = into / "before.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", revision], cwd=ROOT, stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def knows(tree: Path, flag: str) -> bool:
    return flag in (tree / "bench" / "operator.py").read_text()


def run_once(tree: Path, section: str, args: argparse.Namespace, out: Path) -> dict:
    command = [
        sys.executable,
        str(tree / "bench" / "operator.py"),
        "--only",
        section,
        "--rows",
        str(args.rows),
        "--rows-mode-rows",
        str(args.rows),
        "--repeats",
        str(args.repeats),
        "--json",
        str(out),
    ]
    if knows(tree, "--engines"):
        command += ["--engines", "delta-rs"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{tree} {section} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    figures = json.loads(out.read_text())
    return figures.get(section, figures)  # one object per section (both trees)


def check_imports_its_own_tree(tree: Path) -> None:
    """A process with ``PYTHONPATH=tree`` must import that tree's package, not the
    installed (editable) one, or the comparison would time the same code twice."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    probe = "import dagster_sideinputs; print(dagster_sideinputs.__file__)"
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=tree, env=env, capture_output=True, text=True
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(tree.resolve()):
        sys.exit(f"PYTHONPATH={tree} imports {found!r}, not that tree's package")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="899165f^", help="the revision to compare with")
    parser.add_argument("--rows", type=int, default=1_000_000, help="main records")
    parser.add_argument("--rounds", type=int, default=3, help="processes per tree and section")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs inside a process")
    parser.add_argument("--sections", default="frames,rows")
    args = parser.parse_args()
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]

    with tempfile.TemporaryDirectory(prefix="dsi-redesign-") as scratch:
        work = Path(scratch)
        trees = {"before": extract(args.before, work), "now": ROOT}
        for tree in trees.values():
            check_imports_its_own_tree(tree)
        found: dict[tuple[str, str], list[dict]] = {}
        for section in sections:
            for round_ in range(args.rounds):
                order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
                for name in order:
                    out = work / f"{section}-{name}-{round_}.json"
                    figures = run_once(trees[name], section, args, out)
                    found.setdefault((section, name), []).append(figures)
                    print(
                        f"  {section:6} {name:6} round {round_}: operator "
                        f"{figures['operator_rec_s'] / 1e6:5.2f}M rec/s, baseline "
                        f"{figures['baseline_rec_s'] / 1e6:5.2f}M rec/s, ratio "
                        f"{figures['ratio']:.2f}",
                        flush=True,
                    )
        print(f"\n[redesign] {args.rows} rows, {args.rounds} rounds; before = {args.before}")
        for section in sections:
            before, now = found[(section, "before")], found[(section, "now")]
            speed = statistics.median(f["operator_rec_s"] for f in now) / statistics.median(
                f["operator_rec_s"] for f in before
            )
            against = statistics.median(f["ratio"] for f in now) / statistics.median(
                f["ratio"] for f in before
            )
            counts = {tuple(map(tuple, f["operator_counts"])) for f in before + now}
            print(
                f"  {section:6} now / before: speed {speed:.2f}x, against its baseline "
                f"{against:.2f}x; output counts {'equal' if len(counts) == 1 else counts}"
            )


if __name__ == "__main__":
    main()

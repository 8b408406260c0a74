"""Benchmark: the operator on a Spark standalone cluster next to local[2], same data, one run.

    python bench/cluster.py --rows 4000000 --side-rows 200000 --rounds 2 --repeats 2

The input is the ``frames`` scenario of ``bench/operator.py`` (transactions, customer
profiles, a threshold singleton; written once). ``SideInputOperator`` in frames mode
processes all of it in one ``available_now`` run, with the profiles as a broadcast map
side input and as a keyed map side input (broadcast joins off, so the main records and
the profiles are shuffled), and over the same records partitioned by key group and
declared pre-keyed (the main records read as buckets, not shuffled; printed against the
shuffled keyed run of the same deployment), on two deployments of the same two cores:

- ``local[2]``: driver and executor threads in one JVM;
- a standalone cluster on 127.0.0.1 (``tests/cluster.py``): a master and two workers of
  one core each, so two executor JVMs apart from the driver.

A process holds one SparkContext, so each deployment is measured by a driver process of
its own: it warms up once, then times ``--repeats`` runs of each variant. ``--rounds``
alternates the order of the deployments, so that drift in the machine's load hits both.
Printed: records/s (median over all timed runs) of each and the ratio cluster / local;
and the same for two hand-written jobs timed alternately with the operator: the
operator's own job by hand (the same join, both outputs in one tag-partitioned pass:
what the deployment costs the very job the operator runs, against which its ratio is
read), and the batch job of ``bench/operator.py`` (read, join, persist, write both
outputs: slower, so the same cost in seconds is a smaller share of it). Each repeat runs
the three jobs back to back, every other repeat in reverse order; the operator's ratio over
a job's is printed from the medians and from those pairs (per deployment, the median of
the job's seconds over the operator's within a repeat: drift in load between repeats
slows both of a pair alike).
"""

import argparse
import functools
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("broadcast", "keyed", "pre_keyed")
LOCAL = "local[2]"


def _bench_operator() -> Any:
    """``bench/operator.py`` as a module (its file name shadows the standard ``operator``)."""
    spec = importlib.util.spec_from_file_location("bench_operator", REPO / "bench" / "operator.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_operator"] = module
    spec.loader.exec_module(module)
    return module


def _load() -> str:
    return "/".join(f"{v:.1f}" for v in os.getloadavg())


# --- the driver processes --------------------------------------------------------------------


def prepare(args: argparse.Namespace) -> None:
    """Write the input tables once (on local[2]) and a manifest of their locations."""
    ops = _bench_operator()
    import dagster_sideinputs as dsi

    spark = dsi.build_spark_session(
        master=LOCAL, ui_enabled=False, log_level="ERROR", driver_memory="4g"
    )
    try:
        lake = ops.Lake(Path(args.work), spark, argparse.Namespace(side_rows=args.side_rows))
        main_uri = lake.main_table(args.rows)
        keyed_main_uri = lake.keyed_main_table(args.rows)
        lake.profiles()
        lake.rules()
        manifest = {"main": main_uri, "keyed_main": keyed_main_uri, "tables": lake.tables}
        Path(args.out).write_text(json.dumps(manifest))
    finally:
        spark.stop()


def measure(args: argparse.Namespace) -> None:
    """Time the operator on one deployment: a warm-up, then ``repeats`` runs per variant."""
    ops = _bench_operator()
    import dagster_sideinputs as dsi

    local = args.master.startswith("local")
    configs = {} if local else {"spark.executor.memory": args.executor_memory}
    spark = dsi.build_spark_session(
        master=args.master,
        app_name=f"bench-cluster-{'local' if local else 'standalone'}",
        shuffle_partitions=args.shuffle_partitions,
        ui_enabled=False,
        log_level="ERROR",
        driver_memory=args.driver_memory,
        configs={
            **configs,
            # Wait for both executors before the first job, as a long-running app would.
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        },
    )
    manifest = json.loads(Path(args.manifest).read_text())
    lake = ops.Lake(
        Path(args.work),
        spark,
        argparse.Namespace(side_rows=args.side_rows),
        dict(manifest["tables"]),
    )
    results: dict[str, Any] = {
        "master": args.master,
        "default_parallelism": spark.sparkContext.defaultParallelism,
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
    }
    threshold = spark.conf.get("spark.sql.autoBroadcastJoinThreshold") or "10MB"
    try:
        for variant in VARIANTS:
            keyed = variant in ("keyed", "pre_keyed")
            spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1" if keyed else threshold)

            def run(
                label: str, keyed: bool = keyed, pre_keyed: bool = variant == "pre_keyed"
            ) -> tuple[float, tuple[int, int]]:
                root = lake.fresh_root(label)
                main = manifest["keyed_main"] if pre_keyed else manifest["main"]
                op = ops.frames_operator(main, lake, root, keyed=keyed, pre_keyed=pre_keyed)
                started = time.perf_counter()
                result = op.run(spark, trigger="available_now")
                seconds = time.perf_counter() - started
                shutil.rmtree(root, ignore_errors=True)
                return seconds, (result.emitted("enriched"), result.emitted("suspicious"))

            def by_hand(label: str) -> tuple[float, tuple[int, int]]:
                """The hand-written batch job of ``bench/operator.py`` (read, join, persist,
                write both outputs as parquet): what the deployment costs plain Spark."""
                out = lake.fresh_root(label)
                started = time.perf_counter()
                ops.batch_job(spark, lake, manifest["main"], out)
                seconds = time.perf_counter() - started
                counts = ops.output_counts(spark, out)
                shutil.rmtree(out, ignore_errors=True)
                return seconds, counts

            def one_pass(label: str, variant: str = variant) -> tuple[float, tuple[int, int]]:
                """The operator's own job by hand: the same join, both outputs in one
                tag-partitioned pass (``bench/operator.py``'s one-pass bound)."""
                out = lake.fresh_root(label)
                started = time.perf_counter()
                one_pass_by_hand(ops, lake, manifest, variant, out)
                seconds = time.perf_counter() - started
                counts = (
                    ops.parquet_rows(spark, out / "tag=0"),
                    ops.parquet_rows(spark, out / "tag=1"),
                )
                shutil.rmtree(out, ignore_errors=True)
                return seconds, counts

            run(f"warmup_{variant}")
            by_hand(f"warmup_hand_{variant}")
            one_pass(f"warmup_one_pass_{variant}")
            timed: list[tuple[float, tuple[int, int]]] = []
            hand: list[tuple[float, tuple[int, int]]] = []
            same: list[tuple[float, tuple[int, int]]] = []
            jobs = [
                (timed, functools.partial(run, variant)),
                (same, functools.partial(one_pass, f"one_pass_{variant}")),
                (hand, functools.partial(by_hand, f"hand_{variant}")),
            ]
            for repeat in range(args.repeats):
                # Alternating, every other repeat in reverse order (the next round starting
                # reversed): drift in load, and the JVM still getting faster after its
                # warm-up, hit all alike.
                forward = (repeat + args.round) % 2 == 0
                for times, job in jobs if forward else reversed(jobs):
                    times.append(job())
            results[variant] = {
                "seconds": [s for s, _ in timed],
                "counts": sorted({c for _, c in timed}),
                "hand_seconds": [s for s, _ in hand],
                "hand_counts": sorted({c for _, c in hand}),
                "one_pass_seconds": [s for s, _ in same],
                "one_pass_counts": sorted({c for _, c in same}),
            }
        # What the operator ran with (on a cluster it fits them to the executor cores).
        results["shuffle_partitions_in_runs"] = spark.conf.get("spark.sql.shuffle.partitions")
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", threshold)
        spark.stop()
    Path(args.out).write_text(json.dumps(results))


def one_pass_by_hand(
    ops: Any, lake: Any, manifest: dict[str, Any], variant: str, out: Path
) -> None:
    """The join a variant's operator runs, written by hand with both outputs in one pass:
    the profiles broadcast (``broadcast``), shuffled with the records (``keyed``: broadcast
    joins are off), or the records read as the buckets the operator reads their key groups
    as and only the profiles shuffled (``pre_keyed``)."""
    from pyspark.sql import functions as F

    import dagster_sideinputs as dsi
    from dagster_sideinputs.core.keyed import scan_buckets

    spark = lake.spark
    profile = spark.read.parquet(lake.profiles()).select(
        "customer_id", "name", "segment", "risk_score"
    )
    if variant == "pre_keyed":
        buckets = scan_buckets(spark, dsi.KeyGroups(ops.KEY_GROUPS, "key_group"))
        main = ops.bucketed(lake, manifest["keyed_main"], ops.MAIN_DDL, buckets)
    else:
        main = spark.read.parquet(manifest["main"]).select(*ops.MAIN_COLUMNS)
    if variant == "broadcast":
        profile = F.broadcast(profile)
    ops.both_outputs_by_hand(main.join(profile, "customer_id", "left"), out)


# --- the orchestrator -------------------------------------------------------------------------


def _driver(command: str, args: argparse.Namespace, out: Path, **extra: str) -> dict[str, Any]:
    from tests.cluster import run_subprocess, spark_env

    argv = [sys.executable, str(Path(__file__).resolve()), command, "--out", str(out)]
    argv += ["--work", args.work, "--rows", str(args.rows), "--side-rows", str(args.side_rows)]
    argv += ["--repeats", str(args.repeats), "--driver-memory", args.driver_memory]
    argv += ["--executor-memory", args.executor_memory]
    if args.shuffle_partitions:
        argv += ["--shuffle-partitions", str(args.shuffle_partitions)]
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", value]
    run_subprocess(argv, env=spark_env(), log=out.with_suffix(".log"), timeout_s=3600)
    return json.loads(out.read_text())


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from tests.cluster import StandaloneCluster

    work = Path(args.work)
    started = time.perf_counter()
    _driver("_prepare", args, work / "manifest.json")
    print(f"input written in {time.perf_counter() - started:.0f}s (load {_load()})")
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "standalone": []}
    with StandaloneCluster(work / "cluster", workers=2, cores=1, memory="2g") as cluster:
        masters = {"local": LOCAL, "standalone": cluster.master_url}
        for round_ in range(args.rounds):
            order = list(masters) if round_ % 2 == 0 else list(reversed(masters))
            for name in order:
                out = work / f"{name}_{round_}.json"
                started = time.perf_counter()
                result = _driver(
                    "_measure",
                    args,
                    out,
                    master=masters[name],
                    manifest=str(work / "manifest.json"),
                    round=str(round_),
                )
                runs[name].append(result)
                seconds = time.perf_counter() - started
                print(f"  round {round_ + 1} {name:<10} done in {seconds:4.0f}s (load {_load()})")
                sys.stdout.flush()
    return report(args, runs)


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "rows": args.rows,
        "side_rows": args.side_rows,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "load_after": _load(),
        "deployments": {
            name: {
                "master": results[0]["master"],
                "default_parallelism": results[0]["default_parallelism"],
                "shuffle_partitions": results[0]["shuffle_partitions"],
                "shuffle_partitions_in_runs": results[0].get("shuffle_partitions_in_runs"),
            }
            for name, results in runs.items()
        },
    }
    labels = {
        "local": "local[2] (one JVM)",
        "standalone": "standalone, 2 workers x 1 core",
    }
    for name, deployment in figures["deployments"].items():
        print(
            f"{labels[name]:<32} master={deployment['master']} default_parallelism="
            f"{deployment['default_parallelism']} shuffle_partitions="
            f"{deployment['shuffle_partitions']} (in the runs: "
            f"{deployment['shuffle_partitions_in_runs']})"
        )
    descriptions = {
        "broadcast": "broadcast map + singleton",
        "keyed": "keyed (shuffled) map + singleton, broadcast joins off",
        "pre_keyed": "pre-keyed main (key-group partitions read as buckets), keyed map + "
        "singleton, broadcast joins off; the batch job as for keyed",
    }
    for variant in VARIANTS:
        print(
            f"\n[frames, {descriptions[variant]}] {args.rows} main rows, {args.side_rows} profiles"
        )
        entry: dict[str, Any] = {}
        for name, results in runs.items():
            seconds = [s for r in results for s in r[variant]["seconds"]]
            counts = sorted({tuple(c) for r in results for c in r[variant]["counts"]})
            median = statistics.median(seconds)
            entry[name] = {
                "seconds": seconds,
                "median_s": median,
                "rec_s": args.rows / median,
                "counts": counts,
            }
            print(
                f"  {labels[name]:<32} {args.rows / median / 1e6:6.3f} M rec/s  "
                f"(median {median:6.2f} s of {len(seconds)}: "
                f"{', '.join(f'{s:.1f}' for s in seconds)})"
            )
        entry["ratio"] = entry["standalone"]["rec_s"] / entry["local"]["rec_s"]
        entry["counts_match"] = entry["standalone"]["counts"] == entry["local"]["counts"]
        print(
            f"  throughput cluster / local {entry['ratio']:5.2f}x; rows (enriched, suspicious) "
            f"{entry['local']['counts']} -> {'match' if entry['counts_match'] else 'MISMATCH'}"
        )
        for kind, label, goal in (
            ("one_pass", "the same job by hand (one pass)", 0.97),
            ("hand", "hand-written batch job", None),
        ):
            hand: dict[str, Any] = {}
            for name, results in runs.items():
                seconds = [s for r in results for s in r[variant].get(f"{kind}_seconds", [])]
                if not seconds:
                    break
                hand[name] = {"seconds": seconds, "median_s": statistics.median(seconds)}
                print(
                    f"  {label}, {labels[name]:<17} "
                    f"{args.rows / hand[name]['median_s'] / 1e6:6.3f} M rec/s  (median "
                    f"{hand[name]['median_s']:6.2f} s of {len(seconds)}: "
                    f"{', '.join(f'{s:.1f}' for s in seconds)})"
                )
            if len(hand) < len(runs):
                continue
            hand["ratio"] = hand["local"]["median_s"] / hand["standalone"]["median_s"]
            hand["operator_over_it"] = entry["ratio"] / hand["ratio"]
            # The same figure from the pairs that ran back to back: per deployment, the
            # median of the job's seconds over the operator's within each repeat (a
            # drift in load slows both of a pair alike); cluster over local.
            pairs = {
                name: statistics.median(
                    h / o
                    for r in results
                    for o, h in zip(
                        r[variant]["seconds"], r[variant][f"{kind}_seconds"], strict=True
                    )
                )
                for name, results in runs.items()
            }
            hand["paired"] = pairs
            hand["operator_over_it_paired"] = pairs["standalone"] / pairs["local"]
            hand_counts = {
                tuple(c)
                for results in runs.values()
                for r in results
                for c in r[variant][f"{kind}_counts"]
            }
            wanted = f" (goal >= {goal})" if goal else ""
            print(
                f"    its cluster / local {hand['ratio']:5.2f}x; the operator's ratio over it "
                f"{hand['operator_over_it']:5.2f}{wanted}; from the back-to-back pairs "
                f"{hand['operator_over_it_paired']:5.2f} (it / the operator: local "
                f"{pairs['local']:.2f}, cluster {pairs['standalone']:.2f}); "
                f"rows {sorted(hand_counts)}"
            )
            entry["one_pass" if kind == "one_pass" else "hand_written"] = hand
        # The deployment's cost in seconds: about the same for every job of this size, so
        # a faster job's ratio is lower for the same cost (why the goal is read against
        # the same job, not against the slower batch job).
        added: dict[str, float] = {
            "operator": entry["standalone"]["median_s"] - entry["local"]["median_s"]
        }
        for kind in ("one_pass", "hand_written"):
            if kind in entry:
                added[kind] = (
                    entry[kind]["standalone"]["median_s"] - entry[kind]["local"]["median_s"]
                )
        entry["cluster_adds_s"] = added
        print(
            "  the cluster adds (median seconds): "
            + ", ".join(f"{kind.replace('_', ' ')} {value:+.2f} s" for kind, value in added.items())
        )
        figures[variant] = entry
    # Where reading pre-keyed gains: the shuffle it saves crosses processes on the cluster.
    gains = {
        name: figures["keyed"][name]["median_s"] / figures["pre_keyed"][name]["median_s"]
        for name in runs
    }
    figures["pre_keyed_over_shuffled"] = gains
    print(
        "\n[pre-keyed against shuffled, same deployment] "
        + "; ".join(f"{labels[name]} {gain:5.2f}x" for name, gain in gains.items())
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "command", nargs="?", default="run", choices=["run", "_prepare", "_measure"]
    )
    parser.add_argument("--rows", type=int, default=4_000_000, help="main records")
    parser.add_argument("--side-rows", type=int, default=200_000, help="customer profiles")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both deployments")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per round")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--executor-memory", default="2g", help="per executor on the cluster")
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        help="spark.sql.shuffle.partitions of both deployments (default: build_spark_session's "
        "choice: 2 per core on local[2], Spark's 200 on the cluster)",
    )
    parser.add_argument("--work", help="working folder (default: a temporary one, removed)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--manifest", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.command == "_prepare":
        prepare(args)
        return
    if args.command == "_measure":
        measure(args)
        return
    temporary = args.work is None
    args.work = args.work or tempfile.mkdtemp(prefix="dsi-bench-cluster-")
    print(
        f"rows={args.rows} side_rows={args.side_rows} rounds={args.rounds} "
        f"repeats={args.repeats} shuffle_partitions={args.shuffle_partitions or 'default'} "
        f"cpus={os.cpu_count()} load={_load()}"
    )
    try:
        figures = orchestrate(args)
    finally:
        if temporary:
            shutil.rmtree(args.work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()

"""Benchmark: launch -> materialization of a sensor-style run, embedded vs attached.

    python bench/launch.py [--records 2000] [--runs 3]

The example code location behind a real ``dagster-webserver`` (Dagster's default run
launcher: each run is a new process, as a run the sensor requests is). Each measured run
is ``payments_enrichment_job`` over ``--records`` new transactions, launched with the
sensor's tags; its time is from the launch request to the materialization of
``enriched_transactions`` (Dagster's event timestamp), next to the run's own
``run_seconds`` (the operator's micro-batches). Two modes, each on a fresh instance and
lake:

- embedded: every run starts its own Spark (a JVM, Delta's jars);
- attached: runs attach to a local Spark Connect server with Delta, started once
  (``make dev``'s: ``dagster_sideinputs.core.spark.connect_server``), through
  ``DSI_SPARK_REMOTE``. Its start-up is printed apart: it is paid once.

The first run of each mode is printed apart from the others. The server is warmed up
first, as ``make dev`` does (``--no-warm-up``: its first run pays for it). Not a timed
test: the figures depend on the machine and its load.
"""

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from assets.payments import FX_START, hourly  # noqa: E402
from dagster_sideinputs.core.spark.connect_server import LocalConnectServer  # noqa: E402
from tests.cluster import free_port  # noqa: E402
from tests.dagster_layer.webserver import ASSET_JOB, serve  # noqa: E402

JOB = "payments_enrichment_job"
OUTPUT = "enriched_transactions"
SENSOR_TAGS = {"dagster/sensor_name": "payments_enrichment_sensor"}


def transactions(count: int, hour: str) -> dict:
    start = dt.datetime.strptime(hour, hourly.fmt).replace(tzinfo=dt.timezone.utc)
    config = {"count": count, "hour": start.isoformat(), "unknown_customer_share": 0.0}
    return {"ops": {"transactions": {"config": config}}}


def measure(
    root: Path, env: dict[str, str], records: int, runs: int, timeline: bool = False
) -> list[dict[str, float]]:
    """Launch -> materialization of ``runs`` runs of the job, each over ``records`` new
    transactions, behind a webserver started with ``env`` (``timeline``: print each run's
    events, in seconds since its launch)."""
    hour = hourly.get_partition_keys()[-1]
    found = []
    root.mkdir(parents=True)
    with serve(root, {"DSI_FX_START": FX_START, **env}) as server:
        server.run(ASSET_JOB, ["fraud_rules", "customer_profiles"])
        server.run(ASSET_JOB, ["fx_rates"], tags={"dagster/partition": hour})
        for _ in range(runs):
            server.run(ASSET_JOB, ["transactions"], run_config=transactions(records, hour))
            launched = time.time()
            run_id = server.launch(JOB, tags=SENSOR_TAGS)
            server.wait_for_run(run_id)
            [event] = server.materializations(OUTPUT, run_id)
            found.append(
                {
                    "launch_to_materialization_s": int(event["timestamp"]) / 1000 - launched,
                    "run_seconds": event["values"]["run_seconds"],
                    "records": event["values"]["records_processed"],
                }
            )
            print(f"    run {len(found)}: {found[-1]}", flush=True)
            if timeline:
                for event in server.logs(run_id):
                    at = int(event["timestamp"]) / 1000 - launched
                    print(f"      {at:6.2f} s  {event['__typename']}: {event['message'][:320]}")
    return found


def summary(name: str, results: list[dict[str, float]]) -> str:
    first, rest = results[0], results[1:]
    line = (
        f"{name:<10} first run: {first['launch_to_materialization_s']:6.1f} s "
        f"(run_seconds {first['run_seconds']:.1f})"
    )
    if rest:
        median = statistics.median(r["launch_to_materialization_s"] for r in rest)
        operator = statistics.median(r["run_seconds"] for r in rest)
        line += f"; next {len(rest)}: median {median:6.1f} s (run_seconds {operator:.1f})"
    return line + f"; {int(first['records'])} records each"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=["embedded", "attached"], default=None)
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false")
    parser.add_argument(
        "--timeline", action="store_true", help="each run's events, in seconds since its launch"
    )
    args = parser.parse_args()
    warm_up = args.warm_up
    lines = []
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as scratch:
        work = Path(scratch)
        if args.only in (None, "embedded"):
            print("embedded: every run starts its own Spark", flush=True)
            results = measure(work / "embedded", {}, args.records, args.runs, args.timeline)
            lines.append(summary("embedded", results))
        if args.only in (None, "attached"):
            print("attached: starting a Spark Connect server with Delta", flush=True)
            started = time.perf_counter()
            server = LocalConnectServer(work / "connect-server.log", port=free_port())
            with server:
                up = time.perf_counter() - started
                print(f"  server up in {up:.0f} s: {server.url}", flush=True)
                if warm_up:
                    print(f"  warmed up in {server.warm_up():.0f} s (as make dev does)")
                env = {"DSI_SPARK_REMOTE": server.url}
                results = measure(work / "attached", env, args.records, args.runs, args.timeline)
            lines.append(summary("attached", results) + f" (server start-up, once: {up:.0f} s)")
    print("\nlaunch -> materialization of enriched_transactions:")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

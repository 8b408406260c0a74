"""Run the example pipeline end to end, through Dagster, on this machine.

    python -m assets.demo            # or: make demo
    python -m assets.demo --verbose  # or: make demo VERBOSE=1

Starts from scratch: it deletes the Delta tables under ``$DSI_LAKE_ROOT`` (default
``./data/lake``) and Dagster's instance in ``$DAGSTER_HOME`` (default ``./.dagster_home``)
unless ``--keep`` is given. The runs, materializations and checks then appear in
``make dev``. Steps:

1. materialize the side inputs (profiles, fraud rules, the last hours of FX rates) and
   three hourly batches of transactions;
2. run the enrichment job: transactions are enriched, suspicious ones split out,
   transactions of unknown customers wait for their profile;
3. a late batch arrives and is routed to ``late_transactions``;
4. profiles of half of the unknown customers arrive: their transactions are released;
5. the profile timeout passes (the demo waits for it, about a minute, on purpose): the
   rest go to ``unmatched_transactions``;
6. their profiles arrive too, and the replay job feeds them back through the operator.

Each run of the operator prints the figures of the glossary (docs/operations.md):
``new_records + from_buffer = released + buffered + late + unmatched``, then the
buffer's total (``buffered_rows``) and which outputs it materialized. Without
``--verbose`` everything Spark, py4j and Dagster log goes to ``data/demo.log``.

``--kafka`` (``make demo-kafka``) runs the same steps with the transactions in a Kafka
topic: it starts a local single-node broker (Kafka's jars are fetched with Maven on first
use, see ``tests/servers/kafka.py``), or uses ``--bootstrap host:port``; transactions are
produced to the topic by ``produce_transactions_job`` and the operator reads them over
exact offset ranges.

``--seed`` and ``--hour`` pin the generated input, so that two runs (e.g. on
``local[*]`` and on a cluster: ``DSI_SPARK_MASTER=spark://...``, or over Spark Connect:
``DSI_SPARK_REMOTE=sc://...``) process the same transactions. Which transactions time
out before their profile arrives still depends on how long the steps take.
"""

import argparse
import contextlib
import datetime as dt
import itertools
import os
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _prepare_environment(fresh: bool, timeout_seconds: float, hour: str | None) -> None:
    os.environ.setdefault("DAGSTER_HOME", str(REPO / ".dagster_home"))
    os.environ.setdefault("DSI_LAKE_ROOT", str(REPO / "data" / "lake"))
    os.environ.setdefault("DSI_SPARK_UI", "false")
    os.environ["DSI_PROFILE_TIMEOUT_MINUTES"] = str(timeout_seconds / 60)
    if hour is not None:
        # The FX partitions must start before the pinned hour (by default: yesterday).
        day = dt.datetime.fromisoformat(hour).replace(hour=0, minute=0, second=0, microsecond=0)
        os.environ.setdefault(
            "DSI_FX_START", (day - dt.timedelta(days=1)).strftime("%Y-%m-%d-%H:%M")
        )
    home = Path(os.environ["DAGSTER_HOME"])
    if fresh:
        shutil.rmtree(os.environ["DSI_LAKE_ROOT"], ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(
            "telemetry:\n  enabled: false\n"
            "python_logs:\n  managed_python_loggers:\n    - dagster_sideinputs\n"
        )


@contextlib.contextmanager
def _quiet(log: Path) -> Iterator[None]:
    """Send this process's stderr (and so the JVM's, py4j's, Dagster's logs) to ``log``.

    The JVM inherits file descriptor 2 when Spark starts, so the descriptor itself is
    redirected, not only ``sys.stderr``. A failure is still shown, with the log's path.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    saved = os.dup(2)
    sys.stderr.flush()
    with log.open("w") as target:
        os.dup2(target.fileno(), 2)
        try:
            yield
        except BaseException:
            sys.stderr.flush()
            os.dup2(saved, 2)
            print(f"The demo failed; its full log is {log}", file=sys.stderr)
            traceback.print_exc()
            raise SystemExit(1) from None
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def _kafka(bootstrap: str | None) -> Iterator[str]:
    """Where the transactions topic lives: a broker started here, or the given one."""
    topic = os.environ.setdefault("DSI_KAFKA_TOPIC", "transactions")
    if bootstrap:
        yield bootstrap
        return
    from tests.servers.kafka import KafkaBroker  # a real broker from Kafka's own jars

    print("Starting a local Kafka broker (jars fetched with Maven on first use)...")
    with KafkaBroker() as broker:
        broker.create_topic(topic, partitions=4)
        print(f"Kafka broker on {broker.bootstrap_servers}, topic {topic!r} (4 partitions)")
        yield broker.bootstrap_servers


def _short(path: str | Path) -> str:
    """A path relative to the current folder when it is under it (as the docs show it)."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def run_summary(result: object) -> str:
    """One line of a run of the operator, in the glossary's words (docs/operations.md)."""
    import dagster as dg

    from dagster_sideinputs.dagster_layer.figures import figures_line

    assert isinstance(result, dg.ExecuteInProcessResult)
    materialized, created, observed = [], [], []
    figures: dict[str, int] = {}
    for event in result.all_events:
        if event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
            data = event.step_materialization_data.materialization
            rows = data.metadata.get("rows_written")
            # A table the run created but wrote no row to is materialized (it now
            # exists); say so rather than list it beside the tables that got rows.
            empty = rows is not None and rows.value == 0
            (created if empty else materialized).append(data.asset_key.to_user_string())
        elif event.event_type == dg.DagsterEventType.ASSET_OBSERVATION:
            data = event.asset_observation_data.asset_observation
            observed.append(data.asset_key.to_user_string())
        else:
            continue
        if data.asset_key.path == ["enriched_transactions"]:
            figures = {label: entry.value for label, entry in data.metadata.items()}
    return (
        f"{figures_line(figures)}; buffered_rows={figures['buffered_rows']}\n"
        f"    materialized: {', '.join(materialized) or 'none'}"
        + (f"; created (0 rows): {', '.join(created)}" if created else "")
        + (f"; nothing written to: {', '.join(observed)}" if observed else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the payments example end to end.")
    parser.add_argument("--keep", action="store_true", help="keep earlier tables and runs")
    parser.add_argument(
        "--timeout-seconds",
        type=float,
        # make demo and make dev declare the same (the Makefile's variable), so the UI
        # shows the timeout the demo's runs used.
        default=float(os.environ.get("DSI_PROFILE_TIMEOUT_MINUTES", "1")) * 60,
        help="how long transactions wait for a missing profile (default: "
        "$DSI_PROFILE_TIMEOUT_MINUTES, else 60 s; 30 minutes in the example's code)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="seed of the generated transactions (batch i uses seed + i); default: a new "
        "seed per run",
    )
    parser.add_argument(
        "--hour",
        help="ISO timestamp of the hour the transactions and FX rates are generated around "
        "(default: the current hour)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show Spark's, py4j's and Dagster's logs instead of writing them to data/demo.log",
    )
    parser.add_argument(
        "--kafka",
        action="store_true",
        help="read the transactions from a Kafka topic (starts a local broker unless "
        "--bootstrap is given)",
    )
    parser.add_argument("--bootstrap", help="with --kafka: an existing broker's host:port")
    args = parser.parse_args()
    _prepare_environment(fresh=not args.keep, timeout_seconds=args.timeout_seconds, hour=args.hour)
    with contextlib.ExitStack() as stack:
        if args.kafka:
            os.environ["DSI_TRANSACTIONS_SOURCE"] = "kafka"
            os.environ["DSI_KAFKA_BOOTSTRAP"] = stack.enter_context(_kafka(args.bootstrap))
        if args.verbose:
            run(args)
        else:
            with _quiet(Path(os.environ["DSI_LAKE_ROOT"]).parent / "demo.log"):
                run(args)


def run(args: argparse.Namespace) -> None:
    """The demo's steps (see the module docstring)."""
    kafka = os.environ.get("DSI_TRANSACTIONS_SOURCE") == "kafka"

    import dagster as dg

    import dagster_sideinputs as dsi
    from assets.definitions import defs
    from assets.payments import (
        customer_profiles,
        fraud_rules,
        fx_rates,
        hour_start,
        hourly,
        transactions,
    )
    from resources import RESOURCES, lake_root

    instance = dg.DagsterInstance.get()
    home = os.environ["DAGSTER_HOME"]
    repository = defs.get_repository_def()

    def materialize(assets: list, **kwargs: object) -> None:
        result = dg.materialize(assets, resources=RESOURCES, instance=instance, **kwargs)
        assert result.success

    def run_job(name: str) -> None:
        result = repository.get_job(name).execute_in_process(instance=instance)
        assert result.success
        print(f"  {name}: {run_summary(result)}")

    anchor = hour_start(args.hour)
    seeds = None if args.seed is None else itertools.count(args.seed)

    def transactions_batch(**config: object) -> None:
        config["hour"] = anchor.isoformat()  # one hour for all batches, even across :00
        if seeds is not None:
            config["seed"] = next(seeds)
        if kafka:
            produced = repository.get_job("produce_transactions_job").execute_in_process(
                instance=instance,
                run_config={"ops": {"produce_transactions": {"config": config}}},
            )
            assert produced.success
            return
        materialize([transactions], run_config={"ops": {"transactions": {"config": config}}})

    started = time.perf_counter()
    print(f"Delta tables under {_short(lake_root())}; Dagster instance in {_short(home)}")
    if not args.verbose:
        print(
            f"Spark's, py4j's and Dagster's logs: {_short(Path(lake_root()).parent / 'demo.log')}"
        )
    print("1. side inputs and three hours of transactions")
    materialize([fraud_rules])
    materialize([customer_profiles])
    keys = [(anchor - dt.timedelta(hours=h)).strftime(hourly.fmt) for h in (3, 2, 1, 0)]
    for key in keys:
        materialize([fx_rates], partition_key=key)
    for hours_back in (2, 1, 0):
        transactions_batch(hours_back=hours_back, unknown_customer_share=0.01)

    print("2. enrichment: release what is ready, buffer what waits")
    run_job("payments_enrichment_job")

    print("3. a batch with late transactions")
    transactions_batch(count=500, late_share=0.2)
    run_job("payments_enrichment_job")
    # Every transaction waiting now was first seen before this moment.
    last_wait = time.monotonic()

    print("4. half of the missing profiles arrive")
    materialize(
        [customer_profiles],
        run_config={"ops": {"customer_profiles": {"config": {"extra_customers": 25}}}},
    )
    run_job("payments_enrichment_job")

    print(
        f"5. waiting {args.timeout_seconds:.0f}s on purpose: the others time out to "
        "unmatched_transactions"
    )
    time.sleep(max(0.0, last_wait + args.timeout_seconds + 2 - time.monotonic()))
    transactions_batch(count=100, unknown_customer_share=0.0)
    run_job("payments_enrichment_job")

    print("6. the remaining profiles arrive; replay unmatched_transactions")
    materialize(
        [customer_profiles],
        run_config={"ops": {"customer_profiles": {"config": {"extra_customers": 60}}}},
    )
    run_job("replay_unmatched_transactions_job")

    storage = dsi.DeltaStorage(lake_root())
    print("Tables:")
    if kafka:
        from assets.kafka import TOPIC

        size = _topic_size(os.environ["DSI_KAFKA_BOOTSTRAP"], TOPIC)
        print(f"  {'transactions (Kafka topic)':<26} {size:>7} records")
    for name in (
        *(() if kafka else ("transactions",)),
        "enriched_transactions",
        "suspicious_transactions",
        "late_transactions",
        "unmatched_transactions",
    ):
        rows = storage.delta.snapshot(storage.table_uri(name)).num_records
        print(f"  {name:<26} {rows:>7} rows")
    print(f"Done in {time.perf_counter() - started:.0f}s. Browse it with: make dev")


def _topic_size(bootstrap: str, topic: str) -> int:
    """Records in the topic (end minus earliest offsets), asked of the brokers."""
    from dagster_sideinputs.core.sources.kafka.admin import KafkaMetadata
    from dagster_sideinputs.core.sources.kafka.declaration import KafkaInput

    metadata = KafkaMetadata(KafkaInput(bootstrap, topics=(topic,), value_format="string"), "demo")
    partitions = [(topic, p) for p in metadata.describe([topic])[topic].partitions]
    ends, starts = metadata.offsets(partitions, "latest"), metadata.offsets(partitions, "earliest")
    return sum(ends[p] - starts[p] for p in partitions)


if __name__ == "__main__":
    main()

"""Run the example pipeline end to end, through Dagster, on this machine.

    python -m assets.demo            # or: make demo

Uses Dagster's local instance in ``$DAGSTER_HOME`` (default ``./.dagster_home``), so the
runs, materializations and checks appear in ``dagster dev -w workspace.yaml`` afterwards,
and Delta tables under ``$DSI_LAKE_ROOT`` (default ``./data/lake``). Steps:

1. materialize the side inputs (profiles, fraud rules, the last hours of FX rates) and
   three hourly batches of transactions;
2. run the enrichment job: transactions are enriched, suspicious ones split out,
   transactions of unknown customers wait for their profile;
3. a late batch arrives and is routed to ``late_transactions``;
4. profiles of half of the unknown customers arrive: their transactions are released;
5. the profile timeout passes: the rest go to ``unmatched_transactions``;
6. their profiles arrive too, and the replay job feeds them back through the operator.

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
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _prepare_environment(fresh: bool, timeout_seconds: float) -> None:
    os.environ.setdefault("DAGSTER_HOME", str(REPO / ".dagster_home"))
    os.environ.setdefault("DSI_LAKE_ROOT", str(REPO / "data" / "lake"))
    os.environ.setdefault("DSI_SPARK_UI", "false")
    os.environ["DSI_PROFILE_TIMEOUT_MINUTES"] = str(timeout_seconds / 60)
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


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the payments example end to end.")
    parser.add_argument("--keep", action="store_true", help="keep earlier tables and runs")
    parser.add_argument(
        "--timeout-seconds",
        type=float,
        default=60,
        help="how long transactions wait for a missing profile (30 minutes in production)",
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
        "--kafka",
        action="store_true",
        help="read the transactions from a Kafka topic (starts a local broker unless "
        "--bootstrap is given)",
    )
    parser.add_argument("--bootstrap", help="with --kafka: an existing broker's host:port")
    args = parser.parse_args()
    _prepare_environment(fresh=not args.keep, timeout_seconds=args.timeout_seconds)
    if not args.kafka:
        _run(args)
        return
    os.environ["DSI_TRANSACTIONS_SOURCE"] = "kafka"
    with _kafka(args.bootstrap) as bootstrap:
        os.environ["DSI_KAFKA_BOOTSTRAP"] = bootstrap
        _run(args)


def _run(args: argparse.Namespace) -> None:
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
    repository = defs.get_repository_def()

    def materialize(assets: list, **kwargs: object) -> None:
        result = dg.materialize(assets, resources=RESOURCES, instance=instance, **kwargs)
        assert result.success

    def run_job(name: str) -> None:
        result = repository.get_job(name).execute_in_process(instance=instance)
        assert result.success
        for event in result.get_asset_materialization_events():
            materialization = event.step_materialization_data.materialization
            if materialization.asset_key.path == ["enriched_transactions"]:
                meta = materialization.metadata
                print(
                    f"  {name}: batches={meta['batches'].value} records_in="
                    f"{meta['records_in'].value} released={meta['released'].value} "
                    f"buffered={meta['buffered_rows'].value}"
                )

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
    print(f"Delta tables under {lake_root()}; Dagster instance in {os.environ['DAGSTER_HOME']}")
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

    print(f"5. after {args.timeout_seconds:.0f}s the others time out to unmatched_transactions")
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
    from dagster_sideinputs.core.kafka_admin import KafkaMetadata
    from dagster_sideinputs.core.kafka_input import KafkaInput

    metadata = KafkaMetadata(KafkaInput(bootstrap, topics=(topic,), value_format="string"), "demo")
    partitions = [(topic, p) for p in metadata.describe([topic])[topic].partitions]
    ends, starts = metadata.offsets(partitions, "latest"), metadata.offsets(partitions, "earliest")
    return sum(ends[p] - starts[p] for p in partitions)


if __name__ == "__main__":
    main()

"""A process running a Kafka operator to the end, or killing itself at a chosen point
(see test_kafka_crash.py).

    python -m tests.core.kafka_worker <lake root> <bootstrap servers> <topic> [<kill point>]

A kill point ``module:Class.method:n`` wraps that function so that its n-th call
SIGKILLs this process's whole group (the Python driver and its Spark JVM) before doing
anything: nothing after it runs, as when a machine dies.
"""

import datetime as dt
import json
import sys

from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core.sources.kafka.declaration import SPARK_KAFKA_PACKAGE
from tests.kill_points import arm_kill_point

TX = "tx_id long, customer_id long, amount double"
SUSPICIOUS = dsi.OutputTag("suspicious")
INVALID = dsi.OutputTag("invalid_tx")
BATCH = 150


def enrich(main, sides):
    enriched = main.select(
        "tx_id",
        "customer_id",
        "amount",
        "kafka_partition",
        "kafka_offset",
        F.col("profile.name").alias("name"),
    )
    return {dsi.MAIN: enriched, SUSPICIOUS: enriched.filter(F.col("amount") > 900).select("tx_id")}


def operator(root: str, bootstrap: str, topic: str) -> dsi.SideInputOperator:
    return dsi.SideInputOperator(
        main=dsi.MainInput.kafka(
            topic,
            bootstrap_servers=bootstrap,
            schema=TX,
            key="customer_id",
            max_records_per_batch=BATCH,
            asset="transactions",
        ),
        side_inputs={
            "profile": dsi.SideInput.map(
                "profiles",
                key="customer_id",
                missing=dsi.Wait(dt.timedelta(days=3650), then="null"),
            )
        },
        fn=enrich,
        main_output="enriched",
        side_outputs=[SUSPICIOUS],
        routes=dsi.Routes(
            invalid=INVALID
        ),  # The bridge: the kill points name its commit (the session has Delta configured,
        # so engine="auto" would pick delta-spark and no kill would land).
        storage=dsi.DeltaStorage(root, engine="delta-rs"),
    )


def main() -> int:
    root, bootstrap, topic = sys.argv[1:4]
    if len(sys.argv) > 4:
        spec = sys.argv[4]
        arm_kill_point(spec, lambda: print(f"killed at {spec}", flush=True))
    spark = dsi.build_spark_session(
        master="local[2]",
        ui_enabled=False,
        log_level="ERROR",
        shuffle_partitions=2,
        packages=[SPARK_KAFKA_PACKAGE],
    )
    result = operator(root, bootstrap, topic).run(spark)
    print(json.dumps({"batches": [b.summary() for b in result.batches]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

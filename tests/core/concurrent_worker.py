"""A separate process running the same operator as others (see test_concurrency.py).

    python -m tests.core.concurrent_worker <lake root> <wait seconds>

Exit code 0: ran; 3: refused because another run holds the operator.
"""

import sys
import time

from pyspark.sql import functions as F

import dagster_sideinputs as dsi


def slow_enrich(main, sides):
    time.sleep(6)  # keep the batch open long enough for the other process to collide
    return main.select("tx_id", F.col("profile.name").alias("name"))


def main() -> int:
    root, wait = sys.argv[1], float(sys.argv[2])
    spark = dsi.build_spark_session(master="local[1]", ui_enabled=False, log_level="ERROR")
    op = dsi.SideInputOperator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=slow_enrich,
        main_output="enriched",
        storage=dsi.DeltaStorage(root),
    )
    try:
        result = op.run(spark, wait_for_lock=wait)
    except dsi.OperatorBusyError as exc:
        print(exc, file=sys.stderr)
        return 3
    print(f"batches={len(result.batches)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

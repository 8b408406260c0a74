"""A separate process running the same operator as others (see test_concurrency.py).

    python -m tests.core.concurrent_worker <lake root> <wait seconds> [<function seconds>]

The lake's object store settings come from the ``AWS_*`` environment variables (what
``DeltaStorage`` reads), the lock's lease from ``DSI_LOCK_LEASE_SECONDS``. Prints
``ready`` once its Spark session is up, ``locked <epoch seconds>`` when it holds the
operator's lock, ``in-batch <epoch seconds>`` when the function of a batch starts, and
``batches=<n> replayed=<n>`` at the end. Exit code 0: ran; 3: refused because another
run holds the operator. With ``DSI_TEST_START_GATE`` set to a path, it waits after
``ready`` until that file exists (a test starts its JVM early and lets it run later).
"""

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core import operator as operator_module
from dagster_sideinputs.delta.store.s3 import is_s3

_operator_lock = operator_module.operator_lock


@contextlib.contextmanager
def _announced_lock(*args: Any, **kwargs: Any) -> Iterator[None]:
    """The operator's own lock, saying when it is held (the test times the take-over)."""
    with _operator_lock(*args, **kwargs):
        print(f"locked {time.time():.3f}", flush=True)
        yield


operator_module.operator_lock = _announced_lock  # type: ignore[assignment]


def main() -> int:
    root, wait = sys.argv[1], float(sys.argv[2])
    function_s = float(sys.argv[3]) if len(sys.argv) > 3 else 6.0

    def slow_enrich(main, sides):
        # Keep the batch open long enough for the other process to collide (or be killed).
        print(f"in-batch {time.time():.3f}", flush=True)
        time.sleep(function_s)
        return main.select("tx_id", F.col("profile.name").alias("name"))

    spark = dsi.build_spark_session(
        master="local[1]",
        ui_enabled=False,
        log_level="ERROR",
        delta=False,
        packages=["s3"] if is_s3(root) else (),
    )
    op = dsi.SideInputOperator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=slow_enrich,
        main_output="enriched",
        storage=dsi.DeltaStorage(root),
    )
    print("ready", flush=True)
    gate = os.environ.get("DSI_TEST_START_GATE")
    deadline = time.monotonic() + 600
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        result = op.run(spark, wait_for_lock=wait)
    except dsi.OperatorBusyError as exc:
        print(exc, file=sys.stderr)
        return 3
    replayed = sum(1 for batch in result.batches if batch.replayed)
    print(f"batches={len(result.batches)} replayed={replayed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

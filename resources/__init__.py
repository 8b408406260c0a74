"""Resources of the example code location: local Spark and a local Delta lake by default.

Environment variables point it elsewhere without code changes:

- ``DSI_SPARK_MASTER``: e.g. ``spark://10.0.0.5:7077`` (default ``local[*]``).
- ``DSI_SPARK_REMOTE``: a Spark Connect URL, e.g. ``sc://10.0.0.5:15002``.
- ``DSI_LAKE_ROOT``: where every Delta table lives (default ``./data/lake``); on a
  cluster it must be a path every executor can reach (shared filesystem).
- ``DSI_SPARK_UI``: ``false`` to run without the Spark web UI.
- ``DSI_DELTA_ENGINE``: ``auto`` (default: delta-spark, since the session configures
  Delta whenever its jars can be had; the delta-rs bridge otherwise), ``delta-spark`` or
  ``delta-rs``.
"""

import os
from pathlib import Path

import dagster_sideinputs as dsi

REPO_ROOT = Path(__file__).resolve().parents[1]


def lake_root() -> str:
    return os.environ.get("DSI_LAKE_ROOT", str(REPO_ROOT / "data" / "lake"))


spark = dsi.SparkResource(
    master=os.environ.get("DSI_SPARK_MASTER", "local[*]"),
    remote=os.environ.get("DSI_SPARK_REMOTE") or None,
    app_name="payments-example",
    ui_enabled=os.environ.get("DSI_SPARK_UI", "true").lower() != "false",
    driver_memory=os.environ.get("DSI_SPARK_DRIVER_MEMORY", "2g"),
)

io_manager = dsi.DeltaIOManager(root=lake_root(), spark=spark)

RESOURCES = {"spark": spark, "io_manager": io_manager}

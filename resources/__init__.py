"""Resources of the example code location: local Spark and a local Delta lake by default.

Environment variables point it elsewhere without code changes:

- ``DSI_SPARK_MASTER``: e.g. ``spark://10.0.0.5:7077`` (default ``local[*]``).
- ``DSI_SPARK_REMOTE``: a Spark Connect URL, e.g. ``sc://10.0.0.5:15002``.
- ``DSI_LAKE_ROOT``: where every Delta table lives (default ``./data/lake``); on a
  cluster a path every executor can reach (shared filesystem), or an S3 prefix
  (``s3a://bucket/lake``, or ``s3://``): then the session loads the s3a jars and the
  store's endpoint and credentials come from the ``AWS_*`` variables below.
- ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``: the S3 store of an S3 lake
  (each optional: AWS's default credential chain otherwise). They reach the IO manager as
  ``dg.EnvVar``: Dagster shows and stores their names, never their values, and reads them
  where the run executes.
- ``DSI_SPARK_UI``: ``false`` to run without the Spark web UI.
- ``DSI_TRANSACTIONS_SOURCE``: ``kafka`` to read transactions from Kafka
  (``assets/kafka.py``); the session then loads Spark's Kafka connector.
- ``DSI_DELTA_ENGINE``: ``auto`` (default: delta-spark, since the session configures
  Delta whenever its jars can be had; the delta-rs bridge otherwise), ``delta-spark`` or
  ``delta-rs``.
"""

import os
from pathlib import Path

import dagster as dg

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.store.s3 import is_s3

REPO_ROOT = Path(__file__).resolve().parents[1]

# The storage options an S3 lake takes from the environment (delta-rs's names).
S3_VARIABLES = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_ALLOW_HTTP",
)


def lake_root() -> str:
    return os.environ.get("DSI_LAKE_ROOT", str(REPO_ROOT / "data" / "lake"))


KAFKA_PACKAGES = (
    ["kafka"] if os.environ.get("DSI_TRANSACTIONS_SOURCE", "delta").lower() == "kafka" else []
)


def storage_options(root: str) -> dict[str, str]:
    """For an S3 lake, each ``AWS_*`` variable that is set, as a ``dg.EnvVar``."""
    if not is_s3(root):
        return {}
    found: dict[str, str] = {}
    for name in S3_VARIABLES:
        if os.environ.get(name):
            found[name] = dg.EnvVar(name)  # a str to Dagster's config system
    return found


REMOTE = os.environ.get("DSI_SPARK_REMOTE") or None

spark = dsi.SparkResource(
    master=os.environ.get("DSI_SPARK_MASTER", "local[*]"),
    remote=REMOTE,
    app_name="payments-example",
    ui_enabled=os.environ.get("DSI_SPARK_UI", "true").lower() != "false",
    driver_memory=os.environ.get("DSI_SPARK_DRIVER_MEMORY", "2g"),
    packages=[
        # Spark's Kafka connector when transactions come from Kafka, and s3a's jars
        # (fetched once into the Ivy cache by `make install`) when the lake is on S3 (a
        # Spark Connect server loads its own: start it with --packages).
        *(KAFKA_PACKAGES if REMOTE is None else ()),
        *(["s3"] if is_s3(lake_root()) and REMOTE is None else ()),
    ],
)

io_manager = dsi.DeltaIOManager(
    root=lake_root(), storage_options=storage_options(lake_root()), spark=spark
)

RESOURCES = {"spark": spark, "io_manager": io_manager}

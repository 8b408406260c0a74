"""The payments pipeline under Airflow 3: the same operator as Dagster's, as a DAG
(``assets/airflow_dags/payments_enrichment.py`` builds it from here).

``payments_enrichment`` runs when its main input's asset (``transactions``) has an
event, or when a side input's asset (``customer_profiles``, ``fx_rates`` partitions,
``fraud_rules``) has one and records wait in the buffer (the Dagster sensor's rule):
the first task decides, without Spark, the second runs the operator's available
micro-batches on local Spark (``DSI_SPARK_MASTER`` / ``DSI_SPARK_REMOTE`` point it at a
cluster or a Spark Connect server). The tables live under ``DSI_LAKE_ROOT`` (default
``./data/lake``, as the Dagster example's).

Whoever writes an input table announces it as an asset event: an Airflow task with the
asset as outlet, or an outside writer through the REST API (``POST /api/v2/assets/events``;
an ``fx_rates`` hour with ``partition_key`` its start, e.g. ``2026-05-01T10:00:00``).
``make airflow-dev`` opens the UI on ``assets/airflow_dags``. The DAG is built by a
function, outside the DAG folder: a module that makes a DAG when imported registers it
in every DAG file that imports it.
"""

import datetime as dt
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, task

from assets.payments_operator import TRANSACTIONS, declarations, payments_enrichment
from dagster_sideinputs.airflow import SideInputOperatorTask, table_asset
from dagster_sideinputs.delta.storage import DeltaStorage

LAKE_ROOT = os.environ.get("DSI_LAKE_ROOT", str(Path(__file__).resolve().parents[1] / "data/lake"))

# The Dagster assets' freshness policies (assets/payments.py), as the side inputs' max age.
MAX_AGE = {"profile": dt.timedelta(days=1), "rules": dt.timedelta(hours=12)}


def spark_settings() -> dict[str, Any]:
    """The task's Spark session (``dsi.build_spark_session``), from the environment."""
    return {
        "master": os.environ.get("DSI_SPARK_MASTER", "local[*]"),
        "remote": os.environ.get("DSI_SPARK_REMOTE") or None,
        "ui_enabled": os.environ.get("DSI_SPARK_UI", "true").lower() != "false",
        "driver_memory": os.environ.get("DSI_SPARK_DRIVER_MEMORY", "2g"),
    }


def payments_dag(
    dag_id: str = "payments_enrichment",
    lake_root: str = LAKE_ROOT,
    *,
    asset_triggered: bool = True,
    asset_prefix: str = "",
    fn: Callable[..., Any] = payments_enrichment,
    retries: int = 2,
    default_args: Mapping[str, Any] | None = None,
) -> DAG:
    """The DAG (``asset_triggered=False``: run on request only)."""
    storage = DeltaStorage(lake_root)
    side_inputs = declarations()["side_inputs"]

    def asset(name: str) -> Any:
        return table_asset(storage, name, prefix=asset_prefix, group="payments")

    main = asset(TRANSACTIONS.asset)
    schedule: Any = None
    if asset_triggered:
        schedule = main
        for side in side_inputs.values():
            schedule = schedule | asset(side.asset)
    with DAG(
        dag_id,
        schedule=schedule,
        start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        catchup=False,
        max_active_runs=1,  # one operator run at a time (its lock would make others wait)
        default_args=dict(default_args or {}),
        tags=["dagster-sideinputs", "payments"],
        doc_md=__doc__,
    ) as dag:
        enrich = SideInputOperatorTask(
            task_id="payments_enrichment",
            storage=storage,
            main=TRANSACTIONS,
            fn=fn,
            **declarations(),
            max_age=MAX_AGE,
            asset_prefix=asset_prefix,
            asset_group="payments",
            spark=spark_settings(),
            retries=retries,
            retry_delay=dt.timedelta(seconds=5),
            doc_md="Enrich transactions with profiles and FX rates; split out suspicious ones.",
        )

        @task.short_circuit(task_id="main_input_or_records_waiting")
        def worth_a_run(triggering_asset_events: Any = None) -> bool:
            """Run on new transactions (or on request); on a side input's event only when
            records wait in the buffer."""
            updated = {key.name for key in (triggering_asset_events or {})}
            if not updated or main.name in updated:
                print(f"run: {sorted(updated) or 'triggered by hand'}")
                return True
            waiting = enrich.buffered_rows()
            print(f"side inputs updated: {sorted(updated)}; {waiting} record(s) waiting")
            return waiting > 0

        worth_a_run() >> enrich
    return dag

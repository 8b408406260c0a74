"""The payments operator's declarations and function, without an orchestrator.

Transactions (main input, keyed by customer) are enriched with the customer's profile
(keyed map; a transaction of an unknown customer waits up to 30 minutes for its
profile, then goes to ``unmatched_transactions``), converted to USD with the rate of
their hour (``fx_rates``, hourly partitions: an hour waits until its partition is
there) and checked against the fraud rules (singleton). Transactions more than 2 hours
behind the newest event time go to ``late_transactions``.

Dagster runs it as ``assets/enrichment.py``, Airflow as
``assets/airflow_dags/payments_enrichment.py``: the same declarations, the same tables.
Imports no orchestrator.
"""

import datetime as dt
import os
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import dagster_sideinputs as dsi

SUSPICIOUS = dsi.OutputTag(
    "suspicious_transactions",
    description="Enriched transactions breaking a fraud rule, with the rules they break.",
)
UNMATCHED = dsi.OutputTag(
    "unmatched_transactions",
    description="Transactions whose customer profile did not arrive within the timeout.",
)
LATE = dsi.OutputTag(
    "late_transactions", description="Transactions behind the event-time watermark."
)
PROFILE_TIMEOUT = dt.timedelta(minutes=float(os.environ.get("DSI_PROFILE_TIMEOUT_MINUTES", "30")))


def declarations() -> dict[str, Any]:
    """The operator's declarations but its main input (Delta table or Kafka topic,
    ``assets/kafka.py``): the keywords of ``dsi.SideInputOperator`` and of
    ``@dsi.side_input_assets`` alike."""
    return {
        "side_inputs": {
            "profile": dsi.SideInput.map(
                "customer_profiles", key="customer_id", missing=dsi.Wait(PROFILE_TIMEOUT)
            ),
            "fx": dsi.SideInput.map(
                "fx_rates",
                key="currency",
                distribution="broadcast",
                window=dsi.Window.tumbling(dt.timedelta(hours=1), time_column="ts"),
            ),
            "rules": dsi.SideInput.singleton("fraud_rules"),
        },
        "main_output": dsi.OutputTag(
            "enriched_transactions",
            description="Transactions with customer profile, USD amount and hour.",
        ),
        "side_outputs": [SUSPICIOUS],
        "window": dsi.Window.tumbling(dt.timedelta(hours=1), watermark=dt.timedelta(hours=2)),
        "routes": dsi.Routes(late=LATE, unmatched=UNMATCHED),
    }


TRANSACTIONS = dsi.MainInput("transactions", key="customer_id", event_time="ts")
"""The main input as a Delta table."""


def payments_enrichment(main: DataFrame, sides: dsi.SideInputs) -> dsi.Outputs:
    """Enrich transactions with profiles and FX rates; split out suspicious ones."""
    rules = sides["rules"]
    enriched = main.select(
        "tx_id",
        "customer_id",
        "card_id",
        "merchant",
        "amount",
        "currency",
        "ts",
        F.round(F.col("amount") * F.col("fx.rate_to_usd"), 2).alias("amount_usd"),
        F.col("profile.name").alias("customer_name"),
        F.col("profile.segment").alias("segment"),
        F.col("profile.country").alias("country"),
        F.col("profile.risk_score").alias("risk_score"),
        F.col("window.start").alias("hour"),
    )
    broken = F.concat_ws(
        ", ",
        F.when(F.col("amount_usd") > rules.max_amount_usd, F.lit("amount")),
        F.when(F.col("risk_score") > rules.max_risk_score, F.lit("risk")),
        F.when(F.col("country").isin(list(rules.blocked_countries)), F.lit("country")),
    )
    suspicious = (
        enriched.withColumn("rules_broken", broken)
        .filter(F.col("rules_broken") != "")
        .withColumn("rules_version", F.lit(rules.version))
    )
    return {dsi.MAIN: enriched, SUSPICIOUS: suspicious}

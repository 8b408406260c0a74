"""The payments pipeline: its assets, checks, jobs, sensor and schedules."""

import dagster as dg

import dagster_sideinputs as dsi
from assets.enrichment import UNMATCHED, payments_enrichment
from assets.kafka import KAFKA_MODE, produce_transactions_job
from assets.payments import customer_profiles, fraud_rules, fx_rates, transactions

enrichment_job = dsi.build_side_input_job(payments_enrichment, name="payments_enrichment_job")
enrichment_continuous_job = dsi.build_side_input_job(
    payments_enrichment,
    name="payments_enrichment_continuous_job",
    trigger="continuous",
)
fx_rates_job = dg.define_asset_job("fx_rates_job", selection=[fx_rates])

# Transactions: the Delta table (default), or a Kafka topic (DSI_TRANSACTIONS_SOURCE=kafka),
# an external asset fed by produce_transactions_job.
main_input = dsi.kafka_topic_asset(payments_enrichment) if KAFKA_MODE else transactions

# The one Definitions object of this module is what the defs folder loads from it.
defs = dg.Definitions(
    assets=[main_input, customer_profiles, fx_rates, fraud_rules, payments_enrichment],
    asset_checks=[dsi.build_side_input_checks(payments_enrichment)],
    jobs=[
        enrichment_job,
        enrichment_continuous_job,
        dsi.build_replay_job(
            payments_enrichment, UNMATCHED, name="replay_unmatched_transactions_job"
        ),
        dg.define_asset_job(
            "refresh_reference_data",
            selection=dg.AssetSelection.assets(customer_profiles, fraud_rules),
            description="Rematerialize the unpartitioned side inputs (profiles, fraud rules).",
        ),
        *([produce_transactions_job] if KAFKA_MODE else []),
    ],
    sensors=[
        dsi.build_side_input_sensor(
            payments_enrichment, job=enrichment_job, minimum_interval_seconds=30
        )
    ],
    schedules=[
        dg.ScheduleDefinition(
            name="payments_enrichment_every_15_minutes",
            job=enrichment_job,
            cron_schedule="*/15 * * * *",
            description="Catch up on transactions every 15 minutes (the sensor reacts faster).",
        ),
        dg.build_schedule_from_partitioned_job(fx_rates_job, name="fx_rates_hourly"),
    ],
)

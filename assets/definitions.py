"""The code location: ``dagster dev -w workspace.yaml`` loads ``defs`` from here."""

import dagster as dg

import dagster_sideinputs as dsi
from assets.enrichment import UNMATCHED, payments_enrichment
from assets.kafka import KAFKA_MODE, produce_transactions_job
from assets.payments import customer_profiles, fraud_rules, fx_rates, transactions
from resources import RESOURCES

enrichment_checks = dsi.build_side_input_checks(payments_enrichment)
enrichment_job = dsi.build_side_input_job(payments_enrichment, name="payments_enrichment_job")
enrichment_continuous_job = dsi.build_side_input_job(
    payments_enrichment,
    name="payments_enrichment_continuous_job",
    trigger="continuous",
)
replay_unmatched_job = dsi.build_replay_job(
    payments_enrichment, UNMATCHED, name="replay_unmatched_transactions_job"
)
sources_job = dg.define_asset_job(
    "refresh_reference_data",
    selection=dg.AssetSelection.assets(customer_profiles, fraud_rules),
    description="Rematerialize the unpartitioned side inputs (profiles, fraud rules).",
)

enrichment_sensor = dsi.build_side_input_sensor(
    payments_enrichment, job=enrichment_job, minimum_interval_seconds=30
)
enrichment_schedule = dg.ScheduleDefinition(
    name="payments_enrichment_every_15_minutes",
    job=enrichment_job,
    cron_schedule="*/15 * * * *",
    description="Catch up on transactions every 15 minutes (the sensor reacts faster).",
)
fx_schedule = dg.build_schedule_from_partitioned_job(
    dg.define_asset_job("fx_rates_job", selection=[fx_rates]),
    name="fx_rates_hourly",
)

# Transactions: the Delta table (default), or a Kafka topic (DSI_TRANSACTIONS_SOURCE=kafka),
# an external asset fed by produce_transactions_job.
main_input = dsi.kafka_topic_asset(payments_enrichment) if KAFKA_MODE else transactions
producers = [produce_transactions_job] if KAFKA_MODE else []

defs = dg.Definitions(
    assets=[main_input, customer_profiles, fx_rates, fraud_rules, payments_enrichment],
    jobs=[enrichment_job, enrichment_continuous_job, replay_unmatched_job, sources_job, *producers],
    asset_checks=[enrichment_checks],
    sensors=[enrichment_sensor],
    schedules=[enrichment_schedule, fx_schedule],
    resources=RESOURCES,
    # One Spark session per run: the in-process executor keeps every step in the run's
    # process instead of starting a JVM per step.
    executor=dg.in_process_executor,
)

"""The inputs of the payments pipeline, generated locally (nothing is downloaded).

- ``transactions``: the main stream; each materialization appends a batch of card
  transactions of the current hour (some for customers without a profile yet, some
  arriving hours late).
- ``customer_profiles``: one row per customer; expected daily (freshness policy).
- ``fx_rates``: hourly partitioned exchange rates to USD; each partition is one hour.
  The partitions start at the beginning of yesterday (UTC), near the generated data,
  or at ``DSI_FX_START`` (``YYYY-MM-DD-HH:MM``).
- ``fraud_rules``: one row of thresholds; expected every 12 hours.

Each asset says its role for the operator in ``assets/enrichment.py``: the tag
``dsi/role`` and a kind (``main_input`` or ``side_input``), shown in the lineage.
"""

import datetime as dt
import hashlib
import os

import dagster as dg
from pydantic import Field
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import dagster_sideinputs as dsi

CUSTOMERS = 1_000
CURRENCIES = {"USD": 1.0, "EUR": 1.08, "GBP": 1.27, "JPY": 0.0067, "CHF": 1.12}


def _fx_start() -> str:
    """The first FX partition: ``DSI_FX_START``, or the start of yesterday (UTC).

    The demo and the UI work with the last few hours; a start years back would show
    thousands of empty partitions.
    """
    configured = os.environ.get("DSI_FX_START")
    if configured:
        return configured
    today = dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return (today - dt.timedelta(days=1)).strftime("%Y-%m-%d-%H:%M")


FX_START = _fx_start()

hourly = dg.HourlyPartitionsDefinition(start_date=FX_START, end_offset=1)


def _seed(context: dg.OpExecutionContext | dg.AssetExecutionContext) -> int:
    return int(hashlib.sha1(context.run_id.encode()).hexdigest()[:8], 16)


def _uniform(seed: int, stream: int) -> Column:
    """A uniform draw in [0, 1) per row, a pure function of (seed, stream, row id).

    Unlike ``F.rand(seed)``, whose values depend on how rows fall into partitions, it
    gives the same rows on ``local[*]`` and on any cluster.
    """
    bits = F.pmod(F.xxhash64(F.lit(seed), F.lit(stream), F.col("id")), F.lit(1 << 30))
    return bits / float(1 << 30)


def hour_start(iso: str | None = None) -> dt.datetime:
    """The start (UTC) of the hour of an ISO timestamp (UTC if naive), or of the current hour."""
    if iso is None:
        moment = dt.datetime.now(dt.timezone.utc)
    else:
        moment = dt.datetime.fromisoformat(iso)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.astimezone(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)


class TransactionBatch(dg.Config):
    """How many transactions one materialization appends, and how messy they are."""

    count: int = Field(default=5_000, description="Transactions in this batch.")
    unknown_customer_share: float = Field(
        default=0.01, description="Share of transactions by customers with no profile yet."
    )
    hours_back: int = Field(
        default=0, description="Event times fall in the hour this many hours before now."
    )
    late_share: float = Field(
        default=0.0, description="Share of transactions whose event time is 6 hours older."
    )
    seed: int | None = Field(
        default=None,
        description="Seed of the generated rows (and of their tx_id range); default: derived "
        "from the run id, so every run appends new transactions.",
    )
    hour: str | None = Field(
        default=None,
        description="ISO timestamp (UTC if naive) whose hour `hours_back` counts from; "
        "default: the current hour.",
    )


@dg.asset(
    group_name="payments",
    kinds={"spark", "delta", "main_input"},
    tags={"dsi/role": "main_input"},
    metadata={"write_mode": "append"},
    description="Main input of payments_enrichment: card transactions, appended batch by "
    "batch, keyed by customer_id, event time ts.",
)
def transactions(
    context: dg.AssetExecutionContext, config: TransactionBatch, spark: dsi.SparkResource
) -> DataFrame:
    return generate_transactions(context, config, spark)


def generate_transactions(
    context: dg.OpExecutionContext | dg.AssetExecutionContext,
    config: TransactionBatch,
    spark: dsi.SparkResource,
) -> DataFrame:
    """A batch of transactions (also what ``assets/kafka.py`` produces to the topic)."""
    session = spark.spark_session  # first: F.lit needs an active SparkContext in this process
    seed = _seed(context) if config.seed is None else config.seed
    hour = hour_start(config.hour) - dt.timedelta(hours=config.hours_back)
    hour_seconds = int(hour.timestamp())
    currencies = F.array(*[F.lit(c) for c in CURRENCIES])
    rows = session.range(config.count).select(
        (F.lit(seed).cast("long") * 1_000_000 + F.col("id")).alias("tx_id"),
        F.when(
            _uniform(seed, 0) < config.unknown_customer_share,
            (F.lit(CUSTOMERS) + 1 + (_uniform(seed, 1) * 50).cast("long")),
        )
        .otherwise((_uniform(seed, 2) * CUSTOMERS).cast("long") + 1)
        .alias("customer_id"),
        F.concat(F.lit("card-"), (_uniform(seed, 3) * 3_000).cast("long").cast("string")).alias(
            "card_id"
        ),
        F.concat(F.lit("merchant-"), (_uniform(seed, 4) * 200).cast("long").cast("string")).alias(
            "merchant"
        ),
        F.round(F.exp(_uniform(seed, 5) * 9), 2).alias("amount"),
        F.element_at(currencies, (_uniform(seed, 6) * len(CURRENCIES)).cast("int") + 1).alias(
            "currency"
        ),
        F.timestamp_seconds(
            F.lit(hour_seconds)
            + (_uniform(seed, 7) * 3599).cast("long")
            - F.when(_uniform(seed, 8) < config.late_share, F.lit(6 * 3600)).otherwise(F.lit(0))
        ).alias("ts"),
    )
    context.log.info(f"{config.count} transactions around {hour.isoformat()}")
    return rows


class ProfilesConfig(dg.Config):
    """Customers beyond the base population, e.g. to let waiting transactions through."""

    extra_customers: int = Field(
        default=0, description="Also write profiles for this many customers past the base 1000."
    )


@dg.asset(
    group_name="payments",
    kinds={"spark", "delta", "side_input"},
    tags={"dsi/role": "side_input"},
    freshness_policy=dg.FreshnessPolicy.time_window(fail_window=dt.timedelta(days=1)),
    description="Side input 'profile' of payments_enrichment: customer profiles, a map by "
    "customer_id (expected daily).",
)
def customer_profiles(spark: dsi.SparkResource, config: ProfilesConfig) -> DataFrame:
    session = spark.spark_session  # first: F.lit needs an active SparkContext in this process
    segments = F.array(F.lit("retail"), F.lit("business"), F.lit("private"))
    countries = F.array(*[F.lit(c) for c in ("DE", "FR", "GB", "US", "JP", "CH", "XX")])
    return session.range(1, CUSTOMERS + 1 + config.extra_customers).select(
        F.col("id").alias("customer_id"),
        F.concat(F.lit("customer "), F.col("id").cast("string")).alias("name"),
        F.element_at(segments, (F.col("id") % 3 + 1).cast("int")).alias("segment"),
        F.element_at(countries, (F.col("id") % 7 + 1).cast("int")).alias("country"),
        F.round((F.col("id") * 7919 % 1000) / 1000, 3).alias("risk_score"),
    )


@dg.asset(
    group_name="payments",
    kinds={"spark", "delta", "side_input"},
    tags={"dsi/role": "side_input"},
    partitions_def=hourly,
    description="Side input 'fx' of payments_enrichment: exchange rates to USD, one partition "
    "per hour (an hour's transactions wait for its partition).",
)
def fx_rates(context: dg.AssetExecutionContext, spark: dsi.SparkResource) -> DataFrame:
    window = context.partition_time_window
    wobble = 1 + 0.01 * ((window.start.hour % 12) - 6) / 6
    rows = [
        (currency, round(rate * wobble, 6), window.start + dt.timedelta(minutes=1))
        for currency, rate in CURRENCIES.items()
    ]
    return spark.spark_session.createDataFrame(
        rows, "currency string, rate_to_usd double, ts timestamp"
    )


@dg.asset(
    group_name="payments",
    kinds={"spark", "delta", "side_input"},
    tags={"dsi/role": "side_input"},
    freshness_policy=dg.FreshnessPolicy.time_window(fail_window=dt.timedelta(hours=12)),
    description="Side input 'rules' of payments_enrichment: fraud thresholds, one row "
    "(expected every 12 hours; transactions wait while stale).",
)
def fraud_rules(spark: dsi.SparkResource) -> DataFrame:
    return spark.spark_session.createDataFrame(
        [(4_000.0, 0.95, ["XX"], 3)],
        "max_amount_usd double, max_risk_score double, blocked_countries array<string>, "
        "version int",
    )

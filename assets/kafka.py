"""The payments pipeline reading its transactions from Kafka (``make demo-kafka``).

With ``DSI_TRANSACTIONS_SOURCE=kafka`` the operator's main input is the Kafka topic
``$DSI_KAFKA_TOPIC`` (default ``transactions``) on ``$DSI_KAFKA_BOOTSTRAP`` (default
``127.0.0.1:9092``), shown in the lineage as an external asset of kind ``kafka``, and
the job ``produce_transactions`` writes generated transactions to it (JSON values keyed
by customer, through Spark's Kafka sink: the Java producer's default partitioner). The
rest of the pipeline is unchanged. Without the variable, transactions are the Delta
table of ``assets/payments.py`` and no broker is needed.
"""

import os

import dagster as dg
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from assets.payments import TransactionBatch, generate_transactions
from assets.payments_operator import TRANSACTIONS

KAFKA_MODE = os.environ.get("DSI_TRANSACTIONS_SOURCE", "delta").lower() == "kafka"
BOOTSTRAP = os.environ.get("DSI_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
TOPIC = os.environ.get("DSI_KAFKA_TOPIC", "transactions")
SCHEMA = (
    "tx_id long, customer_id long, card_id string, merchant string, amount double, "
    "currency string, ts timestamp"
)


def transactions_input() -> dsi.MainInput:
    """The operator's main input: the Delta table, or the Kafka topic in Kafka mode."""
    if not KAFKA_MODE:
        return TRANSACTIONS
    return dsi.MainInput.kafka(
        TOPIC,
        bootstrap_servers=BOOTSTRAP,
        schema=SCHEMA,
        key="customer_id",
        event_time="ts",  # the transaction's own time, as with the Delta input
        asset="transactions",
    )


@dg.op(description="Generate a batch of transactions and produce them to the Kafka topic.")
def produce_transactions(
    context: dg.OpExecutionContext, config: TransactionBatch, spark: dsi.SparkResource
) -> None:
    rows = generate_transactions(context, config, spark)
    records = rows.select(
        F.col("customer_id").cast("string").alias("key"),
        F.to_json(F.struct(*[F.col(c) for c in rows.columns])).alias("value"),
    )
    records.write.format("kafka").option("kafka.bootstrap.servers", BOOTSTRAP).option(
        "topic", TOPIC
    ).save()
    context.log.info(f"{config.count} transactions produced to {TOPIC} on {BOOTSTRAP}")


@dg.job(description="Produce a batch of generated transactions to the Kafka topic.")
def produce_transactions_job() -> None:
    produce_transactions()

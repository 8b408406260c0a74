"""The Spark Declarative Pipelines side of ``bench/operator.py --only landing``: the
hand-written stream-static join over the landing folder, as SDP runs it.

``enriched``: the landed parquet records (read as a stream) joined with the customer
profiles (read as a static table, broadcast); ``suspicious``: the enriched records above
the rules' threshold. The locations come from the environment (``SDP_*``)."""

import os

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

spark = SparkSession.active()
LANDING = os.environ["SDP_LANDING"]
PROFILES = os.environ["SDP_PROFILES"]
THRESHOLD = float(os.environ["SDP_THRESHOLD"])
SCHEMA = os.environ["SDP_SCHEMA"]


@dp.table
def enriched() -> DataFrame:
    records = spark.readStream.schema(SCHEMA).parquet(LANDING)
    profiles = spark.read.parquet(PROFILES).select("customer_id", "name", "segment", "risk_score")
    return records.join(F.broadcast(profiles), "customer_id", "left")


@dp.table
def suspicious() -> DataFrame:
    return spark.readStream.table("enriched").filter(F.col("amount") > F.lit(THRESHOLD))

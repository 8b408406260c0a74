"""Run the SDP pipeline of this folder several times in one Spark Connect server (a warm
JVM, as the operator's runs have) and print each run's seconds as a JSON line.

Started by ``bench/operator.py`` through ``spark-class org.apache.spark.deploy.SparkPipelines``
(what the ``spark-pipelines`` command does); argv: work folder, runs. Each run is a new
dataflow graph writing into its own database and storage, so each processes every
landed file. Timed: from the run's start to its completion (graph registration and the
server's start are not counted; pyspark's own ``spark-pipelines run`` does the same steps)."""

import json
import sys
import time
from pathlib import Path

from pyspark.pipelines.cli import load_pipeline_spec, register_definitions
from pyspark.pipelines.spark_connect_graph_element_registry import (
    SparkConnectGraphElementRegistry,
)
from pyspark.pipelines.spark_connect_pipeline import (
    create_dataflow_graph,
    handle_pipeline_events,
    start_run,
)
from pyspark.sql import SparkSession


def main() -> None:
    work, runs = Path(sys.argv[1]), int(sys.argv[2])
    spec_path = work / "spark-pipeline.yml"
    spec = load_pipeline_spec(spec_path)
    spark = SparkSession.builder.getOrCreate()
    seconds = []
    for run in range(runs):
        database = f"run_{run}"
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {database}")
        graph = create_dataflow_graph(
            spark, default_catalog=spec.catalog, default_database=database, sql_conf={}
        )
        registry = SparkConnectGraphElementRegistry(spark, graph)
        register_definitions(spec_path, registry, spec, spark, graph)
        started = time.perf_counter()
        events = start_run(
            spark,
            graph,
            full_refresh=[],
            full_refresh_all=False,
            refresh=[],
            dry=False,
            storage=(work / f"storage_{run}").as_uri(),
        )
        handle_pipeline_events(events)
        seconds.append(time.perf_counter() - started)
        counts = [spark.table(f"{database}.{t}").count() for t in ("enriched", "suspicious")]
        print("SDP-RUN " + json.dumps({"run": run, "seconds": seconds[-1], "counts": counts}))
        sys.stdout.flush()
    spark.stop()


if __name__ == "__main__":
    main()

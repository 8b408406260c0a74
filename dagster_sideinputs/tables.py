"""Delta tables from any PySpark program, through the delta-rs bridge (no Delta jars).

Spark reads and writes the parquet files, delta-rs reads the log and commits: a
program's own reads and writes of the lake (an input's first rows, a side input's
refresh, a check of an output) on any Spark session, Spark Connect included:

- :func:`read_table`: one version of a table as a distributed DataFrame;
- :func:`read_changes`: the rows appended between two versions;
- :func:`write_dataframe`: append, overwrite or replace partitions, idempotently with an
  :class:`AppTransaction`; it returns a :class:`WriteResult`;
- :func:`register_delta_source`: the ``dsi_delta`` Spark data source (batch and
  streaming) for sessions without delta-spark.

Examples:
    >>> from dagster_sideinputs.tables import AppTransaction, read_table, write_dataframe
    >>> txn = AppTransaction("loader", 7)  # doctest: +SKIP
    >>> write_dataframe(df, "/data/orders", app_transaction=txn)  # doctest: +SKIP
    >>> read_table(spark, "/data/orders", version=3).count()  # doctest: +SKIP
"""

from dagster_sideinputs.delta.bridge.read import read_changes, read_table
from dagster_sideinputs.delta.bridge.source import register_delta_source
from dagster_sideinputs.delta.bridge.writer import write_dataframe
from dagster_sideinputs.delta.engine import AppTransaction, WriteResult

__all__ = [
    "AppTransaction",
    "WriteResult",
    "read_changes",
    "read_table",
    "register_delta_source",
    "write_dataframe",
]

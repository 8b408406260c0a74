"""Reading rows of a pinned version for the delta-spark engine: the files the engine's log
reader lists (a whole version, whole partitions, or a main input's new files) through
Spark's parquet reader, column mapping translated; through Delta's reader (at
``versionAsOf``) where a file carries a deletion vector. Delta's reader would first build
the version's snapshot with Spark jobs, which the log reader has already read."""

from collections.abc import Sequence
from urllib.parse import unquote

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.delta.engine import DataFile, TableSnapshot
from dagster_sideinputs.delta.log.state import LogState, physical_name, physical_type
from dagster_sideinputs.delta.reader import read_partition_groups, read_snapshot
from dagster_sideinputs.delta.schema import quoted
from dagster_sideinputs.delta.store.files import spark_uri


def read_delta(
    spark: SparkSession, snapshot: TableSnapshot, condition: Column | bool = True
) -> DataFrame:
    """The rows of ``snapshot``'s version that match ``condition``, by Delta's reader."""
    frame = (
        spark.read.format("delta")
        .option("versionAsOf", snapshot.version)
        .load(spark_uri(snapshot.uri))
    )
    if not isinstance(condition, bool):
        frame = frame.where(condition)
    return frame.select(*[F.col(quoted(c)) for c in snapshot.schema.fieldNames()])


def read_subset(
    spark: SparkSession,
    snapshot: TableSnapshot,
    state: LogState,
    files: Sequence[DataFile],
    label: str,
    *,
    whole: Column | bool | None = None,
) -> DataFrame:
    """Files of a version (``state`` is the same version's log state) by Spark's parquet
    reader, column mapping translated. If any of them carries a deletion vector at that
    version, Delta's reader reads them instead: on ``whole`` (the condition selecting
    exactly these files' partitions, when they are whole partitions or the whole table),
    else on their file names."""
    wanted = {f.path for f in files}
    live = [f for f in state.files.values() if unquote(f.path) in wanted]
    if any(f.deletion_vector for f in live):
        if whole is not None:
            return read_delta(spark, snapshot, whole)
        names = [f.uri.rsplit("/", 1)[-1] for f in files]
        return read_delta(spark, snapshot, F.col("_metadata.file_name").isin(names))
    if not state.column_mapping:
        return read_snapshot(spark, snapshot, files=files, name=label, verify=False)
    # Column-mapped files store physical names: read by them, renamed to logical ones.
    stored = {
        f.name: T.StructField(physical_name(f), physical_type(f.dataType), True)
        for f in state.raw_schema.fields
        if f.name not in state.partition_columns
    }
    return read_partition_groups(spark, files, state.schema, state.partition_columns, stored=stored)

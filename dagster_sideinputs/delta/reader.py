"""Reading Delta tables into distributed Spark DataFrames with Spark's native parquet reader.

The file list, the schema and the partition values come from the Delta log (via
delta-rs); the rows are read by Spark's own parquet scan, so the read is as fast as
``spark.read.parquet`` and nothing passes through the driver. The DataFrame has the
Delta schema (never an inferred one) in table column order, with typed partition
columns.
"""

import functools
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.delta.engine import DataFile, TableSnapshot
from dagster_sideinputs.delta.schema import partition_key, partition_string, quoted
from dagster_sideinputs.delta.session import session_setting
from dagster_sideinputs.delta.store.files import is_local, normalize_uri, spark_uri
from dagster_sideinputs.errors import CorruptDataFileError

_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# With more than 32 paths Spark launches a distributed job just to stat them (~0.4 s for
# 60 files here, more than the scan itself); for local and shared filesystems the driver
# does it in milliseconds, so reads of local files raise the threshold. Object stores keep
# Spark's default.
_LISTING_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"


def _conforms(file: DataFile, partition_columns: Sequence[str]) -> bool:
    """Whether the file sits in ``col=value/...`` folders Spark can parse back exactly."""
    segments = file.path.split("/")[:-1]
    if len(segments) != len(partition_columns):
        return False
    for segment, column in zip(segments, partition_columns, strict=True):
        name, sep, raw = segment.partition("=")
        if name != column or not sep or not raw:
            return False
        expected = partition_string(file.partition_values.get(column))
        found = None if raw == _HIVE_NULL else unquote(raw)
        if found != expected:
            return False
    return True


def verify_files(files: Sequence[DataFile], *, table: str) -> None:
    """Cheap integrity check before reading: every file exists with its logged size.

    Only for local and shared filesystems, where a ``stat`` costs microseconds.

    Raises:
        CorruptDataFileError: naming the table, the file and the fix.
    """
    for file in files:
        if not is_local(file.uri):
            return
        try:
            size = os.stat(normalize_uri(file.uri)).st_size
        except FileNotFoundError:
            problem = "is missing"
        else:
            if size == file.size:
                continue
            problem = f"has {size} bytes but the Delta log recorded {file.size}"
        raise CorruptDataFileError(
            f"Data file {file.path!r} of table {table} {problem}; reading it would fail or "
            "return wrong rows. Nothing was read.",
            fix="restore the file from a backup, or drop it from the table with "
            f"`deltalake.DeltaTable({normalize_uri(file.uri).rsplit('/', 1)[0]!r}).repair()` "
            "(for a missing file) / `DeltaTable(uri).restore(<earlier version>)`",
        )


def read_files(
    spark: SparkSession,
    files: Sequence[DataFile],
    *,
    schema: T.StructType,
    partition_columns: Sequence[str],
    root: str,
    table: str,
    verify: bool = True,
) -> DataFrame:
    """A DataFrame over some data files of a table, with the table schema.

    Args:
        spark: the session.
        files: the data files to read (a snapshot's or an incremental range's).
        schema: the full table schema (data and partition columns), in table order.
        partition_columns: partition columns of the table.
        root: the table root (for partition discovery).
        table: name for error messages.
        verify: check existence and size of local files first.
    """
    if verify:
        verify_files(files, table=table)
    if not files:
        return spark.createDataFrame([], schema)
    uris = [spark_uri(file.uri) for file in files]
    with session_setting(spark, _LISTING_THRESHOLD, "100000" if is_local(root) else None):
        reader = spark.read.schema(schema)
        if not partition_columns:
            return reader.parquet(*uris)
        if all(_conforms(file, partition_columns) for file in files):
            # Spark derives the partition columns from the folder names, typed by `schema`.
            scan = reader.option("basePath", spark_uri(root)).parquet(*uris)
            return scan.select(*[F.col(quoted(name)) for name in schema.fieldNames()])
        return read_partition_groups(spark, files, schema, partition_columns)


def read_partition_groups(
    spark: SparkSession,
    files: Sequence[DataFile],
    schema: T.StructType,
    partition_columns: Sequence[str],
    *,
    stored: Mapping[str, T.StructField] | None = None,
) -> DataFrame:
    """One parquet scan per partition, the partition values added as typed literals: for
    layouts Spark cannot parse (foreign writers) and for column-mapped tables.

    Args:
        stored: data column -> the field as the files store it (its physical name and
            type under column mapping); read as stored, then cast to the table type and
            named as the table names it. None: the files use the table's names and types.
    """
    data_fields = [f for f in schema.fields if f.name not in partition_columns]
    in_files = [(stored or {}).get(f.name, f) for f in data_fields]
    file_schema = T.StructType([T.StructField(f.name, f.dataType, True) for f in in_files])
    groups: dict[tuple, list[str]] = {}
    for file in files:
        groups.setdefault(partition_key(file.partition_values, partition_columns), []).append(
            spark_uri(file.uri)
        )
    frames = []
    for key, uris in groups.items():
        scan = spark.read.schema(file_schema).parquet(*uris)
        columns = {
            f.name: F.col(quoted(source.name)).cast(f.dataType).alias(f.name)
            for f, source in zip(data_fields, in_files, strict=True)
        }
        for column, value in zip(partition_columns, key, strict=True):
            columns[column] = F.lit(value).cast(schema[column].dataType).alias(column)
        frames.append(scan.select(*[columns[name] for name in schema.fieldNames()]))
    return functools.reduce(DataFrame.unionByName, frames)


def select_partitions(
    files: Sequence[DataFile], partition_filter: Mapping[str, Collection[Any]] | None
) -> list[DataFile]:
    """Files whose partition values are all in the allowed sets (pruning on the driver)."""
    if not partition_filter:
        return list(files)
    allowed = {
        column: {partition_string(v) for v in values} for column, values in partition_filter.items()
    }
    return [
        file
        for file in files
        if all(
            partition_string(file.partition_values.get(column)) in values
            for column, values in allowed.items()
        )
    ]


def read_snapshot(
    spark: SparkSession,
    snapshot: TableSnapshot,
    *,
    files: Sequence[DataFile] | None = None,
    name: str | None = None,
    partition_filter: Mapping[str, Collection[Any]] | None = None,
    verify: bool = True,
) -> DataFrame:
    """A DataFrame over one already-loaded table snapshot (over ``files`` of it, when
    given), with the partitions outside ``partition_filter`` pruned; ``verify`` as for
    :func:`read_files`."""
    chosen = select_partitions(snapshot.files if files is None else files, partition_filter)
    return read_files(
        spark,
        chosen,
        schema=snapshot.schema,
        partition_columns=snapshot.partition_columns,
        root=snapshot.uri,
        table=name or snapshot.uri,
        verify=verify,
    )

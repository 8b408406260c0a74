"""The bridge's reads of a table by its location: delta-rs opens the table (one version's
metadata), Spark's parquet scan reads the rows (:mod:`~dagster_sideinputs.delta.reader`).
The public :mod:`dagster_sideinputs.tables` names them."""

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from dagster_sideinputs.delta.bridge.table import load_snapshot
from dagster_sideinputs.delta.engine import DataFile
from dagster_sideinputs.delta.log.commits import added_files
from dagster_sideinputs.delta.reader import read_snapshot
from dagster_sideinputs.delta.store.files import TableFiles, normalize_uri
from dagster_sideinputs.delta.store.s3 import configure_spark


def read_table(
    spark: SparkSession,
    uri: str,
    *,
    version: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    name: str | None = None,
    partition_filter: Mapping[str, Collection[Any]] | None = None,
) -> DataFrame:
    """Read a Delta table (latest or a given version) as a distributed DataFrame.

    Args:
        spark: the session.
        uri: the table.
        version: time travel to this version; latest when None.
        storage_options: delta-rs object store options.
        name: asset / table name for error messages.
        partition_filter: ``{column: allowed values}``; other partitions are not read.

    Raises:
        TableNotFoundError, NotADeltaTableError, UnsupportedTableFeatureError,
        CorruptDataFileError

    Examples:
        >>> read_table(spark, "/data/orders", version=3).count()  # doctest: +SKIP
    """
    configure_spark(spark, normalize_uri(uri), storage_options)
    snapshot = load_snapshot(uri, version=version, storage_options=storage_options, name=name)
    return read_snapshot(spark, snapshot, name=name, partition_filter=partition_filter)


def read_changes(
    spark: SparkSession,
    uri: str,
    *,
    start_version: int,
    end_version: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    name: str | None = None,
) -> tuple[DataFrame, int]:
    """Rows added to an append-only table by the versions in ``(start_version, end_version]``.

    ``start_version=-1`` reads everything up to ``end_version`` (its snapshot). Compaction
    commits (``dataChange: false``) add nothing.

    Returns:
        ``(rows, end_version)``; ``end_version`` is the latest version when None was given.

    Raises:
        NonAppendOnlyChangeError: a version in the range removed or rewrote data.
    """
    label = name or normalize_uri(uri)
    configure_spark(spark, normalize_uri(uri), storage_options)
    snapshot = load_snapshot(uri, version=end_version, storage_options=storage_options, name=label)
    if start_version < 0:
        return read_snapshot(spark, snapshot, name=label), snapshot.version
    files: Sequence[DataFile] = added_files(
        TableFiles(snapshot.uri, storage_options),
        start_version,
        snapshot.version,
        table=label,
        schema=snapshot.schema,
    )
    return read_snapshot(spark, snapshot, files=files, name=label), snapshot.version

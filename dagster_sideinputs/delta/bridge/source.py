"""A Spark data source over Delta tables, batch and streaming, built on delta-rs.

``spark.read.format("dsi_delta")`` and ``spark.readStream.format("dsi_delta")`` read
a Delta table through PySpark's Python Data Source API, with offsets = Delta
versions, so Structured Streaming triggers (``availableNow``, processing time) and
checkpoints work as with any source::

    register_delta_source(spark)
    stream = spark.readStream.format("dsi_delta").load("/data/transactions")
    stream.writeStream.trigger(availableNow=True).foreachBatch(fn).start()

Rows travel from a Python worker to the JVM as Arrow batches. That is slower than
Spark's native parquet scan (``bench/delta_io.py`` measures both in one run), which
is why the operator itself reads new files with :func:`read_changes` instead.

Options: ``path`` (required), ``versionAsOf`` (batch reads), ``startingVersion``
(streams: the first version to read; default: the whole table), and
``storage.<key>`` for delta-rs storage options.
"""

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema

from dagster_sideinputs.delta.bridge.table import load_snapshot
from dagster_sideinputs.delta.log.commits import added_files
from dagster_sideinputs.delta.store.files import TableFiles, is_local, normalize_uri

SOURCE_NAME = "dsi_delta"
_BATCH_ROWS = 64 * 1024


class _FilePartition(InputPartition):
    """One data file; shipped (pickled) to the Python worker that reads it."""

    def __init__(self, uri: str, partition_values: dict[str, Any]) -> None:
        super().__init__((uri, partition_values))
        self.uri = uri
        self.partition_values = partition_values


def _storage_options(options: dict[str, str]) -> dict[str, str]:
    return {k[len("storage.") :]: v for k, v in options.items() if k.startswith("storage.")}


def _read_file(
    partition: _FilePartition, schema: T.StructType, storage: dict[str, str]
) -> Iterator[pa.RecordBatch]:
    """Executor side: stream a parquet file as batches in the table schema."""
    target = to_arrow_schema(schema)
    partition_names = set(partition.partition_values)
    data_columns = [f.name for f in schema.fields if f.name not in partition_names]
    if is_local(partition.uri):
        parquet = pq.ParquetFile(normalize_uri(partition.uri))
    else:
        root, _, name = partition.uri.rpartition("/")
        parquet = pq.ParquetFile(pa.BufferReader(TableFiles(root, storage).read_bytes(name)))
    present = set(parquet.schema_arrow.names)
    for batch in parquet.iter_batches(
        batch_size=_BATCH_ROWS, columns=[c for c in data_columns if c in present]
    ):
        arrays = []
        for field in target:
            if field.name in partition_names:
                value = partition.partition_values[field.name]
                arrays.append(pa.array([value] * batch.num_rows).cast(field.type))
            elif field.name in present:
                arrays.append(batch.column(field.name).cast(field.type))
            else:  # a column added to the table after this file was written
                arrays.append(pa.nulls(batch.num_rows, field.type))
        yield pa.RecordBatch.from_arrays(arrays, schema=target)


class _BatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: T.StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        version = self.options.get("versionAsOf")
        snapshot = load_snapshot(
            self.options["path"],
            version=int(version) if version is not None else None,
            storage_options=_storage_options(self.options),
        )
        return [_FilePartition(f.uri, dict(f.partition_values)) for f in snapshot.files]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _FilePartition)
        yield from _read_file(partition, self.schema, _storage_options(self.options))


class _StreamReader(DataSourceStreamReader):
    """Offsets are ``{"version": v}``: a micro-batch reads the files added in ``(start, end]``."""

    def __init__(self, options: dict[str, str], schema: T.StructType) -> None:
        self.options = options
        self.schema = schema

    def initialOffset(self) -> dict:  # noqa: N802 (PySpark's name)
        return {"version": int(self.options.get("startingVersion", 0)) - 1}

    def latestOffset(self) -> dict:  # noqa: N802 (PySpark's name)
        snapshot = load_snapshot(
            self.options["path"], storage_options=_storage_options(self.options)
        )
        return {"version": snapshot.version}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        path = self.options["path"]
        storage = _storage_options(self.options)
        if start["version"] < 0:
            snapshot = load_snapshot(path, version=end["version"], storage_options=storage)
            return [_FilePartition(f.uri, dict(f.partition_values)) for f in snapshot.files]
        schema = load_snapshot(path, version=end["version"], storage_options=storage).schema
        files = added_files(
            TableFiles(path, storage), start["version"], end["version"], table=path, schema=schema
        )
        return [_FilePartition(f.uri, dict(f.partition_values)) for f in files]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _FilePartition)
        yield from _read_file(partition, self.schema, _storage_options(self.options))

    def commit(self, end: dict) -> None:
        """Nothing to release: offsets are table versions, which stay readable."""


class DeltaRsDataSource(DataSource):
    """``format("dsi_delta")``: Delta tables read through delta-rs, batch or streaming."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> T.StructType:
        snapshot = load_snapshot(
            self.options["path"], storage_options=_storage_options(dict(self.options))
        )
        return snapshot.schema

    def reader(self, schema: T.StructType) -> DataSourceReader:
        return _BatchReader(dict(self.options), schema)

    def streamReader(self, schema: T.StructType) -> DataSourceStreamReader:  # noqa: N802
        return _StreamReader(dict(self.options), schema)


def register_delta_source(spark: SparkSession) -> None:
    """Make ``format("dsi_delta")`` available in a session (idempotent)."""
    spark.dataSource.register(DeltaRsDataSource)

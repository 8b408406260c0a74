"""The delta-rs bridge: Spark writes and reads parquet natively, delta-rs reads the log
and commits (and a small table's few rows on the driver, :meth:`DeltaRsEngine.read_on_driver`).

It needs no Delta JVM jars, so it runs on any Spark (and over Spark Connect); it is
the fallback where delta-spark is not configured. It reads tables whose data files map
to rows one to one, and refuses (clearly) tables whose features it cannot read
correctly (deletion vectors in use, column mapping).
"""

import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from dagster_sideinputs.delta.bridge.commit import (
    ENGINE_NAME,
    HOOKS,
    append_rows,
    commit_removals,
    committed_version,
)
from dagster_sideinputs.delta.bridge.read import read_changes, read_on_driver
from dagster_sideinputs.delta.bridge.split import stage_split_dataframe
from dagster_sideinputs.delta.bridge.table import (
    commit_timestamps,
    is_table,
    load_snapshot,
    local_log,
    open_table,
)
from dagster_sideinputs.delta.bridge.writer import (
    commit_staged,
    discard_staged,
    stage_dataframe,
    validate_append,
    write_dataframe,
)
from dagster_sideinputs.delta.engine import (
    AppTransaction,
    DataFile,
    SchemaMode,
    SplitTarget,
    StagedWrite,
    TableSnapshot,
    WriteMode,
    WriteResult,
)
from dagster_sideinputs.delta.log.commits import added_files
from dagster_sideinputs.delta.log.reader import READER
from dagster_sideinputs.delta.reader import read_snapshot
from dagster_sideinputs.delta.store.files import TableFiles, normalize_uri
from dagster_sideinputs.delta.store.s3 import configure_spark


@dataclass(frozen=True)
class DeltaRsEngine:
    """Spark writes and reads parquet natively; delta-rs reads the log and commits.

    Attributes:
        storage_options: delta-rs object store options (credentials, endpoints).
    """

    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # secrets

    @property
    def name(self) -> str:
        return ENGINE_NAME

    @property
    def _options(self) -> dict[str, str] | None:
        return dict(self.storage_options) or None

    # --- metadata ------------------------------------------------------------------

    def exists(self, uri: str) -> bool:
        return is_table(uri, self.storage_options)

    def snapshot(
        self, uri: str, *, version: int | None = None, name: str | None = None
    ) -> TableSnapshot:
        return load_snapshot(uri, version=version, storage_options=self.storage_options, name=name)

    def added_files(
        self, uri: str, start_exclusive: int, end_inclusive: int, *, name: str | None = None
    ) -> list[DataFile]:
        schema = self.snapshot(uri, version=end_inclusive, name=name).schema
        return added_files(
            TableFiles(uri, self.storage_options),
            start_exclusive,
            end_inclusive,
            table=name or normalize_uri(uri),
            schema=schema,
        )

    def transaction_version(self, uri: str, app_id: str) -> int | None:
        if not self.exists(uri):
            return None
        local = local_log(uri)
        if local is not None:
            return READER.state(local, table=normalize_uri(uri)).txns.get(app_id)
        table = open_table(uri, storage_options=self.storage_options)
        version = table.transaction_version(app_id)
        return None if version is None else int(version)

    def commit_timestamps(
        self, uri: str, *, up_to: int | None = None, name: str | None = None
    ) -> list[tuple[int, dt.datetime]]:
        return commit_timestamps(uri, up_to=up_to, storage_options=self.storage_options, name=name)

    # --- reads -------------------------------------------------------------------------

    def read_snapshot(
        self,
        spark: SparkSession,
        snapshot: TableSnapshot,
        *,
        files: Sequence[DataFile] | None = None,
        partition_filter: Mapping[str, Collection[Any]] | None = None,
        name: str | None = None,
    ) -> DataFrame:
        configure_spark(spark, snapshot.uri, self.storage_options)
        return read_snapshot(
            spark, snapshot, files=files, name=name, partition_filter=partition_filter
        )

    def read_changes(
        self,
        spark: SparkSession,
        uri: str,
        *,
        start_version: int,
        end_version: int | None = None,
        name: str | None = None,
    ) -> tuple[DataFrame, int]:
        return read_changes(
            spark,
            uri,
            start_version=start_version,
            end_version=end_version,
            storage_options=self.storage_options,
            name=name,
        )

    def read_rows(self, uri: str, *, columns: Sequence[str] | None = None) -> pa.Table:
        table = open_table(uri, storage_options=self.storage_options)
        return pa.table(table.to_pyarrow_table(columns=list(columns) if columns else None))

    def read_on_driver(
        self,
        snapshot: TableSnapshot,
        *,
        columns: Sequence[str] | None = None,
        limit: int | None = None,
        name: str | None = None,
    ) -> pa.Table | None:
        return read_on_driver(
            snapshot, columns=columns, limit=limit, storage_options=self._options, name=name
        )

    # --- writes --------------------------------------------------------------------------

    def validate_append(
        self,
        schema: T.StructType,
        uri: str,
        *,
        schema_mode: SchemaMode | None = None,
        name: str | None = None,
    ) -> None:
        validate_append(
            schema, uri, schema_mode=schema_mode, storage_options=self.storage_options, name=name
        )

    def stage(
        self,
        df: DataFrame,
        uri: str,
        *,
        mode: WriteMode = "append",
        partition_by: list[str] | None = None,
        replace_partition: Mapping[str, Any] | None = None,
        schema_mode: SchemaMode | None = None,
        name: str | None = None,
        removes_files: bool = False,
    ) -> StagedWrite:
        # Staged files serve a commit that removes files as well: removes_files is moot.
        return stage_dataframe(
            df,
            uri,
            mode=mode,
            partition_by=partition_by,
            replace_partition=replace_partition,
            schema_mode=schema_mode,
            storage_options=self.storage_options,
            name=name,
        )

    def stage_split(
        self, df: DataFrame, column: str, targets: Sequence[SplitTarget]
    ) -> list[StagedWrite] | None:
        return stage_split_dataframe(df, column, targets, storage_options=self.storage_options)

    def commit(
        self,
        staged: StagedWrite,
        *,
        app_transaction: AppTransaction | None = None,
        remove_files: Sequence[DataFile] = (),
        commit_metadata: Mapping[str, Any] | None = None,
        skip_empty_commit: bool = False,
    ) -> WriteResult:
        return commit_staged(
            staged,
            app_transaction=app_transaction,
            remove_files=remove_files,
            commit_metadata=commit_metadata,
            skip_empty_commit=skip_empty_commit,
        )

    def discard(self, staged: StagedWrite) -> None:
        discard_staged(staged)

    def write(
        self,
        df: DataFrame,
        uri: str,
        *,
        mode: WriteMode = "append",
        partition_by: list[str] | None = None,
        replace_partition: Mapping[str, Any] | None = None,
        remove_files: Sequence[DataFile] = (),
        app_transaction: AppTransaction | None = None,
        schema_mode: SchemaMode | None = None,
        name: str | None = None,
        commit_metadata: Mapping[str, Any] | None = None,
        skip_empty_commit: bool = False,
    ) -> WriteResult:
        return write_dataframe(
            df,
            uri,
            mode=mode,
            partition_by=partition_by,
            replace_partition=replace_partition,
            remove_files=remove_files,
            app_transaction=app_transaction,
            schema_mode=schema_mode,
            storage_options=self.storage_options,
            name=name,
            commit_metadata=commit_metadata,
            skip_empty_commit=skip_empty_commit,
        )

    def commit_removals(
        self,
        uri: str,
        files: Sequence[DataFile],
        *,
        app_transaction: AppTransaction | None = None,
        name: str | None = None,
        commit_metadata: Mapping[str, Any] | None = None,
    ) -> WriteResult:
        return commit_removals(
            uri,
            files,
            app_transaction=app_transaction,
            storage_options=self.storage_options,
            name=name,
            commit_metadata=commit_metadata,
        )

    def append_rows(
        self,
        uri: str,
        rows: pa.Table,
        *,
        app_transaction: AppTransaction | None = None,
        name: str | None = None,
    ) -> WriteResult:
        return append_rows(
            uri,
            rows,
            app_transaction=app_transaction,
            storage_options=self.storage_options,
            name=name,
        )

    def compact(self, uri: str, *, name: str | None = None) -> None:
        if not self.exists(uri):
            return
        table = open_table(uri, storage_options=self.storage_options, name=name)
        table.optimize.compact()
        table = open_table(uri, storage_options=self.storage_options, name=name)
        table.create_checkpoint()  # the next open reads one checkpoint, not the log

    def vacuum(self, uri: str, *, retention_hours: float = 0.0) -> None:
        if not self.exists(uri):
            return
        open_table(uri, storage_options=self.storage_options).vacuum(
            retention_hours=int(retention_hours),
            enforce_retention_duration=False,
            dry_run=False,
        )

    def set_properties(
        self, uri: str, properties: Mapping[str, str], *, name: str | None = None
    ) -> None:
        label = name or uri
        table = open_table(uri, storage_options=self.storage_options, name=label)
        table.alter.set_table_properties(dict(properties), post_commithook_properties=HOOKS)
        committed_version(uri, storage_options=self.storage_options, label=label, table=table)

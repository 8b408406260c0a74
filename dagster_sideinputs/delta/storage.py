"""Where tables live, and the one interface every Delta engine implements.

Everything above this module (the operator, the IO manager) talks to Delta through
:class:`DeltaEngine`. The engine shipped here, :class:`DeltaRsEngine`, writes with
Spark + delta-rs and reads with Spark's parquet scan, because the Delta JVM jars are
not always available. A native delta-spark engine (``format("delta")`` with
``txnAppId`` / ``txnVersion`` options) can implement the same protocol where they are.
"""

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import deltalake
from pyspark.sql import DataFrame, SparkSession

from dagster_sideinputs.delta.files import join_uri, normalize_uri
from dagster_sideinputs.delta.reader import read_changes, read_files, select_partitions
from dagster_sideinputs.delta.table import DataFile, TableSnapshot, load_snapshot
from dagster_sideinputs.delta.writer import (
    AppTransaction,
    SchemaMode,
    WriteMode,
    WriteResult,
    commit_removals,
    write_dataframe,
)


@runtime_checkable
class DeltaEngine(Protocol):
    """The storage operations the operator and the Dagster layer rely on."""

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
    ) -> WriteResult: ...

    def commit_removals(
        self,
        uri: str,
        files: Sequence[DataFile],
        *,
        app_transaction: AppTransaction | None = None,
        name: str | None = None,
        commit_metadata: Mapping[str, Any] | None = None,
    ) -> WriteResult: ...

    def snapshot(
        self, uri: str, *, version: int | None = None, name: str | None = None
    ) -> TableSnapshot: ...

    def read_snapshot(
        self,
        spark: SparkSession,
        snapshot: TableSnapshot,
        *,
        files: Sequence[DataFile] | None = None,
        partition_filter: Mapping[str, Collection[Any]] | None = None,
        name: str | None = None,
    ) -> DataFrame: ...

    def read_changes(
        self,
        spark: SparkSession,
        uri: str,
        *,
        start_version: int,
        end_version: int | None = None,
        name: str | None = None,
    ) -> tuple[DataFrame, int]: ...

    def transaction_version(self, uri: str, app_id: str) -> int | None: ...

    def exists(self, uri: str) -> bool: ...


@dataclass(frozen=True)
class DeltaRsEngine:
    """Spark writes and reads parquet natively; delta-rs reads the log and commits.

    Attributes:
        storage_options: delta-rs object store options (credentials, endpoints).
    """

    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # secrets

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

    def snapshot(
        self, uri: str, *, version: int | None = None, name: str | None = None
    ) -> TableSnapshot:
        return load_snapshot(uri, version=version, storage_options=self.storage_options, name=name)

    def read_snapshot(
        self,
        spark: SparkSession,
        snapshot: TableSnapshot,
        *,
        files: Sequence[DataFile] | None = None,
        partition_filter: Mapping[str, Collection[Any]] | None = None,
        name: str | None = None,
    ) -> DataFrame:
        chosen = select_partitions(snapshot.files if files is None else files, partition_filter)
        return read_files(
            spark,
            chosen,
            schema=snapshot.schema,
            partition_columns=snapshot.partition_columns,
            root=snapshot.uri,
            table=name or snapshot.uri,
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

    def transaction_version(self, uri: str, app_id: str) -> int | None:
        if not self.exists(uri):
            return None
        return deltalake.DeltaTable(
            normalize_uri(uri), storage_options=dict(self.storage_options) or None
        ).transaction_version(app_id)

    def exists(self, uri: str) -> bool:
        return deltalake.DeltaTable.is_deltatable(
            normalize_uri(uri), dict(self.storage_options) or None
        )


@dataclass(frozen=True)
class DeltaStorage:
    """Where Delta tables live: a root folder (or bucket prefix) and its options.

    A table's location is derived from its name or asset key path:
    ``DeltaStorage("/data").table_uri(["payments", "transactions"])`` is
    ``/data/payments/transactions``. Frozen and picklable.

    Args:
        root: local folder, shared filesystem path, or object store URI.
        storage_options: delta-rs object store options.
        engine: the Delta implementation; the delta-rs bridge by default.

    Examples:
        >>> storage = DeltaStorage(root="/tmp/lake")
        >>> storage.table_uri("transactions")
        '/tmp/lake/transactions'
    """

    root: str
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # secrets
    engine: DeltaEngine | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", normalize_uri(self.root))
        if self.engine is None:
            object.__setattr__(self, "engine", DeltaRsEngine(dict(self.storage_options)))

    @property
    def delta(self) -> DeltaEngine:
        """The engine (never None after construction)."""
        assert self.engine is not None
        return self.engine

    def table_uri(self, name: str | Sequence[str]) -> str:
        """Location of a table from its name or asset key path."""
        parts = [name] if isinstance(name, str) else list(name)
        return join_uri(self.root, *parts)

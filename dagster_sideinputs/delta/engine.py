"""The one interface to Delta Lake, and the values that cross it.

Everything above the ``delta`` package (the operator's core, the Dagster layer) talks
to Delta through :class:`DeltaEngine` and never imports a Delta library. Two engines
implement it: the delta-rs bridge (:class:`~dagster_sideinputs.delta.bridge.engine.DeltaRsEngine`:
Spark writes parquet, delta-rs commits) and the native delta-spark engine.

Writes come in two phases so that a micro-batch can make every output's data before
any table shows any of it: :meth:`DeltaEngine.stage` runs the Spark job and returns a
:class:`StagedWrite` (nothing visible yet), :meth:`DeltaEngine.commit` makes it visible
in one Delta commit, carrying the batch's application transaction.
"""

import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from dagster_sideinputs.errors import DeltaTableError

WriteMode = Literal["append", "overwrite"]
SchemaMode = Literal["merge", "overwrite"]


@dataclass(frozen=True)
class AppTransaction:
    """A Delta application transaction: the write of ``version`` by application ``app_id``.

    A table remembers the highest version committed per application; a write whose
    version is not above it is skipped. The operator uses ``(operator id, batch id)``.
    """

    app_id: str
    version: int


@dataclass(frozen=True)
class DataFile:
    """One data file of a table: live in a snapshot, or added by a commit.

    Attributes:
        path: path relative to the table root, as in the Delta log (decoded).
        uri: absolute location.
        size: bytes.
        partition_values: partition column -> typed value (None for null).
        num_records: rows in the file, when the writer recorded statistics.
        min_values / max_values / null_count: column statistics, typed (timestamps are
            ``datetime``: aware UTC for ``timestamp``, naive for ``timestamp_ntz``);
            possibly empty.
        version: the commit that added the file, when known (incremental reads).
        modification_time_ms: the add action's modification time.
        deletion_vector: some of the file's rows are deleted by a deletion vector (Spark's
            parquet reader alone would read them).
    """

    path: str
    uri: str
    size: int
    partition_values: Mapping[str, Any] = field(default_factory=dict)
    num_records: int | None = None
    min_values: Mapping[str, Any] = field(default_factory=dict)
    max_values: Mapping[str, Any] = field(default_factory=dict)
    null_count: Mapping[str, Any] = field(default_factory=dict)
    version: int | None = None
    modification_time_ms: int | None = None
    deletion_vector: bool = False


@dataclass(frozen=True)
class TableSnapshot:
    """Metadata of one version of a Delta table (no data read).

    Attributes:
        table_id: the table's id from its ``metaData`` action: it changes when a table is
            deleted and created again at the same location.
        field_ids: column path -> its column-mapping id (``delta.columnMapping.id``), empty
            without column mapping: a column keeps its id through a rename, and a column
            dropped and added again under the same name gets a new one. Top-level columns
            are ``(name,)``; a nested field's path goes through its structs' names, an
            array's ``"element"``, a map's ``"key"`` / ``"value"``.
    """

    uri: str
    version: int
    schema: T.StructType
    partition_columns: tuple[str, ...]
    files: tuple[DataFile, ...]
    commit_timestamp: dt.datetime
    configuration: Mapping[str, str | None]
    table_id: str = ""
    field_ids: Mapping[tuple[str, ...], int] = field(default_factory=dict)

    @property
    def num_records(self) -> int | None:
        """Total rows, or None when some file has no statistics."""
        counts = [f.num_records for f in self.files]
        return None if any(c is None for c in counts) else sum(c for c in counts if c)

    @property
    def data_schema(self) -> T.StructType:
        """The schema of the columns stored in the data files (no partition columns)."""
        return T.StructType([f for f in self.schema.fields if f.name not in self.partition_columns])


@dataclass(frozen=True)
class WriteResult:
    """What a write did.

    Attributes:
        uri: the table.
        version: the table version after the write (the existing one when skipped).
        num_rows: rows written (0 when skipped).
        num_files: data files added.
        num_bytes: bytes added.
        skipped: True when the application transaction was already committed.
        duration_s: wall time of the whole write (staging and commit).
        engine: which engine committed (``delta-rs bridge`` or ``delta-spark``).
    """

    uri: str
    version: int
    num_rows: int
    num_files: int
    num_bytes: int
    skipped: bool
    duration_s: float
    engine: str = ""


@dataclass
class StagedWrite:
    """A table write whose data exists but is not visible yet (see :meth:`DeltaEngine.stage`).

    Attributes:
        uri / name: the table and its name for messages.
        mode / partition_by / replace_partition / schema_mode: as given to ``stage``.
        num_rows / num_files / num_bytes: what the commit will add (known after staging).
        seconds: time spent staging.
        handle: the engine's own state (staged files, a cached DataFrame, ...).
    """

    uri: str
    name: str
    mode: WriteMode
    partition_by: list[str]
    replace_partition: Mapping[str, Any] | None
    schema_mode: SchemaMode | None
    num_rows: int = 0
    num_files: int = 0
    num_bytes: int = 0
    seconds: float = 0.0
    handle: Any = None


@dataclass(frozen=True)
class SplitTarget:
    """One table of a split write (:meth:`DeltaEngine.stage_split`): the rows whose split
    column holds ``value`` are appended to ``uri``."""

    value: int
    uri: str
    name: str
    schema_mode: SchemaMode | None = None


def refused_removals(
    remove_files: Sequence[DataFile], mode: WriteMode, table_exists: bool, label: str
) -> DeltaTableError | None:
    """The error of a write removing files that :meth:`DeltaEngine.commit` refuses (files
    are removed only by an append to an existing table), or None when it is allowed."""
    if remove_files and (mode != "append" or not table_exists):
        return DeltaTableError(
            f"remove_files needs mode='append' on an existing table (table {label}).",
            fix='pass mode="append"',
        )
    return None


@runtime_checkable
class DeltaEngine(Protocol):
    """The Delta operations the operator, the IO manager and the tests rely on.

    Engines are frozen, picklable values; methods that run Spark take the session.
    """

    @property
    def name(self) -> str:
        """Shown in logs and run metadata: ``delta-rs bridge`` or ``delta-spark``."""
        ...

    # --- metadata ------------------------------------------------------------------

    def exists(self, uri: str) -> bool: ...

    def snapshot(
        self, uri: str, *, version: int | None = None, name: str | None = None
    ) -> TableSnapshot:
        """Raises TableNotFoundError, NotADeltaTableError, UnsupportedTableFeatureError."""
        ...

    def added_files(
        self, uri: str, start_exclusive: int, end_inclusive: int, *, name: str | None = None
    ) -> list[DataFile]:
        """Files added with new data by the commits in ``(start_exclusive, end_inclusive]``
        (compaction adds nothing). Raises NonAppendOnlyChangeError for a commit that
        removed data, LogCleanedUpError for a commit the log no longer has."""
        ...

    def transaction_version(self, uri: str, app_id: str) -> int | None:
        """The highest application-transaction version ``app_id`` committed (None: none)."""
        ...

    def commit_timestamps(
        self, uri: str, *, up_to: int | None = None, name: str | None = None
    ) -> list[tuple[int, dt.datetime]]:
        """``(version, commit timestamp)`` of every version the log still holds, up to
        ``up_to`` (the latest when None), oldest first; timestamps are aware UTC.

        The timestamp is the one Delta's time travel by timestamp uses: the commit's
        in-commit timestamp when the table has them, else ``commitInfo.timestamp``, else
        the commit file's modification time. Versions the log retention removed are
        absent. Temporal side inputs (``AsOf.history()``) read these, then each version
        they need with :meth:`snapshot` ``(uri, version=v)``.
        """
        ...

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
        """Rows of a pinned version (of some of its files), with the table schema."""
        ...

    def read_changes(
        self,
        spark: SparkSession,
        uri: str,
        *,
        start_version: int,
        end_version: int | None = None,
        name: str | None = None,
    ) -> tuple[DataFrame, int]: ...

    def read_rows(self, uri: str, *, columns: Sequence[str] | None = None) -> pa.Table:
        """A small table's rows on the driver (operator bookkeeping tables only)."""
        ...

    def read_on_driver(
        self,
        snapshot: TableSnapshot,
        *,
        columns: Sequence[str] | None = None,
        limit: int | None = None,
        name: str | None = None,
    ) -> pa.Table | None:
        """A small pinned version's rows (``columns`` of them, the first ``limit``) read on
        the driver without a Spark job, typed as Spark's ``toArrow`` types them; None when
        this engine reads them with Spark (the caller then does)."""
        ...

    # --- writes --------------------------------------------------------------------------

    def validate_append(
        self,
        schema: T.StructType,
        uri: str,
        *,
        schema_mode: SchemaMode | None = None,
        name: str | None = None,
    ) -> None:
        """Raises SchemaMismatchError when appending ``schema`` would be refused."""
        ...

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
        """Run the Spark job that writes ``df``'s data; nothing is visible until
        :meth:`commit`. Every error of the data or of the code computing it surfaces here.
        ``removes_files``: the commit will also remove files (an engine may stage such a
        write differently)."""
        ...

    def commit(
        self,
        staged: StagedWrite,
        *,
        app_transaction: AppTransaction | None = None,
        remove_files: Sequence[DataFile] = (),
        commit_metadata: Mapping[str, Any] | None = None,
        skip_empty_commit: bool = False,
    ) -> WriteResult:
        """Make a staged write visible in one commit, with ``remove_files`` removed in the
        same commit. Skipped (nothing changes) when the table already holds
        ``app_transaction``; with ``skip_empty_commit``, an empty write to an existing
        table that removes nothing commits nothing."""
        ...

    def stage_split(
        self, df: DataFrame, column: str, targets: Sequence[SplitTarget]
    ) -> list[StagedWrite] | None:
        """Stage appends to several tables with **one** Spark job: each row of ``df`` goes
        to the target whose ``value`` its ``column`` holds (``column`` itself is not
        written). Returns one staged write per target, in order, each committed or
        discarded like :meth:`stage`'s; None, before running anything, when this engine
        cannot do it for these tables (then stage each table's rows on its own)."""
        ...

    def discard(self, staged: StagedWrite) -> None:
        """Forget a staged write that will not be committed (removes its files)."""
        ...

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
        """:meth:`stage` then :meth:`commit` (skipped early when already committed)."""
        ...

    def commit_removals(
        self,
        uri: str,
        files: Sequence[DataFile],
        *,
        app_transaction: AppTransaction | None = None,
        name: str | None = None,
        commit_metadata: Mapping[str, Any] | None = None,
    ) -> WriteResult:
        """Remove live files in one commit, without a Spark job."""
        ...

    def append_rows(
        self,
        uri: str,
        rows: pa.Table,
        *,
        app_transaction: AppTransaction | None = None,
        name: str | None = None,
    ) -> WriteResult:
        """Append a small Arrow table from the driver (operator bookkeeping tables)."""
        ...

    def vacuum(self, uri: str, *, retention_hours: float = 0.0) -> None:
        """Delete files no version newer than ``retention_hours`` references."""
        ...

    def set_properties(
        self, uri: str, properties: Mapping[str, str], *, name: str | None = None
    ) -> None:
        """Set table properties (``delta.*`` configuration) in one metadata commit."""
        ...

    def compact(self, uri: str, *, name: str | None = None) -> None:
        """Rewrite a table's small files into few (a ``dataChange: false`` commit: rows,
        application transactions and incremental readers are unaffected), for operator
        bookkeeping tables that gain one small file per batch."""
        ...

"""The native engine: delta-spark reads and writes, usable over Spark Connect.

Everything goes through what a Spark Connect client can do: DataFrame reads and writes
in ``format("delta")`` (``versionAsOf``, ``txnAppId`` / ``txnVersion``, ``replaceWhere``,
``mergeSchema``, ``userMetadata``), Delta SQL (``VACUUM``), and Spark's readers of the
``_delta_log`` files (:mod:`~dagster_sideinputs.delta.spark_log`; local logs are read
directly). No py4j, no ``delta.tables.DeltaTable`` (its Connect plugin is not available),
no delta-rs: the session's storage credentials are the only ones.

How the operator's steps map to delta-spark (docs/DECISIONS.md has the reasoning):

- **stage**: the projected DataFrame is persisted and one aggregation materializes it
  (running the user's code and the joins) while it counts rows and checks NOT NULL
  columns and partition promises. Every error of the code or the data surfaces here;
  nothing is written.
- **commit**: one ``format("delta")`` write of the persisted rows, carrying the batch's
  application transaction (``txnAppId`` / ``txnVersion``): Delta skips it when the table
  already holds the transaction. Files to remove (the buffer's released slots) must be
  whole partitions: the write becomes ``overwrite`` + ``replaceWhere`` on them, with
  Delta's replaceWhere constraint check off for that write only, so the rows of other
  partitions are appended in the same single commit.
- **removals alone**: the same write with no rows.
- Each commit carries a unique token in ``userMetadata``, by which the engine finds the
  version it made.
"""

import contextlib
import datetime as dt
import decimal
import functools
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.delta.engine import (
    AppTransaction,
    DataFile,
    SchemaMode,
    StagedWrite,
    TableSnapshot,
    WriteMode,
    WriteResult,
)
from dagster_sideinputs.delta.files import is_local, normalize_uri, spark_uri
from dagster_sideinputs.delta.log import append_only_files
from dagster_sideinputs.delta.reader import read_files, select_partitions, verify_files
from dagster_sideinputs.delta.schema import partition_string, plan_append, plan_write_schema
from dagster_sideinputs.delta.spark_log import (
    READER,
    LogState,
    commit_changes,
    is_path_not_found,
    log_files,
    physical_name,
    physical_type,
)
from dagster_sideinputs.delta.staging import allowed_values
from dagster_sideinputs.errors import (
    ConcurrentWriteError,
    DeltaTableError,
    NotADeltaTableError,
    SchemaMismatchError,
)

ENGINE_NAME = "delta-spark"
CONSTRAINT_CHECK = "spark.databricks.delta.replaceWhere.constraintCheck.enabled"
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
_TOKEN = "dsi.write"
_CONCURRENT = (
    "DELTA_CONCURRENT",
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
)
log = logging.getLogger("dagster_sideinputs")
# Session settings are per session, and the operator's commits run one after the other;
# the lock keeps two threads of one process from overlapping their temporary settings.
_CONF_LOCK = threading.RLock()


@dataclass
class _SparkStage:
    """What the native engine keeps between staging and committing."""

    frame: DataFrame
    schema: T.StructType
    table_existed: bool
    persisted: bool


@dataclass(frozen=True)
class DeltaSparkEngine:
    """Delta Lake through delta-spark: Spark reads and writes ``format("delta")``.

    Attributes:
        session: the SparkSession for the operations that take none (removals, small
            bookkeeping tables, vacuum, and logs outside the local filesystem). When
            None, the active session is used. Not pickled: an unpickled engine is unbound.
    """

    session: SparkSession | None = None

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (DeltaSparkEngine, ())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeltaSparkEngine)

    def __hash__(self) -> int:
        return hash(ENGINE_NAME)

    def __repr__(self) -> str:
        return "DeltaSparkEngine()"

    @property
    def name(self) -> str:
        return ENGINE_NAME

    def bound(self, spark: SparkSession) -> "DeltaSparkEngine":
        """This engine, using ``spark`` for the operations that take no session."""
        return self if self.session is spark else DeltaSparkEngine(spark)

    def _spark(self, what: str) -> SparkSession:
        if self.session is not None:
            return self.session
        active = active_session()
        if active is None:
            raise DeltaTableError(
                f"The delta-spark engine needs a SparkSession to {what}, and none is bound "
                "or active.",
                fix="bind the storage to your session: storage = storage.bind(spark)",
            )
        return active

    def _files(self, uri: str) -> Any:
        root = normalize_uri(uri)
        return log_files(root, None if is_local(root) else self._spark(f"read the log of {root}"))

    def _state(self, uri: str, version: int | None = None, *, name: str | None = None) -> LogState:
        return READER.state(self._files(uri), version, table=name or normalize_uri(uri))

    def _latest(self, uri: str) -> int | None:
        return READER.latest_version(self._files(uri))

    # --- metadata ------------------------------------------------------------------

    def exists(self, uri: str) -> bool:
        return self._latest(uri) is not None

    def snapshot(
        self, uri: str, *, version: int | None = None, name: str | None = None
    ) -> TableSnapshot:
        state = self._state(uri, version, name=name)
        return TableSnapshot(
            uri=state.root,
            version=state.version,
            schema=state.schema,
            partition_columns=state.partition_columns,
            files=state.data_files(),
            commit_timestamp=dt.datetime.fromtimestamp(
                state.commit_timestamp_ms / 1000, tz=dt.timezone.utc
            ),
            configuration=state.configuration,
            table_id=state.table_id,
        )

    def added_files(
        self, uri: str, start_exclusive: int, end_inclusive: int, *, name: str | None = None
    ) -> list[DataFile]:
        label = name or normalize_uri(uri)
        state = self._state(uri, end_inclusive, name=label)
        versions = list(range(start_exclusive + 1, end_inclusive + 1))
        if not versions:
            return []
        actions = READER.commits(self._files(uri), versions, table=label)
        changes = (commit_changes(state, v, actions[v]) for v in versions)
        return append_only_files(changes, table=label)

    def transaction_version(self, uri: str, app_id: str) -> int | None:
        if not self.exists(uri):
            return None
        return self._state(uri).txns.get(app_id)

    def commit_timestamps(
        self, uri: str, *, up_to: int | None = None, name: str | None = None
    ) -> list[tuple[int, dt.datetime]]:
        return READER.commit_timestamps(
            self._files(uri), up_to=up_to, table=name or normalize_uri(uri)
        )

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
        label = name or snapshot.uri
        chosen = select_partitions(snapshot.files if files is None else files, partition_filter)
        verify_files(chosen, table=label)
        if not chosen:
            return spark.createDataFrame([], snapshot.schema)
        predicate = _whole_partitions(snapshot, chosen)
        if predicate is not None:
            frame = (
                spark.read.format("delta")
                .option("versionAsOf", snapshot.version)
                .load(spark_uri(snapshot.uri))
            )
            if not isinstance(predicate, bool):
                frame = frame.where(predicate)
            return frame.select(*[F.col(_quoted(c)) for c in snapshot.schema.fieldNames()])
        return self._read_subset(spark, snapshot, chosen, label)

    def _read_subset(
        self, spark: SparkSession, snapshot: TableSnapshot, files: Sequence[DataFile], label: str
    ) -> DataFrame:
        """Some files of a version (a main input's new files): appended files carry no
        deletion vectors, so Spark's parquet reader reads them exactly, column mapping
        translated; files with deletion vectors go through Delta's reader."""
        state = self._state(snapshot.uri, snapshot.version, name=label)
        wanted = {f.path for f in files}
        live = [f for f in state.files.values() if _decoded(f.path) in wanted]
        if any(f.deletion_vector for f in live):
            names = [f.uri.rsplit("/", 1)[-1] for f in files]
            frame = (
                spark.read.format("delta")
                .option("versionAsOf", snapshot.version)
                .load(spark_uri(snapshot.uri))
            )
            return frame.where(F.col("_metadata.file_name").isin(names)).select(
                *[F.col(_quoted(c)) for c in snapshot.schema.fieldNames()]
            )
        if not state.column_mapping:
            return read_files(
                spark,
                files,
                schema=snapshot.schema,
                partition_columns=snapshot.partition_columns,
                root=snapshot.uri,
                table=label,
                verify=False,
            )
        return _read_mapped(spark, state, files)

    def read_changes(
        self,
        spark: SparkSession,
        uri: str,
        *,
        start_version: int,
        end_version: int | None = None,
        name: str | None = None,
    ) -> tuple[DataFrame, int]:
        label = name or normalize_uri(uri)
        snapshot = self.snapshot(uri, version=end_version, name=label)
        if start_version < 0:
            return self.read_snapshot(spark, snapshot, name=label), snapshot.version
        files = self.added_files(uri, start_version, snapshot.version, name=label)
        return self.read_snapshot(spark, snapshot, files=files, name=label), snapshot.version

    def read_rows(self, uri: str, *, columns: Sequence[str] | None = None) -> pa.Table:
        spark = self._spark(f"read {uri}")
        frame = spark.read.format("delta").load(spark_uri(normalize_uri(uri)))
        if columns:
            frame = frame.select(*[F.col(_quoted(c)) for c in columns])
        return frame.toArrow()

    # --- writes --------------------------------------------------------------------------

    def validate_append(
        self,
        schema: T.StructType,
        uri: str,
        *,
        schema_mode: SchemaMode | None = None,
        name: str | None = None,
    ) -> None:
        if not self.exists(uri):
            return
        existing = self.snapshot(uri, name=name).schema
        plan_append(
            schema, existing, table=name or normalize_uri(uri), merge=schema_mode == "merge"
        )

    def _plan(
        self,
        df: DataFrame,
        uri: str,
        label: str,
        *,
        mode: WriteMode,
        partition_by: list[str] | None,
        replace_partition: Mapping[str, Any] | None,
        schema_mode: SchemaMode | None,
    ) -> tuple[DataFrame, T.StructType, list[str], bool]:
        """(projected frame, table schema after the write, partition columns, existed)."""
        exists = self.exists(uri)
        if not exists:
            _refuse_foreign_folder(uri, label)
        current = self.snapshot(uri, name=label) if exists else None
        schema, projected, _, partitions = plan_write_schema(
            df,
            None if current is None else current.schema,
            [] if current is None else list(current.partition_columns),
            mode=mode,
            partition_by=list(partition_by or []),
            schema_mode=schema_mode,
            label=label,
            replace_partition=replace_partition,
        )
        return projected, schema, partitions, exists

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
    ) -> StagedWrite:
        started = time.perf_counter()
        uri = normalize_uri(uri)
        label = name or uri
        projected, schema, partitions, exists = self._plan(
            df, uri, label, mode=mode, partition_by=partition_by,
            replace_partition=replace_partition, schema_mode=schema_mode,
        )  # fmt: skip
        frame = projected.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            rows = _materialize_and_check(
                frame, schema, replace_partition if mode == "overwrite" else None, label
            )
        except BaseException:
            frame.unpersist()
            raise
        return StagedWrite(
            uri=uri,
            name=label,
            mode=mode,
            partition_by=partitions,
            replace_partition=replace_partition,
            schema_mode=schema_mode,
            num_rows=rows,
            seconds=time.perf_counter() - started,
            handle=_SparkStage(frame, schema, exists, persisted=True),
        )

    def discard(self, staged: StagedWrite) -> None:
        handle: _SparkStage = staged.handle
        if handle.persisted:
            handle.frame.unpersist()

    def commit(
        self,
        staged: StagedWrite,
        *,
        app_transaction: AppTransaction | None = None,
        remove_files: Sequence[DataFile] = (),
        commit_metadata: Mapping[str, Any] | None = None,
        skip_empty_commit: bool = False,
    ) -> WriteResult:
        try:
            return self._commit(
                staged,
                app_transaction=app_transaction,
                remove_files=remove_files,
                commit_metadata=commit_metadata,
                skip_empty_commit=skip_empty_commit,
            )
        finally:
            self.discard(staged)

    def _commit(
        self,
        staged: StagedWrite,
        *,
        app_transaction: AppTransaction | None,
        remove_files: Sequence[DataFile],
        commit_metadata: Mapping[str, Any] | None,
        skip_empty_commit: bool,
    ) -> WriteResult:
        started = time.perf_counter()
        handle: _SparkStage = staged.handle
        uri, label = staged.uri, staged.name
        if remove_files and (staged.mode != "append" or not handle.table_existed):
            raise DeltaTableError(
                f"remove_files needs mode='append' on an existing table (table {label}).",
                fix='pass mode="append"',
            )
        current = self._state(uri, name=label) if self.exists(uri) else None
        if current is not None and _holds(current, app_transaction):
            return WriteResult(uri, current.version, 0, 0, 0, True, 0.0, ENGINE_NAME)
        if current is not None and not handle.table_existed:
            # Created by another writer since staging: the data must fit its schema.
            plan_append(handle.schema, current.schema, table=label, merge=False)
        if skip_empty_commit and current is not None and not staged.num_rows and not remove_files:
            return WriteResult(uri, current.version, 0, 0, 0, False, staged.seconds, ENGINE_NAME)
        result = self._save(
            handle.frame,
            uri,
            label,
            mode=staged.mode,
            partition_by=staged.partition_by,
            replace_partition=staged.replace_partition,
            schema_mode=staged.schema_mode,
            current=current,
            remove_files=remove_files,
            app_transaction=app_transaction,
            commit_metadata=commit_metadata,
        )
        return _with_duration(result, staged.seconds + time.perf_counter() - started)

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
        """One table, so nothing to stage: Delta's write is atomic by itself (a failing
        job commits nothing), and the data is computed once."""
        started = time.perf_counter()
        uri = normalize_uri(uri)
        label = name or uri
        current = self._state(uri, name=label) if self.exists(uri) else None
        if current is not None and _holds(current, app_transaction):
            return WriteResult(
                uri, current.version, 0, 0, 0, True, time.perf_counter() - started, ENGINE_NAME
            )
        if remove_files and (mode != "append" or current is None):
            raise DeltaTableError(
                f"remove_files needs mode='append' on an existing table (table {label}).",
                fix='pass mode="append"',
            )
        projected, _, partitions, _ = self._plan(
            df, uri, label, mode=mode, partition_by=partition_by,
            replace_partition=replace_partition, schema_mode=schema_mode,
        )  # fmt: skip
        if skip_empty_commit and current is not None and not remove_files and projected.isEmpty():
            return WriteResult(
                uri, current.version, 0, 0, 0, False, time.perf_counter() - started, ENGINE_NAME
            )
        result = self._save(
            projected,
            uri,
            label,
            mode=mode,
            partition_by=partitions,
            replace_partition=replace_partition,
            schema_mode=schema_mode,
            current=current,
            remove_files=remove_files,
            app_transaction=app_transaction,
            commit_metadata=commit_metadata,
        )
        return _with_duration(result, time.perf_counter() - started)

    def _save(
        self,
        frame: DataFrame,
        uri: str,
        label: str,
        *,
        mode: WriteMode,
        partition_by: list[str],
        replace_partition: Mapping[str, Any] | None,
        schema_mode: SchemaMode | None,
        current: LogState | None,
        remove_files: Sequence[DataFile],
        app_transaction: AppTransaction | None,
        commit_metadata: Mapping[str, Any] | None,
    ) -> WriteResult:
        """One ``format("delta")`` write: the commit."""
        token = uuid.uuid4().hex
        writer = frame.write.format("delta").option(
            "userMetadata",
            json.dumps(
                {_TOKEN: token, "engineInfo.dsi": "dagster-sideinputs", **(commit_metadata or {})},
                default=str,
            ),
        )
        relax_constraint = False
        if remove_files:
            assert current is not None
            predicate = _removal_predicate(current, remove_files, label)
            writer = writer.mode("overwrite")
            if predicate is not None:
                writer = writer.option("replaceWhere", predicate)
                relax_constraint = True
        elif mode == "overwrite":
            writer = writer.mode("overwrite")
            if replace_partition:
                writer = writer.option("replaceWhere", _replace_predicate(replace_partition))
            elif schema_mode == "overwrite":
                writer = writer.option("overwriteSchema", "true")
        else:
            writer = writer.mode("append")
        if schema_mode == "merge":
            writer = writer.option("mergeSchema", "true")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        if app_transaction is not None:
            writer = writer.option("txnAppId", app_transaction.app_id).option(
                "txnVersion", str(app_transaction.version)
            )
        before = -1 if current is None else current.version
        spark = frame.sparkSession
        try:
            with _session_setting(spark, CONSTRAINT_CHECK, "false" if relax_constraint else None):
                writer.save(spark_uri(uri))
        except Exception as exc:
            raise _translated(exc, label, replace_partition) from exc
        return self._result_of(uri, label, before, token)

    def _result_of(self, uri: str, label: str, before: int, token: str) -> WriteResult:
        """The commit this write made (found by its token), or a skip: Delta skips a write
        whose application transaction the table already holds."""
        latest = self._latest(uri)
        if latest is None or latest <= before:
            return WriteResult(uri, before, 0, 0, 0, True, 0.0, ENGINE_NAME)
        versions = list(range(before + 1, latest + 1))
        actions = READER.commits(self._files(uri), versions, table=label)
        for version in reversed(versions):
            info: dict[str, Any] = next(
                (a["commitInfo"] for a in actions[version] if "commitInfo" in a), {}
            )
            if token not in str(info.get("userMetadata") or ""):
                continue
            adds = [a["add"] for a in actions[version] if "add" in a]
            metrics = info.get("operationMetrics") or {}
            rows = metrics.get("numOutputRows")
            if rows is None:
                rows = sum(
                    json.loads(a["stats"]).get("numRecords", 0) for a in adds if a.get("stats")
                )
            return WriteResult(
                uri=uri,
                version=version,
                num_rows=int(rows),
                num_files=len(adds),
                num_bytes=sum(int(a.get("size") or 0) for a in adds),
                skipped=False,
                duration_s=0.0,
                engine=ENGINE_NAME,
            )
        return WriteResult(uri, latest, 0, 0, 0, True, 0.0, ENGINE_NAME)

    def commit_removals(
        self,
        uri: str,
        files: Sequence[DataFile],
        *,
        app_transaction: AppTransaction | None = None,
        name: str | None = None,
        commit_metadata: Mapping[str, Any] | None = None,
    ) -> WriteResult:
        started = time.perf_counter()
        uri = normalize_uri(uri)
        label = name or uri
        current = self._state(uri, name=label)
        if _holds(current, app_transaction):
            return WriteResult(
                uri, current.version, 0, 0, 0, True, time.perf_counter() - started, ENGINE_NAME
            )
        spark = self._spark(f"remove files from {label}")
        empty = spark.createDataFrame([], current.schema)
        result = self._save(
            empty,
            uri,
            label,
            mode="append",
            partition_by=[],
            replace_partition=None,
            schema_mode=None,
            current=current,
            remove_files=files,
            app_transaction=app_transaction,
            commit_metadata=commit_metadata,
        )
        return _with_duration(result, time.perf_counter() - started)

    def append_rows(
        self,
        uri: str,
        rows: pa.Table,
        *,
        app_transaction: AppTransaction | None = None,
        name: str | None = None,
    ) -> WriteResult:
        spark = self._spark(f"append to {name or uri}")
        return self.write(
            spark.createDataFrame(rows),
            uri,
            app_transaction=app_transaction,
            schema_mode="merge",
            name=name,
        )

    def compact(self, uri: str, *, name: str | None = None) -> None:
        # OPTIMIZE commits with dataChange=false: rows, application transactions and
        # streaming readers are unaffected; delta-spark checkpoints every 10 versions.
        if not self.exists(uri):
            return
        spark = self._spark(f"compact {name or uri}")
        spark.sql(f"OPTIMIZE {sql_table(uri)}").collect()

    def vacuum(self, uri: str, *, retention_hours: float = 0.0) -> None:
        if not self.exists(uri):
            return
        spark = self._spark(f"vacuum {uri}")
        hours = max(0, int(retention_hours))
        with _session_setting(spark, RETENTION_CHECK, "false" if hours < 168 else None):
            spark.sql(f"VACUUM {sql_table(uri)} RETAIN {hours} HOURS").collect()


# --- helpers ---------------------------------------------------------------------------------


def active_session() -> SparkSession | None:
    """The session of this thread, else the process's default one (classic or Connect)."""
    with contextlib.suppress(Exception):
        session = SparkSession.getActiveSession()
        if session is not None:
            return session
    with contextlib.suppress(Exception):
        return SparkSession.active()
    return None


def sql_table(uri: str) -> str:
    """``delta.`<path>``` for Delta SQL on a path."""
    return "delta.`" + spark_uri(normalize_uri(uri)).replace("`", "``") + "`"


def _quoted(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def _decoded(path: str) -> str:
    return unquote(path)


def _holds(state: LogState, app_transaction: AppTransaction | None) -> bool:
    if app_transaction is None:
        return False
    committed = state.txns.get(app_transaction.app_id)
    return committed is not None and committed >= app_transaction.version


def _with_duration(result: WriteResult, seconds: float) -> WriteResult:
    return WriteResult(
        result.uri,
        result.version,
        result.num_rows,
        result.num_files,
        result.num_bytes,
        result.skipped,
        seconds,
        result.engine,
    )


@contextlib.contextmanager
def _session_setting(spark: SparkSession, key: str, value: str | None) -> Iterator[None]:
    """Set a session setting for the duration of one write (None: leave it alone)."""
    if value is None:
        yield
        return
    with _CONF_LOCK:
        previous = spark.conf.get(key, None)
        spark.conf.set(key, value)
        try:
            yield
        finally:
            if previous is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, previous)


def _refuse_foreign_folder(uri: str, label: str) -> None:
    """A folder holding files but no Delta log is someone's data: never write into it."""
    if not is_local(uri):
        return  # listing an object store prefix costs a Spark job; Delta ignores strays
    try:
        # Hidden entries (the bridge's _dsi_staging of an interrupted write) are no data.
        entries = [e for e in os.listdir(uri) if not e.startswith((".", "_"))]
    except (FileNotFoundError, NotADirectoryError):
        return
    if entries:
        raise NotADeltaTableError(
            f"Refusing to write to {label}: it holds files but is not a Delta table.",
            fix="choose an empty location, or convert the folder first (delta-spark: "
            "CONVERT TO DELTA parquet.`<path>`; delta-rs: `deltalake.convert_to_deltalake(uri)`)",
        )


def sql_literal(value: Any) -> str:
    """A Python value as a Spark SQL literal (partition predicates)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | decimal.Decimal):
        return repr(value) if not isinstance(value, decimal.Decimal) else str(value)
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP'{value.isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE'{value.isoformat()}'"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def _in_predicate(column: str, values: Collection[Any]) -> str:
    present = sorted({v for v in values if v is not None}, key=repr)
    parts = []
    if present:
        parts.append(f"{_quoted(column)} IN ({', '.join(sql_literal(v) for v in present)})")
    if any(v is None for v in values):
        parts.append(f"{_quoted(column)} IS NULL")
    return "(" + " OR ".join(parts) + ")" if parts else "false"


def _replace_predicate(replace: Mapping[str, Any]) -> str:
    allowed = allowed_values(replace)
    return " AND ".join(_in_predicate(c, values) for c, values in allowed.items())


def _removal_predicate(state: LogState, remove_files: Sequence[DataFile], label: str) -> str | None:
    """A replaceWhere predicate removing exactly ``remove_files``, which must be every
    live file of the partitions they belong to (None: every file of the table).

    Raises:
        ConcurrentWriteError: a file is not live any more, or its partitions hold more.
    """
    columns = state.partition_columns
    live = state.data_files()
    by_path = {f.path: f for f in live}
    removed = {f.path for f in remove_files}
    gone = sorted(removed - set(by_path))
    if gone:
        raise ConcurrentWriteError(
            f"The files to remove from {label} are not all live any more (e.g. {gone[0]!r}): "
            "another writer changed the table. Nothing was committed.",
            fix="rerun (batches are idempotent)",
        )

    def key(file: DataFile) -> tuple:
        return tuple(partition_string(file.partition_values.get(c)) for c in columns)

    partitions = {key(by_path[p]) for p in removed}
    extra = [f.path for f in live if key(f) in partitions and f.path not in removed]
    if extra or (not columns and len(removed) != len(live)):
        raise DeltaTableError(
            f"The delta-spark engine removes whole partitions only, and table {label} holds "
            f"other files in the partitions of the files to remove (e.g. {extra[:1]}).",
            fix="remove every file of a partition, or use the delta-rs bridge for this table",
        )
    if not columns or len(partitions) == len({key(f) for f in live}):
        return None
    typed = {key(by_path[p]): by_path[p].partition_values for p in removed}
    if len(columns) == 1:
        return _in_predicate(columns[0], [values.get(columns[0]) for values in typed.values()])
    clauses = []
    for _, values in sorted(typed.items(), key=lambda item: repr(item[0])):
        parts = [
            f"{_quoted(c)} IS NULL"
            if values.get(c) is None
            else f"{_quoted(c)} = {sql_literal(values.get(c))}"
            for c in columns
        ]
        clauses.append("(" + " AND ".join(parts) + ")")
    return " OR ".join(clauses)


def _whole_partitions(snapshot: TableSnapshot, chosen: Sequence[DataFile]) -> Column | bool | None:
    """How Delta's reader selects ``chosen`` at this version: True (every file), a
    partition predicate (every file of some partitions), or None (not expressible)."""
    if len(chosen) == len(snapshot.files) and {f.path for f in chosen} == {
        f.path for f in snapshot.files
    }:
        return True
    columns = snapshot.partition_columns
    if not columns:
        return None

    def key(file: DataFile) -> tuple:
        return tuple(partition_string(file.partition_values.get(c)) for c in columns)

    wanted = {f.path for f in chosen}
    partitions = {key(f) for f in chosen}
    if any(key(f) in partitions and f.path not in wanted for f in snapshot.files):
        return None
    typed = {key(f): f.partition_values for f in chosen}
    if len(columns) == 1:
        column = columns[0]
        values = [typed[k].get(column) for k in partitions]
        present = [v for v in values if v is not None]
        condition = F.col(_quoted(column)).isin(present) if present else F.lit(False)
        if len(present) != len(values):
            condition = condition | F.col(_quoted(column)).isNull()
        return condition
    clauses = []
    for k in partitions:
        values_ = typed[k]
        parts = [
            F.col(_quoted(c)).isNull()
            if values_.get(c) is None
            else F.col(_quoted(c)) == F.lit(values_.get(c))
            for c in columns
        ]
        clauses.append(functools.reduce(lambda a, b: a & b, parts))
    return functools.reduce(lambda a, b: a | b, clauses)


def _read_mapped(spark: SparkSession, state: LogState, files: Sequence[DataFile]) -> DataFrame:
    """Files of a column-mapped table: read by physical names, renamed to logical ones."""
    raw = state.raw_schema
    schema = state.schema
    partitions = state.partition_columns
    data_fields = [f for f in raw.fields if f.name not in partitions]
    physical = T.StructType(
        [T.StructField(physical_name(f), physical_type(f.dataType), True) for f in data_fields]
    )
    groups: dict[tuple, list[str]] = {}
    for file in files:
        key = tuple(partition_string(file.partition_values.get(c)) for c in partitions)
        groups.setdefault(key, []).append(spark_uri(file.uri))
    frames = []
    for key, uris in groups.items():
        scan = spark.read.schema(physical).parquet(*uris)
        columns: dict[str, Column] = {}
        for field_ in data_fields:
            logical = schema[field_.name].dataType
            columns[field_.name] = (
                F.col(_quoted(physical_name(field_))).cast(logical).alias(field_.name)
            )
        for column, value in zip(partitions, key, strict=True):
            columns[column] = F.lit(value).cast(schema[column].dataType).alias(column)
        frames.append(scan.select(*[columns[name] for name in schema.fieldNames()]))
    return functools.reduce(DataFrame.unionByName, frames)


def _materialize_and_check(
    frame: DataFrame,
    schema: T.StructType,
    replace_partition: Mapping[str, Any] | None,
    label: str,
) -> int:
    """One job over the persisted frame: computes (and caches) every row, counts them,
    and checks NOT NULL columns and the partitions an overwrite promised to stay in."""
    checks: list[Column] = [F.count(F.lit(1)).alias("rows")]
    required = [f.name for f in schema.fields if not f.nullable and f.name in frame.columns]
    for index, column in enumerate(required):
        checks.append(
            F.sum(F.when(F.col(_quoted(column)).isNull(), 1).otherwise(0)).alias(f"n{index}")
        )
    allowed = allowed_values(replace_partition) if replace_partition else {}
    if allowed:
        inside = functools.reduce(
            lambda a, b: a & b,
            [
                _allowed_condition(F.col(_quoted(c)).cast("string"), values)
                for c, values in allowed.items()
            ],
        )
        outside = F.struct(*[F.col(_quoted(c)).cast("string").alias(c) for c in allowed])
        checks.append(F.first(F.when(~inside, outside), ignorenulls=True).alias("outside"))
    row = frame.agg(*checks).collect()[0]
    for index, column in enumerate(required):
        nulls = row[f"n{index}"] or 0
        if nulls:
            raise SchemaMismatchError(
                f"Column {column!r} of table {label} is NOT NULL but the data holds "
                f"{nulls} null value(s). The table is unchanged.",
                fix=f'filter or fill the nulls first, e.g. df.fillna(..., subset=["{column}"])',
            )
    if allowed and row["outside"] is not None:
        shown = {c: sorted(v, key=str) for c, v in allowed.items()}
        raise SchemaMismatchError(
            f"Overwriting partition(s) {shown} of table {label}, but the DataFrame also "
            f"holds rows of partition {row['outside'].asDict()}. The table is unchanged.",
            fix="filter the DataFrame to the partitions being replaced",
        )
    return int(row["rows"])


def _allowed_condition(value: Column, allowed: Collection[str | None]) -> Column:
    present = [v for v in allowed if v is not None]
    condition = value.isin(present) if present else F.lit(False)
    if any(v is None for v in allowed):
        condition = condition | value.isNull()
    return F.coalesce(condition, F.lit(False))


def _translated(
    exc: Exception, label: str, replace_partition: Mapping[str, Any] | None
) -> Exception:
    """A failed delta-spark write as the project's error (the Spark error stays the cause)."""
    text = str(exc)
    if any(marker in text for marker in _CONCURRENT):
        return ConcurrentWriteError(
            f"Another writer committed a conflicting change to table {label} first: "
            f"{_first_line(text)}. This write was not committed.",
            fix="retry the write; for the operator, rerun the job (batches are idempotent)",
        )
    if "DELTA_REPLACE_WHERE_MISMATCH" in text and replace_partition:
        shown = {c: sorted(v, key=str) for c, v in allowed_values(replace_partition).items()}
        return SchemaMismatchError(
            f"Overwriting partition(s) {shown} of table {label}, but the DataFrame also "
            f"holds rows of other partitions ({_first_line(text)}). The table is unchanged.",
            fix="filter the DataFrame to the partitions being replaced",
        )
    if "DELTA_NOT_NULL_CONSTRAINT_VIOLATED" in text or "DELTA_VIOLATE_CONSTRAINT" in text:
        return SchemaMismatchError(
            f"The data violates a constraint of table {label}: {_first_line(text)}. "
            "The table is unchanged.",
            fix="filter or fix the offending rows first",
        )
    if "DELTA_FAILED_TO_MERGE_FIELDS" in text or "DELTA_SCHEMA_" in text:
        return SchemaMismatchError(
            f"delta-spark refused the schema of the write to table {label}: "
            f"{_first_line(text)}. The table is unchanged.",
            fix='cast the columns to the table\'s types, or pass schema_mode="merge"',
        )
    if is_path_not_found(exc):
        return NotADeltaTableError(f"Cannot write table {label}: {_first_line(text)}")
    return exc


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line[:400]

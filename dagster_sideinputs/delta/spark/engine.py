"""The native engine: delta-spark reads and writes, usable over Spark Connect.

Everything goes through what a Spark Connect client can do: DataFrame reads and writes
in ``format("delta")`` (``versionAsOf``, ``txnAppId`` / ``txnVersion``, ``replaceWhere``,
``mergeSchema``, ``userMetadata``), Delta SQL (``OPTIMIZE``, ``VACUUM``), and Spark's
readers of the ``_delta_log`` files (:mod:`~dagster_sideinputs.delta.log.reader`; local
logs are read directly, and logs on an object store with the lake's storage options
are read with ``obstore`` and those options). No ``delta.tables.DeltaTable`` (its Connect
plugin is not available), no delta-rs: one set of storage credentials. py4j only where
the session is classic, for one fast path with a Connect-safe fallback: a plain append
with its transaction (:mod:`~dagster_sideinputs.delta.spark.direct`).

This module owns :class:`DeltaSparkEngine` and the order of each operation; its steps live
in ``spark_stage``, ``spark_commit`` and ``spark_read``. docs/DECISIONS.md has the why.
"""

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.delta.engine import (
    AppTransaction,
    DataFile,
    SchemaMode,
    SplitTarget,
    StagedWrite,
    TableSnapshot,
    WriteMode,
    WriteResult,
    refused_removals,
)
from dagster_sideinputs.delta.log.commits import append_only_files
from dagster_sideinputs.delta.log.files import LogFiles, log_files
from dagster_sideinputs.delta.log.reader import READER
from dagster_sideinputs.delta.log.replay import commit_changes
from dagster_sideinputs.delta.log.state import LogState
from dagster_sideinputs.delta.reader import select_partitions, verify_files
from dagster_sideinputs.delta.schema import check_column_names, plan_append, quoted
from dagster_sideinputs.delta.session import active_session, session_setting
from dagster_sideinputs.delta.spark.commit import (
    ENGINE_NAME,
    commit_staged_files,
    holds,
    save,
    unchanged,
    with_duration,
)
from dagster_sideinputs.delta.spark.direct import discard_stage
from dagster_sideinputs.delta.spark.predicates import sql_literal, sql_table, whole_partitions
from dagster_sideinputs.delta.spark.read import read_subset
from dagster_sideinputs.delta.spark.split import stage_append_native, stage_split_native
from dagster_sideinputs.delta.spark.stage import SparkStage, plan_rows, stage_rows
from dagster_sideinputs.delta.staging import refuse_blocked_location
from dagster_sideinputs.delta.store.errors import cleaning_up
from dagster_sideinputs.delta.store.files import TableFiles, is_local, normalize_uri, spark_uri
from dagster_sideinputs.errors import DeltaTableError

log = logging.getLogger(__name__)
_MTIME_SLACK_MS = 2000
"""How far before a write's start a file's modification time may lie (clocks and the
filesystem's time granularity) for the file to count as the write's."""

RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
"""How many tasks delta-spark's VACUUM lists a table's folders with: Spark's default,
10,000, made a 4-file table's VACUUM run 150,093 tasks in 24 jobs, 31-76 s on local[2]
(a stall of the operator's batch every ``VACUUM_EVERY`` batches, once per vacuumed table);
the session's shuffle partitions instead (4 there), unless the user set it: 153 tasks,
4.6-8.8 s."""


def _stageable(
    mode: WriteMode,
    current: LogState | None,
    replace_partition: Mapping[str, Any] | None,
    remove_files: Sequence[DataFile],
    schema_mode: SchemaMode | None,
) -> bool:
    """Whether :meth:`DeltaSparkEngine.write` may stage the rows as the operator stages an
    append (:func:`stage_append_native` then decides whether the table qualifies): an
    append, or an overwrite of a whole table (a new one, or one whose files may be
    removed) that keeps its schema."""
    if replace_partition or remove_files:
        return False
    if mode == "append" or current is None:
        return True
    append_only = str(current.configuration.get("delta.appendOnly") or "").lower() == "true"
    return mode == "overwrite" and schema_mode is None and not append_only


@dataclass(frozen=True)
class DeltaSparkEngine:
    """Delta Lake through delta-spark: Spark reads and writes ``format("delta")``.

    Attributes:
        session: the SparkSession for the operations that take none (removals, small
            bookkeeping tables, vacuum, and logs on object stores without storage
            options). When None, the active session is used. Not pickled: an unpickled
            engine is unbound.
        storage_options: the lake's object store options (``DeltaStorage`` passes its
            own): the ``_delta_log`` of a table on an object store is then read with
            ``obstore`` (milliseconds) instead of Spark jobs. Empty: through Spark, with
            the session's credentials only. Data is always read and written by Spark.
    """

    session: SparkSession | None = None
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # secrets

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (DeltaSparkEngine, (None, dict(self.storage_options)))

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
        return self if self.session is spark else DeltaSparkEngine(spark, self.storage_options)

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

    def _files(self, uri: str) -> LogFiles:
        root = normalize_uri(uri)
        direct = is_local(root) or bool(self.storage_options)
        spark = None if direct else self._spark(f"read the log of {root}")
        return log_files(root, spark, self.storage_options)

    def _state(self, uri: str, version: int | None = None, *, name: str | None = None) -> LogState:
        return READER.state(self._files(uri), version, table=name or normalize_uri(uri))

    # --- metadata ------------------------------------------------------------------

    def exists(self, uri: str) -> bool:
        return READER.latest_version(self._files(uri)) is not None

    def snapshot(
        self, uri: str, *, version: int | None = None, name: str | None = None
    ) -> TableSnapshot:
        return self._state(uri, version, name=name).table_snapshot()

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
        # The files the log lists, by Spark's parquet reader (spark_read): Delta's reader
        # at versionAsOf would rebuild the version's snapshot with Spark jobs first.
        state = self._state(snapshot.uri, snapshot.version, name=label)
        whole = whole_partitions(snapshot, chosen)
        return read_subset(spark, snapshot, state, chosen, label, whole=whole)

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
            frame = frame.select(*[F.col(quoted(c)) for c in columns])
        return frame.toArrow()

    def read_on_driver(
        self,
        snapshot: TableSnapshot,
        *,
        columns: Sequence[str] | None = None,
        limit: int | None = None,
        name: str | None = None,
    ) -> pa.Table | None:
        return None  # delta-spark reads every table through Spark

    # --- writes --------------------------------------------------------------------------

    def validate_append(
        self,
        schema: T.StructType,
        uri: str,
        *,
        schema_mode: SchemaMode | None = None,
        name: str | None = None,
    ) -> None:
        table = name or normalize_uri(uri)
        if not self.exists(uri):
            check_column_names(schema, table=table, column_mapping=False, mapping_writable=True)
            return
        snapshot = self.snapshot(uri, name=name)
        mapped = snapshot.configuration.get("delta.columnMapping.mode") not in (None, "none")
        check_column_names(schema, table=table, column_mapping=mapped, mapping_writable=True)
        plan_append(schema, snapshot.schema, table=table, merge=schema_mode == "merge")

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
        uri = normalize_uri(uri)
        label = name or uri
        # Before the log is read (which raises on a file in the path): delta-spark would
        # find a blocked new table only when it creates the log, at commit time.
        refuse_blocked_location(uri, label)
        state = self._state(uri, name=label) if self.exists(uri) else None
        # Files removed in the same commit go with the staged ones (Delta's transaction).
        plain = mode == "append"
        with self._cleaning_up(uri):
            if plain and (
                staged := stage_append_native(
                    df, uri, label, state, schema_mode, partition_by or ()
                )
            ):
                return staged  # else: Delta's writer (stage_rows)
            return stage_rows(
                df, uri, label, state, mode=mode, partition_by=partition_by,
                replace_partition=replace_partition, schema_mode=schema_mode,
            )  # fmt: skip

    @contextlib.contextmanager
    def _cleaning_up(self, uri: str) -> Iterator[None]:
        """A write by Delta's own writer (``writeFiles``, ``save``) that fails, e.g. on a
        CHECK constraint or NOT NULL column, leaves the files its finished tasks wrote in
        the table's folder, referenced by no commit: delete them. Only files written
        since the write began (no older version can reference them) that the table's
        log, read again after the failure, does not reference (a commit that landed
        keeps its files)."""
        started_ms = int(time.time() * 1000) - _MTIME_SLACK_MS
        try:
            yield
        except BaseException:
            try:
                self._delete_unreferenced(uri, started_ms)
            except Exception as exc:  # cleanup never masks the write's error
                log.warning("delta-spark: files of a failed write to %s not removed: %s", uri, exc)
            raise

    def _delete_unreferenced(self, uri: str, since_ms: int) -> None:
        files = TableFiles(uri, self.storage_options)
        if not files.exists():
            return
        referenced: set[str] = set()
        if self.exists(uri):
            referenced = {unquote(path) for path, _ in self._state(uri).files}
        stray: list[str] = []
        checksums: list[str] = []
        for entry in files.list_files(""):
            parts = entry.path.replace("\\", "/").split("/")
            if any(p.startswith(("_", ".")) for p in parts[:-1]):
                continue  # the log, staging folders, hidden folders
            if entry.modification_time_ms < since_ms:
                continue
            if parts[-1].startswith(".") and parts[-1].endswith(".crc"):
                checksums.append(entry.path)
            elif not parts[-1].startswith(("_", ".")) and entry.path not in referenced:
                stray.append(entry.path)
        gone = set(stray)
        for path in checksums:  # Hadoop's local checksum of a deleted file: .<name>.crc
            head, _, name = path.rpartition("/")
            if (f"{head}/" if head else "") + name[1:-4] in gone:
                stray.append(path)
        for path in stray:
            files.delete_file(path)
        if stray:
            log.info("delta-spark: removed %d file(s) of a failed write to %s", len(stray), uri)

    def stage_split(
        self, df: DataFrame, column: str, targets: Sequence[SplitTarget]
    ) -> list[StagedWrite] | None:
        uris = [normalize_uri(target.uri) for target in targets]
        if not all(is_local(uri) for uri in uris):
            return None  # a rename there is a copy: each table is staged on its own
        states = []
        for uri, target in zip(uris, targets, strict=True):
            refuse_blocked_location(uri, target.name)
            states.append(self._state(uri, name=target.name) if self.exists(uri) else None)
        return stage_split_native(df, column, targets, states)

    def discard(self, staged: StagedWrite) -> None:
        handle: SparkStage = staged.handle
        if handle.direct is not None:
            discard_stage(handle.direct)
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
        started = time.perf_counter()
        handle: SparkStage = staged.handle
        uri, label = staged.uri, staged.name
        discard = partial(self.discard, staged)  # never in place of the commit's own error
        with cleaning_up(discard, f"discarding the files staged for {label}"):
            if refused := refused_removals(remove_files, staged.mode, handle.table_existed, label):
                raise refused
            current = self._state(uri, name=label) if self.exists(uri) else None
            if current is not None and holds(current, app_transaction):
                return unchanged(uri, current.version, 0.0)
            if current is not None and not handle.table_existed:
                # Created by another writer since staging: the data must fit its schema.
                plan_append(handle.schema, current.schema, table=label, merge=False)
            if skip_empty_commit and current and not staged.num_rows and not remove_files:
                return unchanged(uri, current.version, staged.seconds, skipped=False)
            direct = handle.direct
            if direct is not None and (current is None) == (direct.creating is not None):
                result = commit_staged_files(
                    direct, staged, current, self._files(uri),
                    app_transaction=app_transaction, commit_metadata=commit_metadata,
                    remove_files=remove_files,
                )  # fmt: skip
            else:  # the files staged (if any) are deleted below; the writer writes
                with self._cleaning_up(uri):
                    result = save(
                        handle.frame, staged, current, self._files(uri),
                        remove_files=remove_files, app_transaction=app_transaction,
                        commit_metadata=commit_metadata,
                    )  # fmt: skip
        return with_duration(result, staged.seconds + time.perf_counter() - started)

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
        """One table. An append, or an overwrite of the whole table, that needs nothing
        of Delta's writer but its commit is staged as the operator's outputs are (Spark
        writes the files, their statistics come from the footers, Delta's transaction
        commits them: ``stage_append_native``; measured in docs/DECISIONS.md); any other
        write is Delta's own, atomic by itself (a failing job commits nothing)."""
        started = time.perf_counter()
        uri = normalize_uri(uri)
        label = name or uri
        current = self._state(uri, name=label) if self.exists(uri) else None
        if current is not None and holds(current, app_transaction):
            return unchanged(uri, current.version, time.perf_counter() - started)
        if refused := refused_removals(remove_files, mode, current is not None, label):
            raise refused
        if _stageable(mode, current, replace_partition, remove_files, schema_mode):
            refuse_blocked_location(uri, label)
            with self._cleaning_up(uri):
                staged = stage_append_native(
                    df, uri, label, current, schema_mode, partition_by or (), mode
                )
            if staged is not None:  # the operator's one-pass append (delta/spark/split.py)
                # An overwrite: the same commit, removing every file of the version the
                # transaction read (a commit since then fails it, as Delta's own).
                replaced = current.table_snapshot().files if mode == "overwrite" and current else ()
                result = self.commit(
                    staged, app_transaction=app_transaction, commit_metadata=commit_metadata,
                    skip_empty_commit=skip_empty_commit, remove_files=replaced,
                )  # fmt: skip
                return with_duration(result, time.perf_counter() - started)
        snapshot = None if current is None else self.snapshot(uri, name=label)
        projected, _, partitions = plan_rows(
            df, uri, label, snapshot, mode=mode, partition_by=partition_by,
            replace_partition=replace_partition, schema_mode=schema_mode,
        )  # fmt: skip
        if skip_empty_commit and current is not None and not remove_files and projected.isEmpty():
            return unchanged(uri, current.version, time.perf_counter() - started, skipped=False)
        target = StagedWrite(uri, label, mode, partitions, replace_partition, schema_mode)
        with self._cleaning_up(uri):
            result = save(
                projected, target, current, self._files(uri), remove_files=remove_files,
                app_transaction=app_transaction, commit_metadata=commit_metadata,
            )  # fmt: skip
        return with_duration(result, time.perf_counter() - started)

    def commit_removals(
        self,
        uri: str,
        files: Sequence[DataFile],
        *,
        app_transaction: AppTransaction | None = None,
        name: str | None = None,
        commit_metadata: Mapping[str, Any] | None = None,
    ) -> WriteResult:
        # The removals are a write of no rows: the same commit as a batch's.
        started = time.perf_counter()
        uri = normalize_uri(uri)
        label = name or uri
        current = self._state(uri, name=label)  # raises when there is no table
        if holds(current, app_transaction):
            return unchanged(uri, current.version, time.perf_counter() - started)
        empty = self._spark(f"remove files from {label}").createDataFrame([], current.schema)
        target = StagedWrite(uri, label, "append", list(current.partition_columns), None, None)
        with self._cleaning_up(uri):
            result = save(
                empty, target, current, self._files(uri), remove_files=files,
                app_transaction=app_transaction, commit_metadata=commit_metadata,
                write_rows=False,
            )  # fmt: skip
        return with_duration(result, time.perf_counter() - started)

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
        with (
            session_setting(spark, RETENTION_CHECK, "false" if hours < 168 else None),
            session_setting(spark, LISTING_PARALLELISM, listing_parallelism(spark)),
        ):
            spark.sql(f"VACUUM {sql_table(uri)} RETAIN {hours} HOURS").collect()

    def set_properties(
        self, uri: str, properties: Mapping[str, str], *, name: str | None = None
    ) -> None:
        spark = self._spark(f"set the properties of {name or uri}")
        pairs = ", ".join(f"{sql_literal(k)} = {sql_literal(v)}" for k, v in properties.items())
        spark.sql(f"ALTER TABLE {sql_table(uri)} SET TBLPROPERTIES ({pairs})").collect()


def listing_parallelism(spark: SparkSession) -> str | None:
    """The listing parallelism for one VACUUM (:data:`LISTING_PARALLELISM`): the session's
    shuffle partitions, or None (leave it) when the session sets it itself or its
    settings cannot be read (the listing is then only slower)."""
    try:
        if spark.conf.get(LISTING_PARALLELISM, None) is not None:
            return None
        return str(spark.conf.get("spark.sql.shuffle.partitions"))
    except Exception as exc:  # a session whose settings cannot be read still vacuums
        log.debug("VACUUM keeps Spark's listing parallelism (%s)", exc)
        return None

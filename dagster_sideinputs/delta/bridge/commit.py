"""Committing to a Delta table with delta-rs: add and remove actions, application
transactions, table creation, conflicts.

A commit is one Delta log entry: the files a write staged (``add``), the files it
removes (``remove``), and the application transaction that makes it idempotent.
"""

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import deltalake
import pyarrow as pa
from deltalake import Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    PostCommitHookProperties,
    RemoveAction,
    create_table_with_add_actions,
)
from pyspark.sql import types as T

from dagster_sideinputs.delta.bridge.log_commit import commit_directly, latest_local_state
from dagster_sideinputs.delta.bridge.table import (
    is_table,
    load_snapshot,
    local_log,
    open_table,
    unsupported_feature_error,
)
from dagster_sideinputs.delta.engine import AppTransaction, DataFile, WriteMode, WriteResult
from dagster_sideinputs.delta.log.reader import READER
from dagster_sideinputs.delta.log.state import LogState
from dagster_sideinputs.delta.schema import (
    delta_field,
    partition_string,
    plan_append,
    spark_to_delta_schema,
)
from dagster_sideinputs.delta.staging import StagedFile, allowed_values
from dagster_sideinputs.delta.store.files import normalize_uri
from dagster_sideinputs.errors import ConcurrentWriteError, SchemaMismatchError

ENGINE_NAME = "delta-rs bridge"
CHECKPOINT_EVERY = 10
"""The bridge writes a Delta checkpoint at every version that is a multiple of this (delta-rs
on its own does at ``delta.checkpointInterval``, 100 by default). Opening a table reads its
newest checkpoint and the commits after it: with a checkpoint every 10 versions, a table
the operator commits to once per batch costs the same to open at batch 10,000 as at
batch 10, not a replay of up to 99 commit files."""
CLEANUP_EVERY = 100
"""Expired log files (older than the table's ``delta.logRetentionDuration``, 30 days by
default) are deleted at every version that is a multiple of this, unless the table sets
``delta.enableExpiredLogCleanup=false``. delta-rs would look for them after every commit,
listing the whole log folder each time: ~70 ms per commit at 10,000 versions."""
HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
"""delta-rs's own post-commit work is off: :func:`committed_version` does both, on its
schedule."""
log = logging.getLogger("dagster_sideinputs")


def committed_version(
    uri: str,
    *,
    storage_options: Mapping[str, str] | None,
    label: str,
    table: deltalake.DeltaTable | None = None,
) -> int:
    """The table's version after a commit, writing the checkpoint (and cleaning up expired
    log files) when it falls due at that version.

    ``table``: the table object the commit went through. A local table's new version is
    found by asking for the next commit files
    (:func:`~dagster_sideinputs.delta.bridge.table.local_log`);
    delta-rs brings its table object up to date by listing the log, so it is asked only
    when a checkpoint falls due or the table is on an object store."""
    local = local_log(uri)
    probed = READER.latest_version(local) if local is not None else None
    if probed is not None:
        checkpoint_if_due(uri, probed, storage_options=storage_options, label=label, table=table)
        return probed
    if table is None:
        table = open_table(uri, storage_options=storage_options, name=label)
    else:
        table.update_incremental()
    version = table.version()
    checkpoint_if_due(uri, version, storage_options=storage_options, label=label, table=table)
    return version


def checkpoint_if_due(
    uri: str,
    version: int,
    *,
    storage_options: Mapping[str, str] | None,
    label: str,
    table: deltalake.DeltaTable | None = None,
) -> None:
    """Write the checkpoint of ``version`` when one falls due there (and clean up expired
    log files when that falls due too); the table is opened only then."""
    if not (version > 0 and version % CHECKPOINT_EVERY == 0):
        return
    try:
        if table is None:
            table = open_table(uri, version=version, storage_options=storage_options, name=label)
        elif table.version() != version:
            table.load_as_version(version)
        table.create_checkpoint()
        configuration = table.metadata().configuration or {}
        cleanup = configuration.get("delta.enableExpiredLogCleanup", "true")
        if version % CLEANUP_EVERY == 0 and str(cleanup).lower() != "false":
            table.cleanup_metadata()
    except Exception as exc:  # the commit is done: a missing checkpoint only costs time
        log.warning("table %s: no checkpoint at version %s (%s)", label, version, exc)


def _add_actions(staged: list[StagedFile]) -> list[AddAction]:
    now_ms = int(time.time() * 1000)
    return [
        AddAction(
            path=file.path,  # delta-rs URI-encodes it in the log
            size=file.size,
            partition_values=file.partition_values,
            modification_time=now_ms,
            data_change=True,
            stats=file.log_stats(),
        )
        for file in staged
    ]


def _remove_actions(files: Sequence[DataFile]) -> list[RemoveAction]:
    now_ms = int(time.time() * 1000)
    return [
        RemoveAction(
            path=file.path,  # delta-rs URI-encodes it in the log
            data_change=True,
            deletion_timestamp=now_ms,
            size=file.size,
            partition_values={k: partition_string(v) for k, v in file.partition_values.items()},
        )
        for file in files
    ]


def commit_properties(
    app_transaction: AppTransaction | None, commit_metadata: Mapping[str, Any] | None
) -> CommitProperties:
    """Our commitInfo entries and, when given, the application transaction."""
    return CommitProperties(
        custom_metadata={"engineInfo.dsi": "dagster-sideinputs", **(commit_metadata or {})},
        app_transactions=(
            [Transaction(app_transaction.app_id, app_transaction.version)]
            if app_transaction
            else None
        ),
    )


def already_committed(table: deltalake.DeltaTable, app_transaction: AppTransaction | None) -> bool:
    """Whether the table holds this application transaction (or a later one of the app)."""
    if app_transaction is None:
        return False
    committed = table.transaction_version(app_transaction.app_id)
    return committed is not None and committed >= app_transaction.version


def holds_transaction(
    known: LogState | None, table: deltalake.DeltaTable | None, txn: AppTransaction | None
) -> bool:
    """Whether the table (as our log reader knows it, else opened with delta-rs) already
    holds this application transaction (or a later one of the app)."""
    if txn is None:
        return False
    if known is not None:
        committed = known.txns.get(txn.app_id)
        return committed is not None and committed >= txn.version
    return table is not None and already_committed(table, txn)


def append_rows(
    uri: str,
    rows: pa.Table,
    *,
    app_transaction: AppTransaction | None = None,
    storage_options: Mapping[str, str] | None = None,
    name: str | None = None,
) -> WriteResult:
    """Append a small Arrow table from the driver, idempotently (bookkeeping tables)."""
    started = time.perf_counter()
    uri = normalize_uri(uri)
    label = name or uri
    table = None
    if is_table(uri, storage_options):
        known = latest_local_state(uri, label)
        if known is None:
            table = open_table(uri, storage_options=storage_options, name=label)
        if holds_transaction(known, table, app_transaction):
            current = known.version if known is not None else table.version()  # type: ignore[union-attr]
            return WriteResult(
                uri, current, 0, 0, 0, True, time.perf_counter() - started, ENGINE_NAME
            )
    write_deltalake(
        uri,
        rows,
        mode="append",
        schema_mode="merge",
        storage_options=dict(storage_options or {}) or None,
        commit_properties=commit_properties(app_transaction, None),
        post_commithook_properties=HOOKS,
    )
    version = committed_version(uri, storage_options=storage_options, label=label, table=table)
    return WriteResult(
        uri, version, rows.num_rows, 1, rows.nbytes, False, time.perf_counter() - started,
        ENGINE_NAME,
    )  # fmt: skip


def _create_or_join(
    uri: str,
    delta_schema: deltalake.Schema,
    staged: list[StagedFile],
    schema: T.StructType,
    *,
    partition_by: list[str],
    description: str | None,
    storage_options: Mapping[str, str] | None,
    properties: CommitProperties,
    label: str,
) -> deltalake.DeltaTable | None:
    """Create the table with the staged files, or, when another writer created it in the
    meantime (partitions of one asset backfilled in parallel), return it to write into.

    Returns:
        None when this call created the table; the existing table otherwise.
    """
    try:
        create_table_with_add_actions(
            uri,
            delta_schema,
            _add_actions(staged),
            mode="error",
            partition_by=partition_by or None,
            description=description,
            storage_options=dict(storage_options or {}) or None,
            commit_properties=properties,
            post_commithook_properties=HOOKS,
        )
        return None
    except Exception as exc:  # delta-rs raises a generic error for "already exists"
        if "already exists" not in str(exc).lower():
            raise
    table = open_table(uri, storage_options=storage_options, name=label)
    snapshot = load_snapshot(uri, storage_options=storage_options, name=label)
    if list(snapshot.partition_columns) != list(partition_by):
        raise SchemaMismatchError(
            f"Table {label} was just created by another writer, partitioned by "
            f"{list(snapshot.partition_columns)}, not {partition_by}. This write was not "
            "committed.",
            fix="write with the same partition_by as the other writer",
        )
    plan_append(schema, snapshot.schema, table=label, merge=False)
    return table


def commit_files(
    table: deltalake.DeltaTable | None,
    uri: str,
    staged: list[StagedFile],
    schema: T.StructType,
    new_fields: list[T.StructField],
    *,
    mode: WriteMode,
    partition_by: list[str],
    replace_partition: Mapping[str, Any] | None,
    remove_files: Sequence[DataFile],
    app_transaction: AppTransaction | None,
    storage_options: Mapping[str, str] | None,
    commit_metadata: Mapping[str, Any] | None,
    description: str | None,
    label: str,
) -> int:
    properties = commit_properties(app_transaction, commit_metadata)
    actions: list[AddAction | RemoveAction] = [
        *_add_actions(staged),
        *_remove_actions(remove_files),
    ]
    delta_schema = spark_to_delta_schema(schema, table=label)
    try:
        if table is None:
            table = _create_or_join(
                uri,
                delta_schema,
                staged,
                schema,
                partition_by=partition_by,
                description=description,
                storage_options=storage_options,
                properties=properties,
                label=label,
            )
            if table is None:  # created with the staged files
                return committed_version(uri, storage_options=storage_options, label=label)
        if new_fields:
            table.alter.add_columns([delta_field(field) for field in new_fields])
        filters = (
            [(c, "in", sorted(v, key=str)) for c, v in allowed_values(replace_partition).items()]
            if replace_partition
            else None
        )
        table.create_write_transaction(
            actions,
            mode,
            delta_schema,
            partition_by=partition_by or None,
            partition_filters=filters,
            commit_properties=properties,
            post_commithook_properties=HOOKS,
        )
    except CommitFailedError as exc:
        refused = unsupported_feature_error(exc, label)
        if refused is not None:
            raise refused from exc
        raise ConcurrentWriteError(
            f"Another writer committed a conflicting change to table {label} first: {exc}. "
            "This write was not committed.",
            fix="retry the write; for the operator, rerun the job (batches are idempotent)",
        ) from exc
    return committed_version(uri, storage_options=storage_options, label=label, table=table)


def commit_removals(
    uri: str,
    files: Sequence[DataFile],
    *,
    app_transaction: AppTransaction | None = None,
    storage_options: Mapping[str, str] | None = None,
    name: str | None = None,
    commit_metadata: Mapping[str, Any] | None = None,
) -> WriteResult:
    """Remove live files from a table in one commit, without a Spark job.

    Idempotent like a write: skipped when the application transaction
    was already committed.
    """
    started = time.perf_counter()
    uri = normalize_uri(uri)
    label = name or uri
    known = latest_local_state(uri, label)
    if known is not None:
        if holds_transaction(known, None, app_transaction):
            return WriteResult(
                uri, known.version, 0, 0, 0, True, time.perf_counter() - started, ENGINE_NAME
            )
        version = commit_directly(
            uri,
            known,
            added=(),
            removed=files,
            partition_by=known.partition_columns,
            app_transaction=app_transaction,
            commit_metadata=commit_metadata,
        )
        if version is not None:
            checkpoint_if_due(uri, version, storage_options=storage_options, label=label)
            seconds = time.perf_counter() - started
            return WriteResult(uri, version, 0, 0, 0, False, seconds, ENGINE_NAME)
    # At the version the removal was prepared against (conflict checks see later commits).
    version_read = known.version if known is not None else None
    table = open_table(uri, version=version_read, storage_options=storage_options, name=label)
    if already_committed(table, app_transaction):
        return WriteResult(
            uri, table.version(), 0, 0, 0, True, time.perf_counter() - started, ENGINE_NAME
        )
    properties = commit_properties(app_transaction, commit_metadata)
    try:
        table.create_write_transaction(
            list(_remove_actions(files)),
            "append",
            table.schema(),
            partition_by=table.metadata().partition_columns or None,
            commit_properties=properties,
            post_commithook_properties=HOOKS,
        )
    except CommitFailedError as exc:
        refused = unsupported_feature_error(exc, label)
        if refused is not None:
            raise refused from exc
        raise ConcurrentWriteError(
            f"Another writer committed a conflicting change to table {label} first: {exc}.",
            fix="rerun (batches are idempotent)",
        ) from exc
    version = committed_version(uri, storage_options=storage_options, label=label, table=table)
    return WriteResult(uri, version, 0, 0, 0, False, time.perf_counter() - started, ENGINE_NAME)

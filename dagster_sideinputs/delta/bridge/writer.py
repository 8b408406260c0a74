"""Writing a Spark DataFrame to a Delta table: executors write, the driver commits.

A write has two phases, so that several tables can be written "all or nothing visible":

1. :func:`stage_dataframe`: the schema is checked against the table (or becomes the
   table's schema); Spark writes parquet files natively into a hidden staging folder of
   the table; the driver reads only their footers (statistics, row counts) and checks
   them. Nothing is visible yet, and every error of the data or of the code computing
   it surfaces here.
2. :func:`commit_staged`: the driver moves the files into the table layout and commits
   them as add actions with delta-rs, in one commit together with the application
   transaction ``(app_id, version)`` (skipped when the table already holds it).

:func:`write_dataframe` does both. No data passes through the driver. A failure before
the commit leaves no data visible: staged and moved files are deleted, and unreferenced
files are invisible to Delta readers anyway.
"""

import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from dagster_sideinputs.delta.bridge.commit import (
    ENGINE_NAME,
    already_committed,
    append_rows,
    checkpoint_if_due,
    commit_files,
    commit_removals,
    holds_transaction,
)
from dagster_sideinputs.delta.bridge.log_commit import commit_directly, latest_local_state
from dagster_sideinputs.delta.bridge.table import is_table, load_snapshot, open_table
from dagster_sideinputs.delta.bridge.write_plan import plan_table
from dagster_sideinputs.delta.engine import (
    AppTransaction,
    DataFile,
    SchemaMode,
    StagedWrite,
    WriteMode,
    WriteResult,
    refused_removals,
)
from dagster_sideinputs.delta.schema import check_column_names, plan_append
from dagster_sideinputs.delta.staging import (
    CREATING_MARKER,
    BridgeStage,
    Staging,
    constraint_error,
)
from dagster_sideinputs.delta.store.errors import run_cleanup
from dagster_sideinputs.delta.store.files import normalize_uri
from dagster_sideinputs.delta.store.s3 import configure_spark

__all__ = [
    "AppTransaction",
    "WriteResult",
    "append_rows",
    "commit_removals",
    "commit_staged",
    "discard_staged",
    "stage_dataframe",
    "validate_append",
    "write_dataframe",
]


def stage_dataframe(
    df: DataFrame,
    uri: str,
    *,
    mode: WriteMode = "append",
    partition_by: list[str] | None = None,
    replace_partition: Mapping[str, Any] | None = None,
    schema_mode: SchemaMode | None = None,
    storage_options: Mapping[str, str] | None = None,
    name: str | None = None,
) -> StagedWrite:
    """Write a DataFrame's files into the table's staging folder; nothing is visible yet.
    Raises what :func:`plan_table` raises."""
    started = time.perf_counter()
    configure_spark(df.sparkSession, normalize_uri(uri), storage_options)
    plan = plan_table(
        df, uri, mode=mode, partition_by=partition_by, replace_partition=replace_partition,
        schema_mode=schema_mode, storage_options=storage_options, name=name,
    )  # fmt: skip
    partitions = plan.partition_by
    data_schema = T.StructType([f for f in plan.schema.fields if f.name not in partitions])
    staging = Staging(plan.files)
    try:
        writer = plan.projected.write.mode("overwrite")
        if partitions:
            writer = writer.partitionBy(*partitions)
        writer.parquet(staging.spark_location())
        staged = staging.collect(data_schema, partitions, plan.configuration)
        return plan.staged(staging, staged, time.perf_counter() - started)
    except BaseException as exc:
        run_cleanup(
            partial(staging.discard, published_too=False),
            during=exc, what=f"discarding the files staged for {plan.label}",
        )  # fmt: skip
        violation = constraint_error(exc, plan.constraints, table=plan.label)
        if violation is not None:
            raise violation from exc
        raise


def discard_staged(staged: StagedWrite) -> None:
    """Delete a staged write's files (it will not be committed)."""
    handle: BridgeStage = staged.handle
    handle.staging.discard(published_too=False)


def commit_staged(
    staged: StagedWrite,
    *,
    app_transaction: AppTransaction | None = None,
    remove_files: Sequence[DataFile] = (),
    commit_metadata: Mapping[str, Any] | None = None,
    skip_empty_commit: bool = False,
    table_description: str | None = None,
) -> WriteResult:
    """Make a staged write visible in one delta-rs commit (see the module docstring).

    Raises:
        SchemaMismatchError: another writer created the table with another schema meanwhile.
        ConcurrentWriteError: another writer committed a conflicting change first.
    """
    started = time.perf_counter()
    handle: BridgeStage = staged.handle
    uri, label, options = staged.uri, staged.name, handle.storage_options
    refused = refused_removals(remove_files, staged.mode, handle.table_existed, label)
    if refused is not None:
        handle.staging.discard(published_too=False)
        raise refused
    exists = is_table(uri, options)
    # A local table is known from our log reader (probed, not listed); delta-rs opens one
    # only when the commit must go through it.
    known = latest_local_state(uri, label) if exists else None
    table = open_table(uri, storage_options=options, name=label) if exists and not known else None
    current = known.version if known else (table.version() if table else -1)
    if holds_transaction(known, table, app_transaction):
        run_cleanup(
            partial(handle.staging.discard, published_too=False),
            during=None, what=f"discarding the files staged for {label}", quiet=True,
        )  # fmt: skip
        return WriteResult(uri, current, 0, 0, 0, True, time.perf_counter() - started, ENGINE_NAME)
    if exists and not handle.table_existed:
        # Created by another writer since staging: the data must fit its schema.
        schema = known.schema if known else load_snapshot(uri, storage_options=options).schema
        plan_append(handle.schema, schema, table=label, merge=False)
    committed = False
    failed: BaseException | None = None
    try:
        if skip_empty_commit and exists and not handle.files and not remove_files:
            committed = True
            return WriteResult(uri, current, 0, 0, 0, False, staged.seconds, ENGINE_NAME)
        if not exists:
            handle.staging.files.write_bytes_atomic(CREATING_MARKER, b"")
        handle.staging.publish(handle.files)
        version = None
        if (
            known
            and staged.mode == "append"
            and not handle.new_fields
            and not staged.replace_partition
        ):
            version = commit_directly(
                uri,
                known,
                added=handle.files,
                removed=remove_files,
                partition_by=staged.partition_by,
                app_transaction=app_transaction,
                commit_metadata=commit_metadata,
            )
            if version is not None:
                checkpoint_if_due(uri, version, storage_options=options, label=label)
        if version is None:
            if exists and table is None:
                # At the version this commit was prepared against: delta-rs's conflict
                # checks then see whatever another writer committed since.
                version_read = known.version if known else None
                table = open_table(uri, version=version_read, storage_options=options, name=label)
                if already_committed(table, app_transaction):
                    return WriteResult(uri, table.version(), 0, 0, 0, True,
                                       time.perf_counter() - started, ENGINE_NAME)  # fmt: skip
            version = commit_files(
                table,
                uri,
                handle.files,
                handle.schema,
                handle.new_fields,
                mode=staged.mode,
                partition_by=staged.partition_by,
                replace_partition=staged.replace_partition,
                remove_files=remove_files,
                app_transaction=app_transaction,
                storage_options=options,
                commit_metadata=commit_metadata,
                description=table_description,
                label=label,
            )
        committed = True
        if not exists:  # a marker left behind is harmless once the table has a log
            run_cleanup(
                partial(handle.staging.files.delete_file, CREATING_MARKER),
                during=None, what=f"deleting the creation marker of {label}", quiet=True,
            )  # fmt: skip
    except BaseException as exc:
        failed = exc
        raise
    finally:
        # Never in place of the commit's own error; after a commit, files left behind in
        # the staging folder are unreferenced (and the commit stands).
        run_cleanup(
            partial(handle.staging.discard, published_too=not committed),
            during=failed, what=f"discarding the files staged for {label}", quiet=True,
        )  # fmt: skip
    return WriteResult(
        uri=uri,
        version=version,
        num_rows=staged.num_rows,
        num_files=staged.num_files,
        num_bytes=staged.num_bytes,
        skipped=False,
        duration_s=staged.seconds + time.perf_counter() - started,
        engine=ENGINE_NAME,
    )


def write_dataframe(
    df: DataFrame,
    uri: str,
    *,
    mode: WriteMode = "append",
    partition_by: list[str] | None = None,
    replace_partition: Mapping[str, Any] | None = None,
    remove_files: Sequence[DataFile] = (),
    app_transaction: AppTransaction | None = None,
    schema_mode: SchemaMode | None = None,
    storage_options: Mapping[str, str] | None = None,
    name: str | None = None,
    commit_metadata: Mapping[str, Any] | None = None,
    table_description: str | None = None,
    skip_empty_commit: bool = False,
) -> WriteResult:
    """Write a DataFrame to a Delta table through native Spark writes and a delta-rs commit.

    Args:
        df: the data; never collected to the driver.
        uri: table location (a local path or an object store URI).
        mode: ``append`` adds rows; ``overwrite`` replaces the table, or only the
            partition given by ``replace_partition``.
        partition_by: partition columns of a new table (must match an existing table's).
        replace_partition: with ``mode="overwrite"``, the partition to replace, e.g.
            ``{"partition": "2024-05-01"}`` (a list of values replaces several); other
            partitions are kept.
        remove_files: with ``mode="append"``, live files of the table to remove in the
            same commit (the operator's buffer releases records this way).
        app_transaction: make the write idempotent: skipped when the table already
            committed this ``(app_id, version)`` or a later version of the same app.
        schema_mode: ``merge`` adds new columns on append; ``overwrite`` replaces the
            schema on a full overwrite. Without it a schema mismatch is an error.
        storage_options: delta-rs object store options.
        name: asset / table name for error messages.
        commit_metadata: extra ``commitInfo`` entries.
        table_description: description of a new table.
        skip_empty_commit: when the DataFrame is empty, the table exists and nothing is
            removed, commit nothing (not even the application transaction).

    Returns:
        A :class:`WriteResult`.

    Raises:
        SchemaMismatchError: the DataFrame does not fit the table; the table is unchanged.
        NotADeltaTableError: ``uri`` holds non-Delta files.
        ConcurrentWriteError: another writer committed a conflicting change first.

    Examples:
        >>> write_dataframe(df, "/data/orders", app_transaction=AppTransaction("job", 7))
        ... # doctest: +SKIP
    """
    started = time.perf_counter()
    uri = normalize_uri(uri)
    if app_transaction is not None and is_table(uri, storage_options):
        known = latest_local_state(uri, name or uri)
        table = (
            None if known else open_table(uri, storage_options=storage_options, name=name or uri)
        )
        if holds_transaction(known, table, app_transaction):
            current = known.version if known else table.version()  # type: ignore[union-attr]
            return WriteResult(
                uri, current, 0, 0, 0, True, time.perf_counter() - started, ENGINE_NAME
            )
    staged = stage_dataframe(
        df,
        uri,
        mode=mode,
        partition_by=partition_by,
        replace_partition=replace_partition,
        schema_mode=schema_mode,
        storage_options=storage_options,
        name=name,
    )
    return commit_staged(
        staged,
        app_transaction=app_transaction,
        remove_files=remove_files,
        commit_metadata=commit_metadata,
        skip_empty_commit=skip_empty_commit,
        table_description=table_description,
    )


def validate_append(
    schema: T.StructType,
    uri: str,
    *,
    schema_mode: SchemaMode | None = None,
    storage_options: Mapping[str, str] | None = None,
    name: str | None = None,
) -> None:
    """Check, without writing or running Spark, that an append of ``schema`` would be accepted.

    Raises:
        SchemaMismatchError: as :func:`write_dataframe` would.
    """
    uri = normalize_uri(uri)
    # The bridge refuses to write column-mapped tables (load_snapshot(writing=True)).
    check_column_names(schema, table=name or uri, column_mapping=False, mapping_writable=False)
    if not is_table(uri, storage_options):
        return
    snapshot = load_snapshot(uri, storage_options=storage_options, name=name, writing=True)
    plan_append(schema, snapshot.schema, table=name or uri, merge=schema_mode == "merge")

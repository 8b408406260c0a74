"""Writing a Spark DataFrame to a Delta table: executors write, the driver commits.

1. If the write carries an application transaction ``(app_id, version)`` that the
   table already recorded, nothing is written (exactly-once replays).
2. The schema is checked against the table (or becomes the table's schema).
3. Spark writes parquet files natively into a hidden staging folder of the table.
4. The driver reads only the footers of the new files (statistics, row counts), moves
   the files into the table layout and commits them as add actions with delta-rs, in
   one commit together with the application transaction.

No data passes through the driver. A failure before the commit leaves no data
visible: staged and moved files are deleted, and unreferenced files are invisible to
Delta readers anyway.
"""

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

import deltalake
from deltalake import Transaction
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    RemoveAction,
    create_table_with_add_actions,
)
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from dagster_sideinputs.delta.files import (
    TableFiles,
    normalize_uri,
    spark_uri,
)
from dagster_sideinputs.delta.schema import (
    as_nullable,
    check_partition_columns,
    delta_field,
    partition_string,
    plan_append,
    spark_to_delta_schema,
)
from dagster_sideinputs.delta.stats import file_stats
from dagster_sideinputs.delta.table import DataFile, load_snapshot, open_table
from dagster_sideinputs.errors import (
    ConcurrentWriteError,
    DeltaTableError,
    NotADeltaTableError,
    SchemaMismatchError,
)

WriteMode = Literal["append", "overwrite"]
SchemaMode = Literal["merge", "overwrite"]

STAGING_DIR = "_dsi_staging"
CREATING_MARKER = f"{STAGING_DIR}/_creating"
"""Written before the first files are moved into a folder that is not yet a Delta table:
files found there without a log are then the uncommitted files of an interrupted first
write (never referenced by a commit, so invisible), not a foreign dataset."""
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


@dataclass(frozen=True)
class AppTransaction:
    """A Delta application transaction: the write of ``version`` by application ``app_id``.

    A table remembers the highest version committed per application; a write whose
    version is not above it is skipped. The operator uses ``(operator id, batch id)``.
    """

    app_id: str
    version: int


@dataclass(frozen=True)
class WriteResult:
    """What a write did.

    Attributes:
        uri: the table.
        version: the table version after the write (the existing one when skipped).
        num_rows: rows written, from the parquet footers (0 when skipped).
        num_files: data files added.
        num_bytes: bytes added.
        skipped: True when the application transaction was already committed.
        duration_s: wall time of the whole write.
    """

    uri: str
    version: int
    num_rows: int
    num_files: int
    num_bytes: int
    skipped: bool
    duration_s: float


@dataclass(frozen=True)
class _StagedFile:
    path: str  # final path relative to the table root, decoded
    size: int
    partition_values: dict[str, str | None]
    stats: dict[str, Any]


def _partition_values(relative_dir: str, partition_by: list[str]) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    for segment in [s for s in relative_dir.split("/") if s]:
        column, _, raw = segment.partition("=")
        if column in partition_by:
            value = unquote(raw)  # Spark escapes special characters as %XX
            values[column] = None if value == _HIVE_NULL else value
    return values


def _allowed_values(replace: Mapping[str, Any]) -> dict[str, set[str | None]]:
    """Partition values to replace, per column (a scalar or a collection of values)."""
    allowed: dict[str, set[str | None]] = {}
    for column, value in replace.items():
        values = value if isinstance(value, list | tuple | set | frozenset) else [value]
        allowed[column] = {partition_string(v) for v in values}
    return allowed


def _check_partition(
    staged: list[_StagedFile], replace: Mapping[str, Any] | None, *, table: str
) -> None:
    if not replace:
        return
    allowed = _allowed_values(replace)
    for file in staged:
        found = {column: file.partition_values.get(column) for column in allowed}
        if any(found[column] not in values for column, values in allowed.items()):
            shown = {c: sorted(v, key=str) for c, v in allowed.items()}
            raise SchemaMismatchError(
                f"Overwriting partition(s) {shown} of table {table}, but the DataFrame also "
                f"holds rows of partition {found}. The table is unchanged.",
                fix="filter the DataFrame to the partitions being replaced",
            )


def _check_not_null(staged: list[_StagedFile], schema: T.StructType, *, table: str) -> None:
    required = [f.name for f in schema.fields if not f.nullable]
    for file in staged:
        for column in required:
            nulls = file.stats.get("nullCount", {}).get(column, 0)
            if isinstance(nulls, int) and nulls > 0:
                raise SchemaMismatchError(
                    f"Column {column!r} of table {table} is NOT NULL but the data holds "
                    f"{nulls} null value(s). The table is unchanged.",
                    fix=f'filter or fill the nulls first, e.g. df.fillna(..., subset=["{column}"])',
                )


class _Staging:
    """A hidden folder inside the table where Spark writes a job's files."""

    def __init__(self, files: TableFiles) -> None:
        self.files = files
        self.relative = f"{STAGING_DIR}/{uuid.uuid4().hex}"
        self.moved: list[str] = []

    def spark_location(self) -> str:
        return spark_uri(f"{self.files.root}/{self.relative}")

    def collect(self, data_schema: T.StructType, partition_by: list[str]) -> list[_StagedFile]:
        staged = []
        prefix = self.relative + "/"
        for entry in self.files.list_files(self.relative):
            relative = entry.path[len(prefix) :] if entry.path.startswith(prefix) else entry.path
            name = relative.rsplit("/", 1)[-1]
            if not name.endswith(".parquet") or name.startswith((".", "_")):
                continue
            metadata = self.files.parquet_metadata(entry.path)
            if metadata.num_rows == 0:
                continue
            directory = relative.rsplit("/", 1)[0] if "/" in relative else ""
            staged.append(
                _StagedFile(
                    path=relative,
                    size=entry.size,
                    partition_values=_partition_values(directory, partition_by),
                    stats=file_stats(metadata, data_schema),
                )
            )
        return staged

    def publish(self, staged: list[_StagedFile]) -> None:
        for file in staged:
            self.files.move(f"{self.relative}/{file.path}", file.path)
            self.moved.append(file.path)

    def discard(self, *, published_too: bool) -> None:
        self.files.delete_dir(self.relative)
        if published_too:
            for path in self.moved:
                self.files.delete_file(path)


def _add_actions(staged: list[_StagedFile]) -> list[AddAction]:
    now_ms = int(time.time() * 1000)
    return [
        AddAction(
            path=file.path,  # delta-rs URI-encodes it in the log
            size=file.size,
            partition_values=file.partition_values,
            modification_time=now_ms,
            data_change=True,
            stats=json.dumps(file.stats),
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


def _commit_properties(
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


def _already_committed(table: deltalake.DeltaTable, app_transaction: AppTransaction | None) -> bool:
    """Whether the table holds this application transaction (or a later one of the app)."""
    if app_transaction is None:
        return False
    committed = table.transaction_version(app_transaction.app_id)
    return committed is not None and committed >= app_transaction.version


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
    label = name or uri
    partition_by = list(partition_by or [])
    files = TableFiles(uri, storage_options)
    exists = deltalake.DeltaTable.is_deltatable(uri, dict(storage_options or {}) or None)
    if (
        not exists
        and files.has_entries()
        and not files.exists(CREATING_MARKER)
        and any(not entry.path.startswith(STAGING_DIR) for entry in files.list_files(""))
    ):
        raise NotADeltaTableError(
            f"Refusing to write to {label}: it holds files but is not a Delta table.",
            fix="choose an empty location, or convert the folder with "
            "`deltalake.convert_to_deltalake(uri)` first",
        )

    table = open_table(uri, storage_options=storage_options, name=label) if exists else None
    if table is not None and _already_committed(table, app_transaction):
        return WriteResult(uri, table.version(), 0, 0, 0, True, time.perf_counter() - started)

    target_schema, projected, new_fields, partition_by = _plan_schema(
        df,
        table,
        uri=uri,
        mode=mode,
        partition_by=partition_by,
        schema_mode=schema_mode,
        storage_options=storage_options,
        label=label,
        replace_partition=replace_partition,
        remove_files=remove_files,
    )
    data_schema = T.StructType([f for f in target_schema.fields if f.name not in partition_by])

    staging = _Staging(files)
    committed_ok = False
    try:
        writer = projected.write.mode("overwrite")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.parquet(staging.spark_location())
        staged = staging.collect(data_schema, partition_by)
        _check_partition(staged, replace_partition if mode == "overwrite" else None, table=label)
        _check_not_null(staged, target_schema, table=label)
        if skip_empty_commit and table is not None and not staged and not remove_files:
            committed_ok = True
            return WriteResult(uri, table.version(), 0, 0, 0, False, time.perf_counter() - started)
        if table is None:
            files.write_bytes_atomic(CREATING_MARKER, b"")
        staging.publish(staged)
        version = _commit(
            table,
            uri,
            staged,
            target_schema,
            new_fields,
            mode=mode,
            partition_by=partition_by,
            replace_partition=replace_partition,
            remove_files=remove_files,
            app_transaction=app_transaction,
            storage_options=storage_options,
            commit_metadata=commit_metadata,
            description=table_description,
            label=label,
        )
        committed_ok = True
        if table is None:
            files.delete_file(CREATING_MARKER)
    finally:
        staging.discard(published_too=not committed_ok)
    return WriteResult(
        uri=uri,
        version=version,
        num_rows=sum(f.stats["numRecords"] for f in staged),
        num_files=len(staged),
        num_bytes=sum(f.size for f in staged),
        skipped=False,
        duration_s=time.perf_counter() - started,
    )


def _nullable_fields(fields: list[T.StructField]) -> list[T.StructField]:
    nullable = as_nullable(T.StructType(fields))
    assert isinstance(nullable, T.StructType)
    return nullable.fields


def _plan_schema(
    df: DataFrame,
    table: deltalake.DeltaTable | None,
    *,
    uri: str,
    mode: WriteMode,
    partition_by: list[str],
    schema_mode: SchemaMode | None,
    storage_options: Mapping[str, str] | None,
    label: str,
    replace_partition: Mapping[str, Any] | None,
    remove_files: Sequence[DataFile],
) -> tuple[T.StructType, DataFrame, list[T.StructField], list[str]]:
    """(table schema after the write, projected DataFrame, columns to add, partition columns)."""
    if remove_files and (mode != "append" or table is None):
        raise DeltaTableError(
            f"remove_files needs mode='append' on an existing table (table {label}).",
            fix='pass mode="append"',
        )
    if replace_partition and mode != "overwrite":
        raise DeltaTableError(
            f"replace_partition is only meaningful with mode='overwrite' (table {label}).",
            fix='pass mode="overwrite" together with replace_partition',
        )
    full_replace = mode == "overwrite" and not replace_partition
    if table is None or (full_replace and schema_mode == "overwrite"):
        check_partition_columns(df.schema, partition_by, table=label)
        if replace_partition:
            unknown = set(replace_partition) - set(partition_by)
            if unknown:
                raise SchemaMismatchError(
                    f"replace_partition names {sorted(unknown)}, which are not partition "
                    f"columns of table {label} (partition_by={partition_by}).",
                    fix="pass the table's partition columns in partition_by",
                )
        spark_to_delta_schema(df.schema)  # fail early on types Delta cannot store
        schema = as_nullable(df.schema)
        assert isinstance(schema, T.StructType)
        return schema, df, [], partition_by

    snapshot = load_snapshot(uri, storage_options=storage_options, name=label)
    existing = list(snapshot.partition_columns)
    if partition_by and partition_by != existing:
        raise SchemaMismatchError(
            f"Table {label} is partitioned by {existing}, not {partition_by}.",
            fix=f"pass partition_by={existing} (or none), or write to a new table",
        )
    if replace_partition and set(replace_partition) != set(existing):
        raise SchemaMismatchError(
            f"replace_partition must give every partition column of table {label} "
            f"({existing}); got {sorted(replace_partition)}.",
            fix=f"pass replace_partition={{{', '.join(repr(c) + ': ...' for c in existing)}}}",
        )
    plan = plan_append(df.schema, snapshot.schema, table=label, merge=schema_mode == "merge")
    schema = T.StructType(list(snapshot.schema.fields) + list(_nullable_fields(plan.new_fields)))
    return schema, df.select(*plan.columns), plan.new_fields, existing


def _create_or_join(
    uri: str,
    delta_schema: deltalake.Schema,
    staged: list[_StagedFile],
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


def _commit(
    table: deltalake.DeltaTable | None,
    uri: str,
    staged: list[_StagedFile],
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
    properties = _commit_properties(app_transaction, commit_metadata)
    actions: list[AddAction | RemoveAction] = [
        *_add_actions(staged),
        *_remove_actions(remove_files),
    ]
    delta_schema = spark_to_delta_schema(schema)
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
            if table is None:
                return open_table(uri, storage_options=storage_options, name=label).version()
        if new_fields:
            table.alter.add_columns([delta_field(field) for field in new_fields])
        filters = (
            [(c, "in", sorted(v, key=str)) for c, v in _allowed_values(replace_partition).items()]
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
        )
    except CommitFailedError as exc:
        raise ConcurrentWriteError(
            f"Another writer committed a conflicting change to table {label} first: {exc}. "
            "This write was not committed.",
            fix="retry the write; for the operator, rerun the job (batches are idempotent)",
        ) from exc
    return open_table(uri, storage_options=storage_options, name=label).version()


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
    if not deltalake.DeltaTable.is_deltatable(uri, dict(storage_options or {}) or None):
        return
    snapshot = load_snapshot(uri, storage_options=storage_options, name=name)
    plan_append(schema, snapshot.schema, table=name or uri, merge=schema_mode == "merge")


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

    Idempotent like :func:`write_dataframe`: skipped when the application transaction
    was already committed.
    """
    started = time.perf_counter()
    uri = normalize_uri(uri)
    label = name or uri
    table = open_table(uri, storage_options=storage_options, name=label)
    if _already_committed(table, app_transaction):
        return WriteResult(uri, table.version(), 0, 0, 0, True, time.perf_counter() - started)
    properties = _commit_properties(app_transaction, commit_metadata)
    try:
        table.create_write_transaction(
            list(_remove_actions(files)),
            "append",
            table.schema(),
            partition_by=table.metadata().partition_columns or None,
            commit_properties=properties,
        )
    except CommitFailedError as exc:
        raise ConcurrentWriteError(
            f"Another writer committed a conflicting change to table {label} first: {exc}.",
            fix="rerun (batches are idempotent)",
        ) from exc
    version = open_table(uri, storage_options=storage_options, name=label).version()
    return WriteResult(uri, version, 0, 0, 0, False, time.perf_counter() - started)

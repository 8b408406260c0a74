"""Planning a bridge write against its table, before any Spark job: the table's schema
after the write, the DataFrame projected onto it (and checked against the table's
constraints as it is written), the columns it adds, its partitions. The table's writer
features are checked here too (:func:`~dagster_sideinputs.delta.bridge.table.check_writable`):
nothing is staged for a table the bridge may not write.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from dagster_sideinputs.delta.bridge.table import is_table, load_snapshot
from dagster_sideinputs.delta.engine import SchemaMode, StagedWrite, WriteMode
from dagster_sideinputs.delta.schema import plan_write_schema
from dagster_sideinputs.delta.staging import (
    BridgeStage,
    StagedFile,
    Staging,
    check_not_null,
    check_partition,
    checked_constraints,
    nested_not_null,
    refuse_blocked_location,
    refuse_foreign_folder,
    table_constraints,
)
from dagster_sideinputs.delta.store.files import TableFiles, normalize_uri


@dataclass(frozen=True)
class TablePlan:
    """A bridge write planned against its table, before any Spark job: the table's schema
    after the write, ``df`` projected onto it, the columns it adds, its partitions."""

    uri: str
    label: str
    files: TableFiles
    exists: bool
    schema: T.StructType
    projected: DataFrame
    new_fields: list[T.StructField]
    partition_by: list[str]
    mode: WriteMode = "append"
    replace_partition: Mapping[str, Any] | None = None
    schema_mode: SchemaMode | None = None
    storage_options: Mapping[str, str] | None = None
    constraints: Mapping[str, str] = field(default_factory=dict)
    """The table's CHECK constraints and nested NOT NULL fields, which ``projected``
    checks as it is written (:func:`~dagster_sideinputs.delta.staging.checked_constraints`)."""
    configuration: Mapping[str, str | None] = field(default_factory=dict)
    """The table's properties (empty for a new table): its statistics columns among them."""

    def staged(self, staging: Staging, files: list[StagedFile], seconds: float) -> StagedWrite:
        """The staged write of ``files`` (in ``staging``), checked against the plan."""
        check_partition(
            files, self.replace_partition if self.mode == "overwrite" else None, table=self.label
        )
        check_not_null(files, self.schema, table=self.label)
        return StagedWrite(
            uri=self.uri,
            name=self.label,
            mode=self.mode,
            partition_by=self.partition_by,
            replace_partition=self.replace_partition,
            schema_mode=self.schema_mode,
            num_rows=sum(f.stats["numRecords"] for f in files),
            num_files=len(files),
            num_bytes=sum(f.size for f in files),
            seconds=seconds,
            handle=BridgeStage(
                staging, files, self.schema, self.new_fields, self.exists, self.storage_options
            ),
        )


def plan_table(
    df: DataFrame,
    uri: str,
    *,
    mode: WriteMode = "append",
    partition_by: list[str] | None = None,
    replace_partition: Mapping[str, Any] | None = None,
    schema_mode: SchemaMode | None = None,
    storage_options: Mapping[str, str] | None = None,
    name: str | None = None,
) -> TablePlan:
    """Plan a write of ``df`` to the table at ``uri`` (see :class:`TablePlan`).

    Raises:
        SchemaMismatchError: the DataFrame does not fit the table.
        NotADeltaTableError: ``uri`` holds non-Delta files.
    """
    uri = normalize_uri(uri)
    label = name or uri
    files = TableFiles(uri, storage_options)
    refuse_blocked_location(uri, label)  # first: the log reader raises on a file in the path
    exists = is_table(uri, storage_options)
    if not exists:
        refuse_foreign_folder(files, label)
    snapshot = (
        load_snapshot(uri, storage_options=storage_options, name=label, writing=True)
        if exists
        else None
    )
    schema, projected, new_fields, partitions = plan_write_schema(
        df,
        None if snapshot is None else snapshot.schema,
        [] if snapshot is None else list(snapshot.partition_columns),
        mode=mode,
        partition_by=list(partition_by or []),
        schema_mode=schema_mode,
        label=label,
        replace_partition=replace_partition,
    )
    constraints = (
        {**table_constraints(snapshot.configuration), **nested_not_null(schema)} if snapshot else {}
    )
    return TablePlan(
        uri, label, files, exists, schema, checked_constraints(projected, constraints),
        new_fields, partitions, mode, replace_partition, schema_mode, storage_options,
        constraints, dict(snapshot.configuration) if snapshot else {},
    )  # fmt: skip

"""Staging for the delta-spark engine: the written rows planned against the table
(schema, partitions, a folder that is not a table refused), persisted, and materialized
by one aggregation that counts them and checks NOT NULL columns and the partitions an
overwrite promised to stay in. Every error of the user's code or data surfaces here;
nothing is written. (A plain append on a classic session is staged by Delta's own
transaction instead: :func:`~dagster_sideinputs.delta.spark.direct.stage_append`.)
"""

import dataclasses
import functools
import os
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.delta.engine import SchemaMode, StagedWrite, TableSnapshot, WriteMode
from dagster_sideinputs.delta.log.state import LogState
from dagster_sideinputs.delta.schema import plan_write_schema, quoted
from dagster_sideinputs.delta.spark.commit import write_error
from dagster_sideinputs.delta.spark.direct import DirectStage, plain_append, stage_append
from dagster_sideinputs.delta.staging import CREATING_MARKER, allowed_values
from dagster_sideinputs.delta.store.files import is_local, spark_uri
from dagster_sideinputs.errors import NotADeltaTableError, SchemaMismatchError


@dataclass
class SparkStage:
    """What the native engine keeps between staging and committing."""

    frame: DataFrame
    schema: T.StructType
    table_existed: bool
    persisted: bool
    direct: "DirectStage | None" = None  # files Delta's transaction already wrote


def plan_rows(
    df: DataFrame,
    uri: str,
    label: str,
    current: TableSnapshot | None,
    *,
    mode: WriteMode,
    partition_by: list[str] | None,
    replace_partition: Mapping[str, Any] | None,
    schema_mode: SchemaMode | None,
) -> tuple[DataFrame, T.StructType, list[str]]:
    """(projected frame, table schema after the write, partition columns) of a write of
    ``df`` to the table whose latest version is ``current`` (None: no table yet)."""
    if current is None:
        refuse_foreign_folder(uri, label)
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
    return projected, schema, partitions


def refuse_foreign_folder(uri: str, label: str) -> None:
    """A folder holding files but no Delta log is someone's data: never write into it."""
    if not is_local(uri):
        return  # listing an object store prefix costs a Spark job; Delta ignores strays
    if os.path.exists(os.path.join(uri, CREATING_MARKER)):
        return  # the uncommitted files of an interrupted first split write (spark_split)
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


def materialize_and_check(
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
            F.sum(F.when(F.col(quoted(column)).isNull(), 1).otherwise(0)).alias(f"n{index}")
        )
    allowed = allowed_values(replace_partition) if replace_partition else {}
    if allowed:
        inside = functools.reduce(
            lambda a, b: a & b,
            [
                _allowed_condition(F.col(quoted(c)).cast("string"), values)
                for c, values in allowed.items()
            ],
        )
        outside = F.struct(*[F.col(quoted(c)).cast("string").alias(c) for c in allowed])
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


def stage_rows(
    df: DataFrame,
    uri: str,
    label: str,
    state: LogState | None,
    *,
    mode: WriteMode,
    partition_by: list[str] | None,
    replace_partition: Mapping[str, Any] | None,
    schema_mode: SchemaMode | None,
) -> StagedWrite:
    """Stage a write of ``df`` to the table at ``state`` (None: no table yet): a plain
    append on a classic session through Delta's transaction (its files written now),
    anything else persisted and checked by :func:`materialize_and_check`."""
    started = time.perf_counter()
    current = None if state is None else state.table_snapshot()
    projected, schema, partitions = plan_rows(
        df, uri, label, current, mode=mode, partition_by=partition_by,
        replace_partition=replace_partition, schema_mode=schema_mode,
    )  # fmt: skip
    staged = StagedWrite(
        uri=uri,
        name=label,
        mode=mode,
        partition_by=partitions,
        replace_partition=replace_partition,
        schema_mode=schema_mode,
        num_rows=0,
        seconds=0.0,
        handle=None,
    )
    if state is not None and plain_append(
        projected, state, mode=mode, schema_mode=schema_mode, partition_by=partitions
    ):
        try:
            direct = stage_append(projected, uri, state)
        except Exception as exc:
            error = write_error(exc, label)
            if error is exc:
                raise
            raise error from exc
        if direct is not None:
            rows = direct.rows
            if rows is None:  # a file without statistics: count what was written
                rows = projected.sparkSession.read.parquet(
                    *[spark_uri(f"{uri}/{unquote(p)}") for p in direct.paths]
                ).count()
            return dataclasses.replace(
                staged,
                num_rows=rows,
                num_files=len(direct.paths),
                seconds=time.perf_counter() - started,
                handle=SparkStage(projected, schema, True, persisted=False, direct=direct),
            )
    frame = projected.persist(StorageLevel.MEMORY_AND_DISK_DESER)
    try:
        rows = materialize_and_check(
            frame, schema, replace_partition if mode == "overwrite" else None, label
        )
    except BaseException:
        frame.unpersist()
        raise
    return dataclasses.replace(
        staged,
        num_rows=rows,
        seconds=time.perf_counter() - started,
        handle=SparkStage(frame, schema, current is not None, persisted=True),
    )

"""One Spark job staging appends to several tables (the bridge's
``DeltaEngine.stage_split``): Spark writes the rows partitioned by a split column into one
staging folder; each table's files are then renamed into its own staging folder and
committed like any staged write (:func:`~dagster_sideinputs.delta.writer.commit_staged`).
"""

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from dagster_sideinputs.delta.engine import SplitTarget, StagedWrite
from dagster_sideinputs.delta.files import TableFiles, normalize_uri
from dagster_sideinputs.delta.s3 import configure_spark
from dagster_sideinputs.delta.schema import plan_write_schema
from dagster_sideinputs.delta.staging import (
    BridgeStage,
    Staging,
    check_not_null,
    refuse_foreign_folder,
)
from dagster_sideinputs.delta.table import is_table, load_snapshot


def stage_split_dataframe(
    df: DataFrame,
    column: str,
    targets: Sequence[SplitTarget],
    *,
    storage_options: Mapping[str, str] | None = None,
) -> list[StagedWrite] | None:
    """Stage appends to several tables with one Spark job (see ``DeltaEngine.stage_split``).

    Spark writes ``df`` partitioned by ``column`` into the first table's staging folder;
    each table's files are then renamed into its own staging folder, and staged as by
    :func:`stage_dataframe`. Only for local tables on one filesystem whose schema takes
    the rows as they are (no cast, reorder or partitioning): None otherwise, before any
    Spark job, and the caller stages each table on its own.
    """
    started = time.perf_counter()
    data = df.drop(column)
    planned: list[_SplitPlan] = []
    for target in targets:
        uri = normalize_uri(target.uri)
        label = target.name or uri
        files = TableFiles(uri, storage_options)
        if not files.local:
            return None
        exists = is_table(uri, storage_options)
        if not exists:
            refuse_foreign_folder(files, label)
        snapshot = (
            load_snapshot(uri, storage_options=storage_options, name=label) if exists else None
        )
        schema, projected, new_fields, partition_by = plan_write_schema(
            data,
            None if snapshot is None else snapshot.schema,
            [] if snapshot is None else list(snapshot.partition_columns),
            mode="append",
            partition_by=[],
            schema_mode=target.schema_mode,
            label=label,
            replace_partition=None,
        )
        if partition_by or projected.schema != data.schema:
            return None  # this table takes the rows in another shape
        planned.append(_SplitPlan(target, uri, label, files, exists, schema, new_fields))
    if len({_filesystem(plan.uri) for plan in planned}) > 1:
        return None  # files could not be renamed from one table into another
    configure_spark(df.sparkSession, planned[0].uri, storage_options)
    shared = Staging(planned[0].files)
    stagings = [Staging(plan.files) for plan in planned]
    writes: list[StagedWrite] = []
    try:
        df.write.mode("overwrite").partitionBy(column).parquet(shared.spark_location())
        job_seconds = time.perf_counter() - started
        for index, (plan, staging) in enumerate(zip(planned, stagings, strict=True)):
            moved = time.perf_counter()
            staging.take_over(shared, f"{column}={plan.target.value}")
            staged = staging.collect(plan.schema, [])
            check_not_null(staged, plan.schema, table=plan.label)
            writes.append(
                StagedWrite(
                    uri=plan.uri,
                    name=plan.label,
                    mode="append",
                    partition_by=[],
                    replace_partition=None,
                    schema_mode=plan.target.schema_mode,
                    num_rows=sum(f.stats["numRecords"] for f in staged),
                    num_files=len(staged),
                    num_bytes=sum(f.size for f in staged),
                    seconds=(job_seconds if index == 0 else 0.0) + time.perf_counter() - moved,
                    handle=BridgeStage(
                        staging, staged, plan.schema, plan.new_fields, plan.exists, storage_options
                    ),
                )
            )
    except BaseException:
        for staging in stagings:
            staging.discard(published_too=False)
        raise
    finally:
        shared.discard(published_too=False)
    return writes


@dataclass(frozen=True)
class _SplitPlan:
    target: SplitTarget
    uri: str
    label: str
    files: TableFiles
    exists: bool
    schema: T.StructType
    new_fields: list[T.StructField]


def _filesystem(path: str) -> int:
    """The device of a local path (of its nearest existing folder)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return os.stat(path).st_dev


__all__ = ["stage_split_dataframe"]

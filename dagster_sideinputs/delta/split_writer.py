"""One Spark job staging appends to several tables (the bridge's
``DeltaEngine.stage_split``): Spark writes the rows partitioned by a split column into one
staging folder; each table's files are then renamed into its own staging folder and
committed like any staged write (:func:`~dagster_sideinputs.delta.writer.commit_staged`).
"""

import os
import time
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame

from dagster_sideinputs.delta.engine import SplitTarget, StagedWrite
from dagster_sideinputs.delta.files import is_local, normalize_uri
from dagster_sideinputs.delta.s3 import configure_spark
from dagster_sideinputs.delta.spark_session import session_setting
from dagster_sideinputs.delta.staging import Staging
from dagster_sideinputs.delta.write_plan import TablePlan, plan_table


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
    data = df.drop(column)
    plans: list[TablePlan] = []
    for target in targets:
        if not is_local(normalize_uri(target.uri)):
            return None
        plan = plan_table(
            data,
            target.uri,
            schema_mode=target.schema_mode,
            storage_options=storage_options,
            name=target.name,
        )
        if plan.partition_by or plan.projected.schema != data.schema:
            return None  # this table takes the rows in another shape
        if plan.constraints:
            return None  # its rows are checked as they are written
        plans.append(plan)
    if not same_filesystem([plan.uri for plan in plans]):
        return None  # files could not be renamed from one table into another
    configure_spark(df.sparkSession, plans[0].uri, storage_options)
    stagings = [Staging(plan.files) for plan in plans]
    writes: list[StagedWrite] = []
    try:
        values = [target.value for target in targets]
        seconds = split_job(
            df, column, Staging(plans[0].files), list(zip(values, stagings, strict=True))
        )
        for plan, staging in zip(plans, stagings, strict=True):
            files = staging.collect(plan.schema, [], plan.configuration)
            writes.append(plan.staged(staging, files, seconds))
            seconds = 0.0  # the job's time goes to the first table
    except BaseException:
        for staging in stagings:
            staging.discard(published_too=False)
        raise
    return writes


def split_job(
    df: DataFrame, column: str, shared: Staging, parts: Sequence[tuple[int, Staging]]
) -> float:
    """One Spark job writing ``df`` partitioned by ``column`` into ``shared``; the files of
    each ``(value, staging)`` are then moved into that staging folder (renames), and
    ``shared`` is removed. Returns the seconds it took."""
    started = time.perf_counter()
    try:
        with session_setting(df.sparkSession, CONCURRENT_WRITERS, _writers(df, len(parts))):
            df.write.mode("overwrite").partitionBy(column).parquet(shared.spark_location())
        for value, staging in parts:
            staging.take_over(shared, f"{column}={value}")
    finally:
        shared.discard(published_too=False)
    return time.perf_counter() - started


def write_job(df: DataFrame, staging: Staging) -> float:
    """One Spark job writing ``df``'s rows into ``staging``; returns the seconds it took.
    On failure the folder is left for the caller's discard."""
    started = time.perf_counter()
    df.write.mode("overwrite").parquet(staging.spark_location())
    return time.perf_counter() - started


def same_filesystem(paths: Sequence[str]) -> bool:
    """Whether local ``paths`` are on one filesystem (files can be renamed between them)."""
    return len({_filesystem(path) for path in paths}) <= 1


CONCURRENT_WRITERS = "spark.sql.maxConcurrentOutputFileWriters"
MAX_WRITERS = 16  # files open per task at most (each buffers a row group); then Spark sorts


def _writers(df: DataFrame, targets: int) -> str | None:
    """The setting that lets each task keep one file open per target (None: it already
    may). Without it Spark sorts every task's rows by the split column before writing;
    with it rows stream into their table's file as they come. Measured (4M records, two
    outputs, local[2], medians of 4-6): a broadcast join whose second output filtered
    before the join: 3.88 s unsorted, 4.22 s sorted, 3.95 s as two separate writes; a
    shuffled join whose second output filtered on a joined column: 4.65, 5.20, 5.97 s."""
    try:
        current = int(df.sparkSession.conf.get(CONCURRENT_WRITERS, "0") or 0)
    except ValueError:
        current = 0
    wanted = min(targets, MAX_WRITERS)
    return None if current >= wanted else str(wanted)


def _filesystem(path: str) -> int:
    """The device of a local path (of its nearest existing folder)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return os.stat(path).st_dev


__all__ = ["same_filesystem", "split_job", "stage_split_dataframe", "write_job"]

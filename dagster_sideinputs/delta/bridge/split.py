"""One Spark job staging appends to several tables (the bridge's
``DeltaEngine.stage_split``): Spark writes the rows partitioned by a split column into one
staging folder; each table's files are then renamed into its own staging folder and
committed like any staged write (:func:`~dagster_sideinputs.delta.bridge.writer.commit_staged`).
"""

from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame

from dagster_sideinputs.delta.bridge.write_plan import TablePlan, plan_table
from dagster_sideinputs.delta.engine import SplitTarget, StagedWrite
from dagster_sideinputs.delta.staging import Staging, same_filesystem, split_job
from dagster_sideinputs.delta.store.files import is_local, normalize_uri
from dagster_sideinputs.delta.store.s3 import configure_spark


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

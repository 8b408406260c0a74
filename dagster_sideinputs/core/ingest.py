"""Reading a batch's records: new main-input records and the buffered ones it releases.

New records get the operator's bookkeeping columns (namespace window, key group, first
seen, batch, fingerprint); buffered records already carry them. A pre-keyed main input
is read as a bucketed table, so keyed joins do not shuffle it.
"""

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.buffer import (
    BATCH,
    FINGERPRINT,
    FIRST_SEEN,
    KEY_GROUP,
    REASON,
    SLOT,
    BufferState,
    fingerprint,
)
from dagster_sideinputs.core.keyed import bucketed_scan, check_pre_keyed, key_group
from dagster_sideinputs.core.plan import BatchPlan, MainRange
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.windows import assign_global, assign_windows
from dagster_sideinputs.delta.files import TableFiles, join_uri, spark_uri
from dagster_sideinputs.delta.log import added_files
from dagster_sideinputs.delta.table import TableSnapshot

ORIGIN = "_dsi_origin"
CORRUPT = "_dsi_corrupt_record"
DEFAULT_KEY_GROUPS = 128
PRE_KEYED_MARK = "dsi-pre-keyed-violation"


class BatchReader:
    """Reads the records of planned batches of one operator."""

    def __init__(self, spec: OperatorSpec, spark: SparkSession) -> None:
        self.spec = spec
        self.spark = spark
        self.engine = spec.storage.delta

    def main_files(self, main: MainRange) -> tuple[list[Any], TableSnapshot | None]:
        """The files of a plan's main range (recomputed identically on replay)."""
        if main.kind == "files" or main.end_version < 0:
            return [], None
        if main.is_empty:
            # A batch of buffered records only: no files, but the main input's schema
            # (as the planner had it), so a replay builds the same columns.
            snapshot = self.engine.snapshot(
                self.spec.main_uri, version=main.end_version, name=self.spec.main.asset
            )
            return [], snapshot
        snapshot = self.engine.snapshot(
            self.spec.main_uri, version=main.end_version, name=self.spec.main.asset
        )
        if main.start_version < 0:
            return list(snapshot.files), snapshot
        files = added_files(
            TableFiles(self.spec.main_uri, self.spec.storage.storage_options),
            main.start_version,
            main.end_version,
            table=self.spec.main.asset,
        )
        return files, snapshot

    def raw_main(
        self, main: MainRange, files: list[Any], snapshot: TableSnapshot | None
    ) -> DataFrame:
        """New main records, exactly as stored (no bookkeeping columns)."""
        spec = self.spec
        if main.kind == "files":
            return self._read_landed(main)
        if main.is_empty or snapshot is None:
            schema = snapshot.schema if snapshot is not None else T.StructType([])
            return self.spark.createDataFrame([], schema)
        return self.engine.read_snapshot(self.spark, snapshot, files=files, name=spec.main.asset)

    def _landing_schema(self) -> T.StructType:
        declared = self.spec.main.schema
        schema = T.StructType.fromDDL(declared) if isinstance(declared, str) else declared
        assert isinstance(schema, T.StructType)
        return schema

    def _read_landed(self, main: MainRange) -> DataFrame:
        folder = self.spec.main.path
        assert folder is not None
        schema = self._landing_schema()
        if not main.files:
            return self.spark.createDataFrame([], schema)
        reader = self.spark.read.format(self.spec.main.format).options(
            **dict(self.spec.main.read_options)
        )
        uris = [spark_uri(join_uri(folder, f["path"])) for f in main.files if f["size"] > 0]
        if not uris:
            return self.spark.createDataFrame([], schema)
        if self.spec.main.format in ("json", "csv"):
            with_corrupt = T.StructType([*schema.fields, T.StructField(CORRUPT, T.StringType())])
            return (
                reader.schema(with_corrupt)
                .option("mode", "PERMISSIVE")
                .option("columnNameOfCorruptRecord", CORRUPT)
                .load(uris)
            )
        return reader.schema(schema).load(uris)

    def bookkeeping(self, raw: DataFrame, plan: BatchPlan, main_columns: list[str]) -> DataFrame:
        spec = self.spec
        df = raw
        if spec.window is not None:
            assert spec.window.time_column is not None
            df = assign_windows(df, spec.window, spec.window.time_column)
        else:
            df = assign_global(df)
        groups = spec.main.pre_keyed.max_key_groups if spec.main.pre_keyed else DEFAULT_KEY_GROUPS
        key = spec.main.key
        df = df.withColumn(KEY_GROUP, key_group(key, groups) if key else F.lit(None).cast("int"))
        return (
            df.withColumn(FIRST_SEEN, F.lit(plan.now).cast("timestamp"))
            .withColumn(BATCH, F.lit(plan.batch_id).cast("long"))
            .withColumn(FINGERPRINT, fingerprint(main_columns))
            .withColumn(ORIGIN, F.lit("new"))
        )

    def buffered(self, plan: BatchPlan) -> tuple[DataFrame | None, BufferState]:
        spec = self.spec
        if plan.buffer_version < 0:
            return None, BufferState(None)
        snapshot = self.engine.snapshot(spec.buffer_uri, version=plan.buffer_version, name="buffer")
        state = BufferState(snapshot)
        if not plan.read_slots:
            return None, state
        files = state.files(plan.read_slots)
        if not files:
            return None, state
        rows = self.engine.read_snapshot(self.spark, snapshot, files=files, name="buffer")
        return rows.drop(SLOT, REASON).withColumn(ORIGIN, F.lit("buffer")), state

    def pre_keyed(
        self, raw: DataFrame, files: list[Any], snapshot: TableSnapshot | None
    ) -> tuple[DataFrame, str, str | None]:
        spec = self.spec
        keyed = spec.main.pre_keyed
        assert keyed is not None
        assert spec.main.key is not None
        assert snapshot is not None
        splits = check_pre_keyed(files, keyed, key=spec.main.key, table=spec.main.asset)
        partition_columns = set(snapshot.partition_columns)
        if partition_columns - {keyed.column}:
            return (
                raw,
                "pre-keyed: partition columns besides the key group; read with a shuffle",
                None,
            )
        scan = bucketed_scan(
            self.spark,
            splits,
            schema=snapshot.data_schema,
            key=spec.main.key,
            max_key_groups=keyed.max_key_groups,
            scratch_dir=join_uri(spec.state_uri, "prekeyed"),
            label=spec.operator_id,
        )
        if scan is None:
            return raw, "pre-keyed: files are not on a local filesystem; read with a shuffle", None
        frame, table = scan
        if keyed.column in partition_columns:
            frame = frame.withColumn(
                keyed.column,
                key_group(spec.main.key, keyed.max_key_groups).cast(
                    snapshot.schema[keyed.column].dataType
                ),
            )
        return (
            frame.select(*snapshot.schema.fieldNames()),
            "pre-keyed: main files read as buckets (no shuffle)",
            table,
        )

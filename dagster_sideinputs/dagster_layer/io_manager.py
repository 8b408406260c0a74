"""Spark DataFrames stored as Delta tables, one table per asset."""

import datetime as dt
import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import dagster as dg
from pydantic import Field
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.spark_errors import storage_error
from dagster_sideinputs.dagster_layer.resources import SparkResource
from dagster_sideinputs.delta.bridge.writer import WriteResult
from dagster_sideinputs.delta.engine import TableSnapshot
from dagster_sideinputs.delta.storage import DeltaStorage
from dagster_sideinputs.delta.store.errors import is_store_error
from dagster_sideinputs.delta.store.s3 import store_label
from dagster_sideinputs.errors import DeclarationError, SchemaMismatchError, SideInputError

R = TypeVar("R")

DEFAULT_PARTITION_COLUMN = "partition"
_WRITE_MODES = ("overwrite", "append")
_SCHEMA_MODES = ("merge", "overwrite")


def _store_faults(doing: str) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Store failures (credentials refused, a store down) of an IO manager call as a
    StorageError naming the asset, the table and the store."""

    def wrap(method: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(method)
        def wrapped(self: "DeltaIOManager", context: Any, *args: Any) -> R:
            try:
                return method(self, context, *args)
            except SideInputError:
                raise
            except Exception as exc:
                if not is_store_error(exc):
                    raise
                asset = context.asset_key.to_user_string()
                storage = self.storage
                raise storage_error(
                    "",
                    exc,
                    f"{doing} table {storage.table_uri(context.asset_key.path)}",
                    store=store_label(storage.root, storage.storage_options),
                    subject=f"Asset {asset}",
                ) from exc

        return wrapped

    return wrap


def table_schema_metadata(schema: T.StructType) -> dg.TableSchema:
    """A Spark schema as Dagster column-schema metadata (the UI's Columns tab)."""
    return dg.TableSchema(
        columns=[dg.TableColumn(name=f.name, type=f.dataType.simpleString()) for f in schema.fields]
    )


def write_metadata(
    result: WriteResult, schema: T.StructType, row_count: int | None = None
) -> dict[str, Any]:
    """Materialization metadata of one Delta write.

    ``rows_written`` is what this write added; ``dagster/row_count`` the rows of the
    table (or of the written partition) after it, as Dagster defines it.
    """
    return {
        "dagster/uri": dg.MetadataValue.path(result.uri),
        "rows_written": result.num_rows,
        **({"dagster/row_count": row_count} if row_count is not None else {}),
        "dagster/column_schema": table_schema_metadata(schema),
        "delta_version": result.version,
        "delta_engine": result.engine,
        "files_added": result.num_files,
        "bytes_added": result.num_bytes,
        "write_seconds": round(result.duration_s, 3),
    }


def _looks_like_key(partitions_def: dg.PartitionsDefinition, value: str) -> bool:
    """Whether ``value`` has the form of one of ``partitions_def``'s keys (time windows:
    its date format; multi-partitions: one part per dimension; static: one of its keys;
    other definitions: any text)."""
    if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        try:
            dt.datetime.strptime(value, partitions_def.fmt)
        except ValueError:
            return False
        return True
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        dimensions = partitions_def.partitions_defs
        parts = value.split("|")
        return len(parts) == len(dimensions) and all(
            _looks_like_key(d.partitions_def, part)
            for d, part in zip(dimensions, parts, strict=True)
        )
    if isinstance(partitions_def, dg.StaticPartitionsDefinition):
        return value in set(partitions_def.get_partition_keys())
    return True


def check_partitioning(
    asset: str,
    snapshot: TableSnapshot,
    column: str,
    keys: Collection[str],
    partitions_def: dg.PartitionsDefinition | None,
    *,
    writing: bool,
) -> None:
    """A partitioned asset's table must be able to hold its partition keys: partitioned
    by ``column`` (the only partition column, for writes), a string column, and not
    holding keys of another partitions definition when a key asked for is not there.
    Otherwise a load would read 0 rows without a word, and a write fail in the writer
    with a fix that does not apply to an asset.

    Raises:
        SchemaMismatchError: naming the asset, the table, the keys and the fix.
    """
    uri = snapshot.uri
    shown = ", ".join(sorted(keys)[:3]) + (", ..." if len(keys) > 3 else "")
    what = f"{'writing' if writing else 'loading'} partition(s) {shown} of asset {asset}"
    columns = list(snapshot.partition_columns)
    move = (
        f"move or delete table {uri} (or write the asset to another path) and materialize "
        "the asset's partitions again (a backfill), which writes a table partitioned by "
        f"{column!r}"
    )
    if not columns:
        raise SchemaMismatchError(
            f"{what.capitalize()}: its table {uri} is not partitioned (it was written "
            f"before the asset was partitioned, or by another writer), so it cannot hold "
            f"partition keys in column {column!r}: a load would read no rows.",
            fix=f"{move}; or declare the asset without partitions_def again",
        )
    if column not in columns:
        raise SchemaMismatchError(
            f"{what.capitalize()}: its table {uri} is partitioned by {columns}, not by "
            f"{column!r}, the column DeltaIOManager keeps the partition key in.",
            fix=f"if {columns[0]!r} holds the asset's partition keys, set metadata="
            f'{{"partition_column": "{columns[0]}"}} on the asset; otherwise {move}',
        )
    kind = snapshot.schema[column].dataType
    if not isinstance(kind, T.StringType):
        raise SchemaMismatchError(
            f"{what.capitalize()}: column {column!r} of its table {uri} is "
            f"{kind.simpleString()}; DeltaIOManager keeps Dagster partition keys as strings "
            f"(e.g. {sorted(keys)[0]!r}), which it cannot hold.",
            fix=f'{move}; or set metadata={{"partition_column": "<another name>"}}',
        )
    if writing and columns != [column]:
        raise SchemaMismatchError(
            f"{what.capitalize()}: its table {uri} is partitioned by {columns}; "
            f"DeltaIOManager writes a partition by {column!r} alone.",
            fix=move,
        )
    if writing or partitions_def is None:
        return
    held = {str(v) for f in snapshot.files if (v := f.partition_values.get(column)) is not None}
    missing = [k for k in keys if k not in held]
    foreign = sorted(v for v in held if not _looks_like_key(partitions_def, v))
    if missing and foreign:
        raise SchemaMismatchError(
            f"{what.capitalize()}: its table {uri} holds no partition {missing[0]!r}, and "
            f"holds keys that are not keys of the asset's partitions ({foreign[:3]}): it "
            "was written under another partitions definition, so a load would read no "
            "rows where the asset has data.",
            fix=f"{move}; or declare the asset's partitions as they were",
        )


def check_unpartitioned_write(
    asset: str, snapshot: TableSnapshot, columns: Sequence[str], partition_by: Sequence[str]
) -> None:
    """An asset without partitions must not overwrite or append to a table partitioned by
    columns its DataFrame lacks (its rows would belong to no partition: null keys).

    Raises:
        SchemaMismatchError: naming the asset, the table and the fix.
    """
    lacking = [c for c in snapshot.partition_columns if c not in columns]
    if snapshot.partition_columns and lacking and not partition_by:
        raise SchemaMismatchError(
            f"Writing asset {asset}: its table {snapshot.uri} is partitioned by "
            f"{list(snapshot.partition_columns)} (written by a partitioned asset), and the "
            f"asset, now without partitions, has no column {lacking[0]!r}: its rows would "
            "belong to no partition.",
            fix=f"declare the asset's partitions_def again, or move or delete table "
            f"{snapshot.uri} (or write the asset to another path) and materialize it again",
        )


class DeltaIOManager(dg.ConfigurableIOManager):
    """Stores asset outputs that are Spark DataFrames as Delta tables, and loads them back.

    The table of asset ``["payments", "fx_rates"]`` lives at ``<root>/payments/fx_rates``.
    Writes go through the storage's Delta engine (``engine``: delta-spark when the session
    has Delta configured, else the delta-rs bridge); Spark writes the files, nothing is
    collected.

    Asset metadata it reads:

    - ``write_mode``: ``"overwrite"`` (default) or ``"append"``.
    - ``schema_mode``: unset: the data must match the table; ``"merge"`` to add new
      columns (missing ones written as nulls), ``"overwrite"`` to replace the schema on
      overwrite.
    - ``partition_by``: partition columns of an unpartitioned asset's table.
    - ``partition_column``: for partitioned assets, the Delta partition column that
      holds the Dagster partition key (default ``"partition"``). A run writes only its
      partition(s); loading a partitioned input reads only the mapped partitions. A
      partition key the table cannot hold (the table unpartitioned, partitioned by
      another column, its key column not a string, or holding keys of another partitions
      definition) is refused on load and write (:func:`check_partitioning`); a partition
      not written yet loads as no rows.

    Each materialization reports the Delta version, rows written, files, path and the
    column schema.

    On S3 (``root="s3a://bucket/lake"`` or ``s3://``) the store's endpoint and
    credentials are the ``AWS_*`` environment variables of the process that runs the
    step, overridden by ``storage_options`` (delta-rs's keys: ``AWS_ENDPOINT_URL``,
    ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
    ``AWS_REGION``, ...). Give secrets as ``dg.EnvVar``: Dagster then keeps only the
    variable's name. The same values reach Spark's s3a (set per bucket on the session);
    the session needs the s3a jars (``SparkResource(packages=["s3"])``).

    Examples:
        .. code-block:: python

            spark = SparkResource()
            defs = dg.Definitions(
                assets=[orders, daily_totals],
                resources={"spark": spark,
                           "io_manager": DeltaIOManager(root="/data/lake", spark=spark)},
            )

            # on S3 (the jars once: make install, i.e.
            # python -m dagster_sideinputs.core.spark.jars fetch)
            spark = SparkResource(packages=["s3"])
            io_manager = DeltaIOManager(
                root="s3a://bucket/lake",
                storage_options={
                    "AWS_ENDPOINT_URL": "https://minio.internal:9000",
                    "AWS_ACCESS_KEY_ID": dg.EnvVar("AWS_ACCESS_KEY_ID"),
                    "AWS_SECRET_ACCESS_KEY": dg.EnvVar("AWS_SECRET_ACCESS_KEY"),
                },
                spark=spark,
            )
    """

    root: str = Field(description="Folder or object store URI under which tables live.")
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="delta-rs object store options, for delta-rs and Spark alike (S3: "
        "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, "
        "AWS_REGION; unset ones come from the AWS_* environment). Pass secrets as "
        "dg.EnvVar('AWS_SECRET_ACCESS_KEY').",
    )
    engine: str | None = Field(
        default=None,
        description="Delta engine: 'auto' (delta-spark when the Spark session has Delta "
        "configured, else the delta-rs bridge), 'delta-spark' or 'delta-rs'. Unset: "
        "$DSI_DELTA_ENGINE, else 'auto'.",
    )
    spark: dg.ResourceDependency[SparkResource]

    def __init__(self, **data: Any) -> None:
        # Without it, loading an input fails deep in a run; say so where the manager is made.
        if data.get("spark") is None:
            raise DeclarationError(
                f"DeltaIOManager(root={data.get('root')!r}) has no SparkResource: it reads "
                "tables back into Spark DataFrames when a downstream asset loads one.",
                fix="pass the same resource the run uses: spark = dsi.SparkResource(); "
                'resources={"spark": spark, "io_manager": dsi.DeltaIOManager(root=..., '
                "spark=spark)}",
            )
        super().__init__(**data)

    @property
    def storage(self) -> DeltaStorage:
        """Where tables live, as the core layer sees it."""
        return DeltaStorage(
            root=self.root,
            storage_options=dict(self.storage_options),
            engine=self.engine,  # type: ignore[arg-type]  # checked by DeltaStorage
        )

    @_store_faults("writing")
    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        asset = context.asset_key.to_user_string()
        if not isinstance(obj, DataFrame):
            raise DeclarationError(
                f"Asset {asset} returned a {type(obj).__name__}; DeltaIOManager stores Spark "
                "DataFrames.",
                fix="return a pyspark.sql.DataFrame, or give this asset another io_manager_key",
            )
        metadata: Mapping[str, Any] = context.definition_metadata or {}
        mode = metadata.get("write_mode", "overwrite")
        if mode not in _WRITE_MODES:
            raise DeclarationError(
                f"Asset {asset} has write_mode={mode!r}; expected one of {_WRITE_MODES}.",
                fix='set metadata={"write_mode": "append"} or "overwrite"',
            )
        schema_mode = metadata.get("schema_mode")
        if schema_mode is not None and schema_mode not in _SCHEMA_MODES:
            # The writer treats an unknown mode like none, which would hide the typo.
            raise DeclarationError(
                f"Asset {asset} has schema_mode={schema_mode!r}; expected one of {_SCHEMA_MODES}.",
                fix='set metadata={"schema_mode": "merge"} or "overwrite", or leave it out',
            )
        storage = self.storage.bind(obj.sparkSession)
        uri = storage.table_uri(context.asset_key.path)
        data, partition_by, replace = self._partitioning(context, obj, metadata, asset)
        if storage.delta.exists(uri):
            current = storage.delta.snapshot(uri, name=asset)
            if replace is None:
                check_unpartitioned_write(asset, current, data.columns, partition_by or [])
            else:
                [(column, written)] = replace.items()
                check_partitioning(
                    asset,
                    current,
                    column,
                    [written] if isinstance(written, str) else list(written),
                    context.asset_partitions_def,
                    writing=True,
                )
        try:
            result = storage.delta.write(
                data,
                uri,
                mode=mode,
                partition_by=partition_by,
                replace_partition=replace if mode == "overwrite" else None,
                schema_mode=schema_mode,
                name=asset,
                commit_metadata={"dagster.run_id": context.run_id, "dagster.asset": asset},
            )
        except SchemaMismatchError as exc:
            raise _as_metadata_fix(exc) from exc
        context.add_output_metadata(
            write_metadata(result, data.schema, self._row_count(storage, result, replace))
        )

    def _row_count(
        self, storage: DeltaStorage, result: WriteResult, partition: dict[str, Any] | None
    ) -> int | None:
        """Rows of the table after a write, or of the partition(s) written (file statistics)."""
        snapshot = storage.delta.snapshot(result.uri, version=result.version)
        if partition is None:
            return snapshot.num_records
        [(column, keys)] = partition.items()
        wanted = {keys} if isinstance(keys, str) else set(keys)
        counts = [f.num_records for f in snapshot.files if f.partition_values.get(column) in wanted]
        return None if any(c is None for c in counts) else sum(c for c in counts if c)

    def _partitioning(
        self, context: dg.OutputContext, df: DataFrame, metadata: Mapping[str, Any], asset: str
    ) -> tuple[DataFrame, list[str] | None, dict[str, Any] | None]:
        if not context.has_asset_partitions:
            partition_by = metadata.get("partition_by")
            # A bare string would otherwise be split into one column per character.
            return df, [partition_by] if isinstance(partition_by, str) else partition_by, None
        column = metadata.get("partition_column", DEFAULT_PARTITION_COLUMN)
        keys = list(context.asset_partition_keys)
        if len(keys) == 1:
            if column in df.columns:
                raise SchemaMismatchError(
                    f"Asset {asset} already has a column {column!r}, which DeltaIOManager "
                    "uses for the partition key.",
                    fix=f'set metadata={{"partition_column": "<another name>"}} or drop {column!r}',
                )
            return df.withColumn(column, F.lit(keys[0])), [column], {column: keys[0]}
        if column not in df.columns:
            raise SchemaMismatchError(
                f"Asset {asset} materializes {len(keys)} partitions in one run, so its "
                f"DataFrame must say which partition each row belongs to in column {column!r}.",
                fix=f'add F.lit(<partition key>).alias("{column}") per row, or run one '
                "partition per run",
            )
        return df, [column], {column: keys}

    @_store_faults("reading")
    def load_input(self, context: dg.InputContext) -> DataFrame:
        asset_key = context.asset_key
        asset = asset_key.to_user_string()
        spark = self.spark.spark_session
        storage = self.storage.bind(spark)
        uri = storage.table_uri(asset_key.path)
        snapshot = storage.delta.snapshot(uri, name=asset)
        partition_filter = None
        keys: list[str] = []
        if context.has_asset_partitions:
            upstream = context.upstream_output
            upstream_metadata = (upstream.definition_metadata if upstream else None) or {}
            column = upstream_metadata.get("partition_column", DEFAULT_PARTITION_COLUMN)
            keys = list(context.asset_partition_keys)
            check_partitioning(
                asset, snapshot, column, keys, context.asset_partitions_def, writing=False
            )
            partition_filter = {column: keys}
        frame = storage.delta.read_snapshot(
            spark, snapshot, partition_filter=partition_filter, name=asset
        )
        # Dagster records input metadata as an observation of one partition, and refuses
        # it when the input spans several (e.g. an unpartitioned downstream asset).
        if partition_filter is None or len(keys) == 1:
            context.add_input_metadata(
                {"delta_version": snapshot.version, "delta_engine": storage.delta.name}
            )
        return frame


def _as_metadata_fix(exc: SchemaMismatchError) -> SchemaMismatchError:
    """The writer's fix in the IO manager's spelling: a write's ``schema_mode`` is the
    asset's ``schema_mode`` metadata here."""
    fix = exc.fix
    for mode in _SCHEMA_MODES:
        spelled = f'schema_mode="{mode}"'
        if fix is not None and spelled in fix:
            fix = fix.replace(spelled, f'metadata={{"schema_mode": "{mode}"}} on the asset')
    return SchemaMismatchError(exc.message, fix=fix)

"""Main-input sources: what is new since the last batch, and reading exactly that.

A source has two sides, used once each per batch:

- the planner asks :meth:`~MainSource.next_range` for the slice after the previous
  batch's (Delta versions, new landed files, or Kafka offsets:
  :mod:`~dagster_sideinputs.core.kafka_source`), checking the input's identity (a table
  recreated under the same path, a landed file that changed after it was read);
- the read stage asks :meth:`~MainSource.files` and :meth:`~MainSource.read` for the
  records of a pinned slice, identical on a replay.

The protocol and its slice are :mod:`~dagster_sideinputs.core.main_source`.
"""

import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from dagster_sideinputs.core.columns import CORRUPT
from dagster_sideinputs.core.decoded import CORRUPT_FORMATS, checked_lines, checked_text
from dagster_sideinputs.core.keyed import check_pre_keyed
from dagster_sideinputs.core.main_source import MainSource, SourceSlice
from dagster_sideinputs.core.plan import MainRange
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.delta.engine import AppTransaction, DataFile, TableSnapshot, WriteResult
from dagster_sideinputs.delta.files import TableFiles, join_uri, spark_uri
from dagster_sideinputs.errors import (
    MainInputDataError,
    NonAppendOnlyChangeError,
    OperatorStateError,
    TableNotFoundError,
)

_HIDDEN = (".", "_")
_GLOB = re.compile(r"([\\*?\[\]{}])")
FOOTER_FILES_LIMIT = 256
"""Landed parquet files whose footers a batch reads on the driver (row counts, null
counts of the key); a batch of more files counts its routes with a Spark job instead."""
_FOOTER_SAFE_OPTIONS = frozenset({"datetimerebasemode", "int96rebasemode", "mergeschema"})
"""Parquet read options known to change no record count: with any other, a job counts
(options that skip files are refused when the input is declared)."""


def source_for(spec: OperatorSpec) -> MainSource:
    if spec.main.is_kafka:
        # Local: an operator without Kafka never loads the Kafka modules.
        from dagster_sideinputs.core.kafka_source import KafkaSource

        return KafkaSource(spec)
    return LandingFolder(spec) if spec.main.is_files else DeltaTableSource(spec)


class DeltaTableSource:
    """A Delta table growing by appends; a slice is a version range ``(start, end]``."""

    def __init__(self, spec: OperatorSpec) -> None:
        self.spec = spec
        self.engine = spec.engine
        self.name = spec.main.asset

    def next_range(self, previous: MainRange | None) -> SourceSlice:
        spec = self.spec
        start = previous.end_version if previous is not None else -1
        known_id = previous.table_id if previous is not None else None
        try:
            latest = self.engine.snapshot(spec.main_uri, name=self.name)
        except TableNotFoundError:  # not materialized yet (a non-Delta folder is an error)
            if start >= 0:
                raise OperatorStateError(
                    f"Main input {self.name!r} ({spec.main_uri}) is gone, but the operator "
                    f"{spec.operator_id!r} has read it up to version {start}.",
                    fix="restore the table; if it was removed on purpose, "
                    "`operator.reset(main_from='beginning')` reads the table created there "
                    "next from its beginning (or main_from=<version> after a copy of the "
                    "rows already read) (docs/operations.md, 'Reset')",
                ) from None
            return SourceSlice(MainRange("delta", start, start))
        if known_id and latest.table_id and latest.table_id != known_id:
            raise OperatorStateError(
                f"Main input {self.name!r} ({spec.main_uri}) was deleted and created again "
                f"(table id {known_id} -> {latest.table_id}): the operator's position "
                f"(version {start}) refers to the old table, and reading on from it would "
                "skip the new table's first records.",
                fix="read the new table from its beginning with "
                "`operator.reset(main_from='beginning')` when it holds only new records "
                "(outputs keep the old table's records); when its first versions hold a "
                "copy of the rows already read, read only the versions after them with "
                "`operator.reset(main_from=<version>)` (the last version of the copy); "
                "or restore the old table",
            )
        if latest.version < start:
            raise OperatorStateError(
                f"Main input {self.name!r} is at version {latest.version}, before the "
                f"operator's position (version {start}): it was restored or replaced.",
                fix="when the table holds only rows already read up to some version, read "
                "on after it with `operator.reset(main_from=<version>)` (e.g. "
                f"main_from={latest.version}: only versions written from now on); when it "
                "holds only new records, `operator.reset(main_from='beginning')`",
            )
        end = latest.version
        if spec.options.max_versions_per_batch is not None:
            end = min(end, start + spec.options.max_versions_per_batch)
        if end <= start:
            return SourceSlice(
                MainRange("delta", start, start, table_id=latest.table_id), (), latest
            )
        snapshot = latest if end == latest.version else self._snapshot(end)
        main = MainRange("delta", start, end, table_id=latest.table_id)
        try:
            return SourceSlice(main, self._added(main, snapshot), snapshot)
        except NonAppendOnlyChangeError as exc:
            changed = exc.version
            if changed is None or changed <= start + 1:
                raise self._not_appended(exc, start) from exc
        # The appends before the change are read now; the next batch stops at the change.
        snapshot = self._snapshot(changed - 1)
        main = MainRange("delta", start, changed - 1, table_id=latest.table_id)
        return SourceSlice(main, self._added(main, snapshot), snapshot)

    def _not_appended(self, exc: NonAppendOnlyChangeError, start: int) -> NonAppendOnlyChangeError:
        """The error for a version right after the operator's position that removed or
        rewrote rows: it names the version and the explicit way past it."""
        version = exc.version
        skip = (
            f"`operator.reset(main_from={version})`"
            if version is not None
            else "`operator.reset(main_from=<version>)`"
        )
        error = NonAppendOnlyChangeError(
            f"Main input {self.name!r} ({self.spec.main_uri}) of operator "
            f"{self.spec.operator_id!r}: version {version} is not an append, and the operator "
            f"has read the table up to version {start}. {exc.message} Nothing was written.",
            fix="keep the main input append-only (write corrections to a new table); to go on "
            f"after reviewing the change, skip that version with {skip}: the rows it removed "
            "stay in the outputs, rows it added or rewrote are not read, later versions are",
        )
        error.version = version
        return error

    def _snapshot(self, version: int) -> TableSnapshot:
        return self.engine.snapshot(self.spec.main_uri, version=version, name=self.name)

    def _added(self, main: MainRange, snapshot: TableSnapshot) -> tuple[DataFile, ...]:
        if main.start_version < 0:
            files: Sequence[DataFile] = snapshot.files
        else:
            files = self.engine.added_files(
                self.spec.main_uri, main.start_version, main.end_version, name=self.name
            )
        keyed = self.spec.main.pre_keyed
        if keyed is not None and self.spec.main.key is not None:
            check_pre_keyed(files, keyed, key=self.spec.main.key, table=self.name)
        return tuple(files)

    def files(self, main: MainRange) -> SourceSlice:
        if main.end_version < 0:
            return SourceSlice(main)
        snapshot = self._snapshot(main.end_version)
        if main.table_id and snapshot.table_id and snapshot.table_id != main.table_id:
            raise OperatorStateError(
                f"Main input {self.name!r} was created again (table id {main.table_id} -> "
                f"{snapshot.table_id}) while batch records of the old table were pending.",
                fix="restore the old table to finish the batch, or start over with "
                "`operator.reset(main_from='beginning')`",
            )
        if main.is_empty:
            return SourceSlice(main, (), snapshot)  # keeps the schema for a buffer-only batch
        return SourceSlice(main, self._added(main, snapshot), snapshot)

    def read(self, spark: SparkSession, piece: SourceSlice) -> DataFrame:
        snapshot = piece.snapshot
        if piece.range.is_empty or snapshot is None:
            schema = snapshot.schema if snapshot is not None else T.StructType([])
            return spark.createDataFrame([], schema)
        return self.engine.read_snapshot(spark, snapshot, files=piece.files, name=self.name)

    def statistics(self, piece: SourceSlice) -> Sequence[DataFile]:
        return piece.files

    def schema(self) -> T.StructType | None:
        return None  # each slice's snapshot has it

    def record_read(self, main: MainRange, txn: AppTransaction) -> WriteResult | None:
        return None  # the position lives in the plans


def _null_count(metadata: pq.FileMetaData, column: str) -> int | None:
    """Nulls in a top-level primitive column of a parquet file, from every row group's
    statistics; None when the file lacks such a column (Spark reads it as null; a nested
    field whose path spells the name is not it) or a row group has no null count."""
    arrow = metadata.schema.to_arrow_schema()
    if arrow.get_field_index(column) < 0 or pa.types.is_nested(arrow.field(column).type):
        return None
    leaves = [i for i in range(metadata.num_columns) if metadata.schema.column(i).path == column]
    if len(leaves) != 1:
        return None
    index = leaves[0]
    total = 0
    for group in range(metadata.num_row_groups):
        if metadata.row_group(group).num_rows == 0:
            continue  # an empty row group keeps no statistics
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_null_count:
            return None
        total += stats.null_count
    return total


def _check_file_name(name: str, asset: str, folder: str) -> None:
    """Refuse a landed file Spark cannot read by name: Hadoop paths cannot hold a ':' in a
    file name (the local file system fails on its checksum path), nor control characters.
    Glob characters are fine: the read escapes them."""
    bad = sorted({c for c in name if c == ":" or ord(c) < 32 or ord(c) == 127})
    if bad:
        raise MainInputDataError(
            f"Landed file {name!r} of main input {asset!r} ({folder}) has {bad} in its name, "
            "which Spark's (Hadoop's) file paths cannot hold: it cannot be read. Nothing was "
            "written.",
            fix="rename the file without those characters (e.g. ':' -> '-'); it is then read "
            "as a new file by the next run",
        )


class LandingFolder:
    """A folder where files land; a slice is a list of new files (path, size, mtime).

    The files read are recorded in a small Delta table (the ledger) in the same batch,
    with the batch's application transaction.
    """

    def __init__(self, spec: OperatorSpec) -> None:
        self.spec = spec
        self.engine = spec.engine
        folder = spec.main.path
        assert folder is not None
        self.folder = folder

    def _seen(self) -> dict[str, tuple[int, int | None]]:
        uri = self.spec.files_seen_uri
        if not self.engine.exists(uri):
            return {}
        table = self.engine.read_rows(uri)
        paths = table.column("path").to_pylist()
        sizes = table.column("size").to_pylist()
        times = (
            table.column("mtime_ms").to_pylist()
            if "mtime_ms" in table.column_names
            else [None] * len(paths)
        )
        return {p: (s, t) for p, s, t in zip(paths, sizes, times, strict=True)}

    def next_range(self, previous: MainRange | None) -> SourceSlice:
        listing = TableFiles(self.folder, self.spec.storage.storage_options)
        if not listing.exists():
            return SourceSlice(MainRange("files"))
        seen = self._seen()
        fresh = []
        for entry in listing.list_files(""):
            if "/" in entry.path or entry.path.startswith(_HIDDEN):
                continue
            known = seen.get(entry.path)
            if known is None:
                _check_file_name(entry.path, self.spec.main.asset, self.folder)
                fresh.append(entry)
                continue
            size, mtime = known
            if size != entry.size or (mtime is not None and mtime != entry.modification_time_ms):
                raise MainInputDataError(
                    f"Landed file {entry.path!r} of main input {self.spec.main.asset!r} "
                    f"({self.folder}) changed after the operator read it (size {size} -> "
                    f"{entry.size} bytes): its new records would never be read. Nothing was "
                    "written.",
                    fix="land new records in new files (files are read once, whole); move the "
                    "changed file away and land its new lines as a new file, then rerun",
                )
        fresh.sort(key=lambda e: (e.modification_time_ms, e.path))
        if self.spec.options.max_files_per_batch is not None:
            fresh = fresh[: self.spec.options.max_files_per_batch]
        listed = tuple(
            {"path": e.path, "size": e.size, "mtime_ms": e.modification_time_ms} for e in fresh
        )
        return SourceSlice(MainRange("files", files=listed))

    def files(self, main: MainRange) -> SourceSlice:
        return SourceSlice(main)

    def statistics(self, piece: SourceSlice) -> Sequence[DataFile]:
        """The landed parquet files with the row counts and key null counts of their
        footers, read on the driver (so that a batch whose every record is released is
        counted without a Spark job: a landing folder then costs what a Delta input
        does). Only counts are taken, never min/max values: a footer's bounds may be
        truncated or absent. Nothing for JSON/CSV, when a footer cannot be read, or with
        too many files: the batch's jobs then count the records, and meet a bad file as
        before."""
        listed = piece.range.files
        options = {name.lower() for name, _ in self.spec.main.read_options}
        if (
            self.spec.main.format != "parquet"
            or not listed
            or len(listed) > FOOTER_FILES_LIMIT
            or not options <= _FOOTER_SAFE_OPTIONS
        ):
            return ()
        store = TableFiles(self.folder, self.spec.storage.storage_options)
        key = self.spec.main.key

        def described(entry: Mapping) -> DataFile:
            path, size = entry["path"], entry["size"]
            uri = join_uri(self.folder, path)
            if size == 0:  # never read (see read)
                return DataFile(path, uri, 0, num_records=0, null_count={key: 0} if key else {})
            metadata = store.parquet_metadata(path)
            nulls: dict[str, int] = {}
            if key is not None:
                counted = _null_count(metadata, key)
                if counted is not None:
                    nulls[key] = counted
            return DataFile(path, uri, size, num_records=metadata.num_rows, null_count=nulls)

        try:
            with ThreadPoolExecutor(max_workers=min(8, len(listed))) as pool:
                return tuple(pool.map(described, listed))
        except Exception:  # an unreadable footer: the Spark jobs decide
            return ()

    def schema(self) -> T.StructType:
        declared = self.spec.main.schema
        schema = T.StructType.fromDDL(declared) if isinstance(declared, str) else declared
        assert isinstance(schema, T.StructType)
        return schema

    def read(self, spark: SparkSession, piece: SourceSlice) -> DataFrame:
        schema = self.schema()
        main = self.spec.main
        uris = [
            _GLOB.sub(r"\\\1", spark_uri(join_uri(self.folder, f["path"])))
            for f in piece.range.files
            if f["size"] > 0
        ]
        if not uris:
            return spark.createDataFrame([], schema)
        # Every listed file is read, whatever the session says: the ledger records each as
        # read once this batch commits (spark.sql.files.ignoreCorruptFiles / ...MissingFiles
        # would otherwise drop a file's records silently).
        reader = (
            spark.read.format(main.format)
            .options(**dict(main.read_options))
            .option("ignoreCorruptFiles", "false")
            .option("ignoreMissingFiles", "false")
        )
        if main.format in CORRUPT_FORMATS:
            with_corrupt = T.StructType([*schema.fields, T.StructField(CORRUPT, T.StringType())])
            parsed = (
                reader.schema(with_corrupt)
                .option("mode", "PERMISSIVE")
                .option("columnNameOfCorruptRecord", CORRUPT)
                .load(uris)
            )
            return checked_lines(parsed, schema)
        if main.format == "text":
            return checked_text(reader.schema(schema).load(uris), schema)
        return reader.schema(schema).load(uris)

    def record_read(self, main: MainRange, txn: AppTransaction) -> WriteResult | None:
        if not main.files:
            return None
        rows = pa.table(
            {
                "path": [f["path"] for f in main.files],
                "size": pa.array([f["size"] for f in main.files], pa.int64()),
                "mtime_ms": pa.array([f.get("mtime_ms") for f in main.files], pa.int64()),
                "batch_id": pa.array([txn.version] * len(main.files), pa.int64()),
            }
        )
        return self.engine.append_rows(
            self.spec.files_seen_uri,
            rows,
            app_transaction=txn,
            name=f"{self.spec.operator_id} files_seen",
        )

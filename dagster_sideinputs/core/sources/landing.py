"""A folder where parquet (or text) files land, as the main input: a slice is the list
of new files; the files read are recorded in a small Delta table (the ledger)."""

import logging
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from dagster_sideinputs.core.columns import CORRUPT
from dagster_sideinputs.core.decoded import CORRUPT_FORMATS, checked_lines, checked_text
from dagster_sideinputs.core.sources.main_source import (
    Caching,
    SourceSlice,
    StartFrom,
    no_version_position,
)
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.state.plan import MainRange
from dagster_sideinputs.delta.engine import AppTransaction, DataFile, WriteResult
from dagster_sideinputs.delta.store.files import TableFiles, join_uri, spark_uri
from dagster_sideinputs.errors import MainInputDataError

log = logging.getLogger("dagster_sideinputs")

_HIDDEN = (".", "_")
_GLOB = re.compile(r"([\\*?\[\]{}])")
FOOTER_FILES_LIMIT = 256
"""Landed parquet files whose footers a batch reads on the driver (row counts, null
counts of the key); a batch of more files counts its routes with a Spark job instead."""
_FOOTER_SAFE_OPTIONS = frozenset({"datetimerebasemode", "int96rebasemode", "mergeschema"})
"""Parquet read options known to change no record count: with any other, a job counts
(options that skip files are refused when the input is declared)."""


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
        if self.spec.main.max_files_per_batch is not None:
            fresh = fresh[: self.spec.main.max_files_per_batch]
        listed = tuple(
            {"path": e.path, "size": e.size, "mtime_ms": e.modification_time_ms} for e in fresh
        )
        return SourceSlice(MainRange("files", files=listed))

    def files(self, main: MainRange) -> SourceSlice:
        return SourceSlice(main)

    def statistics(self, piece: SourceSlice) -> Sequence[DataFile] | None:
        """The landed parquet files with the row counts and key null counts of their
        footers, read on the driver (so that a batch whose every record is released is
        counted without a Spark job: a landing folder then costs what a Delta input
        does). Only counts are taken, never min/max values: a footer's bounds may be
        truncated or absent. Nothing for JSON/CSV, when a footer cannot be read, or with
        too many files: the batch's jobs then count the records, and meet a bad file as
        before."""
        listed = piece.range.files
        options = {name.lower() for name, _ in self.spec.main.read_options}
        store = TableFiles(self.folder, self.spec.storage.storage_options)
        key = self.spec.main.key
        if all(entry["size"] == 0 for entry in listed):  # none, or only empty files
            return tuple(
                DataFile(e["path"], join_uri(self.folder, e["path"]), 0, num_records=0)
                for e in listed
            )
        if (
            self.spec.main.format != "parquet"
            or len(listed) > FOOTER_FILES_LIMIT
            or not options <= _FOOTER_SAFE_OPTIONS
        ):
            return None

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
            return None

    def caching(self) -> Caching:
        return "before_jobs" if self.spec.main.format in CORRUPT_FORMATS else "never"

    def record_count(self, piece: SourceSlice) -> int | None:
        return None  # its statistics count the records

    def record_count_missed(self, piece: SourceSlice) -> None:
        return None  # it offers no count

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

    def reset_to(self, main_from: StartFrom) -> MainRange:
        no_version_position("a landing folder", self.spec.main.asset, main_from)
        return MainRange("files")  # the ledger says which files were read (reset.py)

    def keep(self, kept: MainRange) -> tuple[MainRange, list[str]]:
        return kept, []

    def invalid_fix(self, declare_route: str) -> str:
        # A landed file not read yet can still be corrected.
        return f"fix the records at the source (the landed file), or {declare_route}"

    def tidy(self) -> None:
        """Rewrite the ledger's one-file-per-batch into one file. The batch is committed
        already: a failure here only leaves the ledger as it was (read whole, but correct)."""
        spec = self.spec
        try:
            self.engine.compact(spec.files_seen_uri, name=f"{spec.operator_id} files_seen")
            self.engine.vacuum(spec.files_seen_uri, retention_hours=0)
        except Exception as exc:
            log.warning(
                "%s: the ledger of landed files was not compacted (%s)", spec.operator_id, exc
            )

    def record_reset(self, main_from: StartFrom, txn: AppTransaction) -> None:
        """The position is the ledger of files read: emptied to read every file again
        (``beginning``), or filled with every file there now to read only files landing
        later (``latest``)."""
        if main_from == "beginning":
            TableFiles(self.spec.state_uri, self.spec.storage.storage_options).delete_dir(
                "files_seen"
            )
        elif main_from == "latest":
            self.record_read(self.next_range(None).range, txn)

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

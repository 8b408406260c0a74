"""Where the delta-spark engine reads a table's ``_delta_log`` files from.

Local and shared filesystems are read directly (no JVM, milliseconds). An object store
whose storage options the lake was given (``DeltaStorage(storage_options=...)`` or the
``AWS_*`` variables: the one configuration Spark's s3a settings are made from) is read
with ``obstore`` and those options: a listing and a GET per file, milliseconds too. Any
other location is read through the session's own readers (``binaryFile`` for the
listing, ``text`` for commits, ``parquet`` for checkpoints), so it needs no credentials
but Spark's; each read is then a small Spark job.
"""

import errno
import functools
import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote

import obstore
import pyarrow as pa
import pyarrow.parquet as pq
from obstore.exceptions import NotFoundError
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dagster_sideinputs.delta.store.files import (
    file_in_the_way,
    is_local,
    join_uri,
    normalize_uri,
    spark_uri,
)
from dagster_sideinputs.delta.store.object_store import open_object_store
from dagster_sideinputs.errors import TableNotFoundError

LOG_DIR = "_delta_log"


@dataclass(frozen=True)
class LogEntry:
    """A file of ``_delta_log``: its name, size and modification time."""

    name: str
    size: int
    mtime_ms: int


class LogFiles(Protocol):
    """Read access to one table's ``_delta_log`` folder.

    ``probes``: whether :meth:`entry` is cheap and tells a table recreated at the same
    location apart (local filesystems: a stat, modification times in milliseconds). A
    reader that knows version V then finds newer commits by asking for ``V+1.json``,
    ``V+2.json``, ... instead of listing a log folder that grows with every commit.
    """

    root: str
    probes: bool

    def list_log(self) -> list[LogEntry] | None:
        """The files of ``_delta_log`` (None: there is no such folder)."""
        ...

    def entry(self, name: str) -> LogEntry | None:
        """One file of ``_delta_log`` (None: it does not exist)."""
        ...

    def read_json_lines(self, names: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """Parsed JSON lines of log files (raises FileNotFoundError for a missing one)."""
        ...

    def read_parquet(self, names: Sequence[str], columns: Sequence[str]) -> pa.Table:
        """The ``columns`` (those present) of parquet log files, concatenated."""
        ...

    def holds_files(self) -> bool:
        """Whether the table folder holds anything at all."""
        ...


def _concat(tables: Sequence[pa.Table]) -> pa.Table:
    """Checkpoint parts (or checkpoint and sidecars) as one table; their schemas may
    differ in the optional fields a writer left out."""
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="permissive")


def _parse_lines(raw: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


class LocalLogFiles:
    """A log on a local or shared filesystem, read with ``os`` and pyarrow."""

    probes = True

    def __init__(self, root: str) -> None:
        self.root = normalize_uri(root)
        self._log = os.path.join(self.root, LOG_DIR)

    def list_log(self) -> list[LogEntry] | None:
        try:
            with os.scandir(self._log) as entries:
                found = []
                for entry in entries:
                    if entry.is_file():
                        stat = entry.stat()
                        found.append(LogEntry(entry.name, stat.st_size, int(stat.st_mtime * 1000)))
                return found
        except FileNotFoundError:
            return None
        except NotADirectoryError as exc:
            raise self._in_the_way() from exc

    def entry(self, name: str) -> LogEntry | None:
        try:
            stat = os.stat(os.path.join(self._log, name))
        except FileNotFoundError:
            return None
        except NotADirectoryError as exc:
            raise self._in_the_way() from exc
        return LogEntry(name, stat.st_size, int(stat.st_mtime * 1000))

    def _in_the_way(self) -> NotADirectoryError:
        """A file where the log's folder (or one above it) should be is not "no table":
        the error goes up (the operator raises it as a StorageError naming the file)."""
        blocker = file_in_the_way(self._log) or self._log
        return NotADirectoryError(errno.ENOTDIR, f"{blocker} is a file, not a folder", blocker)

    def read_json_lines(self, names: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        result = {}
        for name in names:
            with open(os.path.join(self._log, name), encoding="utf-8") as handle:
                result[name] = _parse_lines(handle.read())
        return result

    def read_parquet(self, names: Sequence[str], columns: Sequence[str]) -> pa.Table:
        tables = []
        for name in names:
            parquet = pq.ParquetFile(os.path.join(self._log, name))
            present = [c for c in columns if c in parquet.schema_arrow.names]
            tables.append(parquet.read(columns=present))
        return _concat(tables)

    def holds_files(self) -> bool:
        return os.path.isdir(self.root) and any(os.scandir(self.root))


@functools.lru_cache(maxsize=128)
def _store(root: str, options: tuple[tuple[str, str], ...]) -> Any:
    """One obstore client per table root and options: a step reads the same logs often."""
    return open_object_store(root, dict(options))


class ObjectStoreLogFiles:
    """A log on an object store, read with ``obstore`` and the lake's storage options."""

    probes = False  # modification times in seconds: a recreated table could look the same

    def __init__(self, root: str, storage_options: Mapping[str, str]) -> None:
        self.root = normalize_uri(root)
        self._store = _store(self.root, tuple(sorted(storage_options.items())))

    def list_log(self) -> list[LogEntry] | None:
        listed = obstore.list_with_delimiter(self._store, LOG_DIR)
        found = [
            LogEntry(
                meta["path"].rsplit("/", 1)[-1],
                int(meta["size"]),
                int(meta["last_modified"].timestamp() * 1000),
            )
            for meta in listed["objects"]
        ]
        if not found and not listed["common_prefixes"]:
            return None  # an object store has no empty folders: no log at all
        return found

    def entry(self, name: str) -> LogEntry | None:
        try:
            meta = obstore.head(self._store, f"{LOG_DIR}/{name}")
        except NotFoundError:
            return None
        return LogEntry(name, int(meta["size"]), int(meta["last_modified"].timestamp() * 1000))

    def _get(self, name: str) -> bytes:
        try:
            return bytes(obstore.get(self._store, f"{LOG_DIR}/{name}").bytes())
        except NotFoundError as exc:
            raise FileNotFoundError(f"{self.root}/{LOG_DIR}/{name}") from exc

    def read_json_lines(self, names: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        return {name: _parse_lines(self._get(name).decode("utf-8")) for name in names}

    def read_parquet(self, names: Sequence[str], columns: Sequence[str]) -> pa.Table:
        tables = []
        for name in names:
            parquet = pq.ParquetFile(io.BytesIO(self._get(name)))
            present = [c for c in columns if c in parquet.schema_arrow.names]
            tables.append(parquet.read(columns=present))
        return _concat(tables)

    def holds_files(self) -> bool:
        listed = obstore.list_with_delimiter(self._store)
        return bool(listed["objects"] or listed["common_prefixes"])


class SparkLogFiles:
    """A log anywhere Spark can read (object stores, HDFS), through the session's readers.

    Every call is a small Spark job; the listing skips file contents.
    """

    probes = False

    def __init__(self, root: str, spark: SparkSession) -> None:
        self.root = normalize_uri(root)
        self.spark = spark
        self._log = spark_uri(join_uri(self.root, LOG_DIR))

    def _uri(self, name: str) -> str:
        return f"{self._log}/{name}"

    def list_log(self) -> list[LogEntry] | None:
        try:
            rows = (
                self.spark.read.format("binaryFile")
                .load(self._log)
                .select("path", "length", "modificationTime")
                .collect()
            )
        except Exception as exc:
            if is_path_not_found(exc):
                return None
            raise
        return [
            LogEntry(
                unquote(row.path.rsplit("/", 1)[-1]),
                int(row.length),
                int(row.modificationTime.timestamp() * 1000),
            )
            for row in rows
        ]

    def entry(self, name: str) -> LogEntry | None:
        return next((e for e in self.list_log() or [] if e.name == name), None)

    def read_json_lines(self, names: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        if not names:
            return {}
        try:
            rows = (
                self.spark.read.text([self._uri(n) for n in names], wholetext=True)
                .select(F.col("_metadata.file_name").alias("name"), "value")
                .collect()
            )
        except Exception as exc:
            if is_path_not_found(exc):
                raise FileNotFoundError(str(exc)) from exc
            raise
        found = {unquote(row.name): _parse_lines(row.value) for row in rows}
        for name in names:
            found.setdefault(name, [])  # an empty file has no row
        return found

    def read_parquet(self, names: Sequence[str], columns: Sequence[str]) -> pa.Table:
        frame = self.spark.read.option("mergeSchema", "true").parquet(
            *[self._uri(n) for n in names]
        )
        present = [c for c in columns if c in frame.columns]
        return frame.select(*present).toArrow()

    def holds_files(self) -> bool:
        try:
            listing = self.spark.read.format("binaryFile").option("recursiveFileLookup", "true")
            return bool(listing.load(spark_uri(self.root)).select("path").limit(1).collect())
        except Exception as exc:
            if is_path_not_found(exc):
                return False
            raise


def is_path_not_found(exc: BaseException) -> bool:
    """Whether a Spark error (classic or Connect) says a path does not exist."""
    condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    try:
        name = condition() if callable(condition) else None
    except Exception:
        name = None
    return name == "PATH_NOT_FOUND" or "PATH_NOT_FOUND" in str(exc)


def log_files(
    root: str, spark: SparkSession | None, storage_options: Mapping[str, str] | None = None
) -> LogFiles:
    """Direct access for local paths, obstore for object stores with storage options;
    through Spark (which must be given) otherwise."""
    if is_local(root):
        return LocalLogFiles(root)
    if storage_options:
        return ObjectStoreLogFiles(root, storage_options)
    if spark is None:
        raise TableNotFoundError(
            f"The delta-spark engine reads the log of {root} through Spark, and no "
            "SparkSession is bound to it.",
            fix="bind the storage to the session first: storage = storage.bind(spark) "
            "(the operator and the IO manager do this themselves)",
        )
    return SparkLogFiles(root, spark)

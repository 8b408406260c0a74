"""Reading a Delta table's transaction log for the delta-spark engine, without delta-rs.

delta-spark keeps what it knows about a table (the live files, their statistics, the
application transactions) in its JVM, which Python reaches only through py4j internals,
and not at all over Spark Connect. The native engine therefore reads ``_delta_log``
itself, as the Delta protocol specifies: the newest complete checkpoint at or below a
version (classic, multi-part, or v2 with sidecars), then the JSON commits after it; a
file is live when its last action is an ``add`` (actions are keyed by path and deletion
vector).

Local and shared filesystems are read directly (no JVM, milliseconds). Any other
location is read through the session's own readers (``binaryFile`` for the listing,
``text`` for commits, ``parquet`` for checkpoints), so it needs no credentials but
Spark's: no second set of storage credentials, unlike the delta-rs bridge.

Replayed states are immutable per version and cached (keyed by the table, the version
and the size and time of the files they came from), and a newer version is replayed
from the newest cached one, so asking again costs a listing.
"""

import datetime as dt
import decimal
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.delta.engine import DataFile
from dagster_sideinputs.delta.files import is_local, join_uri, normalize_uri, spark_uri
from dagster_sideinputs.delta.log import CommitChanges
from dagster_sideinputs.delta.stats import typed_stats
from dagster_sideinputs.errors import (
    NotADeltaTableError,
    TableNotFoundError,
    UnsupportedTableFeatureError,
)

LOG_DIR = "_delta_log"
PHYSICAL_NAME = "delta.columnMapping.physicalName"
_COLUMN_MAPPING_KEYS = ("delta.columnMapping.id", PHYSICAL_NAME, "delta.columnMapping.nested.ids")

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(
    r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10})|\.([0-9a-fA-F-]{36}))?\.(parquet|json)$"
)
# Features that move commits out of _delta_log (a catalog owns them): reading the
# folder alone would miss commits.
_UNREADABLE_FEATURES = frozenset({"catalogManaged", "catalogOwned-preview", "coordinatedCommits"})
_CHECKPOINT_COLUMNS = ("add", "metaData", "protocol", "txn", "sidecar")
_ADD_FIELDS = ("path", "partitionValues", "size", "modificationTime", "stats", "deletionVector")


# --- where the log files are read from ----------------------------------------------------


@dataclass(frozen=True)
class LogEntry:
    """A file of ``_delta_log``: its name, size and modification time."""

    name: str
    size: int
    mtime_ms: int


class LogFiles(Protocol):
    """Read access to one table's ``_delta_log`` folder."""

    root: str

    def list_log(self) -> list[LogEntry] | None:
        """The files of ``_delta_log`` (None: there is no such folder)."""
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
        except (FileNotFoundError, NotADirectoryError):
            return None

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


class SparkLogFiles:
    """A log anywhere Spark can read (object stores, HDFS), through the session's readers.

    Every call is a small Spark job; the listing skips file contents.
    """

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


def log_files(root: str, spark: SparkSession | None) -> LogFiles:
    """Direct access for local paths; through Spark (which must be given) otherwise."""
    if is_local(root):
        return LocalLogFiles(root)
    if spark is None:
        raise TableNotFoundError(
            f"The delta-spark engine reads the log of {root} through Spark, and no "
            "SparkSession is bound to it.",
            fix="bind the storage to the session first: storage = storage.bind(spark) "
            "(the operator and the IO manager do this themselves)",
        )
    return SparkLogFiles(root, spark)


# --- the replayed state -------------------------------------------------------------------


@dataclass(frozen=True)
class LiveFile:
    """A live ``add`` action as the log holds it (names are physical under column mapping)."""

    path: str
    partition_values: Mapping[str, str | None]
    size: int
    modification_time: int | None
    stats: str | None
    deletion_vector: str | None


@dataclass(frozen=True)
class LogState:
    """A table at one version: what its log says, before any typing."""

    root: str
    version: int
    metadata: Mapping[str, Any]
    protocol: Mapping[str, Any]
    files: Mapping[tuple[str, str | None], LiveFile]
    txns: Mapping[str, int]
    commit_timestamp_ms: int
    signature: tuple[str, int, int]
    _schema: list[T.StructType] = field(default_factory=list, compare=False, repr=False)

    @property
    def table_id(self) -> str:
        return str(self.metadata.get("id", ""))

    @property
    def configuration(self) -> dict[str, str | None]:
        return dict(self.metadata.get("configuration") or {})

    @property
    def raw_schema(self) -> T.StructType:
        """The table schema with Delta's field metadata (column mapping included)."""
        if not self._schema:
            self._schema.append(T.StructType.fromJson(json.loads(self.metadata["schemaString"])))
        return self._schema[0]

    @property
    def schema(self) -> T.StructType:
        """The logical schema, without column-mapping metadata."""
        stripped = strip_column_mapping(self.raw_schema)
        assert isinstance(stripped, T.StructType)
        return stripped

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return tuple(self.metadata.get("partitionColumns") or ())

    @property
    def column_mapping(self) -> bool:
        return self.configuration.get("delta.columnMapping.mode") not in (None, "none")

    @property
    def has_deletion_vectors(self) -> bool:
        return any(f.deletion_vector for f in self.files.values())

    def data_files(self) -> tuple[DataFile, ...]:
        """The live files, with typed partition values and statistics, by path."""
        return tuple(
            sorted(
                (to_data_file(self, f) for f in self.files.values()),
                key=lambda f: f.path,
            )
        )


def strip_column_mapping(data_type: T.DataType) -> T.DataType:
    """A type without Delta's column-mapping field metadata (at every depth)."""
    if isinstance(data_type, T.StructType):
        return T.StructType(
            [
                T.StructField(
                    f.name,
                    strip_column_mapping(f.dataType),
                    f.nullable,
                    {k: v for k, v in (f.metadata or {}).items() if k not in _COLUMN_MAPPING_KEYS},
                )
                for f in data_type.fields
            ]
        )
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(strip_column_mapping(data_type.elementType), data_type.containsNull)
    if isinstance(data_type, T.MapType):
        return T.MapType(
            strip_column_mapping(data_type.keyType),
            strip_column_mapping(data_type.valueType),
            data_type.valueContainsNull,
        )
    return data_type


def physical_name(field_: T.StructField) -> str:
    return str((field_.metadata or {}).get(PHYSICAL_NAME) or field_.name)


def physical_type(data_type: T.DataType) -> T.DataType:
    """The type as stored in the data files: physical field names at every depth."""
    if isinstance(data_type, T.StructType):
        return T.StructType(
            [
                T.StructField(physical_name(f), physical_type(f.dataType), f.nullable)
                for f in data_type.fields
            ]
        )
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(physical_type(data_type.elementType), data_type.containsNull)
    if isinstance(data_type, T.MapType):
        return T.MapType(
            physical_type(data_type.keyType),
            physical_type(data_type.valueType),
            data_type.valueContainsNull,
        )
    return data_type


def _logical_stats(values: Any, schema: T.StructType) -> Any:
    """Statistics keyed by physical names, keyed by logical names instead."""
    if not isinstance(values, dict):
        return values
    by_physical = {physical_name(f): f for f in schema.fields}
    renamed = {}
    for key, value in values.items():
        target = by_physical.get(key)
        if target is None:
            continue
        nested = target.dataType
        renamed[target.name] = (
            _logical_stats(value, nested) if isinstance(nested, T.StructType) else value
        )
    return renamed


def typed_partition_value(raw: str | None, data_type: T.DataType) -> Any:
    """A partition value of the log (a string) as a typed Python value."""
    if raw is None or raw == "":
        return None
    try:
        if isinstance(data_type, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
            return int(raw)
        if isinstance(data_type, T.BooleanType):
            return raw.lower() == "true"
        if isinstance(data_type, T.DateType):
            return dt.date.fromisoformat(raw[:10])
        if isinstance(data_type, T.FloatType | T.DoubleType):
            return float(raw)
        if isinstance(data_type, T.DecimalType):
            return decimal.Decimal(raw)
        if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
            parsed = dt.datetime.fromisoformat(raw.replace(" ", "T").replace("Z", "+00:00"))
            if isinstance(data_type, T.TimestampType):
                if parsed.tzinfo is None:
                    return parsed.replace(tzinfo=dt.timezone.utc)
                return parsed.astimezone(dt.timezone.utc)
            return parsed
    except ValueError:
        return raw
    return raw


def to_data_file(state: LogState, live: LiveFile, *, version: int | None = None) -> DataFile:
    """One add action as a :class:`DataFile` (logical names, typed values)."""
    raw_schema = state.raw_schema
    schema = state.schema
    path = unquote(live.path)
    location = path if ("://" in path or path.startswith("/")) else join_uri(state.root, path)
    by_physical = {physical_name(f): f for f in raw_schema.fields}
    partitions = {}
    for key, raw in live.partition_values.items():
        target = by_physical.get(key)
        name = target.name if target is not None else key
        partitions[name] = (
            typed_partition_value(raw, schema[name].dataType) if target is not None else raw
        )
    stats = json.loads(live.stats) if live.stats else {}
    if state.column_mapping and stats:
        stats = {
            "numRecords": stats.get("numRecords"),
            "minValues": _logical_stats(stats.get("minValues") or {}, raw_schema),
            "maxValues": _logical_stats(stats.get("maxValues") or {}, raw_schema),
            "nullCount": _logical_stats(stats.get("nullCount") or {}, raw_schema),
        }
    records, mins, maxs, nulls = typed_stats(stats, schema)
    return DataFile(
        path=path,
        uri=location,
        size=live.size,
        partition_values=partitions,
        num_records=records,
        min_values=mins,
        max_values=maxs,
        null_count=nulls,
        version=version,
        modification_time_ms=live.modification_time,
    )


# --- replay ------------------------------------------------------------------------------


def _dv_id(vector: Any) -> str | None:
    if not vector:
        return None
    if isinstance(vector, Mapping):
        kind = vector.get("storageType") or ""
        where = vector.get("pathOrInlineDv") or ""
        offset = vector.get("offset")
        return f"{kind}{where}" + (f"@{offset}" if offset is not None else "")
    return str(vector)


def _live_from_json(add: Mapping[str, Any]) -> LiveFile:
    return LiveFile(
        path=add["path"],
        partition_values=dict(add.get("partitionValues") or {}),
        size=int(add.get("size") or 0),
        modification_time=add.get("modificationTime"),
        stats=add.get("stats"),
        deletion_vector=_dv_id(add.get("deletionVector")),
    )


def _adds_from_arrow(table: pa.Table) -> list[LiveFile]:
    """The add actions of checkpoint rows, read column by column (fast for big logs)."""
    if "add" not in table.column_names:
        return []
    column = table.column("add").combine_chunks()
    present = {column.type.field(i).name for i in range(column.type.num_fields)}
    values = {
        name: (column.field(name).to_pylist() if name in present else [None] * len(column))
        for name in _ADD_FIELDS
    }
    valid = column.is_valid().to_pylist()
    files = []
    for index, ok in enumerate(valid):
        if not ok or values["path"][index] is None:
            continue
        partitions = values["partitionValues"][index] or []
        files.append(
            LiveFile(
                path=str(values["path"][index]),
                partition_values=dict(partitions)
                if not isinstance(partitions, dict)
                else partitions,
                size=int(values["size"][index] or 0),
                modification_time=values["modificationTime"][index],
                stats=values["stats"][index],
                deletion_vector=_dv_id(values["deletionVector"][index]),
            )
        )
    return files


def _first_action(table: pa.Table, name: str) -> Any:
    if name not in table.column_names:
        return None
    for value in table.column(name).to_pylist():
        if value is not None:
            return value
    return None


def _actions_of(table: pa.Table, name: str) -> list[Any]:
    if name not in table.column_names:
        return []
    return [v for v in table.column(name).to_pylist() if v is not None]


@dataclass
class _Replay:
    """A state being built (mutable), then frozen into a LogState."""

    root: str
    files: dict[tuple[str, str | None], LiveFile] = field(default_factory=dict)
    txns: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    protocol: dict[str, Any] = field(default_factory=dict)

    def apply(self, actions: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
        """Apply one commit's actions; returns its commitInfo."""
        info = None
        for action in actions:
            if "add" in action:
                live = _live_from_json(action["add"])
                self.files[(live.path, live.deletion_vector)] = live
            elif "remove" in action:
                remove = action["remove"]
                self.files.pop((remove["path"], _dv_id(remove.get("deletionVector"))), None)
            elif "txn" in action:
                txn = action["txn"]
                self.txns[txn["appId"]] = int(txn["version"])
            elif "metaData" in action:
                self.metadata = dict(action["metaData"])
            elif "protocol" in action:
                self.protocol = dict(action["protocol"])
            elif "commitInfo" in action:
                info = action["commitInfo"]
        return info


def _from_ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)


def _commit_time(info: Mapping[str, Any] | None, fallback_ms: int) -> int:
    if info:
        for key in ("inCommitTimestamp", "timestamp"):
            if isinstance(info.get(key), int | float):
                return int(info[key])
    return fallback_ms


@dataclass(frozen=True)
class _Listing:
    commits: dict[int, LogEntry]
    checkpoints: dict[int, list[list[LogEntry]]]

    @property
    def latest(self) -> int:
        versions = list(self.commits) + list(self.checkpoints)
        return max(versions) if versions else -1

    def signature(self, version: int) -> tuple[str, int, int]:
        entry = self.commits.get(version)
        if entry is None:
            entry = self.checkpoints[version][0][0]
        return (entry.name, entry.size, entry.mtime_ms)


def _listing(entries: Iterable[LogEntry]) -> _Listing:
    commits: dict[int, LogEntry] = {}
    multipart: dict[tuple[int, int], dict[int, LogEntry]] = {}
    checkpoints: dict[int, list[list[LogEntry]]] = {}
    for entry in entries:
        match = _COMMIT.match(entry.name)
        if match:
            commits[int(match.group(1))] = entry
            continue
        match = _CHECKPOINT.match(entry.name)
        if not match:
            continue
        version = int(match.group(1))
        if match.group(2):  # multi-part: complete only with every part
            parts = int(match.group(3))
            multipart.setdefault((version, parts), {})[int(match.group(2))] = entry
        else:
            checkpoints.setdefault(version, []).append([entry])
    for (version, parts), found in multipart.items():
        if len(found) == parts:
            checkpoints.setdefault(version, []).append([found[i] for i in sorted(found)])
    return _Listing(commits, checkpoints)


class LogReader:
    """Replays table logs, caching states (one reader per process is enough)."""

    def __init__(self, capacity: int = 64) -> None:
        self._cache: OrderedDict[tuple[str, int], LogState] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity = capacity
        self._timestamps: dict[tuple[str, int, int, int], dt.datetime] = {}

    # --- cache ------------------------------------------------------------------------------

    def _cached(self, root: str, version: int, signature: tuple) -> LogState | None:
        with self._lock:
            state = self._cache.get((root, version))
            if state is not None and state.signature == signature:
                self._cache.move_to_end((root, version))
                return state
            return None

    def _remember(self, state: LogState) -> None:
        with self._lock:
            self._cache[(state.root, state.version)] = state
            self._cache.move_to_end((state.root, state.version))
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)

    def _newest_cached(self, root: str, below: int, listing: _Listing) -> LogState | None:
        """The newest cached state of ``root`` at or below ``below`` that the listing still
        has (same commit file), to replay forward from."""
        with self._lock:
            candidates = [s for (r, v), s in self._cache.items() if r == root and v <= below]
        for state in sorted(candidates, key=lambda s: -s.version):
            entry = listing.commits.get(state.version)
            if entry is not None and state.signature == (entry.name, entry.size, entry.mtime_ms):
                return state
        return None

    # --- reading ----------------------------------------------------------------------------

    def listing(self, files: LogFiles) -> _Listing | None:
        entries = files.list_log()
        if entries is None:
            return None
        listing = _listing(entries)
        return listing if listing.latest >= 0 else None

    def latest_version(self, files: LogFiles) -> int | None:
        listing = self.listing(files)
        return None if listing is None else listing.latest

    def state(self, files: LogFiles, version: int | None = None, *, table: str) -> LogState:
        """The table at ``version`` (latest when None).

        Raises:
            TableNotFoundError: no table, no such version, or commits gone from the log.
            NotADeltaTableError: the folder holds files but no Delta log.
            UnsupportedTableFeatureError: the log is owned by a catalog.
        """
        listing = self.listing(files)
        if listing is None:
            if files.holds_files():
                raise NotADeltaTableError(
                    f"{table} holds files but is not a Delta table (no {LOG_DIR} folder).",
                    fix="point the asset at a Delta table, or convert the parquet folder "
                    f"(delta-spark: CONVERT TO DELTA parquet.`{files.root}`; delta-rs: "
                    "`deltalake.convert_to_deltalake(uri)`)",
                )
            raise TableNotFoundError(
                f"No Delta table at {table}" + (f" (version {version})." if version else "."),
                fix="materialize the upstream asset first, or check the storage root and path",
            )
        target = listing.latest if version is None else version
        if target > listing.latest or target < 0:
            raise TableNotFoundError(
                f"Table {table} has no version {target} (latest: {listing.latest}).",
                fix="ask for an existing version (DESCRIBE HISTORY delta.`<path>`)",
            )
        signature = (
            listing.signature(target)
            if target in listing.commits or (target in listing.checkpoints)
            else ("", 0, 0)
        )
        cached = self._cached(files.root, target, signature)
        if cached is not None:
            return cached
        state = self._replay(files, listing, target, signature, table=table)
        self._remember(state)
        return state

    def _replay(
        self,
        files: LogFiles,
        listing: _Listing,
        target: int,
        signature: tuple[str, int, int],
        *,
        table: str,
    ) -> LogState:
        checkpoint = max((v for v in listing.checkpoints if v <= target), default=-1)
        base = self._newest_cached(files.root, target, listing)
        replay = _Replay(files.root)
        start = 0
        if base is not None and base.version >= checkpoint:
            replay.files = dict(base.files)
            replay.txns = dict(base.txns)
            replay.metadata = dict(base.metadata)
            replay.protocol = dict(base.protocol)
            start = base.version + 1
        elif checkpoint >= 0:
            self._read_checkpoint(files, listing.checkpoints[checkpoint], replay)
            start = checkpoint + 1
        missing = [v for v in range(start, target + 1) if v not in listing.commits]
        if missing:
            raise TableNotFoundError(
                f"Version {target} of table {table} cannot be read: commit(s) "
                f"{missing[:3]} are gone from {LOG_DIR} and no checkpoint covers them (log "
                "retention cleaned them up).",
                fix="read a newer version, or raise `delta.logRetentionDuration` on the table",
            )
        names = [listing.commits[v].name for v in range(start, target + 1)]
        if target in listing.commits and target < start:
            names_for_info = [listing.commits[target].name]
        else:
            names_for_info = []
        try:
            commits = files.read_json_lines(names + names_for_info)
        except FileNotFoundError as exc:
            raise TableNotFoundError(
                f"A commit of table {table} disappeared while it was read ({exc}).",
                fix="retry; if it keeps failing, the table is being deleted or cleaned up",
            ) from exc
        info = None
        for name in names:
            info = replay.apply(commits[name])
        if names_for_info:
            info = next(
                (a["commitInfo"] for a in commits[names_for_info[0]] if "commitInfo" in a), None
            )
        if not replay.metadata:
            raise TableNotFoundError(
                f"The log of table {table} has no metadata up to version {target}.",
                fix="check that the folder holds a complete Delta table",
            )
        _check_features(replay.protocol, table)
        entry = listing.commits.get(target) or listing.checkpoints[target][0][0]
        return LogState(
            root=files.root,
            version=target,
            metadata=replay.metadata,
            protocol=replay.protocol,
            files=replay.files,
            txns=replay.txns,
            commit_timestamp_ms=_commit_time(info, entry.mtime_ms),
            signature=signature,
        )

    def _read_checkpoint(
        self, files: LogFiles, candidates: list[list[LogEntry]], replay: _Replay
    ) -> None:
        parts = candidates[0]
        for option in candidates:  # a classic or multi-part checkpoint before a v2 one
            if not _CHECKPOINT.match(option[0].name).group(4):  # type: ignore[union-attr]
                parts = option
                break
        names = [p.name for p in parts]
        if names[0].endswith(".json"):  # a v2 checkpoint in JSON: actions, sidecar list
            lines = files.read_json_lines(names)[names[0]]
            replay.apply(lines)
            sidecars = [a["sidecar"]["path"] for a in lines if "sidecar" in a]
            table = None
        else:
            table = files.read_parquet(names, _CHECKPOINT_COLUMNS)
            sidecars = [s["path"] for s in _actions_of(table, "sidecar")]
        if table is not None:
            for live in _adds_from_arrow(table):
                replay.files[(live.path, live.deletion_vector)] = live
            for txn in _actions_of(table, "txn"):
                replay.txns[txn["appId"]] = int(txn["version"])
            metadata = _first_action(table, "metaData")
            if metadata is not None:
                metadata = dict(metadata)
                if isinstance(metadata.get("configuration"), list):
                    metadata["configuration"] = dict(metadata["configuration"])
                format_ = metadata.get("format")
                if isinstance(format_, dict) and isinstance(format_.get("options"), list):
                    format_["options"] = dict(format_["options"])
                replay.metadata = metadata
            protocol = _first_action(table, "protocol")
            if protocol is not None:
                replay.protocol = dict(protocol)
        if sidecars:
            side = files.read_parquet([f"_sidecars/{unquote(p)}" for p in sidecars], ("add",))
            for live in _adds_from_arrow(side):
                replay.files[(live.path, live.deletion_vector)] = live

    def commits(
        self, files: LogFiles, versions: Sequence[int], *, table: str
    ) -> dict[int, list[dict[str, Any]]]:
        """The actions of some commits.

        Raises:
            TableNotFoundError: a commit is gone from the log.
        """
        names = {v: f"{v:020d}.json" for v in versions}
        try:
            read = files.read_json_lines(list(names.values()))
        except FileNotFoundError as exc:
            missing = next((v for v in versions if not _exists_in(files, names[v])), versions[0])
            raise TableNotFoundError(
                f"Commit {missing} of table {table} is gone from {LOG_DIR} (log retention "
                "cleaned it up before it was read incrementally).",
                fix="restart the incremental read from the oldest retained version, or raise "
                "`delta.logRetentionDuration` on the table",
            ) from exc
        return {v: read[names[v]] for v in versions}

    def commit_timestamps(
        self, files: LogFiles, *, up_to: int | None = None, table: str
    ) -> list[tuple[int, dt.datetime]]:
        """``(version, commit time)`` of every commit file the log holds, oldest first:
        the in-commit timestamp, else ``commitInfo.timestamp``, else the file's time.
        Commit files never change, so each is read once per process.

        Raises:
            TableNotFoundError: the table has no commit files (or none up to ``up_to``).
        """
        listing = self.listing(files)
        entries = [] if listing is None else sorted(listing.commits.items())
        wanted = [(v, e) for v, e in entries if up_to is None or v <= up_to]
        if not wanted:
            raise TableNotFoundError(
                f"No commits in the Delta log of {table}"
                + (f" up to version {up_to}." if up_to is not None else "."),
                fix="materialize the table first",
            )
        root = normalize_uri(files.root)
        missing = [
            (v, e) for v, e in wanted if (root, v, e.size, e.mtime_ms) not in self._timestamps
        ]
        if missing:
            read = files.read_json_lines([e.name for _, e in missing])
            for version, entry in missing:
                info = next((a["commitInfo"] for a in read[entry.name] if "commitInfo" in a), None)
                with self._lock:
                    self._timestamps[(root, version, entry.size, entry.mtime_ms)] = _from_ms(
                        _commit_time(info, entry.mtime_ms)
                    )
        return [(v, self._timestamps[(root, v, e.size, e.mtime_ms)]) for v, e in wanted]


def _exists_in(files: LogFiles, name: str) -> bool:
    entries = files.list_log() or []
    return any(e.name == name for e in entries)


def _check_features(protocol: Mapping[str, Any], table: str) -> None:
    features = set(protocol.get("readerFeatures") or ()) | set(protocol.get("writerFeatures") or ())
    owned = sorted(features & _UNREADABLE_FEATURES)
    if owned:
        raise UnsupportedTableFeatureError(
            f"Table {table} uses {owned}: its commits live in a catalog, not only in "
            f"{LOG_DIR}, so reading the folder would miss some.",
            fix="read it through the catalog's table name, or copy it to a path-based table",
        )


def commit_changes(
    state: LogState, version: int, actions: Sequence[Mapping[str, Any]]
) -> CommitChanges:
    """What one commit did, typed by ``state`` (a version at or after it)."""
    added: list[DataFile] = []
    removed: list[str] = []
    operation = "UNKNOWN"
    schema_changed = False
    for action in actions:
        if "commitInfo" in action:
            operation = action["commitInfo"].get("operation", operation)
        elif "metaData" in action:
            schema_changed = True
        elif "add" in action and action["add"].get("dataChange", True):
            added.append(to_data_file(state, _live_from_json(action["add"]), version=version))
        elif "remove" in action and action["remove"].get("dataChange", True):
            removed.append(unquote(action["remove"]["path"]))
    return CommitChanges(version, operation, tuple(added), tuple(removed), schema_changed)


READER = LogReader()

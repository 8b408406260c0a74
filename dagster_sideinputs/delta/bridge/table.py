"""Opening Delta tables with delta-rs, and what the bridge may rely on about them.

:func:`load_snapshot` gives a :class:`~dagster_sideinputs.delta.engine.TableSnapshot`:
everything the bridge and the operator need to know about one version of a table
without reading data (schema, partition columns, the live data files with their
partition values and statistics, the commit time, the table id).
"""

import datetime as dt
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import deltalake
import pyarrow as pa
from deltalake.exceptions import TableNotFoundError as _DeltaRsTableNotFound

from dagster_sideinputs.delta.engine import DataFile, TableSnapshot
from dagster_sideinputs.delta.log.files import LocalLogFiles
from dagster_sideinputs.delta.log.lazy_files import LazyFiles
from dagster_sideinputs.delta.log.reader import READER
from dagster_sideinputs.delta.log.state import LogState
from dagster_sideinputs.delta.schema import delta_to_spark_schema
from dagster_sideinputs.delta.store.files import (
    TableFiles,
    is_local,
    normalize_uri,
    resolve_log_path,
)
from dagster_sideinputs.errors import (
    NotADeltaTableError,
    TableNotFoundError,
    UnsupportedTableFeatureError,
)

# Reader features whose tables the bridge reads correctly: these change the log, not
# how data files map to rows. ``deletionVectors`` is accepted only while no file of
# the snapshot carries one (checked per snapshot).
SUPPORTED_READER_FEATURES = frozenset(
    {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "deletionVectors"}
)

# Writer features the bridge's commits honour as the protocol asks of a writer: its
# appends and whole-file removals need nothing more for these (CHECK constraints are
# enforced while staging, NOT NULL columns checked from the staged files, an append-only
# table's files never removed). A table listing any other writer feature is refused.
BRIDGE_WRITER_FEATURES = frozenset(
    {
        "appendOnly",
        "invariants",
        "checkConstraints",
        "changeDataFeed",
        "timestampNtz",
        "deletionVectors",
        "v2Checkpoint",
    }
)
# Field metadata of features a legacy protocol (writer version < 7) implies: only a
# table that uses them is refused.
_FIELD_FEATURES = {
    "delta.generationExpression": "generatedColumns",
    "delta.identity.start": "identityColumns",
    "delta.invariants": "invariants (SQL expressions)",
}
_DELTA_SPARK = (
    "the delta-spark engine, which supports it: a session with Delta configured "
    "(SparkResource(delta=True)) and DeltaStorage(engine='auto' or 'delta-spark')"
)
WRITE_NATIVE = "write the table with " + _DELTA_SPARK
_NATIVE = "; or read it with " + _DELTA_SPARK
_FIXES = {
    "columnMapping": "rewrite the table without column mapping (delta-spark: "
    "`REORG TABLE ... APPLY (UPGRADE UNIFORM ...)` or copy it to a new table)" + _NATIVE,
    "deletionVectors": "purge deletion vectors first (delta-spark: "
    "`REORG TABLE t APPLY (PURGE)`), or copy the table" + _NATIVE,
    "typeWidening": "rewrite the files with the widened type (delta-spark: "
    "`REORG TABLE t APPLY (UPGRADE ...)`) or copy the table" + _NATIVE,
}


def open_table(
    uri: str,
    *,
    version: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    name: str | None = None,
) -> deltalake.DeltaTable:
    """Open a Delta table, turning delta-rs's errors into clear ones.

    Args:
        uri: table location.
        version: a version to time-travel to; latest when None.
        storage_options: delta-rs object store options.
        name: the asset / table name to use in error messages (defaults to the URI).

    Raises:
        TableNotFoundError: nothing at ``uri``, or the version does not exist.
        NotADeltaTableError: ``uri`` holds files but no ``_delta_log``.
    """
    uri = normalize_uri(uri)
    label = name or uri
    options = dict(storage_options or {})
    try:
        return deltalake.DeltaTable(uri, version=version, storage_options=options or None)
    except _DeltaRsTableNotFound as exc:
        files = TableFiles(uri, options)
        if files.has_entries() and not files.exists("_delta_log"):
            raise NotADeltaTableError(
                f"{label} holds files but is not a Delta table (no _delta_log folder).",
                fix="point the asset at a Delta table, or convert the parquet folder with "
                "`deltalake.convert_to_deltalake(uri)`",
            ) from exc
        raise TableNotFoundError(
            f"No Delta table at {label}"
            + (f" (version {version})." if version is not None else "."),
            fix="materialize the upstream asset first, or check the storage root and path",
        ) from exc
    except Exception as exc:
        if version is not None and "version" in str(exc).lower():
            raise TableNotFoundError(
                f"Table {label} has no version {version}: {exc}",
                fix="ask for an existing version (see DeltaTable(uri).history())",
            ) from exc
        raise


def check_readable(table: deltalake.DeltaTable, *, name: str) -> None:
    """Refuse tables whose data the bridge would read wrongly.

    Raises:
        UnsupportedTableFeatureError: naming the feature and the fix.
    """
    features = set(table.protocol().reader_features or [])
    mapping_mode = (table.metadata().configuration or {}).get("delta.columnMapping.mode")
    _refuse_unreadable(
        features,
        mapping_mode,
        lambda: pa.table(table.deletion_vectors()).num_rows,
        name=name,
    )


def check_state_readable(state: LogState, *, name: str) -> None:
    """:func:`check_readable` for a version replayed from the log by our own reader.

    Raises:
        UnsupportedTableFeatureError: naming the feature and the fix.
    """
    _refuse_unreadable(
        set(state.protocol.get("readerFeatures") or ()),
        state.configuration.get("delta.columnMapping.mode"),
        lambda: sum(1 for f in state.files.values() if f.deletion_vector),
        name=name,
    )


def _refuse_unreadable(
    features: set[str],
    mapping_mode: str | None,
    files_with_vectors: Callable[[], int],
    *,
    name: str,
) -> None:
    if mapping_mode not in (None, "none"):
        features.add("columnMapping")
    unsupported = sorted(features - SUPPORTED_READER_FEATURES)
    if unsupported:
        feature = unsupported[0]
        raise UnsupportedTableFeatureError(
            f"Table {name} uses the Delta feature(s) {unsupported}, which the delta-rs "
            "bridge cannot read correctly; refusing to return possibly wrong data.",
            fix=_FIXES.get(feature, "rewrite the table without this feature"),
        )
    if "deletionVectors" in features:
        count = files_with_vectors()
        if count:
            raise UnsupportedTableFeatureError(
                f"Table {name} has {count} file(s) with deletion vectors; the "
                "bridge reads parquet files natively and would return deleted rows.",
                fix=_FIXES["deletionVectors"],
            )


def check_writable(protocol: Mapping[str, Any], schema_json: str, *, name: str) -> None:
    """Refuse to write to a table whose writer features the bridge cannot honour:
    features it does not implement, and the columns a writer must compute or check
    (generated, identity, SQL-expression invariants).

    Raises:
        UnsupportedTableFeatureError: naming the features and the fix.
    """
    unsupported = {feature for key, feature in _FIELD_FEATURES.items() if f'"{key}"' in schema_json}
    if int(protocol.get("minWriterVersion") or 1) >= 7:
        unsupported |= set(protocol.get("writerFeatures") or ()) - BRIDGE_WRITER_FEATURES
    if unsupported:
        raise UnsupportedTableFeatureError(
            f"Table {name} uses the Delta writer feature(s) {sorted(unsupported)}, which the "
            "delta-rs bridge cannot write as the Delta protocol requires; nothing was written.",
            fix=WRITE_NATIVE,
        )


def unsupported_feature_error(exc: Exception, label: str) -> UnsupportedTableFeatureError | None:
    """delta-rs refusing a commit for a table feature it does not support (which
    :func:`check_writable` normally refuses first): no conflict, a retry would fail the
    same way."""
    if "unsupported table feature" not in str(exc).lower():
        return None
    return UnsupportedTableFeatureError(
        f"The delta-rs bridge cannot commit to table {label}: {exc}. Nothing was committed.",
        fix=WRITE_NATIVE,
    )


def _commit_timestamp(
    files: TableFiles, version: int, modification_time_ms: int | None = None
) -> dt.datetime:
    relative = f"_delta_log/{version:020d}.json"
    try:
        for line in files.read_bytes(relative).splitlines():
            action = json.loads(line)
            info = action.get("commitInfo")
            if info and "inCommitTimestamp" in info:
                return _from_ms(info["inCommitTimestamp"])
            if info and "timestamp" in info:
                return _from_ms(info["timestamp"])
    except FileNotFoundError:
        pass
    if modification_time_ms is not None:
        return _from_ms(modification_time_ms)
    entries = list(files.list_files("_delta_log"))
    stamps = [e.modification_time_ms for e in entries if e.path.endswith(f"{version:020d}.json")]
    return _from_ms(stamps[0] if stamps else 0)


_COMMIT_FILE = re.compile(r"^_delta_log/(\d{20})\.json$")
# Commit files never change once written: their timestamps are read once per process
# (keyed by the file's size and modification time too, so a table recreated at the same
# location is read again).
_TIMESTAMPS: dict[tuple[str, int, int, int], dt.datetime] = {}


def commit_timestamps(
    uri: str,
    *,
    up_to: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    name: str | None = None,
) -> list[tuple[int, dt.datetime]]:
    """``(version, commit timestamp)`` of every commit file the log holds, oldest first.

    Raises:
        TableNotFoundError: the table has no commit files (or none up to ``up_to``).
    """
    root = normalize_uri(uri)
    files = TableFiles(root, storage_options)
    found: list[tuple[int, dt.datetime]] = []
    entries = files.list_files("_delta_log") if files.exists("_delta_log") else iter(())
    for entry in entries:
        match = _COMMIT_FILE.match(entry.path.replace("\\", "/"))
        if match is None:
            continue
        version = int(match.group(1))
        if up_to is not None and version > up_to:
            continue
        key = (root, version, entry.size, entry.modification_time_ms)
        if key not in _TIMESTAMPS:
            _TIMESTAMPS[key] = _commit_timestamp(files, version, entry.modification_time_ms)
        found.append((version, _TIMESTAMPS[key]))
    if not found:
        raise TableNotFoundError(
            f"No commits in the Delta log of {name or root}"
            + (f" up to version {up_to}." if up_to is not None else "."),
            fix="materialize the table first",
        )
    return sorted(found)


def _from_ms(millis: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(millis / 1000, tz=dt.timezone.utc)


def _data_files(table: deltalake.DeltaTable, root: str) -> tuple[DataFile, ...]:
    actions = pa.table(table.get_add_actions(flatten=False)).to_pylist()
    resolved = [resolve_log_path(root, row["path"]) for row in actions]
    return tuple(
        DataFile(
            path=path,
            uri=location,
            size=row["size_bytes"],
            partition_values=row.get("partition") or {},
            num_records=row.get("num_records"),
            min_values=row.get("min") or {},
            max_values=row.get("max") or {},
            null_count=row.get("null_count") or {},
            modification_time_ms=row.get("modification_time"),
        )
        for row, (path, location) in zip(actions, resolved, strict=True)
    )


def local_log(uri: str) -> LocalLogFiles | None:
    """The log of a table on a local or shared filesystem, read by our own log reader
    (:mod:`~dagster_sideinputs.delta.log.reader`): delta-rs lists the whole ``_delta_log``
    folder on every open, a cost that grows with every commit, where the reader finds
    new commits with a stat each. None for object stores (delta-rs reads those)."""
    root = normalize_uri(uri)
    return LocalLogFiles(root) if is_local(root) else None


def is_table(uri: str, storage_options: Mapping[str, str] | None = None) -> bool:
    """Whether a Delta table is at ``uri`` (a local one is asked of our log reader, which
    knows a table it read before without listing its log)."""
    local = local_log(uri)
    if local is not None:
        return READER.latest_version(local) is not None
    return deltalake.DeltaTable.is_deltatable(
        normalize_uri(uri), dict(storage_options or {}) or None
    )


def load_snapshot(
    uri: str,
    *,
    version: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    name: str | None = None,
    check_features: bool = True,
    writing: bool = False,
) -> TableSnapshot:
    """Read the metadata of one version of a table (latest by default); ``writing``: the
    bridge is about to write to it (:func:`check_writable`).

    Raises:
        TableNotFoundError, NotADeltaTableError, UnsupportedTableFeatureError
    """
    uri = normalize_uri(uri)
    label = name or uri
    local = local_log(uri)
    if local is not None:
        state = READER.state(local, version, table=label)
        if check_features:
            check_state_readable(state, name=label)
        if writing:
            check_writable(state.protocol, str(state.metadata.get("schemaString", "")), name=label)
        return state.table_snapshot()
    table = open_table(uri, version=version, storage_options=storage_options, name=label)
    if check_features:
        check_readable(table, name=label)
    if writing:
        protocol = table.protocol()
        check_writable(
            {
                "minWriterVersion": protocol.min_writer_version,
                "writerFeatures": protocol.writer_features,
            },
            table.schema().to_json(),
            name=label,
        )
    files = TableFiles(uri, storage_options)
    metadata = table.metadata()
    return TableSnapshot(
        uri=uri,
        version=table.version(),
        schema=delta_to_spark_schema(table.schema()),
        partition_columns=tuple(metadata.partition_columns),
        files=LazyFiles(lambda: _data_files(table, uri)),  # type: ignore[arg-type]
        commit_timestamp=_commit_timestamp(files, table.version()),
        configuration=dict(metadata.configuration or {}),
        table_id=str(metadata.id),
    )

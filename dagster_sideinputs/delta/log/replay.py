"""Applying ``_delta_log`` actions: which files of the log folder make a version
(commits, complete checkpoints: classic, multi-part, v2 with sidecars), and a state being
built from a checkpoint and the commits after it (a file is live when its last action is
an ``add``; actions are keyed by path and deletion vector).
"""

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from dagster_sideinputs.delta.engine import DataFile
from dagster_sideinputs.delta.log.commits import CommitChanges
from dagster_sideinputs.delta.log.files import LOG_DIR, LogEntry, LogFiles
from dagster_sideinputs.delta.log.state import LiveFile, LogState, to_data_file
from dagster_sideinputs.errors import UnsupportedTableFeatureError

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(
    r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10})|\.([0-9a-fA-F-]{36}))?\.(parquet|json)$"
)
# Features that move commits out of _delta_log (a catalog owns them): reading the
# folder alone would miss commits.
_UNREADABLE_FEATURES = frozenset({"catalogManaged", "catalogOwned-preview", "coordinatedCommits"})
_CHECKPOINT_COLUMNS = ("add", "metaData", "protocol", "txn", "sidecar")
_ADD_FIELDS = ("path", "partitionValues", "size", "modificationTime", "stats", "deletionVector")


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
class Replay:
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

    def read_checkpoint(self, files: LogFiles, candidates: list[list[LogEntry]]) -> None:
        """Start from a checkpoint: a classic or multi-part one when there is one, else v2
        (parquet or JSON, with its sidecars)."""
        parts = candidates[0]
        for option in candidates:  # a classic or multi-part checkpoint before a v2 one
            if not _CHECKPOINT.match(option[0].name).group(4):  # type: ignore[union-attr]
                parts = option
                break
        names = [p.name for p in parts]
        if names[0].endswith(".json"):  # a v2 checkpoint in JSON: actions, sidecar list
            lines = files.read_json_lines(names)[names[0]]
            self.apply(lines)
            sidecars = [a["sidecar"]["path"] for a in lines if "sidecar" in a]
            table = None
        else:
            table = files.read_parquet(names, _CHECKPOINT_COLUMNS)
            sidecars = [s["path"] for s in _actions_of(table, "sidecar")]
        if table is not None:
            for live in _adds_from_arrow(table):
                self.files[(live.path, live.deletion_vector)] = live
            for txn in _actions_of(table, "txn"):
                self.txns[txn["appId"]] = int(txn["version"])
            metadata = _first_action(table, "metaData")
            if metadata is not None:
                metadata = dict(metadata)
                if isinstance(metadata.get("configuration"), list):
                    metadata["configuration"] = dict(metadata["configuration"])
                format_ = metadata.get("format")
                if isinstance(format_, dict) and isinstance(format_.get("options"), list):
                    format_["options"] = dict(format_["options"])
                self.metadata = metadata
            protocol = _first_action(table, "protocol")
            if protocol is not None:
                self.protocol = dict(protocol)
        if sidecars:
            side = files.read_parquet([f"_sidecars/{unquote(p)}" for p in sidecars], ("add",))
            for live in _adds_from_arrow(side):
                self.files[(live.path, live.deletion_vector)] = live


def from_ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)


def commit_time_ms(info: Mapping[str, Any] | None, fallback_ms: int) -> int:
    if info:
        for key in ("inCommitTimestamp", "timestamp"):
            if isinstance(info.get(key), int | float):
                return int(info[key])
    return fallback_ms


@dataclass(frozen=True)
class LogListing:
    """The versions a log folder holds: commit files, and complete checkpoints (each
    version's candidates, a candidate being its files in part order)."""

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


def parse_listing(entries: Iterable[LogEntry]) -> LogListing:
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
    return LogListing(commits, checkpoints)


def check_features(protocol: Mapping[str, Any], table: str) -> None:
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

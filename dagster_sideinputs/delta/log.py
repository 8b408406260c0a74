"""Reading the Delta transaction log commit by commit, for incremental reads.

A snapshot says which files are live; an incremental read needs which files each
commit *added*, and must notice commits that removed data (an incremental reader of
an append-only stream cannot represent a delete). Commit JSON files are read through
the same storage as the table.
"""

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from dagster_sideinputs.delta.files import TableFiles, resolve_log_path
from dagster_sideinputs.errors import NonAppendOnlyChangeError, TableNotFoundError


@dataclass(frozen=True)
class AddedFile:
    """A file a commit added with new data (``dataChange: true``)."""

    version: int
    path: str
    uri: str
    size: int
    partition_values: Mapping[str, str | None]
    num_records: int | None
    stats: Mapping[str, Any]


@dataclass(frozen=True)
class CommitChanges:
    """What one commit did, as far as an incremental reader cares."""

    version: int
    operation: str
    added: tuple[AddedFile, ...]
    removed_data: tuple[str, ...]
    schema_changed: bool


def _commit_lines(files: TableFiles, version: int, *, table: str) -> list[dict[str, Any]]:
    relative = f"_delta_log/{version:020d}.json"
    try:
        raw = files.read_bytes(relative)
    except FileNotFoundError as exc:
        raise TableNotFoundError(
            f"Commit {version} of table {table} is gone from _delta_log (log retention "
            "cleaned it up before it was read incrementally).",
            fix="restart the incremental read from the oldest retained version, or raise "
            "`delta.logRetentionDuration` on the table",
        ) from exc
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def read_commit(files: TableFiles, version: int, *, table: str) -> CommitChanges:
    """The data-changing actions of one commit."""
    added: list[AddedFile] = []
    removed: list[str] = []
    operation = "UNKNOWN"
    schema_changed = False
    for action in _commit_lines(files, version, table=table):
        if "commitInfo" in action:
            operation = action["commitInfo"].get("operation", operation)
        elif "metaData" in action:
            schema_changed = True
        elif "add" in action and action["add"].get("dataChange", True):
            add = action["add"]
            path, location = resolve_log_path(files.root, add["path"])
            stats = json.loads(add["stats"]) if add.get("stats") else {}
            added.append(
                AddedFile(
                    version=version,
                    path=path,
                    uri=location,
                    size=int(add["size"]),
                    partition_values=add.get("partitionValues") or {},
                    num_records=stats.get("numRecords"),
                    stats=stats,
                )
            )
        elif "remove" in action and action["remove"].get("dataChange", True):
            removed.append(unquote(action["remove"]["path"]))
    return CommitChanges(version, operation, tuple(added), tuple(removed), schema_changed)


def iter_commits(
    files: TableFiles, start_exclusive: int, end_inclusive: int, *, table: str
) -> Iterator[CommitChanges]:
    for version in range(start_exclusive + 1, end_inclusive + 1):
        yield read_commit(files, version, table=table)


def added_files(
    files: TableFiles, start_exclusive: int, end_inclusive: int, *, table: str
) -> list[AddedFile]:
    """Files added with new data by the commits in ``(start_exclusive, end_inclusive]``.

    Commits that only rearrange data (``OPTIMIZE``: adds and removes with
    ``dataChange: false``) contribute nothing, so compaction never duplicates rows.

    Raises:
        NonAppendOnlyChangeError: a commit in the range removed or rewrote data.
    """
    result: list[AddedFile] = []
    for commit in iter_commits(files, start_exclusive, end_inclusive, table=table):
        if commit.removed_data:
            raise NonAppendOnlyChangeError(
                f"Version {commit.version} of table {table} removed data "
                f"({commit.operation}, {len(commit.removed_data)} file(s), e.g. "
                f"{commit.removed_data[0]!r}); an incremental reader of an append-only "
                "table cannot represent that.",
                fix="keep the main input append-only (write corrections to a new table), "
                f"or restart the operator from version {commit.version} after reviewing "
                "the change",
            )
        result.extend(commit.added)
    return result

"""Reading the Delta transaction log commit by commit, for incremental reads.

A snapshot says which files are live; an incremental read needs which files each
commit *added*, and must notice commits that removed data (an incremental reader of
an append-only stream cannot represent a delete). Commit JSON files are read through
the same storage as the table.
"""

import contextlib
import datetime as dt
import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

from pyspark.sql import types as T

from dagster_sideinputs.delta.engine import DataFile
from dagster_sideinputs.delta.stats import typed_stats
from dagster_sideinputs.delta.store.files import TableFiles, resolve_log_path
from dagster_sideinputs.errors import DeltaTableError, LogCleanedUpError, NonAppendOnlyChangeError


@dataclass(frozen=True)
class CommitChanges:
    """What one commit did, as far as an incremental reader cares."""

    version: int
    operation: str
    added: tuple[DataFile, ...]
    removed_data: tuple[str, ...]
    schema_changed: bool


DAMAGED = (ValueError, KeyError, TypeError, AttributeError)
"""What reading a damaged log raises: a commit that is not JSON lines (``ValueError``),
an action without its fields, a checkpoint that is not parquet (``ArrowInvalid`` is a
``ValueError``)."""
_COMMIT_FILE = re.compile(r"\d{20}\.json")

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def reading_log(table: str) -> Iterator[None]:
    """Turn what a damaged log raises into a :class:`DeltaTableError` naming the table."""
    try:
        yield
    except DAMAGED as exc:
        raise DeltaTableError(
            f"The Delta log of table {table} is damaged and cannot be read: "
            f"{type(exc).__name__}: {exc}. Nothing was read from it.",
            fix="restore the damaged _delta_log file from a backup (or the writer's copy); a "
            "commit file must hold one JSON action per line",
        ) from exc


def reads_log(function: F) -> F:
    """:func:`reading_log` around a function given the table's name as ``table=``."""

    @functools.wraps(function)
    def reading(*args: Any, table: str, **kwargs: Any) -> Any:
        with reading_log(table):
            return function(*args, table=table, **kwargs)

    return reading  # type: ignore[return-value]


def _commit_lines(files: TableFiles, version: int, *, table: str) -> list[dict[str, Any]]:
    relative = f"_delta_log/{version:020d}.json"
    try:
        raw = files.read_bytes(relative)
    except FileNotFoundError as exc:
        try:
            names = [entry.path.rsplit("/", 1)[-1] for entry in files.list_files("_delta_log")]
        except OSError:
            names = []
        raise log_cleaned_up(table, version, names) from exc
    with reading_log(table):
        return [json.loads(line) for line in raw.splitlines() if line.strip()]


def log_cleaned_up(table: str, version: int, log_names: Iterable[str]) -> LogCleanedUpError:
    """The error for commit ``version`` of ``table`` gone from its log (``log_names``: the
    files the log still holds, for the oldest commit left)."""
    left = [int(name[:20]) for name in log_names if _COMMIT_FILE.fullmatch(name)]
    oldest = min(left, default=None)
    where = f" (the oldest commit left is {oldest})" if oldest is not None else ""
    error = LogCleanedUpError(
        f"Commit {version} of table {table} is gone from _delta_log{where}: log retention "
        "cleaned it up before it was read incrementally.",
        fix="read on from the oldest commit left (what the commits gone added is not read), "
        "and keep the log longer than the longest pause of its readers: "
        "`delta.logRetentionDuration` on the table",
    )
    error.version, error.oldest = version, oldest
    return error


@reads_log
def read_commit(
    files: TableFiles, version: int, *, table: str, schema: T.StructType
) -> CommitChanges:
    """The data-changing actions of one commit (statistics typed by ``schema``).

    Raises:
        LogCleanedUpError: the commit is gone from the log.
        DeltaTableError: it is damaged (not JSON lines, an action without its fields).
    """
    added: list[DataFile] = []
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
            records, mins, maxs, nulls = typed_stats(stats, schema)
            added.append(
                DataFile(
                    path=path,
                    uri=location,
                    size=int(add["size"]),
                    partition_values=_typed_partitions(add.get("partitionValues") or {}, schema),
                    num_records=records,
                    min_values=mins,
                    max_values=maxs,
                    null_count=nulls,
                    version=version,
                    modification_time_ms=add.get("modificationTime"),
                )
            )
        elif "remove" in action and action["remove"].get("dataChange", True):
            removed.append(unquote(action["remove"]["path"]))
    return CommitChanges(version, operation, tuple(added), tuple(removed), schema_changed)


def _typed_partitions(values: dict[str, Any], schema: T.StructType) -> dict[str, Any]:
    """Partition values as typed Python values, as delta-rs gives them for live files."""
    typed: dict[str, Any] = {}
    for column, raw in values.items():
        if raw is None or raw == "" or column not in schema.fieldNames():
            typed[column] = None if raw in (None, "") else raw
            continue
        kind = schema[column].dataType
        if isinstance(kind, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
            typed[column] = int(raw)
        elif isinstance(kind, T.BooleanType):
            typed[column] = raw.lower() == "true"
        elif isinstance(kind, T.DateType):
            typed[column] = dt.date.fromisoformat(raw)
        else:
            typed[column] = raw
    return typed


def iter_commits(
    files: TableFiles,
    start_exclusive: int,
    end_inclusive: int,
    *,
    table: str,
    schema: T.StructType,
) -> Iterator[CommitChanges]:
    for version in range(start_exclusive + 1, end_inclusive + 1):
        yield read_commit(files, version, table=table, schema=schema)


def added_files(
    files: TableFiles,
    start_exclusive: int,
    end_inclusive: int,
    *,
    table: str,
    schema: T.StructType,
) -> list[DataFile]:
    """Files added with new data by the commits in ``(start_exclusive, end_inclusive]``.

    Commits that only rearrange data (``OPTIMIZE``: adds and removes with
    ``dataChange: false``) contribute nothing, so compaction never duplicates rows.

    Raises:
        NonAppendOnlyChangeError: a commit in the range removed or rewrote data.
    """
    commits = iter_commits(files, start_exclusive, end_inclusive, table=table, schema=schema)
    return append_only_files(commits, table=table)


def append_only_files(commits: Iterable[CommitChanges], *, table: str) -> list[DataFile]:
    """The files the commits added, in order; the check that none removed data.

    Raises:
        NonAppendOnlyChangeError: a commit removed or rewrote data.
    """
    result: list[DataFile] = []
    for commit in commits:
        if commit.removed_data:
            error = NonAppendOnlyChangeError(
                f"Version {commit.version} of table {table} removed data "
                f"({commit.operation}, {len(commit.removed_data)} file(s), e.g. "
                f"{commit.removed_data[0]!r}); an incremental reader of an append-only "
                "table cannot represent that.",
                fix="keep the main input append-only (write corrections to a new table), "
                f"or restart the operator from version {commit.version} after reviewing "
                "the change",
            )
            error.version = commit.version
            raise error
        result.extend(commit.added)
    return result

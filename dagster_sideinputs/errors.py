"""Every error the project raises, under one base class.

Each message says what was found, names the asset / table / column involved, and
ends with the fix. Catch :class:`SideInputError` to handle all of them.
"""

from collections.abc import Iterable, Sequence
from difflib import get_close_matches


class SideInputError(Exception):
    """Base class of every error raised by dagster-sideinputs.

    Args:
        message: what went wrong, naming the asset, table or column.
        fix: how to fix it, ideally with a snippet.
    """

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(message if fix is None else f"{message}\nFix: {fix}")


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """A ' Did you mean "x"?' suffix when ``name`` looks like a typo of a candidate."""
    matches = get_close_matches(name, list(candidates), n=1)
    return f' Did you mean "{matches[0]}"?' if matches else ""


def preview(items: Sequence[object], limit: int = 5) -> str:
    """A short, stable rendering of the first few items of a list for error messages."""
    shown = ", ".join(repr(item) for item in items[:limit])
    more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
    return f"[{shown}{more}]"


# --- configuration and environment ---------------------------------------------------


class DeclarationError(SideInputError):
    """A declaration (main input, side input, window, tag, operator) is inconsistent."""


class SparkStartupError(SideInputError):
    """Spark could not be started (no Java 17+, bad master URL, ...)."""


# --- the Delta bridge ----------------------------------------------------------------


class DeltaTableError(SideInputError):
    """A Delta table could not be read or written as asked."""


class TableNotFoundError(DeltaTableError):
    """No Delta table at the path."""


class NotADeltaTableError(DeltaTableError):
    """The path holds files but no ``_delta_log``."""


class UnsupportedTableFeatureError(DeltaTableError):
    """The table uses a Delta feature the delta-rs bridge cannot read correctly."""


class SchemaMismatchError(DeltaTableError):
    """Written data does not match the table schema (and schema merging was not asked)."""


class CorruptDataFileError(DeltaTableError):
    """A data file of the table cannot be read (truncated, not parquet, missing)."""


class NonAppendOnlyChangeError(DeltaTableError):
    """An incremental read met a version that removed or rewrote data."""

    version: int | None = None
    """The first version in the range read that removed or rewrote data."""


class LogCleanedUpError(DeltaTableError):
    """An incremental read needs commits the table's log no longer holds (log retention
    removed them after a checkpoint): what they added cannot be told apart any more."""

    version: int | None = None
    """The first commit needed and gone."""
    oldest: int | None = None
    """The oldest commit the log still holds (None when unknown)."""


class ConcurrentWriteError(DeltaTableError):
    """Another writer committed a conflicting change to the same table first."""


# --- side input data -----------------------------------------------------------------


class SideInputDataError(SideInputError):
    """A side input's data does not fit its declared view."""


class SingletonCardinalityError(SideInputDataError):
    """A singleton side input holds several rows in one namespace."""


class EmptySingletonError(SideInputDataError):
    """A ready singleton side input holds no row and declares no default."""


class DuplicateKeyError(SideInputDataError):
    """A map side input holds several rows for one key."""


class MissingSideColumnError(SideInputDataError, AttributeError, KeyError):
    """A row function read a column its side input's row does not have (the side table
    lost it, or the name is wrong). Also an ``AttributeError`` and a ``KeyError``, so
    ``getattr(row, name, default)`` and ``try: row[name] except KeyError`` keep working."""


class MainInputDataError(SideInputError):
    """Records of the main input cannot be processed (null key, schema drift, ...)."""


class KafkaOffsetsLostError(MainInputDataError):
    """Kafka offsets the operator had not read yet are gone (retention, truncation)."""


class KafkaSourceError(SideInputError):
    """The Kafka brokers could not be asked for offsets or topics, or the Spark session
    cannot read Kafka (its connector is missing)."""


# --- the operator ----------------------------------------------------------------------


class UndeclaredOutputTagError(SideInputError):
    """The user function emitted to a tag that was not declared."""


class BufferLimitExceededError(SideInputError):
    """The buffer of waiting records passed its configured row or age limit."""


class PreKeyedViolationError(SideInputError):
    """A main input declared pre-keyed is not partitioned by key as promised."""


class OperatorBusyError(SideInputError):
    """Another run of the same operator holds its lock."""


class OperatorStateError(SideInputError):
    """The operator's recorded state (batch plans, buffer) is inconsistent with its inputs."""


class FunctionError(SideInputError):
    """The operator's user function failed (raised, returned the wrong thing, or read a
    column that does not exist)."""


class SparkJobError(SideInputError):
    """A Spark job of a batch failed for a reason outside the operator's checks (lost
    executors, out of memory, an unreadable file...)."""


class StorageError(SideInputError):
    """The lake's filesystem or object store refused a read or a write made outside
    Spark (the operator's state, staged files, a table's log): a file where a folder
    should be, no space left, a permission, an unreachable store."""


__all__ = [
    "BufferLimitExceededError",
    "ConcurrentWriteError",
    "CorruptDataFileError",
    "DeclarationError",
    "DeltaTableError",
    "DuplicateKeyError",
    "EmptySingletonError",
    "FunctionError",
    "KafkaOffsetsLostError",
    "KafkaSourceError",
    "MainInputDataError",
    "MissingSideColumnError",
    "NonAppendOnlyChangeError",
    "NotADeltaTableError",
    "OperatorBusyError",
    "OperatorStateError",
    "PreKeyedViolationError",
    "SchemaMismatchError",
    "SideInputDataError",
    "SideInputError",
    "SingletonCardinalityError",
    "SparkJobError",
    "SparkStartupError",
    "StorageError",
    "TableNotFoundError",
    "UndeclaredOutputTagError",
    "UnsupportedTableFeatureError",
]

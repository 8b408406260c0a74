"""What users declare about the main input and the buffer, and the shared vocabulary.

Every declaration is a frozen dataclass: immutable, hashable where it can be,
picklable (the operator ships some of them to executors), with a readable ``repr``.
Validation happens at construction, so a mistake fails where it was written. Side
inputs live in :mod:`~dagster_sideinputs.core.side_inputs`, windows in
:mod:`~dagster_sideinputs.core.windows`, output tags in
:mod:`~dagster_sideinputs.core.outputs`.
"""

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from pyspark.sql import Column, DataFrame
from pyspark.sql import types as T

from dagster_sideinputs.errors import DeclarationError

View = Literal["singleton", "list", "map", "multimap"]
Readiness = Literal["present", "complete", "fresh"]
Distribution = Literal["broadcast", "keyed", "forwarded"]
Missing = Literal["null", "wait", "unmatched"]
OnTimeout = Literal["unmatched", "null"]
OnEmpty = Literal["release", "unmatched"]
OnExceed = Literal["fail", "overflow"]
KeyTranslator: TypeAlias = str | Column | Callable[[DataFrame], Column]

READINESS = ("present", "complete", "fresh")
DISTRIBUTIONS = ("broadcast", "keyed", "forwarded")
MISSING = ("null", "wait", "unmatched")
ON_TIMEOUT = ("unmatched", "null")
ON_EMPTY = ("release", "unmatched")


def check_choice(value: object, choices: Sequence[str], what: str, where: str) -> None:
    if value is not None and value not in choices:
        raise DeclarationError(
            f"{where}: {what}={value!r} is not one of {list(choices)}.",
            fix=f"pass {what}= one of {', '.join(repr(c) for c in choices)}",
        )


def asset_path(name: str | Sequence[str]) -> tuple[str, ...]:
    """An asset name (``"payments/transactions"``) or key path as a tuple of parts."""
    parts = tuple(name.split("/")) if isinstance(name, str) else tuple(name)
    if not parts or any(not part or not isinstance(part, str) for part in parts):
        raise DeclarationError(
            f"{name!r} is not a valid asset name.", fix='use e.g. "transactions"'
        )
    return parts


@dataclass(frozen=True)
class KeyGroups:
    """Declares a main input already partitioned by key (Flink's reinterpretAsKeyedStream).

    The promise: every file (split) of the main input holds the rows of exactly one
    key group, ``pmod(hash(key), max_key_groups)`` with Spark's Murmur3 ``hash``, and
    the key-group column says which. The operator checks it from the Delta log before
    writing anything and then runs its keyed steps without shuffling the main input.

    Args:
        max_key_groups: number of key groups (Spark buckets).
        column: the column holding each row's key group (a Delta partition column or
            a data column whose per-file min == max).
    """

    max_key_groups: int = 128
    column: str = "key_group"

    def __post_init__(self) -> None:
        if not isinstance(self.max_key_groups, int) or self.max_key_groups < 1:
            raise DeclarationError(
                f"KeyGroups.max_key_groups must be an integer >= 1, got {self.max_key_groups!r}."
            )


@dataclass(frozen=True)
class MainInput:
    """The high-throughput input, read incrementally.

    Args:
        asset: asset name of a Delta table that grows by appends.
        key: the key column (for keyed side inputs, per-key waiting, key groups).
        event_time: event-time column (for windows and lateness).
        pre_keyed: declare the table already partitioned by key group.
        path: table location when it is not ``<storage root>/<asset>``.

    Examples:
        >>> MainInput("transactions", key="customer_id", event_time="ts")
        MainInput('transactions', key='customer_id', event_time='ts')
    """

    asset: str
    key: str | None = None
    event_time: str | None = None
    pre_keyed: KeyGroups | None = None
    path: str | None = None
    format: str = "delta"
    schema: T.StructType | str | None = field(default=None, compare=False, hash=False)
    read_options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        asset_path(self.asset)
        if self.pre_keyed is not None and self.key is None:
            raise DeclarationError(
                f"MainInput {self.asset!r} is declared pre_keyed but has no key.",
                fix="pass key=<the column the input is partitioned by>",
            )
        if self.format != "delta" and self.schema is None:
            raise DeclarationError(
                f"MainInput.files({self.path!r}) needs a schema: files are read as they "
                "land, and an inferred schema would drift.",
                fix="pass schema=T.StructType([...]) or a DDL string",
            )
        if self.format != "delta" and self.pre_keyed is not None:
            raise DeclarationError(
                f"MainInput.files({self.path!r}) cannot be pre_keyed: the key-group promise "
                "is checked from Delta statistics, which plain files do not have.",
                fix="land the files in a Delta table partitioned by key group",
            )

    @classmethod
    def files(
        cls,
        path: str,
        *,
        format: str = "json",
        schema: T.StructType | str,
        key: str | None = None,
        event_time: str | None = None,
        asset: str | None = None,
        options: dict[str, str] | None = None,
    ) -> "MainInput":
        """A landing folder: every new file is read once, in the micro-batch that finds it.

        Args:
            path: the folder (flat; files starting with ``.`` or ``_`` are ignored).
            format: a Spark file format (``json``, ``csv``, ``parquet``, ...).
            schema: the records' schema (a StructType, or a DDL string such as
                ``"tx_id long, customer_id long, amount double, ts timestamp"``).
            key / event_time: as for Delta main inputs.
            asset: the asset name shown in lineage (default: the folder's name).
            options: Spark reader options (e.g. ``{"header": "true"}`` for CSV).
        """
        if not isinstance(schema, str | T.StructType):
            raise DeclarationError(
                f"MainInput.files({path!r}): schema must be a StructType or a DDL string."
            )
        name = asset or path.rstrip("/").rsplit("/", 1)[-1]
        return cls(
            asset=name,
            key=key,
            event_time=event_time,
            path=path,
            format=format,
            schema=schema,
            read_options=tuple(sorted((options or {}).items())),
        )

    @property
    def is_files(self) -> bool:
        return self.format != "delta"

    def __repr__(self) -> str:
        head = (
            f"MainInput.files({self.path!r}, format={self.format!r}"
            if self.is_files
            else f"MainInput({self.asset!r}"
        )
        extras = [
            f"{name}={value!r}"
            for name, value in (
                ("key", self.key),
                ("event_time", self.event_time),
                ("pre_keyed", self.pre_keyed),
            )
            if value is not None
        ]
        return head + "".join(", " + e for e in extras) + ")"


@dataclass(frozen=True)
class BufferLimits:
    """Bounds on the records waiting in the operator's buffer.

    Args:
        max_rows: most records the buffer may hold after a batch (0: none may wait).
        max_age: oldest a buffered record may get.
        on_exceed: ``fail`` stops the batch before it writes anything, with an error
            saying which limit and how to raise it; ``overflow`` routes the oldest
            records to the operator's overflow tag.
    """

    max_rows: int | None = 10_000_000
    max_age: dt.timedelta | None = dt.timedelta(days=7)
    on_exceed: OnExceed = "fail"

    def __post_init__(self) -> None:
        check_choice(self.on_exceed, ("fail", "overflow"), "on_exceed", "BufferLimits")
        if self.max_rows is not None and (not isinstance(self.max_rows, int) or self.max_rows < 0):
            raise DeclarationError(
                f"BufferLimits.max_rows must be an integer >= 0, got {self.max_rows!r}."
            )
        if self.max_age is not None and self.max_age < dt.timedelta(0):
            raise DeclarationError(f"BufferLimits.max_age must be >= 0, got {self.max_age}.")

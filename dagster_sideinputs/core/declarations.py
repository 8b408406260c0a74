"""What users declare: the main input, side inputs, windows, output tags, limits.

Every declaration is a frozen dataclass: immutable, hashable where it can be,
picklable (the operator ships some of them to executors), with a readable ``repr``.
Validation happens at construction, so a mistake fails where it was written.
"""

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from pyspark.sql import Column, DataFrame
from pyspark.sql import types as T

from dagster_sideinputs.errors import DeclarationError

View = Literal["singleton", "list", "map", "multimap"]
Readiness = Literal["present", "complete", "fresh"]
Distribution = Literal["broadcast", "keyed", "forwarded"]
Missing = Literal["null", "wait", "unmatched"]
OnTimeout = Literal["unmatched", "null"]
OnExceed = Literal["fail", "overflow"]
KeyTranslator: TypeAlias = "str | Column | Callable[[DataFrame], Column]"
WindowMapping: TypeAlias = Callable[[dt.datetime, dt.datetime], tuple[dt.datetime, dt.datetime]]

_READINESS = ("present", "complete", "fresh")
_DISTRIBUTIONS = ("broadcast", "keyed", "forwarded")
_MISSING = ("null", "wait", "unmatched")


def _check_choice(value: object, choices: Sequence[str], what: str, where: str) -> None:
    if value is not None and value not in choices:
        raise DeclarationError(
            f"{where}: {what}={value!r} is not one of {list(choices)}.",
            fix=f"pass {what}= one of {', '.join(repr(c) for c in choices)}",
        )


def asset_path(name: str | Sequence[str]) -> tuple[str, ...]:
    """An asset name (``"payments/transactions"``) or key path as a tuple of parts."""
    parts = tuple(name.split("/")) if isinstance(name, str) else tuple(name)
    if not parts or any(not part for part in parts):
        raise DeclarationError(
            f"{name!r} is not a valid asset name.", fix='use e.g. "transactions"'
        )
    return parts


# --- output tags -----------------------------------------------------------------------


@dataclass(frozen=True)
class OutputTag:
    """The name of one output of the operator: one Dagster asset, one Delta table.

    Two tags are equal when their names are equal (the schema does not count).

    Args:
        name: asset name of the output (``"suspicious_transactions"`` or
            ``"payments/suspicious"``).
        schema: output schema; required in rows mode, where records are built in Python.
        description: shown on the Dagster asset.

    Examples:
        >>> OutputTag("suspicious_transactions")
        OutputTag('suspicious_transactions')
    """

    name: str
    schema: T.StructType | None = field(default=None, compare=False, hash=False)
    description: str | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        asset_path(self.name)
        if self.schema is not None and not isinstance(self.schema, T.StructType):
            raise DeclarationError(
                f"OutputTag {self.name!r}: schema must be a pyspark StructType, "
                f"got {type(self.schema).__name__}.",
                fix='pass e.g. T.StructType([T.StructField("id", T.LongType())])',
            )

    def __repr__(self) -> str:
        return "MAIN" if self.name == _MAIN_NAME else f"OutputTag({self.name!r})"


_MAIN_NAME = "__main__"
MAIN = OutputTag(_MAIN_NAME, description="The untagged main output of the operator.")
"""The main output. Use it as a key of the mapping a function returns: ``{MAIN: df}``."""


# --- windows -------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """Event-time windows over a timestamp column: tumbling or sliding.

    Windows are half-open ``[start, end)`` and aligned to the Unix epoch (plus
    ``offset``), like Spark's ``window()`` and Dagster's time partitions.

    Attributes:
        size: window length.
        slide: distance between window starts (``size`` for tumbling windows).
        time_column: the event-time column the windows are computed on.
        watermark: allowed lateness: a record is late when its window ended before
            (max event time seen) - watermark.
        offset: shift of window starts from the epoch.
    """

    size: dt.timedelta
    slide: dt.timedelta
    time_column: str | None = None
    watermark: dt.timedelta | None = None
    offset: dt.timedelta = dt.timedelta(0)

    def __post_init__(self) -> None:
        if self.size <= dt.timedelta(0) or self.slide <= dt.timedelta(0):
            raise DeclarationError(
                f"Window size and slide must be positive (size={self.size}, slide={self.slide}).",
                fix="e.g. Window.tumbling(timedelta(hours=1), time_column='ts')",
            )
        if self.slide > self.size:
            raise DeclarationError(
                f"Window slide {self.slide} is longer than its size {self.size}: records "
                "between windows would belong to none.",
                fix="use a slide <= size",
            )
        if (self.size % self.slide) != dt.timedelta(0):
            raise DeclarationError(
                f"Window size {self.size} is not a multiple of its slide {self.slide}.",
                fix="choose a slide that divides the size",
            )

    @classmethod
    def tumbling(
        cls,
        size: dt.timedelta,
        *,
        time_column: str | None = None,
        watermark: dt.timedelta | None = None,
        offset: dt.timedelta = dt.timedelta(0),
    ) -> "Window":
        """Consecutive, non-overlapping windows of ``size``."""
        return cls(size, size, time_column, watermark, offset)

    @classmethod
    def sliding(
        cls,
        size: dt.timedelta,
        *,
        slide: dt.timedelta,
        time_column: str | None = None,
        watermark: dt.timedelta | None = None,
        offset: dt.timedelta = dt.timedelta(0),
    ) -> "Window":
        """Overlapping windows of ``size`` starting every ``slide``; a record is in several."""
        return cls(size, slide, time_column, watermark, offset)

    @property
    def is_tumbling(self) -> bool:
        return self.size == self.slide

    def with_time_column(self, column: str) -> "Window":
        return Window(self.size, self.slide, column, self.watermark, self.offset)

    def __repr__(self) -> str:
        kind = (
            f"Window.tumbling({self.size!r}"
            if self.is_tumbling
            else f"Window.sliding({self.size!r}, slide={self.slide!r}"
        )
        extras = [f"time_column={self.time_column!r}"] if self.time_column else []
        if self.watermark is not None:
            extras.append(f"watermark={self.watermark!r}")
        return kind + "".join(", " + e for e in extras) + ")"


# --- main input ----------------------------------------------------------------------


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
        if self.max_key_groups < 1:
            raise DeclarationError(
                f"KeyGroups.max_key_groups must be >= 1, got {self.max_key_groups}."
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


# --- side inputs ---------------------------------------------------------------------


@dataclass(frozen=True)
class SideInput:
    """An additional, usually slowly changing input, seen through a view.

    Build one with :meth:`singleton`, :meth:`list`, :meth:`map` or :meth:`multimap`.

    Attributes:
        asset: asset name of the side Delta table.
        view: how the user function sees it.
        key: the side table's key column (map / multimap).
        readiness: when it may be used; by default ``complete`` for windowed side
            inputs, ``fresh`` when it has a freshness rule (``max_age`` here, a
            FreshnessPolicy in Dagster), else ``present``.
        distribution: ``broadcast`` ships the view to every task; ``keyed`` joins it by
            key without broadcasting; ``forwarded`` joins on ``forward_column``.
        key_translator: main-record expression giving the side key (a column name, a
            Column, or a function of the main DataFrame returning a Column). Without
            one, a map / multimap joins main records on the column named like ``key``;
            when main records have no such column, the function gets the whole view.
        missing: for keyed lookups, what happens to a main record whose key has no
            side row: ``null`` (joined with nulls), ``wait`` (buffered until the row
            arrives or ``timeout`` passes), ``unmatched`` (to the unmatched tag).
        timeout: with ``missing="wait"``, how long a record may wait.
        on_timeout: after the timeout: ``unmatched`` tag or ``null`` join.
        window: side windows (a time-window partitioned side asset).
        window_mapping: maps a main window ``(start, end)`` to the side window to read;
            default: the side window containing the main window's last instant.
        max_age: freshness without Dagster: the table's last commit must be this recent.
        default: a singleton's value when its namespace is ready but empty.
        pick: for a map with duplicate keys, keep the row with the greatest value of
            this column instead of failing.
        forward_column: the shared column of a ``forwarded`` distribution.
        path: table location when it is not ``<storage root>/<asset>``.
    """

    asset: str
    view: View
    key: str | None = None
    readiness: Readiness | None = None
    distribution: Distribution | None = None
    key_translator: Any = field(default=None, compare=False, hash=False)
    missing: Missing = "null"
    timeout: dt.timedelta | None = None
    on_timeout: OnTimeout = "unmatched"
    window: Window | None = None
    window_mapping: WindowMapping | None = field(default=None, compare=False, hash=False)
    max_age: dt.timedelta | None = None
    default: Any = field(default=None, compare=False, hash=False)
    pick: str | None = None
    forward_column: str | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        where = f"SideInput.{self.view}({self.asset!r})"
        asset_path(self.asset)
        _check_choice(self.readiness, _READINESS, "readiness", where)
        _check_choice(self.distribution, _DISTRIBUTIONS, "distribution", where)
        _check_choice(self.missing, _MISSING, "missing", where)
        if self.view in ("map", "multimap") and not self.key:
            raise DeclarationError(f"{where} needs key=<the side table's key column>.")
        if self.missing != "null" and self.view not in ("map", "multimap"):
            raise DeclarationError(
                f"{where}: missing={self.missing!r} only applies to keyed map/multimap views."
            )
        if self.missing == "wait" and self.timeout is None:
            raise DeclarationError(
                f"{where}: missing='wait' needs a timeout, or records could wait forever.",
                fix="pass timeout=timedelta(hours=1) (then on_timeout decides)",
            )
        if self.distribution == "forwarded" and not self.forward_column:
            raise DeclarationError(
                f"{where}: distribution='forwarded' needs forward_column=<shared column>."
            )
        if self.window is not None and self.window.time_column is None:
            raise DeclarationError(
                f"{where}: a windowed side input needs the side table's time column.",
                fix="pass window=Window.tumbling(timedelta(hours=1), time_column='ts')",
            )
        if self.pick is not None and self.view != "map":
            raise DeclarationError(f"{where}: pick= only applies to map views.")

    @classmethod
    def singleton(cls, asset: str, **options: Any) -> "SideInput":
        """One value (one row) per namespace; ``sides[name]`` is that row."""
        return cls(asset=asset, view="singleton", **options)

    @classmethod
    def list(cls, asset: str, **options: Any) -> "SideInput":
        """All rows as a bag; ``sides[name]`` is a DataFrame of them."""
        return cls(asset=asset, view="list", **options)

    @classmethod
    def map(cls, asset: str, *, key: str, **options: Any) -> "SideInput":
        """Key -> one row; joined to each main record as a struct column."""
        return cls(asset=asset, view="map", key=key, **options)

    @classmethod
    def multimap(cls, asset: str, *, key: str, **options: Any) -> "SideInput":
        """Key -> all rows of that key; joined to each main record as an array column."""
        return cls(asset=asset, view="multimap", key=key, **options)

    def __repr__(self) -> str:
        extras = [f"key={self.key!r}"] if self.key else []
        for name in ("readiness", "distribution", "window", "pick", "forward_column"):
            value = getattr(self, name)
            if value is not None:
                extras.append(f"{name}={value!r}")
        if self.missing != "null":
            extras.append(f"missing={self.missing!r}, timeout={self.timeout!r}")
        if self.max_age is not None:
            extras.append(f"max_age={self.max_age!r}")
        return f"SideInput.{self.view}({self.asset!r}" + "".join(", " + e for e in extras) + ")"


# --- buffer limits -------------------------------------------------------------------


@dataclass(frozen=True)
class BufferLimits:
    """Bounds on the records waiting in the operator's buffer.

    Args:
        max_rows: most records the buffer may hold after a batch.
        max_age: oldest a buffered record may get.
        on_exceed: ``fail`` stops the batch before it writes anything, with an error
            saying which limit and how to raise it; ``overflow`` routes the oldest
            records to the operator's overflow tag.
    """

    max_rows: int | None = 10_000_000
    max_age: dt.timedelta | None = dt.timedelta(days=7)
    on_exceed: OnExceed = "fail"

    def __post_init__(self) -> None:
        _check_choice(self.on_exceed, ("fail", "overflow"), "on_exceed", "BufferLimits")
        if self.max_rows is not None and self.max_rows < 0:
            raise DeclarationError(f"BufferLimits.max_rows must be >= 0, got {self.max_rows}.")

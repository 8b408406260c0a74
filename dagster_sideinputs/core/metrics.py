"""Metrics of micro-batches and runs: what came in, where every record went, how long it took.

Accounting: every record a batch looks at (``rows_in`` new records, counted once per
window they belong to, plus ``released_from_buffer`` records read back from the
buffer) goes to exactly one route: released to the function, buffered, late,
unmatched, overflow or invalid. ``accounted`` checks that the routes add up.
"""

import datetime as dt
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class TableWrite:
    """One table written by a batch."""

    table: str
    uri: str
    version: int
    rows: int
    skipped: bool
    seconds: float


@dataclass(frozen=True)
class BatchMetrics:
    """Everything a micro-batch did.

    Attributes:
        operator_id / batch_id: which batch.
        replayed: the batch was planned by an earlier, interrupted run.
        main_range: the slice of the main input read.
        rows_in: new main records (one per window they belong to).
        released_from_buffer: buffered records read back because they may be released.
        routes: records per route: ``released``, ``buffered``, ``key_wait``, ``late``,
            ``unmatched``, ``overflow``, ``invalid``.
        writes: per output table (tag name, or ``buffer``), rows and Delta version.
        side_versions: the pinned version of each side table.
        readiness: per side input and namespace, ``{"ready": bool, "reason": str}``.
        buffer_rows / buffer_oldest_age_s: the buffer after the batch.
        watermark / max_event_time: event-time progress.
        durations: seconds per phase and in total.
        notes: how the batch ran (e.g. whether a pre-keyed input avoided its shuffle).
        physical_plan: Spark's physical plan of the classification step, when the run
            was asked to ``explain``.
        engine: the Delta engine that committed the batch's tables.
    """

    operator_id: str
    batch_id: int
    replayed: bool
    main_range: str
    rows_in: int
    released_from_buffer: int
    routes: dict[str, int]
    writes: dict[str, TableWrite]
    side_versions: dict[str, int | None]
    readiness: dict[str, dict[str, dict[str, Any]]]
    buffer_rows: int
    buffer_oldest_age_s: float | None
    watermark: dt.datetime | None
    max_event_time: dt.datetime | None
    durations: dict[str, float]
    notes: list[str] = field(default_factory=list)
    physical_plan: str | None = None
    engine: str = ""

    @property
    def released(self) -> int:
        return self.routes.get("released", 0)

    @property
    def newly_buffered(self) -> int:
        return self.routes.get("buffered", 0) + self.routes.get("key_wait", 0)

    @property
    def records_processed(self) -> int:
        """Every record the batch routed: ``rows_in`` + ``released_from_buffer``."""
        return self.rows_in + self.released_from_buffer

    @property
    def accounted(self) -> bool:
        """Every record looked at went to exactly one route."""
        return sum(self.routes.values()) == self.records_processed

    @property
    def records_per_second(self) -> float:
        """``records_processed`` per second of the batch (a batch that only releases
        buffered records has a throughput too)."""
        total = self.durations.get("total", 0.0)
        return self.records_processed / total if total > 0 else 0.0

    def emitted(self, table: str) -> int:
        write = self.writes.get(table)
        return 0 if write is None else write.rows

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["released"] = self.released
        data["newly_buffered"] = self.newly_buffered
        data["records_processed"] = self.records_processed
        data["records_per_second"] = round(self.records_per_second, 1)
        data["accounted"] = self.accounted
        return data

    def summary(self) -> str:
        """One line with the glossary's words, e.g. ``batch 3: versions 4..5, new_records=500
        from_buffer=0 -> released=490 buffered=10 late=0 unmatched=0; buffered_rows=10; 1.2s``."""
        return (
            f"batch {self.batch_id}{' (replay)' if self.replayed else ''}: {self.main_range}, "
            f"{figures_line(record_figures([self]))}; buffered_rows={self.buffer_rows}; "
            f"{human_duration(self.durations.get('total', 0.0))}"
        )


@dataclass(frozen=True)
class RunResult:
    """The batches one ``run`` processed, and why it stopped."""

    batches: list[BatchMetrics]
    stopped: str

    @property
    def rows_in(self) -> int:
        return sum(b.rows_in for b in self.batches)

    @property
    def records_processed(self) -> int:
        """New records plus records read back from the buffer, over all batches."""
        return sum(b.records_processed for b in self.batches)

    def emitted(self, table: str) -> int:
        return sum(b.emitted(table) for b in self.batches)

    @property
    def last(self) -> BatchMetrics | None:
        return self.batches[-1] if self.batches else None


ROUTES = ("released", "buffered", "late", "unmatched", "overflow", "invalid")
"""Where a processed record can go; they add up to ``records_processed``."""


def record_figures(batches: Sequence["BatchMetrics"]) -> dict[str, int]:
    """Records in and where they went, summed over batches (the figures' names are defined in
    ``dagster_sideinputs.dagster_layer.figures.GLOSSARY``)."""
    new = sum(b.rows_in for b in batches)
    from_buffer = sum(b.released_from_buffer for b in batches)
    routes = {route: sum(b.routes.get(route, 0) for b in batches) for route in ROUTES}
    # Waiting for a side row of the key is waiting in the buffer too.
    routes["buffered"] += sum(b.routes.get("key_wait", 0) for b in batches)
    return {
        "new_records": new,
        "from_buffer": from_buffer,
        "records_processed": new + from_buffer,
        **routes,
    }


def figures_line(figures: dict[str, int]) -> str:
    """``new_records=500 from_buffer=0 -> released=490 buffered=10 late=0 unmatched=0``.

    Routes that can only be non-zero with an overflow or invalid output are shown when
    they are not zero, so the line always adds up.
    """
    routes = [
        f"{route}={figures[route]}"
        for route in ROUTES
        if route not in ("overflow", "invalid") or figures[route]
    ]
    return (
        f"new_records={figures['new_records']} from_buffer={figures['from_buffer']} -> "
        + " ".join(routes)
    )


def human_duration(value: dt.timedelta | float | None) -> str:
    """A duration as people write it: ``30 minutes``, ``1 day``, ``1 hour 30 minutes``, ``45s``.

    Examples:
        >>> human_duration(dt.timedelta(days=1))
        '1 day'
        >>> human_duration(dt.timedelta(minutes=90))
        '1 hour 30 minutes'
        >>> human_duration(45.54)
        '45.5s'
    """
    if value is None:
        return "none"
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    if seconds < 60:
        return f"{round(seconds, 1):g}s"
    parts = []
    rest = round(seconds)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count} {unit}{'s' if count != 1 else ''}")
    return " ".join(parts)

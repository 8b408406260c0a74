"""Batch plans: what a micro-batch will do, written down before it writes anything.

A plan pins the main input range, the version of every side table, every readiness
decision, the buffer version it reads and the clock. A replay of the batch (after a
crash) loads the plan instead of making a new one, so it computes exactly the same
output; the Delta application transactions then keep it from writing anything twice.
Plans are frozen values with an exact JSON round trip.
"""

import datetime as dt
import json
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from dagster_sideinputs.core.callbacks import map_to_side_window
from dagster_sideinputs.core.sideinputs.readiness import Decision
from dagster_sideinputs.core.sideinputs.windows import (
    GLOBAL,
    WindowSpan,
    parse_namespace_id,
    shifted,
)
from dagster_sideinputs.core.spec import BoundSide

PLAN_FORMAT = 2


def _ts(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.timezone.utc).isoformat()


def _parse_ts(value: str | None) -> dt.datetime | None:
    return None if value is None else dt.datetime.fromisoformat(value)


@dataclass(frozen=True, order=True)
class OffsetRange:
    """The offsets ``[start, end)`` of one Kafka partition a batch reads.

    ``log_end`` is the partition's end offset when the batch was planned: ``log_end -
    end`` is the lag the batch left behind.
    """

    topic: str
    partition: int
    start: int
    end: int
    log_end: int | None = None

    @property
    def size(self) -> int:
        """Offsets in the range (records, but for compacted or transactional topics)."""
        return max(0, self.end - self.start)

    @property
    def lag(self) -> int | None:
        return None if self.log_end is None else max(0, self.log_end - self.end)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "start": self.start,
            "end": self.end,
            "log_end": self.log_end,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "OffsetRange":
        log_end = data.get("log_end")
        return cls(
            topic=str(data["topic"]),
            partition=int(data["partition"]),
            start=int(data["start"]),
            end=int(data["end"]),
            log_end=None if log_end is None else int(log_end),
        )

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] {self.start}..{self.end}"


@dataclass(frozen=True)
class MainRange:
    """The slice of the main input a batch reads.

    Delta main inputs: the versions ``(start_version, end_version]`` of the table whose
    id is ``table_id``. Landing folders: the new files by name, with their sizes and
    modification times. Kafka: the offsets ``[start, end)`` of every partition known
    (sorted by topic and partition; a partition without new records keeps its position
    with ``start == end``), the ids of the topics they belong to, and the offsets
    skipped as lost (``on_data_loss="skip"``). ``anchor`` marks the first batch of an
    input read from its end (``starting_offsets="latest"``): it runs even without records,
    to write that position down.
    """

    kind: Literal["delta", "files", "kafka"]
    start_version: int = -1
    end_version: int = -1
    files: tuple[Mapping[str, Any], ...] = ()
    table_id: str | None = None
    offsets: tuple[OffsetRange, ...] = ()
    topic_ids: Mapping[str, str] = field(default_factory=dict)
    lost: tuple[OffsetRange, ...] = ()
    anchor: bool = False

    @property
    def is_empty(self) -> bool:
        if self.kind == "delta":
            return self.end_version <= self.start_version
        if self.kind == "kafka":
            return not self.lost and not self.anchor and all(r.size == 0 for r in self.offsets)
        return not self.files

    @property
    def records(self) -> int:
        """Kafka: offsets to read (an upper bound of the records)."""
        return sum(r.size for r in self.offsets)

    @property
    def lost_offsets(self) -> int:
        return sum(r.size for r in self.lost)

    def describe(self) -> str:
        if self.kind == "delta":
            return f"versions ({self.start_version}, {self.end_version}]"
        if self.kind == "kafka":
            moving = [r for r in self.offsets if r.size]
            shown = ", ".join(str(r) for r in moving[:4])
            more = f", +{len(moving) - 4} partition(s)" if len(moving) > 4 else ""
            text = f"offsets {shown}{more} ({self.records} offsets)" if moving else "no new offsets"
            if self.anchor:
                text += " (starting at the log end)"
            if self.lost:
                text += f"; {self.lost_offsets} lost offset(s) skipped"
            return text
        return f"{len(self.files)} new file(s)"

    def detail(self) -> dict[str, Any]:
        """Per-partition offsets and lag (Kafka), for metrics and metadata."""
        if self.kind != "kafka":
            return {}
        return {
            "offsets": [{**r.to_dict(), "lag": r.lag} for r in self.offsets],
            "lag": sum(r.lag or 0 for r in self.offsets),
            "lost": [r.to_dict() for r in self.lost],
            "lost_offsets": self.lost_offsets,
        }

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind,
            "start_version": self.start_version,
            "end_version": self.end_version,
            "files": [dict(f) for f in self.files],
            "table_id": self.table_id,
        }
        if self.kind == "kafka":
            data["offsets"] = [r.to_dict() for r in self.offsets]
            data["topic_ids"] = dict(sorted(self.topic_ids.items()))
            data["lost"] = [r.to_dict() for r in self.lost]
            data["anchor"] = self.anchor
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MainRange":
        return cls(
            kind=data["kind"],
            start_version=data.get("start_version", -1),
            end_version=data.get("end_version", -1),
            files=tuple(data.get("files") or ()),
            table_id=data.get("table_id"),
            offsets=tuple(OffsetRange.from_dict(r) for r in data.get("offsets") or ()),
            topic_ids=dict(data.get("topic_ids") or {}),
            lost=tuple(OffsetRange.from_dict(r) for r in data.get("lost") or ()),
            anchor=bool(data.get("anchor", False)),
        )


@dataclass(frozen=True)
class NamespacePlan:
    """One main namespace in play: its window, its side namespaces, and the verdict."""

    start: dt.datetime | None
    end: dt.datetime | None
    side_namespaces: Mapping[str, str]
    ready: bool
    late: bool = False


@dataclass(frozen=True)
class AsOfPlan:
    """What a batch pinned for one as-of (temporal) side input.

    Attributes:
        horizon: the side data is known up to this time: records with a later event
            time wait (until the side input's ``grace`` after their time has passed).
            None: the side table holds no validity yet.
        versions: ``AsOf.history()`` only: the table versions the batch reads, oldest
            first, each with the time it became valid (its commit timestamp, made
            non-decreasing); a version is valid until the next one's time.
    """

    horizon: dt.datetime | None
    versions: tuple[tuple[int, dt.datetime], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "horizon": _ts(self.horizon),
            "versions": [[version, _ts(at)] for version, at in self.versions],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AsOfPlan":
        return cls(
            horizon=_parse_ts(data.get("horizon")),
            versions=tuple(
                (int(version), _parse_ts(at))  # type: ignore[misc]
                for version, at in data.get("versions") or ()
            ),
        )


@dataclass(frozen=True)
class BatchPlan:
    """Everything a batch decides before it reads or writes data.

    Attributes:
        read_slots: buffer slots the batch reads (their records are routed again and
            their files removed in the batch's buffer commit).
        reroute: the declaration changed since the buffered records were written: they
            get fresh namespaces and key groups under the current one.
        routing: fingerprint of the declaration the batch routes under.
        tables: every table the batch may commit to (outputs, buffer, ledger): a plan
            none of them committed is planned again rather than replayed.
        side_ids: the Delta table id of each side table read: a version number means
            nothing once the table was deleted and created again.
        as_of: per as-of side input, its horizon and (history) versions.
        buffer_renames: buffered main columns that are not the main input's column of the
            same name any more (core/batch/buffer_schema.py): the column they now are (renamed
            under column mapping), or None (dropped).
        buffer_rewrite: the buffer's columns no longer match the main input's: every slot
            is read and the buffer written again whole, in the main input's schema.
    """

    operator_id: str
    batch_id: int
    now: dt.datetime
    main: MainRange
    side_versions: Mapping[str, int | None]
    decisions: Mapping[str, Mapping[str, Decision]]
    namespaces: Mapping[str, NamespacePlan]
    read_slots: tuple[str, ...]
    buffer_version: int
    watermark: dt.datetime | None
    max_event_time: dt.datetime | None
    reroute: bool = False
    routing: str = ""
    tables: tuple[str, ...] = ()
    side_ids: Mapping[str, str | None] = field(default_factory=dict)
    as_of: Mapping[str, AsOfPlan] = field(default_factory=dict)
    buffer_renames: Mapping[str, str | None] = field(default_factory=dict)
    buffer_rewrite: bool = False
    # Unique per plan (the random part): the key of the plan's claim (state/folder.py).
    planned_by: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    )

    @property
    def ready_namespaces(self) -> list[str]:
        return sorted(ns for ns, plan in self.namespaces.items() if plan.ready)

    @property
    def late_namespaces(self) -> list[str]:
        return sorted(ns for ns, plan in self.namespaces.items() if plan.late)

    def with_batch_id(self, batch_id: int) -> "BatchPlan":
        return replace(self, batch_id=batch_id)

    def to_json(self) -> str:
        data = {
            "format": PLAN_FORMAT,
            "operator_id": self.operator_id,
            "batch_id": self.batch_id,
            "now": _ts(self.now),
            "main": self.main.to_dict(),
            "side_versions": dict(self.side_versions),
            "decisions": {
                side: {ns: {"ready": d.ready, "reason": d.reason} for ns, d in per_ns.items()}
                for side, per_ns in self.decisions.items()
            },
            "namespaces": {
                ns: {
                    "start": _ts(p.start),
                    "end": _ts(p.end),
                    "side_namespaces": dict(p.side_namespaces),
                    "ready": p.ready,
                    "late": p.late,
                }
                for ns, p in self.namespaces.items()
            },
            "read_slots": list(self.read_slots),
            "buffer_version": self.buffer_version,
            "watermark": _ts(self.watermark),
            "max_event_time": _ts(self.max_event_time),
            "reroute": self.reroute,
            "routing": self.routing,
            "tables": list(self.tables),
            "side_ids": dict(self.side_ids),
            "as_of": {side: entry.to_dict() for side, entry in self.as_of.items()},
            "planned_by": self.planned_by,
            "buffer_renames": dict(self.buffer_renames),
            "buffer_rewrite": self.buffer_rewrite,
        }
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "BatchPlan":
        """Raises ValueError / KeyError / TypeError on a malformed plan (the caller
        names the file)."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a plan is a JSON object")
        return cls(
            operator_id=data["operator_id"],
            batch_id=int(data["batch_id"]),
            now=_parse_ts(data["now"]),  # type: ignore[arg-type]
            main=MainRange.from_dict(data["main"]),
            side_versions=dict(data["side_versions"]),
            decisions={
                side: {ns: Decision(**d) for ns, d in per_ns.items()}
                for side, per_ns in data["decisions"].items()
            },
            namespaces={
                ns: NamespacePlan(
                    start=_parse_ts(p["start"]),
                    end=_parse_ts(p["end"]),
                    side_namespaces=dict(p["side_namespaces"]),
                    ready=bool(p["ready"]),
                    late=bool(p.get("late", False)),
                )
                for ns, p in data["namespaces"].items()
            },
            read_slots=tuple(data["read_slots"]),
            buffer_version=int(data["buffer_version"]),
            watermark=_parse_ts(data["watermark"]),
            max_event_time=_parse_ts(data["max_event_time"]),
            reroute=bool(data.get("reroute", False)),
            routing=str(data.get("routing", "")),
            tables=tuple(data.get("tables") or ()),
            side_ids=dict(data.get("side_ids") or {}),
            as_of={
                side: AsOfPlan.from_dict(entry) for side, entry in (data.get("as_of") or {}).items()
            },
            planned_by=data.get("planned_by", ""),
            buffer_renames=dict(data.get("buffer_renames") or {}),
            buffer_rewrite=bool(data.get("buffer_rewrite", False)),
        )


def describe_change(before: Mapping[str, Any], now: Mapping[str, Any], prefix: str = "") -> str:
    """``" (window: {...} -> None; sides.fx: ...)"``: the keys of two declaration
    summaries that differ, for error messages ("" when equal)."""
    changes = _changes(before, now, prefix)
    return f" ({'; '.join(changes)})" if changes else ""


def _changes(before: Any, now: Any, prefix: str) -> list[str]:
    if isinstance(before, Mapping) and isinstance(now, Mapping):
        found: list[str] = []
        for key in sorted(set(before) | set(now), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in before:
                found.append(f"{path} added")
            elif key not in now:
                found.append(f"{path} removed")
            else:
                found.extend(_changes(before[key], now[key], path))
        return found
    return [] if before == now else [f"{prefix or 'value'}: {before!r} -> {now!r}"]


@dataclass(frozen=True)
class Previous:
    """The last committed batch: its plan and commit record (None for the first batch)."""

    plan: BatchPlan | None = None
    record: Mapping[str, Any] | None = None


def side_windows(bound: BoundSide, plan: BatchPlan) -> list[WindowSpan] | None:
    """The side windows that released records of this batch read (None: not windowed):
    the ones the plan recorded (the mapping, a user's included, was called and checked
    when planning: a replay reads what the plan says, even if the mapping changed)."""
    window = bound.side.window
    if window is None:
        return None
    spans: set[WindowSpan] = set()
    for p in plan.namespaces.values():
        if not p.ready or p.start is None or p.end is None:
            continue
        recorded = parse_namespace_id(p.side_namespaces.get(bound.name, GLOBAL))
        spans.add(
            map_to_side_window(window, bound.side.window_mapping, p.start, p.end, label=bound.label)
            if recorded is None
            else (recorded, shifted(recorded, window.size))
        )
    return sorted(spans)

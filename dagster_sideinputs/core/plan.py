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

from dagster_sideinputs.core.readiness import Decision

PLAN_FORMAT = 2


def _ts(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.timezone.utc).isoformat()


def _parse_ts(value: str | None) -> dt.datetime | None:
    return None if value is None else dt.datetime.fromisoformat(value)


@dataclass(frozen=True)
class MainRange:
    """The slice of the main input a batch reads.

    Delta main inputs: the versions ``(start_version, end_version]`` of the table whose
    id is ``table_id``. Landing folders: the new files by name, with their sizes and
    modification times.
    """

    kind: Literal["delta", "files"]
    start_version: int = -1
    end_version: int = -1
    files: tuple[Mapping[str, Any], ...] = ()
    table_id: str | None = None

    @property
    def is_empty(self) -> bool:
        if self.kind == "delta":
            return self.end_version <= self.start_version
        return not self.files

    def describe(self) -> str:
        if self.kind == "delta":
            return f"versions ({self.start_version}, {self.end_version}]"
        return f"{len(self.files)} new file(s)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "start_version": self.start_version,
            "end_version": self.end_version,
            "files": [dict(f) for f in self.files],
            "table_id": self.table_id,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MainRange":
        return cls(
            kind=data["kind"],
            start_version=data.get("start_version", -1),
            end_version=data.get("end_version", -1),
            files=tuple(data.get("files") or ()),
            table_id=data.get("table_id"),
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
    # Unique per plan (the random part): the key of the plan's claim (state.py).
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

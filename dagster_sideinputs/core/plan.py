"""Batch plans: what a micro-batch will do, written down before it writes anything.

A plan pins the main input range, the version of every side table, every readiness
decision, the buffer version it reads and the clock. A replay of the batch (after a
crash) loads the plan instead of making a new one, so it computes exactly the same
output; the Delta application transactions then keep it from writing anything twice.

Plans and commit records are small JSON files in the operator's state folder:
``plans/<batch>.json`` (created exclusively: two runs cannot plan the same batch) and
``commits/<batch>.json`` (written last: the batch is complete).
"""

import datetime as dt
import json
import os
import socket
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from dagster_sideinputs.core.readiness import Decision
from dagster_sideinputs.delta.files import TableFiles
from dagster_sideinputs.errors import OperatorStateError


def _ts(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.timezone.utc).isoformat()


def _parse_ts(value: str | None) -> dt.datetime | None:
    return None if value is None else dt.datetime.fromisoformat(value)


@dataclass
class MainRange:
    """The slice of the main input a batch reads.

    Delta main inputs: the versions ``(start_version, end_version]``. Landing folders:
    the new files by name, with their sizes.
    """

    kind: Literal["delta", "files"]
    start_version: int = -1
    end_version: int = -1
    files: list[dict[str, Any]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        if self.kind == "delta":
            return self.end_version <= self.start_version
        return not self.files

    def describe(self) -> str:
        if self.kind == "delta":
            return f"versions ({self.start_version}, {self.end_version}]"
        return f"{len(self.files)} new file(s)"


@dataclass
class NamespacePlan:
    """One main namespace in play: its window, its side namespaces, and the verdict."""

    start: dt.datetime | None
    end: dt.datetime | None
    side_namespaces: dict[str, str]
    ready: bool
    late: bool = False


@dataclass
class BatchPlan:
    """Everything a batch decides before it reads or writes data."""

    operator_id: str
    batch_id: int
    now: dt.datetime
    main: MainRange
    side_versions: dict[str, int | None]
    decisions: dict[str, dict[str, Decision]]
    namespaces: dict[str, NamespacePlan]
    read_slots: list[str]
    buffer_version: int
    watermark: dt.datetime | None
    max_event_time: dt.datetime | None
    planned_by: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    @property
    def ready_namespaces(self) -> list[str]:
        return sorted(ns for ns, plan in self.namespaces.items() if plan.ready)

    @property
    def late_namespaces(self) -> list[str]:
        return sorted(ns for ns, plan in self.namespaces.items() if plan.late)

    def to_json(self) -> str:
        data = asdict(self)
        data["now"] = _ts(self.now)
        data["watermark"] = _ts(self.watermark)
        data["max_event_time"] = _ts(self.max_event_time)
        for ns in data["namespaces"].values():
            ns["start"], ns["end"] = _ts(ns["start"]), _ts(ns["end"])
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "BatchPlan":
        data = json.loads(text)
        return cls(
            operator_id=data["operator_id"],
            batch_id=data["batch_id"],
            now=_parse_ts(data["now"]),  # type: ignore[arg-type]
            main=MainRange(**data["main"]),
            side_versions=data["side_versions"],
            decisions={
                side: {ns: Decision(**d) for ns, d in per_ns.items()}
                for side, per_ns in data["decisions"].items()
            },
            namespaces={
                ns: NamespacePlan(
                    start=_parse_ts(p["start"]),
                    end=_parse_ts(p["end"]),
                    side_namespaces=p["side_namespaces"],
                    ready=p["ready"],
                    late=p.get("late", False),
                )
                for ns, p in data["namespaces"].items()
            },
            read_slots=data["read_slots"],
            buffer_version=data["buffer_version"],
            watermark=_parse_ts(data["watermark"]),
            max_event_time=_parse_ts(data["max_event_time"]),
            planned_by=data.get("planned_by", ""),
        )


class PlanLog:
    """The plans and commit records of one operator."""

    def __init__(self, state: TableFiles) -> None:
        self._files = state

    def _ids(self, folder: str) -> list[int]:
        ids = []
        for entry in self._files.list_files(folder):
            name = entry.path.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                ids.append(int(name[:-5]))
        return sorted(ids)

    def last_planned(self) -> int | None:
        ids = self._ids("plans")
        return ids[-1] if ids else None

    def last_committed(self) -> int | None:
        ids = self._ids("commits")
        return ids[-1] if ids else None

    def create(self, plan: BatchPlan) -> bool:
        """Write a new plan; False when a plan for that batch already exists."""
        return self._files.write_bytes_atomic(
            f"plans/{plan.batch_id:020d}.json", plan.to_json().encode(), exclusive=True
        )

    def load(self, batch_id: int) -> BatchPlan:
        try:
            raw = self._files.read_bytes(f"plans/{batch_id:020d}.json")
        except FileNotFoundError as exc:
            raise OperatorStateError(
                f"The plan of batch {batch_id} is missing from {self._files.root}/plans.",
                fix="restore the operator's state folder, or reset the operator (see README)",
            ) from exc
        return BatchPlan.from_json(raw.decode())

    def commit(self, batch_id: int, record: dict[str, Any]) -> None:
        self._files.write_bytes_atomic(
            f"commits/{batch_id:020d}.json", json.dumps(record, default=str, indent=1).encode()
        )

    def load_commit(self, batch_id: int) -> dict[str, Any]:
        return json.loads(self._files.read_bytes(f"commits/{batch_id:020d}.json"))

"""Planning a micro-batch: what is new, what is ready, what to release.

The planner looks only at metadata (Delta logs, file listings, file statistics and
the readiness provider) plus, when statistics cannot tell, one small Spark job for
the event-time windows of new records. Its result, a
:class:`~dagster_sideinputs.core.plan.BatchPlan`, is written down before the batch
reads or writes any data.
"""

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dagster_sideinputs.core.buffer import BufferState, keywait_slot, namespace_slot
from dagster_sideinputs.core.keyed import check_pre_keyed
from dagster_sideinputs.core.plan import BatchPlan, MainRange, NamespacePlan
from dagster_sideinputs.core.readiness import Decision, SideFacts
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.views import SIDE_NS, SideData
from dagster_sideinputs.core.windows import (
    GLOBAL,
    NS_START,
    as_utc,
    assign_windows,
    map_to_side_window,
    namespace_id,
    parse_namespace_id,
    windows_between,
)
from dagster_sideinputs.delta.files import TableFiles, normalize_uri
from dagster_sideinputs.delta.log import added_files
from dagster_sideinputs.delta.table import TableSnapshot
from dagster_sideinputs.errors import SideInputDataError, TableNotFoundError

MAX_ENUMERATED_WINDOWS = 2000
_HIDDEN = (".", "_")


@dataclass
class Planned:
    """A plan and what was learned while making it (reused by a fresh batch)."""

    plan: BatchPlan
    main_files: list[Any] = field(default_factory=list)
    main_snapshot: TableSnapshot | None = None
    side_snapshots: dict[str, TableSnapshot | None] = field(default_factory=dict)


def parse_stat_time(value: Any) -> dt.datetime | None:
    """A timestamp statistic (typed, or an ISO string from a commit's JSON stats)."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return as_utc(value)
    text = str(value).replace("Z", "+00:00").replace(" ", "T")
    try:
        return as_utc(dt.datetime.fromisoformat(text))
    except ValueError:
        return None


def _file_stat(file: Any, kind: str, column: str) -> Any:
    typed = getattr(file, f"{kind}_values", None)
    if typed is not None:
        return typed.get(column)
    stats = getattr(file, "stats", None) or {}
    return (stats.get("minValues" if kind == "min" else "maxValues") or {}).get(column)


class Planner:
    """Makes the plan of the next batch of one operator."""

    def __init__(self, spec: OperatorSpec, spark: SparkSession | None) -> None:
        self.spec = spec
        self.spark = spark
        self.engine = spec.storage.delta

    # --- main input ------------------------------------------------------------------

    def main_range(
        self, previous: BatchPlan | None
    ) -> tuple[MainRange, list[Any], TableSnapshot | None]:
        if self.spec.main.is_files:
            return self._files_range()
        start = previous.main.end_version if previous is not None else -1
        try:
            latest = self.engine.snapshot(self.spec.main_uri, name=self.spec.main.asset)
        except TableNotFoundError:  # not materialized yet (a non-Delta folder is an error)
            return MainRange("delta", start, start), [], None
        end = latest.version
        if self.spec.max_versions_per_batch is not None:
            end = min(end, start + self.spec.max_versions_per_batch)
        if end <= start:
            return MainRange("delta", start, start), [], latest
        snapshot = (
            latest
            if end == latest.version
            else self.engine.snapshot(self.spec.main_uri, version=end, name=self.spec.main.asset)
        )
        if start < 0:
            files: list[Any] = list(snapshot.files)
        else:
            files = added_files(
                TableFiles(self.spec.main_uri, self.spec.storage.storage_options),
                start,
                end,
                table=self.spec.main.asset,
            )
        if self.spec.main.pre_keyed is not None and self.spec.main.key is not None:
            check_pre_keyed(
                files, self.spec.main.pre_keyed, key=self.spec.main.key, table=self.spec.main.asset
            )
        return MainRange("delta", start, end), files, snapshot

    def files_seen(self) -> set[str]:
        uri = self.spec.files_seen_uri
        if not self.engine.exists(uri):
            return set()
        table = DeltaTable(
            normalize_uri(uri), storage_options=dict(self.spec.storage.storage_options) or None
        )
        return set(pa.table(table.to_pyarrow_table(columns=["path"])).column("path").to_pylist())

    def _files_range(self) -> tuple[MainRange, list[Any], None]:
        folder = self.spec.main.path
        assert folder is not None
        files = TableFiles(folder, self.spec.storage.storage_options)
        if not files.exists():
            return MainRange("files"), [], None
        seen = self.files_seen()
        fresh = [
            entry
            for entry in files.list_files("")
            if "/" not in entry.path
            and not entry.path.startswith(_HIDDEN)
            and entry.path not in seen
        ]
        fresh.sort(key=lambda e: (e.modification_time_ms, e.path))
        if self.spec.max_files_per_batch is not None:
            fresh = fresh[: self.spec.max_files_per_batch]
        listed = [{"path": e.path, "size": e.size} for e in fresh]
        return MainRange("files", files=listed), [], None

    # --- namespaces ------------------------------------------------------------------

    def new_windows(
        self, main_files: Sequence[Any], new_rows: Callable[[], DataFrame]
    ) -> list[tuple[dt.datetime, dt.datetime]]:
        """The windows new records fall in: from statistics when they suffice, else one job."""
        window = self.spec.window
        assert window is not None
        assert window.time_column is not None
        column = window.time_column
        lows = [parse_stat_time(_file_stat(f, "min", column)) for f in main_files]
        highs = [parse_stat_time(_file_stat(f, "max", column)) for f in main_files]
        known_lows = [v for v in lows if v is not None]
        known_highs = [v for v in highs if v is not None]
        if main_files and len(known_lows) == len(lows) and len(known_highs) == len(highs):
            spans = windows_between(
                window, min(known_lows), max(known_highs), MAX_ENUMERATED_WINDOWS
            )
            if spans is not None:
                return spans
        rows = assign_windows(new_rows().select(column), window, column)
        starts = [
            r[0]
            for r in rows.select(NS_START).where(F.col(NS_START).isNotNull()).distinct().collect()
        ]
        return sorted((as_utc(s), as_utc(s) + window.size) for s in starts)

    # --- the plan ------------------------------------------------------------------------

    def plan(
        self,
        *,
        batch_id: int,
        now: dt.datetime,
        previous: BatchPlan | None,
        previous_commit: dict[str, Any] | None,
        new_rows: Callable[[MainRange, list[Any], TableSnapshot | None], DataFrame],
    ) -> Planned | None:
        """The next batch's plan, or None when there is nothing to do."""
        spec = self.spec
        main_range, main_files, main_snapshot = self.main_range(previous)
        buffer = BufferState(
            self.engine.snapshot(spec.buffer_uri) if self.engine.exists(spec.buffer_uri) else None
        )
        side_snapshots = {b.name: self._side_snapshot(b.name, previous) for b in spec.sides}

        namespaces: dict[str, tuple[dt.datetime | None, dt.datetime | None]] = {}
        if spec.window is None:
            if not main_range.is_empty or GLOBAL in buffer.namespaces():
                namespaces[GLOBAL] = (None, None)
        else:
            if not main_range.is_empty:
                rows = lambda: new_rows(main_range, main_files, main_snapshot)  # noqa: E731
                for start, end in self.new_windows(main_files, rows):
                    namespaces[namespace_id(start)] = (start, end)
            for ns in buffer.namespaces():
                buffered_start = parse_namespace_id(ns)
                if buffered_start is not None:
                    namespaces[ns] = (buffered_start, buffered_start + spec.window.size)

        decisions, mapping = self._readiness(namespaces, side_snapshots, now)
        watermark = self._watermark(previous_commit)
        plans = {
            ns: NamespacePlan(
                start=start,
                end=end,
                side_namespaces=mapping[ns],
                ready=all(decisions[side][mapping[ns][side]].ready for side in mapping[ns]),
                late=bool(
                    spec.routes.late is not None
                    and watermark is not None
                    and end is not None
                    and as_utc(end) <= watermark
                ),
            )
            for ns, (start, end) in namespaces.items()
        }
        read_slots = self._read_slots(buffer, plans, side_snapshots, previous, main_files, now)
        if main_range.is_empty and not read_slots:
            return None
        plan = BatchPlan(
            operator_id=spec.operator_id,
            batch_id=batch_id,
            now=now,
            main=main_range,
            side_versions={
                name: (snap.version if snap is not None else None)
                for name, snap in side_snapshots.items()
            },
            decisions=decisions,
            namespaces=plans,
            read_slots=read_slots,
            buffer_version=buffer.version,
            watermark=watermark,
            max_event_time=parse_stat_time((previous_commit or {}).get("max_event_time")),
        )
        return Planned(plan, main_files, main_snapshot, side_snapshots)

    def _side_snapshot(self, name: str, previous: BatchPlan | None) -> TableSnapshot | None:
        bound = self.spec.side(name)
        if self.engine.exists(bound.uri):
            return self.engine.snapshot(bound.uri, name=bound.side.asset)
        used = previous.side_versions.get(name) if previous is not None else None
        if used is not None:
            raise SideInputDataError(
                f"{bound.label}: table {bound.uri} is gone, but batch {previous.batch_id} "  # type: ignore[union-attr]
                f"used its version {used}. Waiting for it would hold records forever.",
                fix="restore or rematerialize the side input asset; buffered records are kept",
            )
        return None

    def _readiness(
        self,
        namespaces: dict[str, tuple[dt.datetime | None, dt.datetime | None]],
        side_snapshots: dict[str, TableSnapshot | None],
        now: dt.datetime,
    ) -> tuple[dict[str, dict[str, Decision]], dict[str, dict[str, str]]]:
        decisions: dict[str, dict[str, Decision]] = {}
        mapping: dict[str, dict[str, str]] = {ns: {} for ns in namespaces}
        for bound in self.spec.sides:
            snapshot = side_snapshots[bound.name]
            side_windows: dict[str, tuple[dt.datetime, dt.datetime]] = {}
            for ns, (start, end) in namespaces.items():
                if bound.side.window is None or start is None or end is None:
                    mapping[ns][bound.name] = GLOBAL
                    continue
                side_start, side_end = map_to_side_window(bound.side, start, end)
                side_ns = namespace_id(side_start)
                mapping[ns][bound.name] = side_ns
                side_windows[side_ns] = (side_start, side_end)
            facts = self._facts(bound.name, snapshot)
            windows = None if bound.side.window is None else sorted(side_windows.values())
            if windows == [] and bound.side.window is not None:
                decisions[bound.name] = {}
                continue
            decisions[bound.name] = self.spec.readiness.decide(facts, windows, now)
        return decisions, mapping

    def _facts(self, name: str, snapshot: TableSnapshot | None) -> SideFacts:
        bound = self.spec.side(name)
        facts = SideFacts(name=name, side=bound.side, snapshot=snapshot)
        window = bound.side.window
        if snapshot is None or window is None:
            return facts
        column = window.time_column
        assert column is not None

        @cache
        def max_event_time() -> dt.datetime | None:
            highs = [parse_stat_time(f.max_values.get(column)) for f in snapshot.files]
            if snapshot.files and all(h is not None for h in highs):
                return max(highs)  # type: ignore[type-var]
            return self._side_max_time(name, snapshot)

        def window_row_counts(windows: Sequence[tuple[dt.datetime, dt.datetime]]) -> dict[str, int]:
            if self.spark is None:
                raise SideInputDataError(
                    f"{bound.label}: deciding 'present' for side windows needs Spark here."
                )
            data = SideData(bound, snapshot, self.spark, self.engine)
            frame = data.rows(windows)
            return {r[SIDE_NS]: r["count"] for r in frame.groupBy(SIDE_NS).count().collect()}

        facts.max_event_time = max_event_time
        facts.window_row_counts = window_row_counts
        return facts

    def _side_max_time(self, name: str, snapshot: TableSnapshot) -> dt.datetime | None:
        if self.spark is None:
            return None
        bound = self.spec.side(name)
        column = bound.side.window.time_column  # type: ignore[union-attr]
        frame = self.engine.read_snapshot(self.spark, snapshot, name=bound.side.asset)
        value = frame.agg(F.max(F.col(f"`{column}`"))).collect()[0][0]
        return None if value is None else as_utc(value)

    def _watermark(self, previous_commit: dict[str, Any] | None) -> dt.datetime | None:
        window = self.spec.window
        if window is None or window.watermark is None or not previous_commit:
            return None
        seen = parse_stat_time(previous_commit.get("max_event_time"))
        return None if seen is None else seen - window.watermark

    def _read_slots(
        self,
        buffer: BufferState,
        plans: dict[str, NamespacePlan],
        side_snapshots: dict[str, TableSnapshot | None],
        previous: BatchPlan | None,
        main_files: Sequence[Any],
        now: dt.datetime,
    ) -> list[str]:
        slots = buffer.slots()
        if not slots:
            return []
        if self._overflow_due(buffer, main_files, now):
            return slots
        ready = {ns for ns, plan in plans.items() if plan.ready}
        chosen = [namespace_slot(ns) for ns in ready if namespace_slot(ns) in slots]
        waiting = [keywait_slot(ns) for ns in ready if keywait_slot(ns) in slots]
        if waiting and self._recheck_keys(buffer, side_snapshots, previous, now):
            chosen.extend(waiting)
        return sorted(chosen)

    def _recheck_keys(
        self,
        buffer: BufferState,
        side_snapshots: dict[str, TableSnapshot | None],
        previous: BatchPlan | None,
        now: dt.datetime,
    ) -> bool:
        waits = self.spec.keyed_waits
        if not waits:
            return True  # records left by an earlier declaration: let them through once
        for bound in waits:
            snapshot = side_snapshots[bound.name]
            before = previous.side_versions.get(bound.name) if previous else None
            if snapshot is not None and snapshot.version != before:
                return True
        oldest = buffer.oldest(buffer.keywait_slots())
        shortest = min(b.side.timeout for b in waits if b.side.timeout is not None)
        return oldest is None or as_utc(oldest) + shortest <= as_utc(now)

    def _overflow_due(
        self, buffer: BufferState, main_files: Sequence[Any], now: dt.datetime
    ) -> bool:
        limits = self.spec.buffer
        if limits.on_exceed != "overflow":
            return False
        oldest = buffer.oldest()
        if (
            limits.max_age is not None
            and oldest is not None
            and as_utc(oldest) < as_utc(now) - limits.max_age
        ):
            return True
        if limits.max_rows is None:
            return False
        counts = [getattr(f, "num_records", None) for f in main_files]
        incoming = sum(c for c in counts if c) if all(c is not None for c in counts) else None
        if incoming is None:
            return buffer.rows() > 0
        return buffer.rows() + incoming > limits.max_rows

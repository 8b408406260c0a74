"""Plan stage: what is new, what is ready, what to release.

The planner looks only at metadata (Delta logs, file listings, file statistics and the
readiness provider) plus, when statistics cannot tell, one small Spark job for the
event-time windows of new records
(:mod:`~dagster_sideinputs.core.batch.main_windows`). Its result, a
:class:`~dagster_sideinputs.core.state.plan.BatchPlan`, is written down before the batch
reads or writes any data.
"""

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from pyspark.sql import SparkSession

from dagster_sideinputs.core.batch.buffer import BufferState, choose_slots, load_state
from dagster_sideinputs.core.batch.buffer_schema import Carry, plan_carry
from dagster_sideinputs.core.batch.main_windows import MainWindows, Namespaces
from dagster_sideinputs.core.callbacks import map_to_side_window
from dagster_sideinputs.core.columns import SIDE_NS
from dagster_sideinputs.core.sideinputs.readiness import (
    Decision,
    SideFacts,
    apply_grace,
    decide_readiness,
    never_ready,
)
from dagster_sideinputs.core.sideinputs.side_data import SideData
from dagster_sideinputs.core.sideinputs.temporal import (
    as_of_sides,
    earliest_time,
    main_time_column,
    plan_as_of,
)
from dagster_sideinputs.core.sideinputs.time_stats import cached_max_time, max_reader
from dagster_sideinputs.core.sideinputs.windows import (
    GLOBAL,
    WindowSpan,
    as_utc,
    namespace_id,
    parse_stat_time,
)
from dagster_sideinputs.core.sources.main_source import MainSource, SourceSlice
from dagster_sideinputs.core.spec import BoundSide, OperatorSpec
from dagster_sideinputs.core.state.plan import AsOfPlan, BatchPlan, NamespacePlan, Previous
from dagster_sideinputs.delta.engine import TableSnapshot
from dagster_sideinputs.errors import DeltaTableError, SideInputDataError


@dataclass(frozen=True)
class Planned:
    """A plan and what was learned while making it (reused by the batch that runs it)."""

    plan: BatchPlan
    source: SourceSlice


class Planner:
    """Makes the plan of the next batch of one operator."""

    def __init__(self, spec: OperatorSpec, source: MainSource, spark: SparkSession | None) -> None:
        self.spec = spec
        self.source = source
        self.spark = spark
        self.engine = spec.engine
        self.windows = MainWindows(spec, source, spark)

    def plan(
        self,
        *,
        batch_id: int,
        now: dt.datetime,
        previous: Previous,
        routing: str,
        reroute: bool,
    ) -> Planned | None:
        """The next batch's plan, or None when there is nothing to do."""
        spec = self.spec
        last = previous.plan
        piece = self.source.next_range(last.main if last is not None else None)
        buffer = load_state(spec)
        carry = self._carry(piece, buffer, last)
        side_snapshots = {b.name: self._side_snapshot(b, last) for b in spec.sides}
        namespaces = self.windows.namespaces(piece, buffer, reroute=reroute)
        decisions, mapping = self._readiness(namespaces, side_snapshots, now)
        watermark = self._watermark(previous.record)
        plans = {
            ns: NamespacePlan(
                start=start,
                end=end,
                side_namespaces=mapping[ns],
                ready=all(decisions[side][mapping[ns][side]].ready for side in mapping[ns]),
                late=bool(
                    spec.options.routes.late is not None
                    and watermark is not None
                    and end is not None
                    and as_utc(end) <= watermark
                ),
            )
            for ns, (start, end) in namespaces.items()
        }
        side_changed = any(
            _changed(last, b.name, side_snapshots[b.name])
            for b in (*spec.keyed_waits, *as_of_sides(spec))
        )
        slots = choose_slots(
            spec,
            buffer,
            plans,
            side_changed=side_changed,
            incoming=_incoming(piece),
            now=now,
            reroute=reroute or carry.rewrite,
        )
        if piece.range.is_empty and not slots:
            return None
        as_of = self._as_of(piece, buffer, slots, side_snapshots, now)
        for name, entry in as_of.items():  # users see how far each as-of side input reaches
            if GLOBAL in decisions.get(name, {}):
                known = entry.horizon.isoformat() if entry.horizon is not None else "nothing"
                decision = decisions[name][GLOBAL]
                decisions[name][GLOBAL] = Decision(
                    decision.ready, f"{decision.reason}; known up to {known}"
                )
        plan = BatchPlan(
            operator_id=spec.operator_id,
            batch_id=batch_id,
            now=now,
            main=piece.range,
            side_versions={
                name: (snap.version if snap is not None else None)
                for name, snap in side_snapshots.items()
            },
            decisions=decisions,
            namespaces=plans,
            read_slots=slots,
            buffer_version=buffer.version,
            watermark=watermark,
            max_event_time=parse_stat_time((previous.record or {}).get("max_event_time")),
            reroute=reroute and bool(slots),
            routing=routing,
            tables=tuple(spec.written_tables()),
            side_ids={
                name: (snap.table_id or None) if snap is not None else None
                for name, snap in side_snapshots.items()
            },
            as_of=as_of,
            buffer_renames=carry.renames,
            buffer_rewrite=carry.rewrite,
        )
        return Planned(plan, piece)

    def _carry(self, piece: SourceSlice, buffer: BufferState, last: BatchPlan | None) -> Carry:
        """How buffered records meet the main input's schema at the plan's version
        (:mod:`~dagster_sideinputs.core.batch.buffer_schema`)."""
        if buffer.snapshot is None:
            return Carry({}, False)
        schema = self.source.schema()
        ids_now: Mapping[tuple[str, ...], int] = {}
        ids_then: Mapping[tuple[str, ...], int] | None = {}
        then = None
        if schema is None and piece.range.kind == "delta":
            snapshot = piece.snapshot
            end = piece.range.end_version
            if end < 0:
                return Carry({}, False)
            if snapshot is None or snapshot.version != end:
                snapshot = self.engine.snapshot(self.spec.main_uri, version=end)
            schema, ids_now = snapshot.schema, snapshot.field_ids
            if (
                ids_now
                and last is not None
                and last.main.kind == "delta"
                and last.main.end_version >= 0
            ):
                then = last.main.end_version
                try:
                    ids_then = self.engine.snapshot(self.spec.main_uri, version=then).field_ids
                except DeltaTableError:  # that version's log is gone
                    ids_then = None
        return plan_carry(
            self.spec, buffer, schema, ids_now=ids_now, ids_then=ids_then, then_version=then
        )

    def _as_of(
        self,
        piece: SourceSlice,
        buffer: BufferState,
        slots: Sequence[str],
        side_snapshots: Mapping[str, TableSnapshot | None],
        now: dt.datetime,
    ) -> dict[str, AsOfPlan]:
        """Horizon and history versions of every as-of side input, pinned for the batch."""
        sides = as_of_sides(self.spec)
        if not sides:
            return {}
        column = main_time_column(self.spec)
        files = [*piece.files, *buffer.files(slots)] if slots else list(piece.files)
        earliest = earliest_time(files, column) if files else None
        return {
            b.name: plan_as_of(
                b,
                side_snapshots[b.name],
                engine=self.engine,
                spark=self.spark,
                now=now,
                earliest=earliest,
            )
            for b in sides
        }

    # --- side inputs -----------------------------------------------------------------------

    def _side_snapshot(self, bound: BoundSide, last: BatchPlan | None) -> TableSnapshot | None:
        if self.engine.exists(bound.uri):
            return self.engine.snapshot(bound.uri, name=bound.side.asset)
        used = last.side_versions.get(bound.name) if last is not None else None
        if used is not None:
            raise SideInputDataError(
                f"{bound.label}: table {bound.uri} is gone, but batch {last.batch_id} "  # type: ignore[union-attr]
                f"used its version {used}. Waiting for it would hold records forever.",
                fix="restore or rematerialize the side input asset; buffered records are kept",
            )
        return None

    def _readiness(
        self,
        namespaces: Namespaces,
        side_snapshots: Mapping[str, TableSnapshot | None],
        now: dt.datetime,
    ) -> tuple[dict[str, dict[str, Decision]], dict[str, dict[str, str]]]:
        decisions: dict[str, dict[str, Decision]] = {}
        mapping: dict[str, dict[str, str]] = {ns: {} for ns in namespaces}
        for bound in self.spec.sides:
            side = bound.side
            side_windows: dict[str, WindowSpan] = {}
            for ns, (start, end) in namespaces.items():
                if side.window is None or start is None or end is None:
                    mapping[ns][bound.name] = GLOBAL
                    continue
                span = map_to_side_window(
                    side.window, side.window_mapping, start, end, label=bound.label
                )
                mapping[ns][bound.name] = namespace_id(span[0])
                side_windows[namespace_id(span[0])] = span
            facts = self._facts(bound, side_snapshots[bound.name])
            windows = None if side.window is None else sorted(side_windows.values())
            if side.window is not None and not windows:
                decisions[bound.name] = {}
                continue
            decided = decide_readiness(self.spec.readiness, bound.label, facts, windows, now)
            if facts.snapshot is None:
                # Whatever the provider says, and whatever grace= would make final.
                decided = never_ready(side, windows, decided)
            elif windows is not None:
                decided = apply_grace(side, windows, decided, now)
            wanted = [GLOBAL] if windows is None else [namespace_id(s) for s, _ in windows]
            if side.window is not None and GLOBAL in {m[bound.name] for m in mapping.values()}:
                wanted.append(GLOBAL)
            for key in wanted:  # a provider that forgets a namespace must not lose records
                decided.setdefault(key, Decision(False, "no readiness decision"))
            decisions[bound.name] = decided
        return decisions, mapping

    def _facts(self, bound: BoundSide, snapshot: TableSnapshot | None) -> SideFacts:
        facts = SideFacts(name=bound.name, side=bound.side, snapshot=snapshot)
        window = bound.side.window
        if snapshot is None or window is None:
            return facts
        column = window.time_column
        assert column is not None

        @cache
        def max_event_time() -> dt.datetime | None:
            # Exact: a window is final when the side data reaches its end, to the
            # microsecond; statistics (milliseconds) only choose the files to read.
            read = max_reader(self.engine, self.spark, snapshot, column, name=bound.side.asset)
            return cached_max_time(bound.uri, snapshot, column, read)

        def window_row_counts(windows: Sequence[WindowSpan]) -> dict[str, int]:
            if self.spark is None:
                raise SideInputDataError(
                    f"{bound.label}: deciding 'present' for side windows needs Spark here."
                )
            data = SideData(bound, snapshot, self.spark, self.engine)
            frame = data.rows(windows)
            return {r[SIDE_NS]: r["count"] for r in frame.groupBy(SIDE_NS).count().collect()}

        return SideFacts(
            name=bound.name,
            side=bound.side,
            snapshot=snapshot,
            window_row_counts=window_row_counts,
            max_event_time=max_event_time,
        )

    def _watermark(self, record: Mapping[str, Any] | None) -> dt.datetime | None:
        window = self.spec.window
        if window is None or window.watermark is None or not record:
            return None
        seen = parse_stat_time(record.get("max_event_time"))
        return None if seen is None else seen - window.watermark


def _changed(last: BatchPlan | None, name: str, snapshot: TableSnapshot | None) -> bool:
    """Whether a side table differs from the one the last batch read: another version, or
    the same version number of a table deleted and created again."""
    if snapshot is None:
        return False
    if last is None or snapshot.version != last.side_versions.get(name):
        return True
    known = last.side_ids.get(name)
    return bool(known and snapshot.table_id and known != snapshot.table_id)


def _incoming(piece: SourceSlice) -> int | None:
    """New records of the slice, or an upper bound (None: unknown before reading)."""
    if piece.range.kind == "kafka":
        return piece.range.records
    if piece.range.kind != "delta":
        return None
    counts = [f.num_records for f in piece.files]
    return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

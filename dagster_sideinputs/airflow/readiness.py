"""Readiness from Airflow: side inputs are ready from their assets' events.

- non-windowed side inputs: ready once their asset has an event (``present`` and
  ``complete`` alike); with a maximum age (the side input's ``max_age``, or
  ``max_age=`` here, Airflow's counterpart of a Dagster ``FreshnessPolicy``), only
  while the last event is at most that old (``fresh``).
- windowed side inputs: a window is ready once the asset has an event for its
  partition, the partition key being the window's start (UTC) in ``partition_format``
  (Airflow's own partition key format by default, as ``CronPartitionTimetable``
  writes it). A side input named in ``data_windows`` is decided from its table instead
  (:class:`~dagster_sideinputs.DeltaReadiness`: a window is final once the side data
  passes its end).

The Delta table must exist too: an event without its table is not ready. Every
decision carries its reason, which the operator records in the batch plan; the task
logs those not ready and the asset events carry them.
"""

import datetime as dt
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from dagster_sideinputs.core.metrics import human_duration
from dagster_sideinputs.core.sideinputs.readiness import (
    Decision,
    DeltaReadiness,
    SideFacts,
    WindowSpan,
    effective_readiness,
)
from dagster_sideinputs.core.sideinputs.windows import GLOBAL, as_utc, namespace_id
from dagster_sideinputs.errors import DeclarationError

PARTITION_FORMAT = "%Y-%m-%dT%H:%M:%S"
"""The partition key of a window: its start (UTC) in this format (Airflow's default
``key_format`` of ``CronPartitionTimetable``)."""


class AssetEventLike(Protocol):
    """What readiness reads of an Airflow asset event (``AssetEventResult``)."""

    @property
    def timestamp(self) -> dt.datetime: ...

    @property
    def partition_key(self) -> str | None: ...


EventsOf = Callable[[str], Sequence[AssetEventLike]]
"""The asset events of a side input's asset, by side input name (oldest first)."""


class AirflowReadiness:
    """A readiness provider backed by Airflow's asset events.

    Args:
        events_of: the events of a side input's asset, by side input name;
            :class:`~dagster_sideinputs.airflow.SideInputOperatorTask` reads them from
            the task's ``inlet_events``.
        assets: the side inputs' asset names, by side input name (shown in reasons).
        max_age: per side input name, the age past which its last event is stale
            (overrides the side input's own ``max_age``).
        partition_format: how a window's start is written as a partition key.
        data_windows: windowed side inputs decided from their tables, not partitions.
    """

    def __init__(
        self,
        events_of: EventsOf,
        assets: Mapping[str, str],
        *,
        max_age: Mapping[str, dt.timedelta] | None = None,
        partition_format: str = PARTITION_FORMAT,
        data_windows: Collection[str] = (),
    ) -> None:
        self.events_of = events_of
        self.assets = dict(assets)
        self.max_age = dict(max_age or {})
        self.partition_format = partition_format
        self.data_windows = frozenset(data_windows)
        self._fallback = DeltaReadiness()
        unknown = (set(self.max_age) | self.data_windows) - set(self.assets)
        if unknown:
            raise DeclarationError(
                f"AirflowReadiness names side inputs {sorted(unknown)} the operator does "
                f"not have (it has {sorted(self.assets)}).",
                fix="key max_age= and data_windows= by the side inputs' names",
            )

    def decide(
        self, facts: SideFacts, windows: Sequence[WindowSpan] | None, now: dt.datetime
    ) -> dict[str, Decision]:
        asset = self.assets.get(facts.name, facts.side.asset)
        keys = [GLOBAL] if windows is None else [namespace_id(start) for start, _ in windows]
        if facts.snapshot is None:
            reason = f"asset {asset!r} has no Delta table yet"
            return {key: Decision(False, reason) for key in keys}
        if windows is not None and facts.name in self.data_windows:
            return self._fallback.decide(facts, windows, now)
        events = list(self.events_of(facts.name))
        if windows is not None:
            return self._partitions(asset, events, windows)
        last = max((as_utc(e.timestamp) for e in events), default=None)
        max_age = self.max_age.get(facts.name, facts.side.max_age)
        rule = effective_readiness(facts.side, has_freshness_policy=max_age is not None)
        if rule == "fresh":
            return {GLOBAL: _fresh(asset, last, max_age, now)}
        if last is None:
            return {GLOBAL: Decision(False, f"asset {asset!r} has no asset event yet")}
        return {GLOBAL: Decision(True, f"asset event at {last.isoformat()}")}

    def _partitions(
        self, asset: str, events: Sequence[AssetEventLike], windows: Sequence[WindowSpan]
    ) -> dict[str, Decision]:
        seen = {e.partition_key: e for e in events if e.partition_key}
        decisions: dict[str, Decision] = {}
        for start, _ in windows:
            key = as_utc(start).strftime(self.partition_format)
            event = seen.get(key)
            decisions[namespace_id(start)] = Decision(
                event is not None,
                f"partition {key} of asset {asset!r} "
                + (
                    f"has an asset event ({as_utc(event.timestamp).isoformat()})"
                    if event is not None
                    else "has no asset event yet"
                ),
            )
        return decisions


def _fresh(
    asset: str, last: dt.datetime | None, max_age: dt.timedelta | None, now: dt.datetime
) -> Decision:
    if max_age is None:
        raise DeclarationError(
            f"A side input reading asset {asset!r} has readiness='fresh' but no maximum age.",
            fix="pass max_age= to the SideInput, or max_age={<side input>: timedelta(...)} "
            "to the task",
        )
    if last is None:
        return Decision(
            False, f"asset {asset!r} has no asset event yet (max age {human_duration(max_age)})"
        )
    age = as_utc(now) - last
    verdict = "fresh" if age <= max_age else "stale"
    return Decision(
        age <= max_age,
        f"{verdict}: last asset event {human_duration(age)} ago ({last.isoformat()}), max age "
        f"{human_duration(max_age)}",
    )


def events_from_context(inlet_events: Any, assets: Mapping[str, Any]) -> EventsOf:
    """``events_of`` reading a task's ``inlet_events`` (one query per side input and
    batch: events that arrive during a run count from its next batch on)."""

    def events_of(name: str) -> Sequence[AssetEventLike]:
        return list(inlet_events[assets[name]])

    return events_of

"""Readiness from the Dagster instance: materializations, partitions, freshness policies.

- ``present``: the side asset has been materialized at least once (for a windowed side
  input: the partition of the side window).
- ``complete``: a non-partitioned side asset has one successful materialization; a
  time-window partitioned one has the partition the main window maps to. A partition
  materialized with no rows is final and empty: its records get the view's empty value
  (or go to ``unmatched`` with ``on_empty="unmatched"``).
- ``grace`` (declared on a windowed side input) makes a side window final that long
  after its end even if its partition never materializes (decided by the operator's
  planner for every provider).
- ``fresh``: the asset's ``FreshnessPolicy`` passes at the batch's time:
  ``time_window`` policies want the last materialization within ``fail_window``;
  ``cron`` policies want it no older than the last deadline tick minus
  ``lower_bound_delta``. A side input without a policy falls back to its ``max_age``.

The Delta table must exist too: a materialization without its table is not ready.
Every decision carries its reason, which the operator records in the batch plan and
the job shows in its logs and metadata.
"""

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from dagster_sideinputs.core.metrics import human_duration
from dagster_sideinputs.core.sideinputs.declaration import SideInput
from dagster_sideinputs.core.sideinputs.readiness import (
    Decision,
    DeltaReadiness,
    SideFacts,
    WindowSpan,
    effective_readiness,
)
from dagster_sideinputs.core.sideinputs.windows import GLOBAL, as_utc, namespace_id
from dagster_sideinputs.errors import DeclarationError

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class SideAsset:
    """What the Dagster definitions say about one side input's asset."""

    key: dg.AssetKey
    freshness_policy: dg.FreshnessPolicy | None = None
    partitions_def: dg.PartitionsDefinition | None = None

    @property
    def time_partitions(self) -> dg.TimeWindowPartitionsDefinition | None:
        if isinstance(self.partitions_def, dg.TimeWindowPartitionsDefinition):
            return self.partitions_def
        return None


def side_assets_from_graph(graph: Any, sides: Mapping[str, SideInput]) -> dict[str, SideAsset]:
    """Freshness policy and partitions of every side input's asset, from an asset graph.

    ``graph`` is a repository's or a job's asset graph (``.has(key)`` / ``.get(key)``);
    an asset it does not know (e.g. a job run outside its code location) is treated as
    having no policy and no partitions.
    """
    found: dict[str, SideAsset] = {}
    for name, side in sides.items():
        key = dg.AssetKey(side.asset.split("/"))
        if graph is None or not graph.has(key):
            found[name] = SideAsset(key)
            continue
        node = graph.get(key)
        found[name] = SideAsset(key, node.freshness_policy, node.partitions_def)
    return found


def last_deadline(policy: dg.FreshnessPolicy, now: dt.datetime) -> dt.datetime:
    """The last tick of a cron policy's deadline at or before ``now``."""
    ticks = dg.TimeWindowPartitionsDefinition(
        cron_schedule=policy.deadline_cron,  # type: ignore[attr-defined]
        start=_EPOCH,
        fmt="%Y-%m-%d-%H:%M",
        timezone=policy.timezone,  # type: ignore[attr-defined]
    )
    key = ticks.get_partition_key_for_timestamp(as_utc(now).timestamp())
    return as_utc(ticks.time_window_for_partition_key(key).start)


def freshness_decision(
    policy: dg.FreshnessPolicy, last: dt.datetime | None, now: dt.datetime
) -> Decision:
    """Whether a FreshnessPolicy passes at ``now`` given the last materialization time."""
    if last is None:
        return Decision(False, "never materialized (freshness policy cannot pass)")
    age = as_utc(now) - as_utc(last)
    if hasattr(policy, "fail_window"):
        window = policy.fail_window.to_timedelta()
        ok = age <= window
        return Decision(
            ok,
            f"{'fresh' if ok else 'stale'}: materialized {_human(age)} ago, "
            f"freshness window {human_duration(window)}",
        )
    deadline = last_deadline(policy, now)
    lower_bound = deadline - policy.lower_bound_delta  # type: ignore[attr-defined]
    ok = as_utc(last) >= lower_bound
    return Decision(
        ok,
        f"{'fresh' if ok else 'stale'}: materialized {as_utc(last).isoformat()}, needs >= "
        f"{lower_bound.isoformat()} (cron {policy.deadline_cron!r} deadline "  # type: ignore[attr-defined]
        f"{deadline.isoformat()})",
    )


def _human(age: dt.timedelta) -> str:
    seconds = int(age.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


class DagsterReadiness:
    """A readiness provider backed by a Dagster instance and the code location's definitions.

    Args:
        instance: where materializations are recorded.
        side_assets: per side input name, its asset's freshness policy and partitions.
    """

    def __init__(self, instance: dg.DagsterInstance, side_assets: Mapping[str, SideAsset]) -> None:
        self.instance = instance
        self.side_assets = dict(side_assets)
        self._fallback = DeltaReadiness()
        self.decisions: dict[str, dict[str, Decision]] = {}
        """The latest decisions, per side input (what a check reports without a run)."""

    def decide(
        self, facts: SideFacts, windows: Sequence[WindowSpan] | None, now: dt.datetime
    ) -> dict[str, Decision]:
        decisions = self._decide(facts, windows, now)
        self.decisions[facts.name] = decisions
        return decisions

    def _decide(
        self, facts: SideFacts, windows: Sequence[WindowSpan] | None, now: dt.datetime
    ) -> dict[str, Decision]:
        asset = self.side_assets.get(facts.name) or SideAsset(
            dg.AssetKey(facts.side.asset.split("/"))
        )
        keys = [GLOBAL] if windows is None else [namespace_id(start) for start, _ in windows]
        if facts.snapshot is None:
            reason = f"asset {asset.key.to_user_string()} has no Delta table yet"
            return {key: Decision(False, reason) for key in keys}
        if windows is not None and asset.time_partitions is not None:
            return self._partitions(asset, windows)
        if windows is not None:
            return self._fallback.decide(facts, windows, now)
        event = self.instance.get_latest_materialization_event(asset.key)
        last = (
            None if event is None else dt.datetime.fromtimestamp(event.timestamp, dt.timezone.utc)
        )
        rule = effective_readiness(
            facts.side, has_freshness_policy=asset.freshness_policy is not None
        )
        if rule == "fresh":
            return {GLOBAL: self._fresh(facts.side, asset, last, facts, now)}
        if last is None:
            return {
                GLOBAL: Decision(False, f"asset {asset.key.to_user_string()} never materialized")
            }
        return {
            GLOBAL: Decision(
                True,
                f"materialized {last.isoformat()} (run {event.run_id[:8]})",  # type: ignore[union-attr]
            )
        }

    def _fresh(
        self,
        side: SideInput,
        asset: SideAsset,
        last: dt.datetime | None,
        facts: SideFacts,
        now: dt.datetime,
    ) -> Decision:
        if asset.freshness_policy is not None:
            return freshness_decision(asset.freshness_policy, last, now)
        if side.max_age is not None:
            return self._fallback.decide(facts, None, now)[GLOBAL]
        raise DeclarationError(
            f"Side input {facts.name!r} has readiness='fresh', but asset "
            f"{asset.key.to_user_string()} has no FreshnessPolicy and the side input no max_age.",
            fix="add freshness_policy=dg.FreshnessPolicy.time_window(fail_window=...) to the "
            "asset, or max_age= to the SideInput",
        )

    def _partitions(self, asset: SideAsset, windows: Sequence[WindowSpan]) -> dict[str, Decision]:
        partitions = asset.time_partitions
        assert partitions is not None
        materialized = self.instance.get_materialized_partitions(asset.key)
        decisions: dict[str, Decision] = {}
        for start, end in windows:
            key = partitions.get_partition_key_for_timestamp(as_utc(start).timestamp())
            span = partitions.time_window_for_partition_key(key)
            if (as_utc(span.start), as_utc(span.end)) != (as_utc(start), as_utc(end)):
                raise DeclarationError(
                    f"Side window [{start}, {end}) of asset {asset.key.to_user_string()} is not "
                    f"one of its partitions (partition {key} is [{span.start}, {span.end})).",
                    fix="declare the side input's window like the asset's partitions, e.g. "
                    "Window.tumbling(timedelta(hours=1)) for HourlyPartitionsDefinition",
                )
            ok = key in materialized
            decisions[namespace_id(start)] = Decision(
                ok, f"partition {key} {'materialized' if ok else 'not materialized yet'}"
            )
        return decisions

"""Readiness from Dagster: freshness policies (time window and cron) and partitions."""

import datetime as dt

import dagster as dg
import pytest

import dagster_sideinputs as dsi
from dagster_sideinputs.core.sideinputs.readiness import SideFacts
from dagster_sideinputs.dagster_layer.readiness import (
    DagsterReadiness,
    SideAsset,
    freshness_decision,
    last_deadline,
)

UTC = dt.timezone.utc
NOON = dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def test_time_window_policy_passes_within_its_fail_window():
    policy = dg.FreshnessPolicy.time_window(fail_window=dt.timedelta(hours=6))
    fresh = freshness_decision(policy, NOON - dt.timedelta(hours=5), NOON)
    stale = freshness_decision(policy, NOON - dt.timedelta(hours=7), NOON)
    assert fresh.ready
    assert not stale.ready
    assert "stale: materialized 7h ago" in stale.reason


def test_cron_policy_wants_a_materialization_after_the_last_deadline_minus_the_lower_bound():
    policy = dg.FreshnessPolicy.cron(
        deadline_cron="0 10 * * *", lower_bound_delta=dt.timedelta(hours=1)
    )
    assert last_deadline(policy, NOON) == dt.datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert last_deadline(policy, NOON.replace(hour=9)) == dt.datetime(
        2024, 4, 30, 10, 0, tzinfo=UTC
    )
    assert freshness_decision(policy, NOON.replace(hour=9, minute=30), NOON).ready
    late = freshness_decision(policy, NOON.replace(hour=8, minute=59), NOON)
    assert not late.ready
    assert "needs >= 2024-05-01T09:00:00+00:00" in late.reason
    # Before today's deadline, yesterday's window counts.
    assert freshness_decision(
        policy, dt.datetime(2024, 4, 30, 9, 30, tzinfo=UTC), NOON.replace(hour=9)
    ).ready


def test_never_materialized_asset_is_not_fresh():
    policy = dg.FreshnessPolicy.time_window(fail_window=dt.timedelta(hours=1))
    assert not freshness_decision(policy, None, NOON).ready


def test_side_window_not_matching_the_partitions_is_a_declaration_error():
    hourly = dg.HourlyPartitionsDefinition(start_date="2024-05-01-00:00")
    side = dsi.SideInput.map(
        "fx", key="currency", window=dsi.Window.tumbling(dt.timedelta(hours=2), time_column="ts")
    )
    with dg.instance_for_test() as instance:
        readiness = DagsterReadiness(instance, {"fx": SideAsset(dg.AssetKey("fx"), None, hourly)})
        facts = SideFacts("fx", side, snapshot=object())  # type: ignore[arg-type]
        window = (NOON, NOON + dt.timedelta(hours=2))
        with pytest.raises(dsi.DeclarationError, match="not one of its partitions"):
            readiness.decide(facts, [window], NOON)

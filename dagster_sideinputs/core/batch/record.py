"""Record stage: the batch's metrics, its commit record, and housekeeping.

The commit record is written last: from then on the batch is complete, and the next
run plans the batch after it. Old plans and commit records are pruned after every batch
(the state folder never holds more than :data:`~dagster_sideinputs.core.state.folder.KEEP` of
each, so listing it costs the same at batch 10,000 as at batch 10). Every
``VACUUM_EVERY`` batches the buffer's unreferenced files are deleted, a landing
folder's ledger of files read (one small file per batch) is compacted into one, so that
reading it costs one file, not one per batch ever run, and the operator's own tables get
a short log retention (:data:`OWN_LOG_RETENTION`) unless they set one.
"""

import datetime as dt
import logging

from dagster_sideinputs.core.batch.buffer import Counts, after_batch
from dagster_sideinputs.core.batch.context import Batch, StageContext, explain
from dagster_sideinputs.core.batch.route_rules import ROUTES
from dagster_sideinputs.core.metrics import BatchMetrics
from dagster_sideinputs.core.sideinputs.windows import as_utc

VACUUM_EVERY = 25
RETENTION_KEY = "delta.logRetentionDuration"
OWN_LOG_RETENTION = {
    RETENTION_KEY: "interval 1 hour",
    "delta.deletedFileRetentionDuration": "interval 1 hour",
}
"""The log retention of the operator's own tables (buffer, ledger; Delta asks that a
log keeps removed files' entries as long as they may be vacuumed, so both). A commit a
batch: with Delta's default (30 days) their logs would grow to millions of files,
which delta-spark lists at every commit and checkpoint. Their old versions are never
read: a replay reads the buffer at the version its plan pinned, and the operator, the
tables' only writer, commits nothing between a crash and its replay (the buffer is
vacuumed with no retention anyway: ``VACUUM_EVERY``). Expired entries go when a
checkpoint is written, back to the newest checkpoint before them (delta-spark: every 10
versions, keeping them to the end of the day they expire in; the bridge: every 100)."""
log = logging.getLogger("dagster_sideinputs")


def record(context: StageContext, batch: Batch) -> BatchMetrics:
    spec, plan = context.spec, batch.plan
    metrics = metrics_of(context, batch)
    max_seen = [t for t in (plan.max_event_time, metrics.max_event_time) if t is not None]
    context.state.commit(
        plan.batch_id,
        {
            **metrics.as_dict(),
            "max_event_time": max(max_seen).isoformat() if max_seen else None,
            "routing": plan.routing,
            # The position again: the next batch starts from it even if this plan is lost.
            "main": plan.main.to_dict(),
            "side_ids": dict(plan.side_ids),
        },
    )
    context.state.prune()
    if plan.batch_id % VACUUM_EVERY == VACUUM_EVERY - 1:
        spec.engine.vacuum(spec.buffer_uri, retention_hours=0)
        context.source.tidy()
        keep_own_logs_short(context)
    return metrics


def keep_own_logs_short(context: StageContext) -> None:
    """Give each of the operator's own tables :data:`OWN_LOG_RETENTION` unless it sets a
    retention itself (tables made before this existed get it here too). The batch is
    committed already: a failure only leaves the retention as it was."""
    spec = context.spec
    for uri in spec.own_tables():
        try:
            if not spec.engine.exists(uri):
                continue
            if RETENTION_KEY in spec.engine.snapshot(uri).configuration:
                continue
            spec.engine.set_properties(uri, OWN_LOG_RETENTION)
        except Exception as exc:  # housekeeping after the commit: never fail the batch
            log.warning("%s: the log retention of %s was not set (%s)", spec.operator_id, uri, exc)


def metrics_of(context: StageContext, batch: Batch) -> BatchMetrics:
    plan = batch.plan
    routes = {route: 0 for route in ROUTES}
    rows_in = from_buffer = 0
    for (route, origin), values in batch.counts.items():
        routes[route] = routes.get(route, 0) + values["n"]
        if origin == "new":
            rows_in += values["n"]
        else:
            from_buffer += values["n"]
    after = after_batch(plan, batch.buffer, batch.counts)
    physical_plan = batch.physical_plan
    if physical_plan is None and context.explain and batch.classified is not None:
        physical_plan = explain(batch.classified)
    return BatchMetrics(
        operator_id=context.spec.operator_id,
        batch_id=plan.batch_id,
        replayed=batch.replayed,
        main_range=plan.main.describe(),
        rows_in=rows_in,
        released_from_buffer=from_buffer,
        routes=routes,
        writes=dict(batch.writes),
        side_versions=dict(plan.side_versions),
        readiness={
            side: {ns: {"ready": d.ready, "reason": d.reason} for ns, d in per_ns.items()}
            for side, per_ns in plan.decisions.items()
        },
        buffer_rows=after.rows,
        buffer_oldest_age_s=after.age_s(plan.now),
        watermark=plan.watermark,
        max_event_time=max_event_time(batch.counts),
        durations=dict(batch.durations),
        notes=list(batch.notes),
        physical_plan=physical_plan,
        engine=context.spec.engine.name,
        main_detail=plan.main.detail(),
    )


def max_event_time(counts: Counts) -> dt.datetime | None:
    """Latest event time of the batch's valid records (invalid ones must not move time)."""
    values = [
        as_utc(v["max_time"])
        for (route, _), v in counts.items()
        if route != "invalid" and v.get("max_time") is not None
    ]
    return max(values) if values else None

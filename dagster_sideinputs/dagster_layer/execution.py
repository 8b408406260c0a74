"""Running a side-input operator inside a Dagster run.

``available_now`` runs every available micro-batch and reports one materialization
per output asset. ``continuous`` runs the operator on a worker thread and reports a
materialization per micro-batch; when the run is terminated (from the UI, or any
interrupt), it asks the operator to stop after its current batch, waits for it, and
ends the run: no batch is left half-written, and none is lost.
"""

import datetime as dt
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg

from dagster_sideinputs.core.metrics import BatchMetrics, RunResult
from dagster_sideinputs.core.operator import SideInputOperator
from dagster_sideinputs.core.outputs import OutputTag
from dagster_sideinputs.dagster_layer.assets import (
    CHECK_ACCOUNTED,
    CHECK_BUFFER,
    CHECK_READY,
    SideInputAssets,
)
from dagster_sideinputs.dagster_layer.io_manager import table_schema_metadata
from dagster_sideinputs.dagster_layer.kafka import kafka_batch_metadata, kafka_run_metadata
from dagster_sideinputs.dagster_layer.readiness import (
    DagsterReadiness,
    side_assets_from_graph,
)
from dagster_sideinputs.delta.storage import DeltaStorage
from dagster_sideinputs.errors import DeclarationError, did_you_mean


def storage_of(resources: Any, decl: SideInputAssets) -> DeltaStorage:
    """The DeltaStorage of the run's Delta IO manager (where every table lives)."""
    manager = getattr(resources, decl.io_manager_key)
    storage = getattr(manager, "storage", None)
    if not isinstance(storage, DeltaStorage):
        raise DeclarationError(
            f"Resource {decl.io_manager_key!r} of operator {decl.name!r} is a "
            f"{type(manager).__name__}, not a DeltaIOManager: the operator needs to know "
            "where the tables live.",
            fix=f'resources={{"{decl.io_manager_key}": dsi.DeltaIOManager(root=..., spark=...)}}',
        )
    return storage


def build_operator(
    decl: SideInputAssets,
    storage: DeltaStorage,
    instance: dg.DagsterInstance,
    asset_graph: Any,
    replay: str | None = None,
) -> SideInputOperator:
    """The operator of a declaration, deciding readiness from the instance.

    ``asset_graph`` (a job's or repository's) supplies the side assets' freshness
    policies and partitions.
    """
    side_assets = side_assets_from_graph(asset_graph, decl.side_inputs)
    for name, side in decl.side_inputs.items():
        if side.window is None and side_assets[name].time_partitions is not None:
            raise DeclarationError(
                f"Side input {name!r} reads time-partitioned asset {side.asset!r} but declares "
                "no window, so every batch would see all partitions at once.",
                fix="pass window=dsi.Window.tumbling(<partition length>, time_column=<time "
                "column>) so each main window reads its partition",
            )
    tag = None
    if replay is not None:
        tags = {t.name: t for t in decl.all_tags}
        if replay not in tags:
            raise DeclarationError(
                f"Cannot replay {replay!r}: operator {decl.name!r} has outputs "
                f"{sorted(tags)}.{did_you_mean(replay, tags)}"
            )
        tag = tags[replay]
    return decl.operator(storage, DagsterReadiness(instance, side_assets), replay=tag)


def _batch_metadata(metrics: BatchMetrics, tag: OutputTag) -> dict[str, Any]:
    return {
        "batch_id": metrics.batch_id,
        "rows_written": metrics.emitted(tag.name),
        "records_in": metrics.rows_in,
        "released": metrics.released,
        "buffered_rows": metrics.buffer_rows,
        "main_range": metrics.main_range,
        "side_input_versions": dg.MetadataValue.json(metrics.side_versions),
        "batch_seconds": metrics.durations.get("total", 0.0),
        **kafka_batch_metadata(metrics),
    }


def _readiness_markdown(readiness: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = ["| side input | namespace | ready | reason |", "|---|---|---|---|"]
    for side, per_ns in sorted(readiness.items()):
        for ns, decision in sorted(per_ns.items()):
            lines.append(
                f"| {side} | {ns} | {'yes' if decision['ready'] else 'no'} | {decision['reason']} |"
            )
    return "\n".join(lines)


def output_metadata(
    op: SideInputOperator,
    tag: OutputTag,
    batches: Sequence[BatchMetrics],
    seconds: float,
) -> dict[str, Any]:
    """Materialization metadata of one output asset after a run."""
    uri = op.output_tables[tag.name]
    engine = op.spec.storage.delta
    metadata: dict[str, Any] = {
        "dagster/uri": dg.MetadataValue.path(uri),
        "rows_written": sum(b.emitted(tag.name) for b in batches),
        "batches": len(batches),
        "records_in": sum(b.rows_in for b in batches),
        "released": sum(b.released for b in batches),
        "run_seconds": round(seconds, 3),
        "throughput_records_per_s": round(sum(b.rows_in for b in batches) / seconds, 1)
        if seconds > 0
        else 0.0,
    }
    if engine.exists(uri):
        snapshot = engine.snapshot(uri, name=tag.name)
        metadata["delta_version"] = snapshot.version
        metadata["dagster/column_schema"] = table_schema_metadata(snapshot.schema)
        if snapshot.num_records is not None:
            metadata["dagster/row_count"] = snapshot.num_records
    buffer = op.buffer()
    metadata["buffered_rows"] = buffer.rows()
    oldest = buffer.oldest()
    metadata["oldest_buffered_age_s"] = (
        round((dt.datetime.now(dt.timezone.utc) - oldest).total_seconds(), 1)
        if oldest is not None
        else 0.0
    )
    if batches:
        last = batches[-1]
        metadata["main_range"] = ", ".join(b.main_range for b in batches[-3:])
        metadata["side_input_versions"] = dg.MetadataValue.json(last.side_versions)
        metadata["readiness"] = dg.MetadataValue.md(_readiness_markdown(last.readiness))
        metadata["routes"] = dg.MetadataValue.json(
            {route: sum(b.routes.get(route, 0) for b in batches) for route in last.routes}
        )
    metadata.update(kafka_run_metadata(op, batches))
    return metadata


def check_results(
    op: SideInputOperator, batches: Sequence[BatchMetrics]
) -> list[dg.AssetCheckResult]:
    """The operator's asset checks, on its main output."""
    key = dg.AssetKey(op.spec.main_tag.name.split("/"))
    limits = op.spec.options.buffer
    buffer = op.buffer()
    rows, oldest = buffer.rows(), buffer.oldest()
    age = (dt.datetime.now(dt.timezone.utc) - oldest) if oldest is not None else None
    within = (limits.max_rows is None or rows <= limits.max_rows) and (
        limits.max_age is None or age is None or age <= limits.max_age
    )
    plan = op.last_plan()
    not_ready = (
        {
            f"{side}/{ns}": d.reason
            for side, per_ns in plan.decisions.items()
            for ns, d in per_ns.items()
            if not d.ready
        }
        if plan is not None
        else {}
    )
    unaccounted = [b.batch_id for b in batches if not b.accounted]
    return [
        dg.AssetCheckResult(
            asset_key=key,
            check_name=CHECK_BUFFER,
            passed=within,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "buffered_rows": rows,
                "max_rows": limits.max_rows or -1,
                "oldest_buffered_age_s": round(age.total_seconds(), 1) if age else 0.0,
                "max_age_s": limits.max_age.total_seconds() if limits.max_age else -1.0,
            },
        ),
        dg.AssetCheckResult(
            asset_key=key,
            check_name=CHECK_READY,
            passed=not not_ready,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"not_ready": dg.MetadataValue.json(not_ready)},
            description="; ".join(f"{k}: {v}" for k, v in not_ready.items()) or None,
        ),
        dg.AssetCheckResult(
            asset_key=key,
            check_name=CHECK_ACCOUNTED,
            passed=not unaccounted,
            metadata={
                "batches": len(batches),
                "unaccounted_batches": dg.MetadataValue.json(unaccounted),
                "records_in": sum(b.rows_in + b.released_from_buffer for b in batches),
                "records_routed": sum(sum(b.routes.values()) for b in batches),
            },
        ),
    ]


def _log_batch(context: dg.AssetExecutionContext, metrics: BatchMetrics) -> None:
    context.log.info(metrics.summary())
    for side, per_ns in metrics.readiness.items():
        for ns, decision in per_ns.items():
            if not decision["ready"]:
                context.log.info(f"side input {side!r} not ready for {ns}: {decision['reason']}")
    for note in metrics.notes:
        context.log.info(note)


def _run_continuous(
    context: dg.AssetExecutionContext,
    op: SideInputOperator,
    spark: Any,
    config: dict[str, Any],
    batches: list[BatchMetrics],
) -> None:
    stop = threading.Event()
    reports: queue.Queue[BatchMetrics] = queue.Queue()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["result"] = op.run(
                spark,
                trigger="continuous",
                interval=dt.timedelta(seconds=config["interval_seconds"]),
                max_batches=config.get("max_batches"),
                stop=stop,
                on_batch=reports.put,
                wait_for_lock=config["wait_for_lock_seconds"],
            )
        except BaseException as exc:  # handed to the run's thread below
            outcome["error"] = exc

    worker = threading.Thread(target=work, name=f"dsi-{op.operator_id}", daemon=True)
    worker.start()
    try:
        while worker.is_alive() or not reports.empty():
            try:
                metrics = reports.get(timeout=0.5)
            except queue.Empty:
                continue
            batches.append(metrics)
            _log_batch(context, metrics)
            for tag in op.spec.all_tags:
                context.log_event(
                    dg.AssetMaterialization(
                        asset_key=dg.AssetKey(tag.name.split("/")),
                        metadata=_batch_metadata(metrics, tag),
                        description=f"micro-batch {metrics.batch_id}",
                    )
                )
    except BaseException:
        context.log.info("Run terminated: stopping after the current micro-batch.")
        stop.set()
        worker.join()
        raise
    if "error" in outcome:
        raise outcome["error"]


def execute(context: dg.AssetExecutionContext, decl: SideInputAssets) -> Iterator[Any]:
    """The body of a ``@side_input_assets`` multi-asset."""
    config = dict(context.op_config or {})
    trigger = config.get("trigger", "available_now")
    spark = getattr(context.resources, decl.spark_resource_key).spark_session
    storage = storage_of(context.resources, decl)
    graph = context.job_def.asset_layer.asset_graph
    main_op = build_operator(decl, storage, context.instance, graph)
    replay = config.get("replay")
    op = (
        main_op
        if replay is None
        else build_operator(decl, storage, context.instance, graph, replay=replay)
    )
    context.log.info(f"{op!r}: trigger={trigger}, tables under {storage.root}")
    started = time.perf_counter()
    batches: list[BatchMetrics] = []
    if trigger == "continuous":
        _run_continuous(context, op, spark, config, batches)
    else:

        def collect(metrics: BatchMetrics) -> None:
            batches.append(metrics)
            _log_batch(context, metrics)

        result: RunResult = op.run(
            spark,
            trigger="available_now",
            max_batches=config.get("max_batches"),
            on_batch=collect,
            wait_for_lock=config.get("wait_for_lock_seconds", 0.0),
        )
        context.log.info(f"{len(result.batches)} micro-batch(es); stopped: {result.stopped}")
    seconds = time.perf_counter() - started
    for tag in decl.all_tags:
        # A replay writes through its own operator; the replayed output itself is unchanged.
        writer = op if tag in op.spec.all_tags else main_op
        yield dg.MaterializeResult(
            asset_key=dg.AssetKey(tag.name.split("/")),
            metadata=output_metadata(writer, tag, batches if writer is op else [], seconds),
        )
    yield from check_results(main_op, batches if op is main_op else [])

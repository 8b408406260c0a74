"""Running a side-input operator inside a Dagster run.

``available_now`` runs every available micro-batch and reports one materialization per
output asset the run committed to (an observation with the same figures for the
others). ``continuous`` runs the operator on a worker thread and reports the same per
micro-batch; when the run is terminated (from the UI, or any
interrupt), it asks the operator to stop after its current batch, waits for it, reports
every batch committed, and ends the step as a clean stop ("Stopped after micro-batch N"):
no batch is left half-written, and none is lost.
"""

import contextlib
import datetime as dt
import logging
import queue
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg

from dagster_sideinputs.core.declarations import asset_path
from dagster_sideinputs.core.metrics import BatchMetrics, RunResult
from dagster_sideinputs.core.operator import SideInputOperator
from dagster_sideinputs.core.outputs import OutputTag
from dagster_sideinputs.core.spark_errors import lake_storage_errors
from dagster_sideinputs.dagster_layer.declaration import CHECK_ACCOUNTED, SideInputAssets
from dagster_sideinputs.dagster_layer.describe import inputs_markdown
from dagster_sideinputs.dagster_layer.figures import figures_line, record_figures
from dagster_sideinputs.dagster_layer.io_manager import table_schema_metadata
from dagster_sideinputs.dagster_layer.kafka import kafka_batch_metadata, kafka_run_metadata
from dagster_sideinputs.dagster_layer.readiness import (
    DagsterReadiness,
    side_assets_from_graph,
)
from dagster_sideinputs.delta.storage import DeltaStorage
from dagster_sideinputs.errors import DeclarationError, StorageError, did_you_mean
from dagster_sideinputs.run_report import after_commit as _after_commit
from dagster_sideinputs.run_report import buffer_figures as _buffer_figures
from dagster_sideinputs.run_report import (
    main_range,
    run_figures,
    split_outputs,
    table_versions,
)

log = logging.getLogger("dagster_sideinputs")


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


def asset_graph_of(job_def: dg.JobDefinition) -> Any:
    """The whole asset graph a job was made from (a subset job's own graph hides the
    partitions of the assets it does not execute, e.g. the side inputs of a check run)."""
    graph = job_def.asset_layer.asset_graph
    return getattr(graph, "source_asset_graph", graph)


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


def run_inputs(decl: SideInputAssets) -> dict[str, Any]:
    """``dsi/inputs`` as this run declares them (timeouts, windows, readiness rules).

    The asset's definition shows the code location's declaration; a run made elsewhere
    (``make demo`` in its own process, another deployment) may declare other values
    (``DSI_PROFILE_TIMEOUT_MINUTES``): each materialization shows the ones it ran with.
    """
    unmatched = decl.spec.routes.get("unmatched")
    target = unmatched.name if unmatched is not None else "the unmatched output"
    return {"dsi/inputs": dg.MetadataValue.md(inputs_markdown(decl.main, decl.side_inputs, target))}


def readiness_markdown(readiness: Mapping[str, Mapping[str, Any]]) -> str:
    """Per side input and window: ready or not, and why (decisions as dicts or Decisions)."""
    lines = ["| side input | window | ready | reason |", "|---|---|---|---|"]
    for side, per_ns in sorted(readiness.items()):
        for ns, decision in sorted(per_ns.items()):
            ready, reason = (
                (decision["ready"], decision["reason"])
                if isinstance(decision, Mapping)
                else (decision.ready, decision.reason)
            )
            lines.append(f"| {side} | {ns} | {'yes' if ready else 'no'} | {reason} |")
    return "\n".join(lines)


def _table_figures(op: SideInputOperator, tag: OutputTag) -> dict[str, Any]:
    uri = op.output_tables[tag.name]
    engine = op.spec.storage.delta
    metadata: dict[str, Any] = {
        "dagster/uri": dg.MetadataValue.path(uri),
        "delta_engine": engine.name,
    }
    try:
        with lake_storage_errors(op.spec, f"reading the figures of output table {tag.name!r}"):
            snapshot = engine.snapshot(uri, name=tag.name) if engine.exists(uri) else None
    except StorageError as exc:
        return metadata | _after_commit(op, f"the figures of table {tag.name!r}", exc)
    if snapshot is not None:
        metadata["delta_version"] = snapshot.version
        metadata["dagster/column_schema"] = table_schema_metadata(snapshot.schema)
        if snapshot.num_records is not None:
            metadata["dagster/row_count"] = snapshot.num_records
    return metadata


def output_metadata(
    op: SideInputOperator,
    tag: OutputTag,
    batches: Sequence[BatchMetrics],
    seconds: float,
    buffer: Mapping[str, Any] | None = None,
    declared: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Metadata of one output asset after a run: what the run did, and the table now.

    Every label is defined in :data:`~dagster_sideinputs.dagster_layer.figures.GLOSSARY`.

    Args:
        op: the operator owning the output's table.
        buffer: the buffer figures of the operator that ran (default: ``op``'s).
        declared: the inputs as the run declared them (:func:`run_inputs`).
    """
    figures = run_figures(tag, batches, seconds)
    metadata: dict[str, Any] = {
        "rows_written": figures.pop("rows_written"),
        **_table_figures(op, tag),
        **figures,
        **(buffer if buffer is not None else _buffer_figures(op)),
    }
    if batches:
        last = batches[-1]
        metadata["main_range"] = main_range(batches)
        metadata["side_input_versions"] = dg.MetadataValue.json(last.side_versions)
        metadata["readiness"] = dg.MetadataValue.md(readiness_markdown(last.readiness))
    metadata.update(kafka_run_metadata(op, batches))
    metadata.update(declared or {})
    return metadata


def batch_metadata(
    op: SideInputOperator,
    tag: OutputTag,
    metrics: BatchMetrics,
    declared: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Metadata of one output asset after one micro-batch of a continuous run."""
    return {
        "batch_id": metrics.batch_id,
        "rows_written": metrics.emitted(tag.name),
        **_table_figures(op, tag),
        **record_figures([metrics]),
        "buffered_rows": metrics.buffer_rows,
        "main_range": metrics.main_range,
        "side_input_versions": dg.MetadataValue.json(metrics.side_versions),
        "readiness": dg.MetadataValue.md(readiness_markdown(metrics.readiness)),
        "batch_seconds": metrics.durations.get("total", 0.0),
        **kafka_batch_metadata(metrics),
        **(declared or {}),
    }


def _key(tag: OutputTag) -> dg.AssetKey:
    return dg.AssetKey(list(asset_path(tag.name)))


def accounted_check(decl: SideInputAssets, batches: Sequence[BatchMetrics]) -> dg.AssetCheckResult:
    """``records_accounted_for``: every record the run looked at went to exactly one route."""
    unaccounted = [b.batch_id for b in batches if not b.accounted]
    figures = record_figures(batches)
    return dg.AssetCheckResult(
        asset_key=dg.AssetKey(list(asset_path(decl.main_output.name))),
        check_name=CHECK_ACCOUNTED,
        passed=not unaccounted,
        metadata={
            "batches": len(batches),
            **figures,
            "unaccounted_batches": dg.MetadataValue.json(unaccounted),
        },
        description=figures_line(figures) if batches else "no micro-batch in this run",
    )


def _durations_line(durations: Mapping[str, float]) -> str:
    """The batch's time, then its stages' (a log line's last words).

    Examples:
        >>> _durations_line({"read": 0.31, "route": 1.2, "total": 1.51})
        '1.51s (read 0.31s, route 1.20s)'
    """
    stages = ", ".join(
        f"{name} {seconds:.2f}s" for name, seconds in durations.items() if name != "total"
    )
    total = f"{durations.get('total', 0.0):.2f}s"
    return f"{total} ({stages})" if stages else total


def _log_batch(context: dg.AssetExecutionContext, metrics: BatchMetrics) -> None:
    context.log.info(
        f"batch {metrics.batch_id}{' (replay of an interrupted batch)' if metrics.replayed else ''}"
        f" {metrics.main_range}: {figures_line(record_figures([metrics]))}; "
        f"buffered_rows={metrics.buffer_rows}; {_durations_line(metrics.durations)}"
    )
    for side, per_ns in metrics.readiness.items():
        for ns, decision in per_ns.items():
            if not decision["ready"]:
                context.log.info(f"side input {side!r} not ready for {ns}: {decision['reason']}")
    for note in metrics.notes:
        context.log.info(note)


@contextlib.contextmanager
def _stop_on_interrupt(stop: threading.Event) -> Iterator[None]:
    """While a continuous run works, an interrupt asks it to stop after its micro-batch.

    Dagster's Terminate (and a SIGTERM) interrupts the run's process. Instead of
    Dagster's handler (an exception at whatever line the run is on) or PySpark's (which
    cancels every Spark job, the batch in flight's included, then raises), the first
    interrupt sets ``stop``: the operator finishes its current micro-batch, every
    committed batch is reported, and the step ends. A second one interrupts at once.
    Signal handlers belong to the main thread: elsewhere nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt  # asked twice: stop now
        stop.set()

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, restored in previous.items():
            signal.signal(sig, restored)


def _run_continuous(
    context: dg.AssetExecutionContext,
    op: SideInputOperator,
    spark: Any,
    config: dict[str, Any],
    batches: list[BatchMetrics],
    declared: Mapping[str, Any],
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

    versions = table_versions(op)

    def report(metrics: BatchMetrics) -> None:
        nonlocal versions
        batches.append(metrics)
        _log_batch(context, metrics)
        written, untouched = split_outputs(op.spec.all_tags, [metrics], versions)
        what = f"micro-batch {metrics.batch_id}"
        for tag in written:
            context.log_event(
                dg.AssetMaterialization(
                    asset_key=_key(tag),
                    metadata=batch_metadata(op, tag, metrics, declared),
                    description=what if metrics.emitted(tag.name) else f"{what}: created (0 rows)",
                )
            )
        for tag in untouched:
            context.log_event(
                dg.AssetObservation(
                    asset_key=_key(tag),
                    metadata=batch_metadata(op, tag, metrics, declared),
                    description=f"{what}: nothing written to this table",
                )
            )
        versions = {
            name: metrics.writes[name].version if name in metrics.writes else version
            for name, version in versions.items()
        }

    def stopped() -> str:
        return f"micro-batch {batches[-1].batch_id}" if batches else "no micro-batch"

    worker = threading.Thread(target=work, name=f"dsi-{op.operator_id}", daemon=True)
    announced = False
    with _stop_on_interrupt(stop):
        worker.start()
        try:
            # Until the operator ends (a stop ends it after its current micro-batch), and
            # every batch it committed is reported: none reaches Delta but not Dagster.
            while worker.is_alive() or not reports.empty():
                if stop.is_set() and not announced:
                    context.log.info("Stop requested: stopping after the current micro-batch.")
                    announced = True
                try:
                    metrics = reports.get(timeout=0.5)
                except queue.Empty:
                    continue
                report(metrics)
        except BaseException:  # interrupted twice, or reporting failed
            stop.set()
            worker.join()
            while not reports.empty():
                report(reports.get_nowait())
            context.log.info(f"Interrupted after {stopped()}.")
            raise
    if "error" in outcome:
        raise outcome["error"]
    if stop.is_set():
        if not announced:  # the operator ended before the loop above saw the request
            context.log.info("Stop requested: stopping after the current micro-batch.")
        context.log.info(f"Stopped after {stopped()}.")


def execute(context: dg.AssetExecutionContext, decl: SideInputAssets) -> Iterator[Any]:
    """The body of a ``@side_input_assets`` multi-asset.

    Reports a materialization only for the outputs the run committed to; the others get
    an observation with the same figures. ``records_accounted_for`` is evaluated on the
    run's own batches (a replay's included).
    """
    config = dict(context.op_execution_context.op_config or {})
    trigger = config.get("trigger", "available_now")
    spark = getattr(context.resources, decl.spark_resource_key).spark_session
    storage = storage_of(context.resources, decl).bind(spark)
    graph = asset_graph_of(context.job_def)
    replay = config.get("replay")
    op = build_operator(decl, storage, context.instance, graph, replay=replay)
    context.log.info(
        f"{op!r}: trigger={trigger}, tables under {storage.root}, Delta engine "
        f"{storage.delta.name} (asked for: {storage_of(context.resources, decl).choice})"
    )
    batches: list[BatchMetrics] = []
    declared = run_inputs(decl)
    if trigger == "continuous":
        _run_continuous(context, op, spark, config, batches, declared)
        yield accounted_check(decl, batches)
        return

    def collect(metrics: BatchMetrics) -> None:
        batches.append(metrics)
        _log_batch(context, metrics)

    versions = table_versions(op)
    started = time.perf_counter()
    result: RunResult = op.run(
        spark,
        trigger="available_now",
        max_batches=config.get("max_batches"),
        on_batch=collect,
        wait_for_lock=config.get("wait_for_lock_seconds", 0.0),
    )
    seconds = time.perf_counter() - started
    buffer = _buffer_figures(op)
    context.log.info(
        f"{len(batches)} micro-batch(es), stopped: {result.stopped}; "
        f"{figures_line(record_figures(batches))}; buffered_rows={buffer.get('buffered_rows')}"
    )
    # A replay runs its own operator, which never writes the output it replays: that
    # table's figures come from the main operator.
    main_op = op if replay is None else build_operator(decl, storage, context.instance, graph)
    owner = {tag.name: op for tag in op.spec.all_tags}
    tags = [next((t for t in op.spec.all_tags if t == tag), tag) for tag in decl.all_tags]
    written, untouched = split_outputs(tags, batches, versions)
    for tag in written:
        yield dg.MaterializeResult(
            asset_key=_key(tag),
            metadata=output_metadata(op, tag, batches, seconds, buffer, declared),
        )
    what = f"replay of {replay}" if replay else f"run of {len(batches)} micro-batch(es)"
    for tag in untouched:
        yield dg.AssetObservation(
            asset_key=_key(tag),
            metadata=output_metadata(
                owner.get(tag.name, main_op), tag, batches, seconds, buffer, declared
            ),
            description=f"{what}: nothing written to this table",
        )
    yield accounted_check(decl, batches)

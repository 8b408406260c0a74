"""The side-input operator as an Airflow task.

One task run is one ``available_now`` run of the operator: every available micro-batch,
then the task ends. Its inlets are the main and side inputs' assets, its outlets the
outputs' (see :mod:`dagster_sideinputs.airflow.assets`). Each output the run wrote rows
to (or whose commit it found made by an interrupted try it replays) gets an asset event
whose ``extra`` holds the run's figures, with the names and meanings of the Dagster
materializations' (``dagster_sideinputs.dagster_layer.figures.GLOSSARY``; the table's
row count as ``row_count``); the other outputs get none.

A failed batch fails the task: the log's first error line is the
:class:`~dagster_sideinputs.SideInputError`'s text (what, which asset, the fix). A retry
(``retries=``) is the operator's rerun: an interrupted batch is replayed exactly or
planned again, never written twice.
"""

import dataclasses
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from airflow.sdk import Asset, BaseOperator

from dagster_sideinputs.airflow.assets import table_asset
from dagster_sideinputs.airflow.readiness import (
    PARTITION_FORMAT,
    AirflowReadiness,
    events_from_context,
)
from dagster_sideinputs.core.metrics import BatchMetrics, figures_line, record_figures
from dagster_sideinputs.core.operator import SideInputOperator
from dagster_sideinputs.core.options import MOVED_KEYWORDS, OperatorOptions, declare
from dagster_sideinputs.core.outputs import OutputTag
from dagster_sideinputs.core.spark.session import build_spark_session
from dagster_sideinputs.core.spark_errors import lake_storage_errors
from dagster_sideinputs.delta.storage import DeltaStorage
from dagster_sideinputs.errors import DeclarationError, SideInputError, StorageError
from dagster_sideinputs.run_report import (
    buffer_figures,
    main_range,
    run_figures,
    split_outputs,
    table_versions,
)

DECLARATIONS = frozenset(f.name for f in dataclasses.fields(OperatorOptions))
"""The core's declaration keywords (``main``, ``side_inputs``, ``fn``, ``main_output``,
``side_outputs``, ``window``, ``routes``, ...): the task takes them as the core does (and
the keywords they replaced, :data:`~dagster_sideinputs.core.options.MOVED_KEYWORDS`, with
a warning)."""
REQUIRED = frozenset(
    f.name
    for f in dataclasses.fields(OperatorOptions)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)
"""The declaration keywords without a default: the task names those it is missing."""


class SideInputOperatorTask(BaseOperator):
    """Runs a side-input operator's available micro-batches as one Airflow task.

    Takes the core's declarations (the keywords of
    :class:`~dagster_sideinputs.SideInputOperator`: ``main``, ``side_inputs``, ``fn``,
    ``main_output``, ``side_outputs``, ``window``, ``routes``, ``buffer``, ...) and
    Airflow's task arguments (``task_id``, ``retries``, ...), plus:

    Args:
        storage: where the tables live (a ``DeltaStorage`` or its root).
        spark: keyword arguments of :func:`~dagster_sideinputs.build_spark_session`
            (``master="spark://..."``, ``remote="sc://..."``, ``configs=``, ...); the task
            builds the session, or attaches to the Connect server.
        max_age: per side input, the age past which its last asset event is stale
            (Airflow's counterpart of a Dagster ``FreshnessPolicy``).
        partition_format / data_windows: see :class:`AirflowReadiness`.
        asset_prefix / asset_group: the assets' names start with ``asset_prefix``; they
            are shown in ``asset_group``.
        max_batches: stop after this many micro-batches.
        wait_for_lock: seconds to wait for another run of the operator to finish.
    """

    ui_color = "#dbeafe"
    outlets: list[Any]

    def __init__(
        self,
        *,
        storage: DeltaStorage | str,
        spark: Mapping[str, Any] | None = None,
        max_age: Mapping[str, Any] | None = None,
        partition_format: str = PARTITION_FORMAT,
        data_windows: Collection[str] = (),
        asset_prefix: str = "",
        asset_group: str = "",
        max_batches: int | None = None,
        wait_for_lock: float = 0.0,
        **kwargs: Any,
    ) -> None:
        declared = {
            name: kwargs.pop(name)
            for name in list(kwargs)
            if name in DECLARATIONS or name in MOVED_KEYWORDS
        }
        missing = sorted(REQUIRED - set(declared))
        if missing:
            raise DeclarationError(
                f"SideInputOperatorTask {kwargs.get('task_id')!r} is missing {missing}.",
                fix='pass main=dsi.MainInput(...), side_inputs={...}, fn=..., main_output="..." '
                "as to dsi.SideInputOperator",
            )
        self.options = declare(OperatorOptions, declared, "SideInputOperatorTask")
        self.storage = storage if isinstance(storage, DeltaStorage) else DeltaStorage(storage)
        self.spark_settings = dict(spark or {})
        self.max_age = dict(max_age or {})
        self.partition_format = partition_format
        self.data_windows = tuple(data_windows)
        self.max_batches = max_batches
        self.wait_for_lock = wait_for_lock
        # Checks the declarations now (a DAG import error shows in the UI) and names the tables.
        op = SideInputOperator.from_options(self.options, self.storage)
        AirflowReadiness(
            lambda name: (),
            {b.name: b.side.asset for b in op.spec.sides},
            max_age=self.max_age,
            data_windows=self.data_windows,
        )

        def asset(name: str) -> Asset:
            return table_asset(self.storage, name, prefix=asset_prefix, group=asset_group)

        self.main_asset = asset(self.options.main.asset)
        self.side_assets = {b.name: asset(b.side.asset) for b in op.spec.sides}
        self.output_assets = {tag.name: asset(tag.name) for tag in op.spec.all_tags}
        kwargs.setdefault("inlets", [self.main_asset, *self.side_assets.values()])
        kwargs.setdefault("outlets", list(self.output_assets.values()))
        super().__init__(**kwargs)

    def operator(self, readiness: Any = None, spark: Any = None) -> SideInputOperator:
        """The core operator (its storage bound to ``spark`` when given)."""
        storage = self.storage if spark is None else self.storage.bind(spark)
        return SideInputOperator.from_options(self.options, storage, readiness)

    def buffered_rows(self) -> int:
        """Records waiting in the buffer now (read from its Delta log, without Spark):
        whether a side input's new event is worth a run."""
        return self.operator().buffer().rows()

    def execute(self, context: Any) -> dict[str, Any]:
        spark = build_spark_session(
            **{"app_name": f"airflow-{self.dag_id}-{self.task_id}", **self.spark_settings}
        )
        readiness = AirflowReadiness(
            events_from_context(context["inlet_events"], self.side_assets),
            {name: asset.name for name, asset in self.side_assets.items()},
            max_age=self.max_age,
            partition_format=self.partition_format,
            data_windows=self.data_windows,
        )
        op = self.operator(readiness, spark)
        self.log.info(
            "%r: tables under %s, Delta engine %s",
            op,
            op.spec.storage.root,
            op.spec.storage.delta.name,
        )
        batches: list[BatchMetrics] = []

        def collect(metrics: BatchMetrics) -> None:
            batches.append(metrics)
            self._log_batch(metrics)

        try:
            versions = table_versions(op)
            started = time.perf_counter()
            result = op.run(
                spark,
                trigger="available_now",
                max_batches=self.max_batches,
                on_batch=collect,
                wait_for_lock=self.wait_for_lock,
            )
        except SideInputError as exc:
            # First, alone, before Airflow's traceback (which also chains Spark's).
            self.log.error("%s: %s", type(exc).__name__, exc)
            raise
        seconds = time.perf_counter() - started
        buffer = buffer_figures(op)
        figures = record_figures(batches)
        self.log.info(
            "%d micro-batch(es), stopped: %s; %s; buffered_rows=%s",
            len(batches),
            result.stopped,
            figures_line(figures),
            buffer.get("buffered_rows"),
        )
        written, untouched = split_outputs(
            op.spec.all_tags, batches, versions, creation_counts=False
        )
        for tag in written:
            extra = event_extra(op, tag, batches, seconds, buffer)
            context["outlet_events"][self.output_assets[tag.name]].extra.update(extra)
            self.log.info("asset event for %s: rows_written=%s", tag.name, extra["rows_written"])
        for tag in untouched:
            self.log.info("no asset event for %s: the run wrote no rows to it", tag.name)
        # Airflow records an event for every outlet of a successful task: keep those the
        # run wrote to (the DAG's lineage keeps all of them).
        unwritten = [self.output_assets[tag.name] for tag in untouched]
        self.outlets = [o for o in self.outlets if o not in unwritten]
        return {"batches": len(batches), **figures, **buffer}

    def _log_batch(self, metrics: BatchMetrics) -> None:
        self.log.info("%s", metrics.summary())
        for side, per_ns in metrics.readiness.items():
            for ns, decision in per_ns.items():
                if not decision["ready"]:
                    self.log.info(
                        "side input %r not ready for %s: %s", side, ns, decision["reason"]
                    )
        for note in metrics.notes:
            self.log.info("%s", note)


def event_extra(
    op: SideInputOperator,
    tag: OutputTag,
    batches: Sequence[BatchMetrics],
    seconds: float,
    buffer: Mapping[str, Any],
) -> dict[str, Any]:
    """An output's asset event ``extra``: the run's figures, the table now, readiness."""
    extra: dict[str, Any] = {**run_figures(tag, batches, seconds), **_table(op, tag), **buffer}
    if batches:
        last = batches[-1]
        extra["main_range"] = main_range(batches)
        extra["side_input_versions"] = dict(last.side_versions)
        extra["readiness"] = last.readiness
        extra["not_ready"] = {
            side: {ns: d["reason"] for ns, d in per_ns.items() if not d["ready"]}
            for side, per_ns in last.readiness.items()
            if any(not d["ready"] for d in per_ns.values())
        }
    return extra


def _table(op: SideInputOperator, tag: OutputTag) -> dict[str, Any]:
    uri = op.output_tables[tag.name]
    engine = op.spec.storage.delta
    figures: dict[str, Any] = {"uri": uri, "delta_engine": engine.name}
    try:
        with lake_storage_errors(op.spec, f"reading the figures of output table {tag.name!r}"):
            snapshot = engine.snapshot(uri, name=tag.name)
    except StorageError as exc:
        return figures | {"figures_unavailable": f"table {tag.name!r}: {exc.message}"[:1000]}
    figures["delta_version"] = snapshot.version
    if snapshot.num_records is not None:
        figures["row_count"] = snapshot.num_records
    return figures

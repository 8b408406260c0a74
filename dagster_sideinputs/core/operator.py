"""The side-input operator, usable from any PySpark program.

A run processes the main input in micro-batches. Each batch is planned (pinned side
versions, readiness decisions), written down, executed and committed. A batch left
incomplete is either replayed exactly from its plan (when some table already committed
it: its Delta application transactions keep every table exactly-once) or, when no table
committed anything, planned again from the current inputs, so that a fix of the inputs
takes effect.
"""

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from pyspark.sql import SparkSession

from dagster_sideinputs.core.batch.buffer import BufferState, load_state
from dagster_sideinputs.core.batch.context import StageContext
from dagster_sideinputs.core.batch.run import peek, step
from dagster_sideinputs.core.binding import build_spec
from dagster_sideinputs.core.callbacks import clock_time, report_batch
from dagster_sideinputs.core.metrics import BatchMetrics, RunResult
from dagster_sideinputs.core.options import OperatorOptions, declare, init_takes, options_of
from dagster_sideinputs.core.sideinputs.readiness import ReadinessProvider
from dagster_sideinputs.core.spark.session import fit_shuffle_partitions
from dagster_sideinputs.core.spark_errors import lake_storage_errors
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.state import identity
from dagster_sideinputs.core.state.folder import OperatorState, Unreadable
from dagster_sideinputs.core.state.lock import operator_lock
from dagster_sideinputs.core.state.plan import BatchPlan
from dagster_sideinputs.core.state.recovery import Recovery
from dagster_sideinputs.core.state.reset import MainFrom, reset
from dagster_sideinputs.delta.storage import DeltaStorage
from dagster_sideinputs.delta.store.files import TableFiles
from dagster_sideinputs.delta.store.s3 import configure_spark
from dagster_sideinputs.errors import DeclarationError

Trigger = Literal["available_now", "continuous"]

POLL_INTERVAL = dt.timedelta(seconds=1)
"""The continuous trigger's default polling interval. A poll that finds nothing costs no
Spark job (a listing and a few small reads), so a short interval keeps latency low: an
append waits half an interval on average, then one batch (docs/performance.md)."""

log = logging.getLogger("dagster_sideinputs")


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass(frozen=True, kw_only=True)
class OperatorArguments(OperatorOptions):
    """The keyword arguments of :class:`SideInputOperator`: its declaration and function
    (:class:`~dagster_sideinputs.core.options.OperatorOptions`), where its tables live, and
    who decides readiness."""

    storage: DeltaStorage
    readiness: ReadinessProvider | None = None

    def options(self) -> OperatorOptions:
        return options_of(self, self.fn)


class SideInputOperator:
    """Joins a main input with side inputs, buffers what is not ready, splits the results.

    Args:
        main: the main input.
        side_inputs: side inputs by name (the name of the joined column and of
            ``sides[name]``).
        fn: frames mode: ``fn(main: DataFrame, sides: SideInputs) -> Outputs``; rows
            mode: ``fn(record, ctx)`` yielding main-output records.
        main_output: the main output's asset name (or an OutputTag with a schema).
        storage: where the tables live.
        side_outputs: the declared side-output tags.
        window: main windows (event time); by default the finest window of a windowed
            side input, else none (one global namespace).
        routes: where the records the operator routes itself go (late, unmatched,
            overflow, invalid): :class:`~dagster_sideinputs.core.outputs.Routes`.
        buffer: buffer limits. (A batch's share of a backlog is the main input's:
            ``MainInput(max_versions_per_batch=)`` and its kin.)
        mode: ``frames`` (Spark-native, fast) or ``rows`` (per record, Flink style).
        operator_id: identity of the operator's state and transactions (default: the
            main output's name). Changing it starts from scratch.
        readiness: who decides readiness (default: the side Delta tables themselves).
        schema_mode: ``"merge"`` lets outputs gain columns; by default a schema change
            of an output is an error.
        future_tolerance: in a windowed operator, a record whose event time is further
            ahead of the batch's clock than this is invalid: one bogus year-9999
            timestamp would otherwise push the watermark past every window.
        cache: whether a batch caches its classified records for its several writes.
            ``auto`` (like ``never``) recomputes them from the batch's pinned inputs for
            each write: measured cheaper than building Spark's cache, for broadcast and
            shuffle joins alike (4M records, a keyed map of 200k rows, two outputs: 11.1 s
            cached, 4.8 s recomputed; docs/DECISIONS.md). ``always`` caches.

    Examples:
        >>> op = SideInputOperator(                                   # doctest: +SKIP
        ...     main=MainInput("transactions", key="customer_id"),
        ...     side_inputs={"profile": SideInput.map("customer_profiles", key="customer_id")},
        ...     fn=lambda main, sides: main,
        ...     main_output="enriched_transactions",
        ...     storage=DeltaStorage("/data"),
        ... )
        >>> op.run(spark, trigger="available_now")                     # doctest: +SKIP
    """

    @init_takes(OperatorArguments)
    def __init__(self, **arguments: Any) -> None:
        declared = declare(OperatorArguments, arguments, "SideInputOperator")
        self._bind(declared.options(), declared.storage, declared.readiness)

    @classmethod
    def from_options(
        cls,
        options: OperatorOptions,
        storage: DeltaStorage,
        readiness: ReadinessProvider | None = None,
    ) -> "SideInputOperator":
        """The operator of an :class:`OperatorOptions` value (the Dagster layer's path)."""
        operator = cls.__new__(cls)
        operator._bind(options, storage, readiness)
        return operator

    def _bind(
        self, options: OperatorOptions, storage: DeltaStorage, readiness: ReadinessProvider | None
    ) -> None:
        if not isinstance(storage, DeltaStorage):
            raise DeclarationError(
                f"storage= must be a dsi.DeltaStorage, got {type(storage).__name__}.",
                fix='storage=dsi.DeltaStorage(root="/data/lake")',
            )
        self.options = options
        self._readiness = readiness
        self.spec: OperatorSpec = build_spec(options, storage, readiness)
        self.state = OperatorState(
            TableFiles(self.spec.state_uri, storage.storage_options), self.spec.operator_id
        )
        self.recovery = Recovery(self.spec, self.state)
        self._context: StageContext | None = None
        self._read_input = False  # whether the last batch read a slice of the main input

    def __repr__(self) -> str:
        return (
            f"SideInputOperator({self.spec.operator_id!r}, main={self.spec.main!r}, "
            f"sides={[b.name for b in self.spec.sides]}, "
            f"outputs={[t.name for t in self.spec.all_tags]})"
        )

    # --- introspection ------------------------------------------------------------------

    @property
    def operator_id(self) -> str:
        return self.spec.operator_id

    @property
    def output_tables(self) -> dict[str, str]:
        """Output name -> table location (main output first)."""
        return {tag.name: self.spec.table_uri(tag) for tag in self.spec.all_tags}

    @property
    def state_uri(self) -> str:
        """The operator's own folder: batch plans, commit records, buffer, lock."""
        return self.spec.state_uri

    def buffer(self) -> BufferState:
        """The buffer's current state (from the Delta log; no Spark needed)."""
        with self._storage_errors("reading the buffer's state"):
            return load_state(self.spec)

    def last_committed_batch(self) -> int | None:
        with self._storage_errors("reading the commit records"):
            return self.state.last_committed()

    def last_plan(self) -> BatchPlan | None:
        with self._storage_errors("reading the batch plans"):
            planned = self.state.last_planned()
            if planned is None:
                return None
            loaded = self.state.load_plan(planned)
        return None if isinstance(loaded, Unreadable) else loaded

    def peek(self, *, now: dt.datetime | None = None) -> BatchPlan | None:
        """The plan the next batch would make now, without writing it (None: no work).

        Uses no Spark unless windows of new records cannot be told from statistics.
        An incomplete batch that some table committed (to be replayed) is returned as is.
        """
        with self._storage_errors("planning the next batch"):
            return peek(self.recovery, now or _utc_now())

    # --- running --------------------------------------------------------------------------

    def run(
        self,
        spark: SparkSession,
        *,
        trigger: Trigger = "available_now",
        interval: dt.timedelta = POLL_INTERVAL,
        max_batches: int | None = None,
        stop: threading.Event | None = None,
        on_batch: Callable[[BatchMetrics], None] | None = None,
        wait_for_lock: float = 0.0,
        clock: Callable[[], dt.datetime] = _utc_now,
        explain: bool = False,
    ) -> RunResult:
        """Process the main input in micro-batches.

        Args:
            spark: the session (the operator never creates one).
            trigger: ``available_now`` processes everything there is, then returns;
                ``continuous`` keeps polling every ``interval`` until ``stop`` is set.
            interval: polling interval of the continuous trigger, from one poll's start to
                the next (a batch that takes longer is followed by the next poll at once).
            max_batches: stop after this many batches.
            stop: set it (from another thread or a signal handler) to stop after the
                current batch.
            on_batch: called with the metrics of each committed batch.
            wait_for_lock: seconds to wait for another run of this operator to finish.
            clock: the time source (batches pin it in their plans).
            explain: record Spark's physical plan of each batch in its metrics.

        Raises:
            OperatorBusyError: another run holds the operator.
            SideInputError: any batch failure, with nothing of that batch lost; rerun to
                resume exactly where it stopped.
        """
        if trigger not in ("available_now", "continuous"):
            raise DeclarationError(f"trigger={trigger!r} is not 'available_now' or 'continuous'.")
        stop = stop or threading.Event()
        batches: list[BatchMetrics] = []
        self._use_session(spark)
        with self._storage_errors("running the operator"), self._lock(wait_for_lock):
            context = self._context_for(spark)
            context.explain = explain
            verdict = identity.check(self.spec, self.state)
            while not stop.is_set():
                started = time.monotonic()
                fit_shuffle_partitions(spark)
                metrics = self._step(context, clock_time(clock, self.operator_id), verdict)
                if metrics is not None:
                    batches.append(metrics)
                    if not metrics.replayed:  # a replay finished an older plan's batch
                        verdict = replace(verdict, reroute=False)
                    if on_batch is not None:
                        report_batch(on_batch, metrics, self.operator_id)
                if max_batches is not None and len(batches) >= max_batches:
                    return RunResult(batches, "max_batches")
                # A batch that read an empty slice (an empty landed file, a version adding
                # no rows) is idle but moved the position: what follows may hold records.
                idle = metrics is None or (_idle(metrics) and not self._read_input)
                if trigger == "available_now" and idle:
                    return RunResult(batches, "caught_up")
                if trigger == "continuous":
                    stop.wait(max(0.0, interval.total_seconds() - (time.monotonic() - started)))
        return RunResult(batches, "stopped")

    def run_batch(
        self, spark: SparkSession, *, now: dt.datetime | None = None
    ) -> BatchMetrics | None:
        """Run at most one batch (the incomplete one first); None when there is nothing to do."""
        self._use_session(spark)
        fit_shuffle_partitions(spark)
        with self._storage_errors("running a batch"), self._lock(0.0):
            verdict = identity.check(self.spec, self.state)
            return self._step(self._context_for(spark), now or _utc_now(), verdict)

    def _storage_errors(self, doing: str) -> Any:
        """Store failures of the block as a StorageError naming the lake's store."""
        return lake_storage_errors(self.spec, doing)

    def _lock(self, wait_s: float) -> Any:
        return operator_lock(
            self.state_uri,
            operator_id=self.operator_id,
            wait_s=wait_s,
            storage_options=self.spec.storage.storage_options,
        )

    def _use_session(self, spark: SparkSession) -> None:
        """Resolve the storage's Delta engine for this session (delta-spark where the
        session has Delta, unless the storage names an engine)."""
        bound = self.spec.storage.bind(spark)
        if bound is not self.spec.storage:
            self._bind(self.options, bound, self._readiness)

    def _context_for(self, spark: SparkSession) -> StageContext:
        if self._context is None or self._context.spark is not spark:
            # Spark reads the lake (and a landing folder) on object stores with the
            # storage's own endpoint and credentials (s3a settings per bucket).
            storage = self.spec.storage
            for uri in (storage.root, self.spec.main_uri):
                configure_spark(spark, uri, storage.storage_options)
            self._context = StageContext(self.spec, spark, self.state)
        return self._context

    def _step(
        self, context: StageContext, now: dt.datetime, verdict: identity.Verdict
    ) -> BatchMetrics | None:
        """One batch: replayed, re-planned or planned (:mod:`.batch.run`)."""
        done = step(context, self.recovery, now, verdict)
        if done is None:
            return None
        metrics, plan = done
        self._read_input = not plan.main.is_empty
        if plan.routing:
            identity.confirm_routing(self.spec, self.state, plan.routing)
        identity.record_buffer(self.spec, self.state)
        log.info("%s: %s", self.operator_id, metrics.summary())
        return metrics

    def reset(
        self,
        *,
        main_from: MainFrom = "keep",
        drop_buffered: bool = False,
        wait_for_lock: float = 0.0,
    ) -> int:
        """Start over explicitly after a change the operator refuses to guess about.

        Commits a *reset batch* (see :mod:`~dagster_sideinputs.core.state.reset`): batch ids keep
        increasing, the main-input position moves as asked, the current declaration
        becomes the operator's identity, and a pending batch is set aside. Output tables
        are never touched.

        Args:
            main_from: where the next batch reads the main input from: ``beginning`` (a
                Delta table's first version; a landing folder's every file again),
                ``latest`` (only what arrives from now on), ``keep`` (the recorded
                position, when only the identity or the buffer needs resetting; refused
                when there is none; for Kafka, of what the brokers still hold: a vanished
                topic's or partition's position is dropped, a recreated topic is read
                from its beginning, offsets retention deleted unread are skipped, every
                other partition keeps its position), or a Delta table version (read the
                versions after it, e.g. to skip a version that deleted rows).
            drop_buffered: delete the buffered records (a removal committed by the reset
                batch); otherwise they are kept and routed again by the next batch.
            wait_for_lock: seconds to wait for a running run of the operator.

        Returns:
            The reset batch's id.
        """
        with self._storage_errors("resetting the operator"), self._lock(wait_for_lock):
            return reset(self.spec, self.state, main_from=main_from, drop_buffered=drop_buffered)


def _idle(metrics: BatchMetrics) -> bool:
    """A batch that read no new records and moved none out of the buffer: running again
    now would repeat it (an ``available_now`` run stops there)."""
    moved = sum(v for route, v in metrics.routes.items() if route not in ("buffered", "key_wait"))
    rebuffered = metrics.routes.get("buffered", 0) + metrics.routes.get("key_wait", 0)
    return metrics.rows_in == 0 and moved == 0 and rebuffered == metrics.released_from_buffer


__all__ = ["POLL_INTERVAL", "SideInputOperator", "Trigger"]

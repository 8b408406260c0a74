"""The side-input operator, usable from any PySpark program.

A run processes the main input in micro-batches. Each batch is planned (pinned side
versions, readiness decisions), written down, executed and committed; a batch left
incomplete by a crash is replayed from its plan by the next run before anything
new, and its Delta application transactions keep every table exactly-once.
"""

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pyspark.sql import DataFrame, SparkSession

from dagster_sideinputs.core.batch import BatchRunner
from dagster_sideinputs.core.buffer import BufferState
from dagster_sideinputs.core.declarations import (
    BufferLimits,
    MainInput,
    OutputTag,
    SideInput,
    Window,
)
from dagster_sideinputs.core.lock import operator_lock
from dagster_sideinputs.core.metrics import BatchMetrics, RunResult
from dagster_sideinputs.core.plan import BatchPlan, PlanLog
from dagster_sideinputs.core.planner import Planned, Planner
from dagster_sideinputs.core.readiness import ReadinessProvider
from dagster_sideinputs.core.spec import CachePolicy, Mode, OperatorSpec, Routes, build_spec
from dagster_sideinputs.delta.files import TableFiles
from dagster_sideinputs.delta.storage import DeltaStorage
from dagster_sideinputs.errors import DeclarationError, OperatorStateError

Trigger = Literal["available_now", "continuous"]
log = logging.getLogger("dagster_sideinputs")


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class SideInputOperator:
    """Joins a main input with side inputs, buffers what is not ready, splits the results.

    Args:
        main: the main input.
        side_inputs: side inputs by name (the name of the joined column and of
            ``sides[name]``).
        fn: frames mode: ``fn(main: DataFrame, sides: SideInputs) -> Outputs``; rows
            mode: ``fn(record, ctx)`` yielding main-output records.
        main_output: the main output's asset name (or an OutputTag with a schema).
        side_outputs: the declared side-output tags.
        storage: where the tables live.
        window: main windows (event time); by default the finest window of a windowed
            side input, else none (one global namespace).
        late / unmatched / overflow / invalid: tags for the records the operator routes
            itself: behind the watermark, without a side row after waiting, pushed out
            of a full buffer, unprocessable (null key, corrupt line).
        buffer: buffer limits.
        mode: ``frames`` (Spark-native, fast) or ``rows`` (per record, Flink style).
        operator_id: identity of the operator's state and transactions (default: the
            main output's name). Changing it starts from scratch.
        readiness: who decides readiness (default: the side Delta tables themselves).
        schema_mode: ``"merge"`` lets outputs gain columns; by default a schema change
            of an output is an error.
        max_versions_per_batch / max_files_per_batch: bound a batch's share of a backlog.
        future_tolerance: in a windowed operator, a record whose event time is further
            ahead of the batch's clock than this is invalid: one bogus year-9999
            timestamp would otherwise push the watermark past every window.
        cache: whether a batch caches its classified records for its several writes.
            ``auto`` caches only when a side input is joined by shuffle (shuffling again
            for every output would cost more); with broadcast joins recomputing from the
            pinned inputs is cheaper than building the cache.

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

    def __init__(
        self,
        *,
        main: MainInput,
        side_inputs: Mapping[str, SideInput],
        fn: Callable[..., Any],
        main_output: str | OutputTag,
        storage: DeltaStorage,
        side_outputs: Sequence[OutputTag] = (),
        window: Window | None = None,
        late: OutputTag | None = None,
        unmatched: OutputTag | None = None,
        overflow: OutputTag | None = None,
        invalid: OutputTag | None = None,
        buffer: BufferLimits | None = None,
        mode: Mode = "frames",
        operator_id: str | None = None,
        readiness: ReadinessProvider | None = None,
        schema_mode: Literal["merge"] | None = None,
        max_versions_per_batch: int | None = None,
        max_files_per_batch: int | None = None,
        future_tolerance: dt.timedelta | None = dt.timedelta(days=1),
        cache: CachePolicy = "auto",
    ) -> None:
        self.spec: OperatorSpec = build_spec(
            main=main,
            side_inputs=side_inputs,
            fn=fn,
            main_output=main_output,
            side_outputs=side_outputs,
            window=window,
            routes=Routes(late, unmatched, overflow, invalid),
            buffer=buffer or BufferLimits(),
            mode=mode,
            storage=storage,
            operator_id=operator_id,
            readiness=readiness,
            schema_mode=schema_mode,
            max_versions_per_batch=max_versions_per_batch,
            max_files_per_batch=max_files_per_batch,
            future_tolerance=future_tolerance,
            cache=cache,
        )
        self.plans = PlanLog(TableFiles(self.spec.state_uri, storage.storage_options))
        self._runner: BatchRunner | None = None
        self._runner_spark: SparkSession | None = None

    def __repr__(self) -> str:
        return (
            f"SideInputOperator({self.spec.operator_id!r}, main={self.spec.main!r}, "
            f"sides={[b.name for b in self.spec.sides]}, "
            f"outputs={[t.name for t in self.spec.all_tags]})"
        )

    # --- introspection -----------------------------------------------------------------------

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
        engine = self.spec.storage.delta
        if not engine.exists(self.spec.buffer_uri):
            return BufferState(None)
        return BufferState(engine.snapshot(self.spec.buffer_uri, name="buffer"))

    def last_committed_batch(self) -> int | None:
        return self.plans.last_committed()

    def last_plan(self) -> BatchPlan | None:
        planned = self.plans.last_planned()
        return None if planned is None else self.plans.load(planned)

    def peek(self, *, now: dt.datetime | None = None) -> BatchPlan | None:
        """The plan the next batch would make now, without writing it (None: no work).

        Uses no Spark unless windows of new records cannot be told from statistics.
        An incomplete batch (to be replayed) is returned as is.
        """
        pending = self._pending_replay()
        if pending is not None:
            return pending
        planner = Planner(self.spec, spark=None)
        previous, commit = self._previous()
        planned = planner.plan(
            batch_id=self._next_batch_id(),
            now=now or _utc_now(),
            previous=previous,
            previous_commit=commit,
            new_rows=self._no_spark_rows,
        )
        return None if planned is None else planned.plan

    @staticmethod
    def _no_spark_rows(*_: Any) -> DataFrame:
        raise OperatorStateError(
            "Peeking at this batch needs Spark: the event-time windows of new records are "
            "not in the file statistics.",
            fix="run the operator instead of peeking",
        )

    # --- running -------------------------------------------------------------------------------

    def run(
        self,
        spark: SparkSession,
        *,
        trigger: Trigger = "available_now",
        interval: dt.timedelta = dt.timedelta(seconds=10),
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
            interval: polling interval of the continuous trigger.
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
        self._runner_for(spark).explain = explain
        batches: list[BatchMetrics] = []
        with operator_lock(
            self.state_uri,
            operator_id=self.operator_id,
            wait_s=wait_for_lock,
            storage_options=self.spec.storage.storage_options,
        ):
            while not stop.is_set():
                started = time.monotonic()
                metrics = self._step(spark, clock())
                if metrics is not None:
                    batches.append(metrics)
                    if on_batch is not None:
                        on_batch(metrics)
                if max_batches is not None and len(batches) >= max_batches:
                    return RunResult(batches, "max_batches")
                if metrics is None and trigger == "available_now":
                    return RunResult(batches, "caught_up")
                if trigger == "continuous":
                    stop.wait(max(0.0, interval.total_seconds() - (time.monotonic() - started)))
        return RunResult(batches, "stopped")

    def run_batch(
        self, spark: SparkSession, *, now: dt.datetime | None = None
    ) -> BatchMetrics | None:
        """Run at most one batch (the incomplete one first); None when there is nothing to do."""
        with operator_lock(
            self.state_uri,
            operator_id=self.operator_id,
            storage_options=self.spec.storage.storage_options,
        ):
            return self._step(spark, now or _utc_now())

    def _runner_for(self, spark: SparkSession) -> BatchRunner:
        if self._runner is None or self._runner_spark is not spark:
            self._runner = BatchRunner(self.spec, spark, self.plans)
            self._runner_spark = spark
        return self._runner

    def _pending_replay(self) -> BatchPlan | None:
        planned, committed = self.plans.last_planned(), self.plans.last_committed()
        if planned is not None and (committed is None or planned > committed):
            return self.plans.load(planned)
        return None

    def _previous(self) -> tuple[BatchPlan | None, dict[str, Any] | None]:
        committed = self.plans.last_committed()
        if committed is None:
            return None, None
        return self.plans.load(committed), self.plans.load_commit(committed)

    def _next_batch_id(self) -> int:
        committed = self.plans.last_committed()
        return 0 if committed is None else committed + 1

    def _step(self, spark: SparkSession, now: dt.datetime) -> BatchMetrics | None:
        runner = self._runner_for(spark)
        pending = self._pending_replay()
        if pending is not None:
            log.info("%s: replaying interrupted batch %s", self.operator_id, pending.batch_id)
            return runner.execute(pending, None, replayed=True)
        previous, commit = self._previous()
        planner = Planner(self.spec, spark)
        planned: Planned | None = planner.plan(
            batch_id=self._next_batch_id(),
            now=now,
            previous=previous,
            previous_commit=commit,
            new_rows=lambda main, files, snapshot: runner.reader.raw_main(main, files, snapshot),
        )
        if planned is None:
            return None
        plan = planned.plan
        log.info(
            "%s: batch %s planned: main %s, side versions %s, releasing %s",
            self.operator_id,
            plan.batch_id,
            plan.main.describe(),
            plan.side_versions,
            plan.read_slots or "nothing from the buffer",
        )
        if not self.plans.create(planned.plan):
            # Another process planned this batch between our check and our write.
            return runner.execute(self.plans.load(planned.plan.batch_id), None, replayed=True)
        return runner.execute(planned.plan, planned, replayed=False)

"""Write stage: stage every table's data, then commit every table.

1. **Stage** each output the batch writes (main first), then the records that wait (the
   buffer). Staging runs the batch's Spark jobs (the user function, the joins) and
   leaves nothing visible. Any error here, of the data or of the code, stops the batch
   with nothing committed, and the staged files are discarded. A batch whose routes the
   staging job counted (core/batch/route_counts.py) takes its counts here, and its
   invalid records stop it here.
2. **Claim** the plan for commit (:meth:`OperatorState.claim`, put-if-absent): a plan
   another run set aside meanwhile commits nothing.
3. **Commit** each staged table, with the batch's application transaction
   ``(operator id, batch id)``: the buffer's commit also removes the files of the slots
   the batch read; a landing folder's ledger records the files read. A crash between two
   commits is repaired by the next run, which replays the batch from its plan and skips
   every table that already holds the transaction.
"""

import logging
from dataclasses import dataclass
from functools import partial

from pyspark.sql import DataFrame

from dagster_sideinputs.core.batch.buffer import BUFFER_ROUTES, released_files, waiting_rows
from dagster_sideinputs.core.batch.context import Batch, StageContext
from dagster_sideinputs.core.batch.frame_split import one_pass
from dagster_sideinputs.core.batch.invalid_records import check_invalid
from dagster_sideinputs.core.batch.route_counts import count_routes
from dagster_sideinputs.core.columns import SLOT, TAG
from dagster_sideinputs.core.metrics import TableWrite
from dagster_sideinputs.core.outputs import OutputTag
from dagster_sideinputs.core.spark_errors import partly_committed, store_failure, translated
from dagster_sideinputs.core.state.folder import COMMIT
from dagster_sideinputs.delta.engine import (
    AppTransaction,
    DataFile,
    SplitTarget,
    StagedWrite,
    WriteResult,
)
from dagster_sideinputs.delta.store.errors import is_store_error, run_cleanup
from dagster_sideinputs.errors import OperatorStateError

log = logging.getLogger("dagster_sideinputs")
BUFFER = "buffer"


@dataclass(frozen=True)
class _Target:
    """One table a batch writes."""

    label: str
    uri: str
    frame: DataFrame | None
    partition_by: list[str] | None = None
    schema_mode: str | None = None
    buffer: bool = False
    tag: OutputTag | None = None
    mode: str = "append"

    @property
    def removes_released(self) -> bool:
        """The buffer's commit removes the files of the slots read (an overwrite of the
        buffer removes every file itself)."""
        return self.buffer and self.mode == "append"


def write(context: StageContext, batch: Batch) -> Batch:
    spec, plan = context.spec, batch.plan
    txn = AppTransaction(spec.operator_id, plan.batch_id)
    targets = _targets(context, batch)
    writes: dict[str, TableWrite] = {}
    pending = []
    for target in targets:
        if batch.replayed and _holds(context, target.uri, txn):
            writes[target.label] = TableWrite(target.label, target.uri, -1, 0, True, 0.0)
            log.info("batch %s: %s already committed; skipped", plan.batch_id, target.label)
            continue
        pending.append(target)
    staged: list[tuple[_Target, StagedWrite | None]] = []
    shared: dict[str, StagedWrite] = {}
    removed = released_files(batch.buffer, plan)
    try:
        if not _one_job(batch, pending):
            context.share(batch.decoded)
        shared = _stage_function_outputs(context, batch, pending)
        if not shared and len(pending) > 1 and batch.tagged is None:
            context.share(batch.decoded)  # the engine split nothing: a job per table
        one_pass = list(shared)
        for target in pending:
            staged.append(
                (
                    target,
                    shared.pop(target.label, None)
                    or _stage(
                        context,
                        batch,
                        target,
                        removes_files=target.removes_released and bool(removed),
                    ),
                )
            )
        batch = _observed_counts(context, batch)
    except BaseException as exc:
        for stage in [*(stage for _, stage in staged), *shared.values()]:
            if stage is not None:
                _discard(context, stage, during=exc)
        raise
    try:
        decision = context.state.claim(plan, COMMIT)
    except BaseException as exc:  # e.g. the store went down after staging
        for _, stage in staged:
            if stage is not None:
                _discard(context, stage, during=exc)
        raise
    if decision != COMMIT:
        for _, stage in staged:
            if stage is not None:
                spec.engine.discard(stage)
        raise OperatorStateError(
            f"Operator {spec.operator_id!r}: batch {plan.batch_id}'s plan was set aside by "
            "another run (which took the operator's lock over while this run was paused "
            "or cut off longer than the lock's lease) and planned again: this run committed "
            "nothing of it, and the other run's plan holds.",
            fix="nothing to repair: rerun to process what is left; keep runs of one "
            "operator apart (Dagster run concurrency) and the lease above the longest pause",
        )
    meta = {"dsi.operator": spec.operator_id, "dsi.batch": plan.batch_id}
    committed = [label for label, done in writes.items() if done.skipped]
    for index, (target, stage) in enumerate(staged):
        try:
            result = _commit(context, target, stage, txn, meta, removed)
        except BaseException as exc:
            for _, later in staged[index + 1 :]:
                if later is not None:
                    _discard(context, later, during=exc)
            if not committed:
                if is_store_error(exc):  # named by the table it was committing
                    raise store_failure(context, exc, f"committing {target.label!r}") from exc
                raise
            rest = [t.label for t, _ in staged[index:]]
            raise partly_committed(
                context,
                exc,
                batch_id=plan.batch_id,
                committed=committed,
                rest=rest,
                views=batch.views,
            ) from exc
        writes[target.label] = _table_write(target, result)
        committed.append(target.label)
    ledger = context.source.record_read(plan.main, txn)
    if ledger is not None:
        writes["files_seen"] = _table_write(_Target("files_seen", ledger.uri, None), ledger)
    batch = batch.but(writes=writes)
    return batch.noted(f"outputs {one_pass} written in one pass") if one_pass else batch


def _one_job(batch: Batch, pending: list[_Target]) -> bool:
    """Whether one Spark job may stage every pending table: each is an output of the
    function, which the engine can stage together (:func:`_stage_function_outputs`)."""
    return all(t.tag in batch.function_tags and t.frame is not None for t in pending)


def _observed_counts(context: StageContext, batch: Batch) -> Batch:
    """The batch with the routes its staging job counted (core/batch/route_counts.py), or
    counted by a job now when that job did not see every record once; invalid records
    with no table to go to stop the batch here, its outputs staged but not committed."""
    observed, classified = batch.observed, batch.classified
    if observed is None:
        return batch
    assert classified is not None
    spec = context.spec
    counts, notes = observed.counts(), []
    if counts is None:
        counts = translated(context, lambda: count_routes(spec, classified), views=batch.views)
        notes.append("the write job did not see every record once: routes counted by a job")
        if batch.source is not None:
            context.source.record_count_missed(batch.source)
    check_invalid(spec, context.source, classified, counts)
    return batch.but(counts=counts, observed=None).noted(*notes)


def _discard(context: StageContext, stage: StagedWrite, *, during: BaseException) -> None:
    """Discard a stage after ``during`` failed the batch, never in that error's place (a
    store that went down fails the discard too)."""
    run_cleanup(
        partial(context.spec.engine.discard, stage),
        during=during,
        what=f"discarding the files staged for {stage.name}",
    )


def _targets(context: StageContext, batch: Batch) -> list[_Target]:
    """The tables this batch writes: outputs with something to add, then the buffer."""
    spec = context.spec
    routed = {route: 0 for route in (*BUFFER_ROUTES, *spec.routes)}
    for (route, _), values in batch.counts.items():
        routed[route] = routed.get(route, 0) + values["n"]
    builtin = {tag: route for route, tag in spec.routes.items()}
    targets = []
    for tag in spec.all_tags:
        frame = batch.outputs.get(tag)
        if frame is None:
            continue
        route_name = builtin.get(tag)
        nothing = (
            route_name is not None and not routed.get(route_name) and tag not in batch.function_tags
        )
        if nothing and spec.engine.exists(spec.table_uri(tag)):
            continue  # nothing to add: its Spark job would find nothing
        targets.append(
            _Target(
                tag.name, spec.table_uri(tag), frame, schema_mode=spec.options.schema_mode, tag=tag
            )
        )
    waiting = sum(routed[r] for r in BUFFER_ROUTES)
    if waiting or batch.plan.read_slots:
        assert batch.classified is not None
        rows = waiting_rows(batch.classified, batch.main_columns) if waiting else None
        # The main input's schema changed under buffered records: the batch read every
        # slot, and writes the buffer again whole in the new schema (core/batch/buffer_schema.py).
        whole = batch.plan.buffer_rewrite and rows is not None
        targets.append(
            _Target(
                BUFFER,
                spec.buffer_uri,
                rows,
                [SLOT],
                "overwrite" if whole else "merge",
                buffer=True,
                mode="overwrite" if whole else "append",
            )
        )
    return targets


def _stage_function_outputs(
    context: StageContext, batch: Batch, pending: list[_Target]
) -> dict[str, StagedWrite]:
    """A row function's outputs staged by one Spark job, when every output that reads its
    tagged result is exactly the function's records with the same fields and the engine
    can split one write into several tables (:meth:`DeltaEngine.stage_split`): labels to
    their staged writes. Otherwise nothing is staged here, and a tagged result that
    several writes read is persisted first, so that the function runs once per record."""
    tagged = batch.tagged
    if tagged is None:
        return _stage_frames_outputs(context, batch, pending)
    readers = [t for t in pending if t.tag in tagged.layout.tags]
    if len(readers) < 2:
        return {}
    tags = [t.tag for t in readers if t.tag is not None]
    frame = tagged.layout.shared(tagged.frame, tags) if tagged.pure.issuperset(tags) else None
    if frame is not None:
        targets = [
            SplitTarget(tagged.layout.tags.index(tag), t.uri, t.label, t.schema_mode)  # type: ignore[arg-type]
            for t, tag in zip(readers, tags, strict=True)
        ]
        engine, split = context.spec.engine, frame
        staged = translated(
            context,
            lambda: engine.stage_split(split, TAG, targets),
            views=batch.views,
            what="computing outputs " + ", ".join(repr(t.label) for t in readers),
        )
        if staged is not None:
            return {t.label: stage for t, stage in zip(readers, staged, strict=True)}
    context.persist(tagged.frame)
    return {}


def _stage_frames_outputs(
    context: StageContext, batch: Batch, pending: list[_Target]
) -> dict[str, StagedWrite]:
    """A frames function's outputs staged by one Spark job, when they are all one
    DataFrame or filters of it, with the same columns (:func:`frame_split.one_pass`),
    and the engine can split one write into several tables: labels to their staged
    writes; otherwise nothing is staged here."""
    readers = [t for t in pending if t.tag in batch.function_tags and t.frame is not None]
    if len(readers) < 2:
        return {}
    frame = one_pass([t.frame for t in readers if t.frame is not None], TAG)
    if frame is None:
        return {}
    targets = [SplitTarget(i, t.uri, t.label, t.schema_mode) for i, t in enumerate(readers)]  # type: ignore[arg-type]
    engine = context.spec.engine
    staged = translated(
        context,
        lambda: engine.stage_split(frame, TAG, targets),
        views=batch.views,
        what="computing outputs " + ", ".join(repr(t.label) for t in readers),
    )
    if staged is None:
        return {}
    return {t.label: stage for t, stage in zip(readers, staged, strict=True)}


def _holds(context: StageContext, uri: str, txn: AppTransaction) -> bool:
    version = context.spec.engine.transaction_version(uri, txn.app_id)
    return version is not None and version >= txn.version


def _stage(
    context: StageContext, batch: Batch, target: _Target, *, removes_files: bool
) -> StagedWrite | None:
    if target.frame is None:
        return None  # a removal-only buffer commit
    engine = context.spec.engine
    name = f"{context.spec.operator_id} buffer" if target.buffer else target.label
    frame = target.frame
    return translated(
        context,
        lambda: engine.stage(
            frame,
            target.uri,
            partition_by=target.partition_by,
            mode=target.mode,  # type: ignore[arg-type]
            schema_mode=target.schema_mode,  # type: ignore[arg-type]
            name=name,
            removes_files=removes_files,
        ),
        views=batch.views,
        what="computing the records that wait (buffer)"
        if target.buffer
        else f"computing output {target.label!r}",
    )


def _commit(
    context: StageContext,
    target: _Target,
    stage: StagedWrite | None,
    txn: AppTransaction,
    meta: dict[str, object],
    removed: list[DataFile],
) -> WriteResult:
    engine = context.spec.engine
    name = f"{context.spec.operator_id} buffer" if target.buffer else target.label
    if stage is None:
        return engine.commit_removals(
            target.uri, removed, app_transaction=txn, name=name, commit_metadata=meta
        )
    result = engine.commit(
        stage,
        app_transaction=txn,
        remove_files=removed if target.removes_released else (),
        commit_metadata=meta,
        skip_empty_commit=True,
    )
    log.info(
        "batch %s: %s %s (%s rows, version %s, %.1fs)",
        txn.version,
        "skipped" if result.skipped else "wrote",
        target.label,
        result.num_rows,
        result.version,
        result.duration_s,
    )
    return result


def _table_write(target: _Target, result: WriteResult) -> TableWrite:
    return TableWrite(
        target.label, result.uri, result.version, result.num_rows, result.skipped, result.duration_s
    )


__all__ = ["BUFFER", "write"]

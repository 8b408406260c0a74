"""The explicit, documented way to start over: a *reset batch*.

The operator refuses to guess when its state no longer matches its inputs (a main table
deleted and created again, a buffer deleted, an operator id taken by another
declaration). A reset is the user's answer: it commits a batch of its own, so batch ids
keep increasing (the output tables' application transactions stay meaningful), moves
the main-input position where the user says, optionally drops the buffered records,
and records the current declaration as the operator's identity. Output tables are
never touched.
"""

import datetime as dt
import logging
from dataclasses import replace
from typing import Literal

from dagster_sideinputs.core.batch.buffer import load_state
from dagster_sideinputs.core.sources.choice import source_for
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.state import identity
from dagster_sideinputs.core.state.folder import COMMIT, SET_ASIDE, OperatorState
from dagster_sideinputs.core.state.plan import BatchPlan, MainRange
from dagster_sideinputs.core.state.recovery import RESET, Recovery
from dagster_sideinputs.delta.engine import AppTransaction
from dagster_sideinputs.errors import DeclarationError, OperatorStateError

MainFrom = Literal["beginning", "latest", "keep"] | int
log = logging.getLogger("dagster_sideinputs")


def reset(
    spec: OperatorSpec, state: OperatorState, *, main_from: MainFrom, drop_buffered: bool
) -> int:
    """Commit a reset batch (the caller holds the operator's lock); returns its id."""
    if isinstance(main_from, bool) or not (
        isinstance(main_from, int) or main_from in ("beginning", "latest", "keep")
    ):
        raise DeclarationError(
            f"main_from={main_from!r} is not 'beginning', 'latest', 'keep' or a Delta version.",
            fix="pass main_from='keep' (the recorded position), 'beginning', 'latest', or the "
            "main table version after which to read",
        )
    recovery = Recovery(spec, state)
    main, dropped = _position(spec, recovery, main_from)
    pending = recovery.pending()
    if pending is not None:
        if isinstance(pending, BatchPlan) and state.claim(pending, SET_ASIDE) == COMMIT:
            raise OperatorStateError(
                f"Operator {spec.operator_id!r}: batch {pending.batch_id} is claimed for "
                "commit by a run that has not finished it (killed, or still running): a "
                "reset now could let both change the tables.",
                fix="run the operator once (it finishes the batch), then reset",
            )
        state.discard_plan(state.last_planned())  # type: ignore[arg-type]
    held = recovery.committed_versions()
    batch_id = max([recovery.next_batch_id(), *[v + 1 for v in held]])
    txn = AppTransaction(spec.operator_id, batch_id)
    buffer = load_state(spec)
    if drop_buffered and buffer.files():
        spec.engine.commit_removals(
            spec.buffer_uri,
            buffer.files(),
            app_transaction=txn,
            name=f"{spec.operator_id} buffer",
            commit_metadata={"dsi.operator": spec.operator_id, "dsi.reset": batch_id},
        )
    if main_from != "keep":
        source_for(spec).record_reset(main_from, txn)
    plan = BatchPlan(
        operator_id=spec.operator_id,
        batch_id=batch_id,
        now=dt.datetime.now(dt.timezone.utc),
        main=main,
        side_versions={},
        decisions={},
        namespaces={},
        read_slots=(),
        buffer_version=load_state(spec).version,
        watermark=None,
        max_event_time=None,
        routing=RESET,
    )
    state.create_plan(plan)
    state.commit(
        batch_id,
        {
            "batch_id": batch_id,
            "reset": True,
            "main_from": main_from,
            "main": main.to_dict(),
            "dropped": dropped,
            "buffer_rows": load_state(spec).rows(),
        },
    )
    # "reset" is no declaration's fingerprint: records still buffered are routed again
    # (the declaration they were routed under is kept when known, for its window).
    state.write_identity(
        {
            **spec.identity(),
            "routing": RESET,
            "routing_detail": _routing_detail(state),
            **identity.table_ids(spec),
        }
    )
    log.warning("%s: reset at batch %s (main from %s)", spec.operator_id, batch_id, main_from)
    for note in dropped:
        log.warning("%s: reset at batch %s: %s", spec.operator_id, batch_id, note)
    return batch_id


def _routing_detail(state: OperatorState) -> object:
    try:
        return (state.identity() or {}).get("routing_detail")
    except OperatorStateError:  # an unreadable operator.json is what the reset replaces
        return None


def _position(
    spec: OperatorSpec, recovery: Recovery, main_from: MainFrom
) -> tuple[MainRange, list[str]]:
    """Where the next batch reads the main input from (checked before anything changes),
    with a note per position 'keep' had to drop or move (what the inputs no longer hold)."""
    if main_from == "keep":
        try:
            previous = recovery.previous().plan
        except OperatorStateError as exc:
            raise OperatorStateError(
                f"Operator {spec.operator_id!r}: main_from='keep' needs the recorded position, "
                f"which cannot be read: {exc.message}",
                fix="say where to read from: main_from='beginning', 'latest', or (a Delta main "
                "input) the version after which to read",
            ) from exc
        if previous is None:
            raise OperatorStateError(
                f"Operator {spec.operator_id!r} has no recorded position to keep (no committed "
                f"batch in {spec.state_uri}).",
                fix="say where to read from: main_from='beginning', 'latest', or (a Delta main "
                "input) the version after which to read",
            )
        offsets = tuple(replace(r, start=r.end) for r in previous.main.offsets)
        kept = replace(
            previous.main,
            start_version=previous.main.end_version,
            files=(),
            offsets=offsets,
            lost=(),
            anchor=False,
        )
        return source_for(spec).keep(kept)
    return source_for(spec).reset_to(main_from), []

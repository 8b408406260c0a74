"""Checking, at the start of every run, that the operator's state belongs to its tables.

The exactly-once argument relies on identities the operator used to assume: its state
folder belongs to this declaration (not to another operator with the same id), the main
input is the table it has been reading, the buffer is the one it wrote, and its output
tables hold no batch its state does not know. :func:`check` verifies each of them
against ``operator.json`` and the tables' application transactions, and refuses with an
:class:`~dagster_sideinputs.errors.OperatorStateError` naming what changed and how to
proceed. It never skips records to carry on.

It also says whether the declaration's routing changed since the buffered records were
written (then the next batch routes every buffered record again).
"""

import logging
from dataclasses import dataclass
from typing import Any

from dagster_sideinputs.core.buffer import load_state
from dagster_sideinputs.core.spec import OperatorSpec, fingerprint
from dagster_sideinputs.core.state import OperatorState
from dagster_sideinputs.errors import OperatorStateError, TableNotFoundError

log = logging.getLogger("dagster_sideinputs")
_RESET = "`operator.reset(...)` (README, 'Guarantees')"


@dataclass(frozen=True)
class Verdict:
    """What the run may rely on: the recorded identity, and whether to re-route."""

    identity: dict[str, Any]
    routing: str
    reroute: bool


def check(spec: OperatorSpec, state: OperatorState) -> Verdict:
    """Verify the state against the declaration and the tables (see the module docstring).

    Raises:
        OperatorStateError: naming what changed and how to proceed.
    """
    routing = fingerprint(spec.routing())
    recorded = state.identity()
    current = {**spec.identity(), "routing": routing, "routing_detail": spec.routing()}
    if recorded is None:
        if state.is_empty():
            _refuse_orphan_tables(spec)
        else:
            log.info(
                "%s: recording the operator's identity (state of an earlier version)",
                spec.operator_id,
            )
        state.write_identity({**current, "buffer_table_id": buffer_id(spec)})
        return Verdict(current, routing, reroute=False)
    _compare(spec, recorded)
    _check_tables_behind(spec, state)
    _check_buffer(spec, recorded, state)
    reroute = recorded.get("routing") not in (None, routing)
    if reroute:
        _refuse_sliding_change(spec, recorded)
        if load_state(spec).rows() == 0:
            state.write_identity({**recorded, "routing": routing, "routing_detail": spec.routing()})
            reroute = False
    return Verdict(recorded, routing, reroute)


def confirm_routing(spec: OperatorSpec, state: OperatorState, routing: str) -> None:
    """After a batch re-routed the buffer under the current declaration, record it."""
    recorded = state.identity() or {}
    if recorded.get("routing") != routing:
        state.write_identity({**recorded, "routing": routing, "routing_detail": spec.routing()})


def record_buffer(spec: OperatorSpec, state: OperatorState) -> None:
    """Remember the buffer table's id once it exists (a deleted buffer is then noticed)."""
    recorded = state.identity() or {}
    if not recorded.get("buffer_table_id"):
        table_id = buffer_id(spec)
        if table_id:
            state.write_identity({**recorded, "buffer_table_id": table_id})


def buffer_id(spec: OperatorSpec) -> str | None:
    try:
        return spec.engine.snapshot(spec.buffer_uri).table_id or None
    except TableNotFoundError:
        return None


def _compare(spec: OperatorSpec, recorded: dict[str, Any]) -> None:
    mine = spec.identity()
    if recorded.get("main_output") != mine["main_output"]:
        raise OperatorStateError(
            f"Operator id {spec.operator_id!r} is already used by the operator whose main output "
            f"is {recorded.get('main_output')!r} (its state is {spec.state_uri}); this operator's "
            f"main output is {mine['main_output']!r}. Two operators sharing one id would "
            "resume from each other's position.",
            fix="give one of them its own operator_id=...",
        )
    before, now = recorded.get("main_input") or {}, mine["main_input"]
    if before and before != now:
        raise OperatorStateError(
            f"Operator {spec.operator_id!r} has read main input {before.get('uri')!r} "
            f"({before.get('kind')}), but is now declared with {now['uri']!r} ({now['kind']}): "
            "its position refers to the other input.",
            fix=f"use a new operator_id for the new input, or start over with {_RESET}",
        )


def _refuse_orphan_tables(spec: OperatorSpec) -> None:
    """No state, but tables holding this operator's batches: the state was deleted."""
    for tag in spec.all_tags:
        uri = spec.table_uri(tag)
        version = spec.engine.transaction_version(uri, spec.operator_id)
        if version is not None:
            raise OperatorStateError(
                f"Operator {spec.operator_id!r} has no state in {spec.state_uri}, but its output "
                f"{tag.name!r} ({uri}) holds its batch {version}: the state folder (plans, "
                "commit records, buffer) was deleted or moved. Starting from scratch would "
                "process the main input again and duplicate the output.",
                fix=f"restore the state folder, or start over explicitly with {_RESET} after "
                "deciding what happens to the existing output rows",
            )


def _check_tables_behind(spec: OperatorSpec, state: OperatorState) -> None:
    """An output or buffer holding a batch the state never planned: state lost or restored
    from an older backup. Replaying would skip those tables' writes as already done."""
    ids = [i for i in (state.last_committed(), state.last_planned()) if i is not None]
    known = max(ids, default=-1)
    for label, uri in [(t.name, spec.table_uri(t)) for t in spec.all_tags] + [
        ("buffer", spec.buffer_uri)
    ]:
        version = spec.engine.transaction_version(uri, spec.operator_id)
        if version is not None and version > known:
            raise OperatorStateError(
                f"Table {label!r} ({uri}) holds batch {version} of operator {spec.operator_id!r}, "
                f"but the operator's state ({spec.state_uri}) knows batches up to {known} only: "
                "plans or commit records were deleted, or restored from an older backup. New "
                "batches would reuse those ids and be skipped as already written.",
                fix=f"restore the newest state folder, or start over with {_RESET}",
            )


def _check_buffer(spec: OperatorSpec, recorded: dict[str, Any], state: OperatorState) -> None:
    known = recorded.get("buffer_table_id")
    if not known:
        return
    current = buffer_id(spec)
    if current == known:
        return
    what = "was deleted" if current is None else "was replaced by another table"
    raise OperatorStateError(
        f"The buffer of operator {spec.operator_id!r} ({spec.buffer_uri}) {what} after the "
        "operator stored waiting records in it: they would be silently lost.",
        fix="restore the buffer folder from a backup, or acknowledge the loss with "
        "`operator.reset(drop_buffered=True)`",
    )


def _refuse_sliding_change(spec: OperatorSpec, recorded: dict[str, Any]) -> None:
    """Buffered rows of a sliding main window are (record, window) pairs: under another
    window they cannot be turned back into records."""
    before = (recorded.get("routing_detail") or {}).get("window")
    now = spec.routing()["window"]
    if before is None or before == now or before.get("size") == before.get("slide"):
        return
    if load_state(spec).rows():
        raise OperatorStateError(
            f"Operator {spec.operator_id!r} buffers records of sliding windows ({before}), "
            f"and its window changed to {now}: a buffered row is one (record, window) pair, "
            "which another window definition cannot re-route.",
            fix="restore the previous window until the buffer drains (see buffer_rows in the "
            "run metrics), or drop the buffered rows with "
            "`operator.reset(main_from='keep', drop_buffered=True)`",
        )

"""Checking, at the start of every run, that the operator's state belongs to its tables.

The exactly-once argument relies on identities the operator used to assume: its state
folder belongs to this declaration (not to another operator with the same id), the main
input is the table it has been reading, the buffer and the ledger of landed files are
the tables it wrote, ``operator.json`` itself was not deleted, and its output tables hold
no batch its state does not know. (The main table's id, landed files' sizes and times and
side tables' ids are checked where they are read: ``sources/``, ``batch/planner.py``,
``recovery.py``.) :func:`check` verifies each of them
against ``operator.json`` and the tables' application transactions, and refuses with an
:class:`~dagster_sideinputs.errors.OperatorStateError` naming what changed and how to
proceed. It never skips records to carry on.

It also says whether the declaration's routing changed since the buffered records were
written (then the next batch routes every buffered record again).
"""

import logging
from dataclasses import dataclass
from typing import Any

from dagster_sideinputs.core.batch.buffer import load_state
from dagster_sideinputs.core.spec import OperatorSpec, fingerprint
from dagster_sideinputs.core.state.folder import IDENTITY_FILE, OperatorState
from dagster_sideinputs.errors import OperatorStateError, TableNotFoundError

log = logging.getLogger("dagster_sideinputs")
_RESET = "`operator.reset(...)` (docs/operations.md, 'Reset')"


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
        elif state.has_identity_era_plans():
            raise OperatorStateError(
                f"Operator {spec.operator_id!r}: {state.root}/{IDENTITY_FILE} is missing, but "
                "the operator's batches were written with it: it was deleted, and with it "
                "what the recorded position refers to (main input, buffer, declaration).",
                fix=f"restore the file from a backup, or record the current declaration with "
                f"`operator.reset(main_from='keep')` after checking the main input is the one "
                f"read so far ({_RESET})",
            )
        else:
            log.info(
                "%s: recording the operator's identity (state of an earlier version)",
                spec.operator_id,
            )
        state.write_identity({**current, **table_ids(spec)})
        return Verdict(current, routing, reroute=False)
    _compare(spec, recorded)
    _check_tables_behind(spec, state)
    recorded = _check_buffer(spec, recorded, state)
    _check_ledger(spec, recorded)
    reroute = recorded.get("routing") not in (None, routing)
    if reroute:
        _refuse_sliding_change(spec, recorded)
        # With a batch pending, the recorded declaration is what its replay is checked
        # against (recovery.py): it is updated once that batch is settled.
        if load_state(spec).rows() == 0 and not state.has_pending():
            state.write_identity({**recorded, "routing": routing, "routing_detail": spec.routing()})
            reroute = False
    return Verdict(recorded, routing, reroute)


def confirm_routing(spec: OperatorSpec, state: OperatorState, routing: str) -> None:
    """After a batch re-routed the buffer under the current declaration, record it."""
    recorded = state.identity() or {}
    if recorded.get("routing") != routing:
        state.write_identity({**recorded, "routing": routing, "routing_detail": spec.routing()})


def record_buffer(spec: OperatorSpec, state: OperatorState) -> None:
    """Remember the ids of the buffer and the ledger of landed files once they exist (a
    deleted or replaced table is then noticed)."""
    recorded = state.identity() or {}
    missing = {name: value for name, value in table_ids(spec).items() if not recorded.get(name)}
    found = {name: value for name, value in missing.items() if value}
    if found:
        state.write_identity({**recorded, **found})


def table_ids(spec: OperatorSpec) -> dict[str, str | None]:
    """The Delta table ids of the operator's own tables (None: not created yet)."""
    ids = {"buffer_table_id": buffer_id(spec)}
    if spec.main.kind == "files":
        ids["ledger_table_id"] = _table_id(spec, spec.files_seen_uri)
    return ids


def buffer_id(spec: OperatorSpec) -> str | None:
    return _table_id(spec, spec.buffer_uri)


def _table_id(spec: OperatorSpec, uri: str) -> str | None:
    try:
        return spec.engine.snapshot(uri).table_id or None
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
    """An output, the buffer or the ledger holding a batch the state never planned: state
    lost or restored from an older backup. Replaying would skip those tables' writes as
    already done."""
    ids = [i for i in (state.last_committed(), state.last_planned()) if i is not None]
    known = max(ids, default=-1)
    labels = {spec.table_uri(t): t.name for t in spec.all_tags}
    labels.update({spec.buffer_uri: "buffer", spec.files_seen_uri: "files_seen"})
    for uri in spec.written_tables():
        version = spec.engine.transaction_version(uri, spec.operator_id)
        if version is not None and version > known:
            raise OperatorStateError(
                f"Table {labels.get(uri, uri)!r} ({uri}) holds batch {version} of operator "
                f"{spec.operator_id!r}, but the operator's state ({spec.state_uri}) knows "
                f"batches up to {known} only: plans or commit records were deleted, or restored "
                "from an older backup. New batches would reuse those ids and be skipped as "
                "already written.",
                fix=f"restore the newest state folder, or start over with {_RESET}: "
                "main_from='latest' takes the main input as read up to now",
            )


def _check_buffer(
    spec: OperatorSpec, recorded: dict[str, Any], state: OperatorState
) -> dict[str, Any]:
    """The buffer is the table the operator wrote. One deleted while it held no record
    loses nothing: it is forgotten, and created again when records wait."""
    known = recorded.get("buffer_table_id")
    if not known:
        return recorded
    current = buffer_id(spec)
    if current == known:
        return recorded
    if current is None and _left_empty(state):
        log.warning("%s: the empty buffer was deleted; it is created again", spec.operator_id)
        forgotten = {**recorded, "buffer_table_id": None}
        state.write_identity(forgotten)
        return forgotten
    what = "was deleted" if current is None else "was replaced by another table"
    raise OperatorStateError(
        f"The buffer of operator {spec.operator_id!r} ({spec.buffer_uri}) {what} after the "
        "operator stored waiting records in it: they would be silently lost.",
        fix="restore the buffer folder from a backup, or acknowledge the loss with "
        "`operator.reset(drop_buffered=True)`",
    )


def _left_empty(state: OperatorState) -> bool:
    """Whether the last committed batch left no record in the buffer, and none is pending."""
    committed = state.last_committed()
    if committed is None or state.last_planned() not in (None, committed):
        return False
    record = state.load_commit(committed)
    return isinstance(record, dict) and record.get("buffer_rows") == 0


def _check_ledger(spec: OperatorSpec, recorded: dict[str, Any]) -> None:
    """A landing folder's ledger of files read is the position: without it every landed
    file would be read again."""
    known = recorded.get("ledger_table_id")
    if spec.main.kind != "files" or not known:
        return
    current = _table_id(spec, spec.files_seen_uri)
    if current == known:
        return
    what = "was deleted" if current is None else "was replaced by another table"
    raise OperatorStateError(
        f"The ledger of files operator {spec.operator_id!r} has read from "
        f"{spec.main.path!r} ({spec.files_seen_uri}) {what}: every landed file would be read "
        "again, duplicating their records in the outputs.",
        fix="restore the files_seen folder from a backup, or say which files count as read "
        "with `operator.reset(main_from='latest')` (every file there now) or "
        "`operator.reset(main_from='beginning')` (none)",
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

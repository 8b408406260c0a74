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

from dagster_sideinputs.core import identity
from dagster_sideinputs.core.buffer import load_state
from dagster_sideinputs.core.plan import BatchPlan, MainRange
from dagster_sideinputs.core.recovery import Recovery
from dagster_sideinputs.core.sources import source_for
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.state import OperatorState
from dagster_sideinputs.delta.engine import AppTransaction
from dagster_sideinputs.delta.files import TableFiles
from dagster_sideinputs.errors import DeclarationError

MainFrom = Literal["beginning", "latest", "keep"]
log = logging.getLogger("dagster_sideinputs")


def reset(
    spec: OperatorSpec, state: OperatorState, *, main_from: MainFrom, drop_buffered: bool
) -> int:
    """Commit a reset batch (the caller holds the operator's lock); returns its id."""
    if main_from not in ("beginning", "latest", "keep"):
        raise DeclarationError(f"main_from={main_from!r} is not 'beginning', 'latest' or 'keep'.")
    recovery = Recovery(spec, state)
    if recovery.pending() is not None:
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
    main = _position(spec, recovery, main_from, txn)
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
        routing="reset",
    )
    state.create_plan(plan)
    state.commit(batch_id, {"batch_id": batch_id, "reset": True, "main_from": main_from})
    # "reset" is no declaration's fingerprint: records still buffered are routed again.
    state.write_identity(
        {**spec.identity(), "routing": "reset", "buffer_table_id": identity.buffer_id(spec)}
    )
    log.warning("%s: reset at batch %s (main from %s)", spec.operator_id, batch_id, main_from)
    return batch_id


def _position(
    spec: OperatorSpec, recovery: Recovery, main_from: MainFrom, txn: AppTransaction
) -> MainRange:
    previous = recovery.previous().plan
    if main_from == "keep" and previous is not None:
        offsets = tuple(replace(r, start=r.end) for r in previous.main.offsets)
        return replace(
            previous.main,
            start_version=previous.main.end_version,
            files=(),
            offsets=offsets,
            lost=(),
            anchor=False,
        )
    if spec.main.is_kafka:
        if main_from == "latest":
            # Every partition's position at its log end, under the topics' current ids.
            now = source_for(spec).next_range(None).range
            ends = tuple(
                replace(r, start=r.log_end or r.end, end=r.log_end or r.end) for r in now.offsets
            )
            return replace(now, offsets=ends, lost=(), anchor=False)
        return MainRange("kafka")  # no position: every partition from its earliest offset
    if spec.main.is_files:
        if main_from == "beginning":
            TableFiles(spec.state_uri, spec.storage.storage_options).delete_dir("files_seen")
        elif main_from == "latest":
            source = source_for(spec)
            source.record_read(source.next_range(None).range, txn)
        return MainRange("files")
    if main_from == "latest" and spec.engine.exists(spec.main_uri):
        latest = spec.engine.snapshot(spec.main_uri, name=spec.main.asset)
        return MainRange("delta", latest.version, latest.version, table_id=latest.table_id)
    return MainRange("delta", -1, -1)

"""Recovery: what an operator's next step does with an incomplete batch.

A batch whose plan has no commit record is either

- **replayed** exactly from its plan, when some table it may write (an output, the
  buffer, a landing folder's ledger) already holds its application transaction: the
  transactions then keep every table exactly-once. Only under the declaration routing
  and the side tables the plan was made with: otherwise the replay could not compute
  what the committed tables hold, and it is refused;
- **set aside and planned again** from the current inputs, when no table committed
  anything and no run claimed the plan for commit (``claims/``, decided once, atomically:
  a run that claimed it may still be committing): then a fix of the inputs (a
  deduplicated side table, a corrected record) takes effect instead of the failure being
  pinned by the old plan.

An unreadable plan is set aside only when no table holds its batch; an unreadable commit
record is dropped, so its batch is replayed (idempotently) and the record rewritten; a
lost plan of a committed batch is rebuilt from its commit record (which repeats the
position). A pending reset batch (interrupted after its table changes) is completed.
"""

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.state.folder import COMMIT, SET_ASIDE, OperatorState, Unreadable
from dagster_sideinputs.core.state.plan import BatchPlan, MainRange, Previous, describe_change
from dagster_sideinputs.errors import OperatorStateError

log = logging.getLogger("dagster_sideinputs")
RESET = "reset"
"""The routing of a reset batch's plan (no declaration has this fingerprint)."""


class Recovery:
    """Reads an operator's state to decide its next step."""

    def __init__(self, spec: OperatorSpec, state: OperatorState) -> None:
        self.spec = spec
        self.state = state

    def pending(self) -> BatchPlan | Unreadable | None:
        """The last planned batch when it has no commit record yet."""
        planned, committed = self.state.last_planned(), self.state.last_committed()
        if planned is None or (committed is not None and planned <= committed):
            return None
        return self.state.load_plan(planned)

    def committed_anywhere(self, batch_id: int, tables: Sequence[str]) -> list[str]:
        engine = self.spec.engine
        holding = []
        for uri in dict.fromkeys([*tables, *self.spec.written_tables()]):
            version = engine.transaction_version(uri, self.spec.operator_id)
            if version is not None and version >= batch_id:
                holding.append(uri)
        return holding

    def committed_versions(self) -> list[int]:
        engine = self.spec.engine
        versions = (
            engine.transaction_version(u, self.spec.operator_id) for u in self.spec.written_tables()
        )
        return [v for v in versions if v is not None]

    def settle_pending(self, routing: str | None = None) -> BatchPlan | None:
        """The pending batch to replay, or None after setting aside a plan no table committed
        (it is planned again from the current inputs, so a fix of the inputs applies).

        Args:
            routing: the current declaration's routing fingerprint: a batch written in
                part under another one is not finished under this one.

        Raises:
            OperatorStateError: the pending batch cannot be finished exactly (its plan is
                unreadable, the declaration changed, a side table it read was replaced).
        """
        pending = self.pending()
        if pending is None:
            return None
        batch_id = self.state.last_planned()
        assert batch_id is not None
        tables = pending.tables if isinstance(pending, BatchPlan) else ()
        holding = self.committed_anywhere(batch_id, tables)
        if isinstance(pending, Unreadable):
            if holding:
                raise OperatorStateError(
                    f"Operator {self.spec.operator_id!r}: plan file {pending.path} cannot be read "
                    f"({pending.problem}), and tables {holding} already hold that batch: it "
                    "cannot be replayed exactly.",
                    fix="restore the plan file from a backup and rerun; otherwise "
                    "`operator.reset(main_from='keep')` reads that batch's main records again "
                    f"(none is lost; those {holding} hold appear there twice) (docs/operations.md, "
                    "'Reset')",
                )
            log.warning("%s: unreadable plan %s set aside", self.spec.operator_id, pending.path)
        elif pending.routing == RESET:
            # An interrupted reset made its table changes before writing its plan.
            self.state.commit(batch_id, {"batch_id": batch_id, "reset": True})
            return None
        elif holding:
            self._check_replayable(pending, holding, routing)
            return pending
        elif self.state.claim(pending, SET_ASIDE) == COMMIT:
            # A run claimed the plan for commit and has not committed yet (killed, or
            # paused past its lease and maybe still running): only a replay is safe.
            self._check_replayable(pending, ["its claim"], routing)
            return pending
        else:
            log.info(
                "%s: batch %s was planned but no table committed it: planning it again",
                self.spec.operator_id,
                batch_id,
            )
        self.state.discard_plan(batch_id)
        return None

    def _check_replayable(
        self, plan: BatchPlan, holding: Sequence[str], routing: str | None
    ) -> None:
        """A replay must compute what the committed tables already hold: the same
        declaration and the same side tables as the plan's."""
        where = (
            f"Operator {self.spec.operator_id!r}: batch {plan.batch_id} is written in part "
            f"({list(holding)} hold it)"
        )
        if routing and plan.routing and plan.routing != routing:
            before = (self.state.identity() or {}).get("routing_detail")
            change = describe_change(before, self.spec.routing()) if before else ""
            raise OperatorStateError(
                f"{where}, and the declaration changed since it was planned{change}: finishing "
                "it under the new declaration could place some of its records twice and "
                "others nowhere.",
                fix="restore the previous declaration and rerun once to finish the batch, then "
                "change it",
            )
        engine = self.spec.engine
        for bound in self.spec.sides:
            version = plan.side_versions.get(bound.name)
            known = plan.side_ids.get(bound.name)
            if version is None:
                continue
            current = engine.snapshot(bound.uri).table_id if engine.exists(bound.uri) else None
            if current is None or (known and current and current != known):
                what = "is gone" if current is None else "was deleted and created again"
                raise OperatorStateError(
                    f"{where}, and {bound.label} ({bound.uri}), whose version {version} it read, "
                    f"{what}: the rest of the batch cannot be computed as its first tables were.",
                    fix="restore the side table (its Delta log and files) and rerun to finish the "
                    "batch; otherwise start over with `operator.reset(...)` (docs/operations.md, "
                    "'Reset'), accepting that batch's records may be missing or repeated",
                )

    def previous(self) -> Previous:
        """The last committed batch. An unreadable commit record is dropped: its batch is
        then pending, and replaying it (idempotent) writes the record again. A lost or
        unreadable plan of a committed batch is rebuilt from its commit record, which
        repeats the position (main-input range, side tables)."""
        while True:
            committed = self.state.last_committed()
            if committed is None:
                return Previous()
            record = self.state.load_commit(committed)
            if not isinstance(record, Unreadable):
                return Previous(self._committed_plan(committed, record), record)
            log.warning("%s: unreadable commit record %s", self.spec.operator_id, record.path)
            self.state.drop_commit(committed)

    def _committed_plan(self, batch_id: int, record: Mapping[str, Any]) -> BatchPlan:
        loaded = self.state.load_plan(batch_id)
        if isinstance(loaded, BatchPlan):
            return loaded
        main = record.get("main")
        if not isinstance(main, Mapping):
            raise OperatorStateError(
                f"Operator {self.spec.operator_id!r}: the plan of committed batch {batch_id} "
                f"({loaded.path}) cannot be read ({loaded.problem}), and its commit record "
                "does not repeat the position: where the main input was read up to is lost.",
                fix="restore the plan file from a backup, or say where to read from with "
                "`operator.reset(main_from='latest' | 'beginning' | <Delta version>)` "
                "(docs/operations.md, 'Reset')",
            )
        log.warning(
            "%s: plan %s (%s) rebuilt from its commit record",
            self.spec.operator_id,
            loaded.path,
            loaded.problem,
        )
        return BatchPlan(
            operator_id=self.spec.operator_id,
            batch_id=batch_id,
            now=dt.datetime.fromtimestamp(0, dt.timezone.utc),
            main=MainRange.from_dict(main),
            side_versions=dict(record.get("side_versions") or {}),
            decisions={},
            namespaces={},
            read_slots=(),
            buffer_version=-1,
            watermark=None,
            max_event_time=None,
            routing=str(record.get("routing") or ""),
            side_ids=dict(record.get("side_ids") or {}),
        )

    def next_batch_id(self) -> int:
        known = [
            i for i in (self.state.last_committed(), self.state.last_planned()) if i is not None
        ]
        return max(known) + 1 if known else 0

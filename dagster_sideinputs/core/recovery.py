"""Recovery: what an operator's next step does with an incomplete batch.

A batch whose plan has no commit record is either

- **replayed** exactly from its plan, when some table it may write (an output, the
  buffer, a landing folder's ledger) already holds its application transaction: the
  transactions then keep every table exactly-once;
- **set aside and planned again** from the current inputs, when no table committed
  anything: then a fix of the inputs (a deduplicated side table, a corrected record)
  takes effect instead of the failure being pinned by the old plan.

An unreadable plan is set aside only when no table holds its batch; an unreadable commit
record is dropped, so its batch is replayed (idempotently) and the record rewritten.
"""

import logging
from collections.abc import Sequence

from dagster_sideinputs.core.plan import BatchPlan
from dagster_sideinputs.core.planner import Previous
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.state import OperatorState, Unreadable
from dagster_sideinputs.errors import OperatorStateError

log = logging.getLogger("dagster_sideinputs")


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

    def settle_pending(self) -> BatchPlan | None:
        """The pending batch to replay, or None after setting aside a plan no table committed
        (it is planned again from the current inputs, so a fix of the inputs applies)."""
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
                    fix="restore the plan file from a backup, or start over with "
                    "`operator.reset(...)` (README, 'Guarantees')",
                )
            log.warning("%s: unreadable plan %s set aside", self.spec.operator_id, pending.path)
        elif holding:
            return pending
        else:
            log.info(
                "%s: batch %s was planned but no table committed it: planning it again",
                self.spec.operator_id,
                batch_id,
            )
        self.state.discard_plan(batch_id)
        return None

    def previous(self) -> Previous:
        """The last committed batch. An unreadable commit record is dropped: its batch is
        then pending, and replaying it (idempotent) writes the record again."""
        while True:
            committed = self.state.last_committed()
            if committed is None:
                return Previous()
            record = self.state.load_commit(committed)
            if not isinstance(record, Unreadable):
                return Previous(self.state.plan(committed), record)
            log.warning("%s: unreadable commit record %s", self.spec.operator_id, record.path)
            self.state.drop_commit(committed)

    def next_batch_id(self) -> int:
        known = [
            i for i in (self.state.last_committed(), self.state.last_planned()) if i is not None
        ]
        return max(known) + 1 if known else 0

"""The operator's state folder: batch plans, commit records, and its identity.

``<root>/_sideinputs/<operator id>/`` holds:

- ``plans/<batch>.json``: a batch's plan, created exclusively (two runs cannot plan
  the same batch) before the batch reads or writes data;
- ``claims/<batch>-<plan>.json``: what became of one plan of a batch, created
  exclusively (put-if-absent on object stores) before anything of it is committed, or
  before it is set aside: ``commit`` or ``set aside``, whichever run comes first. A run
  paused past its lock's lease whose plan another run set aside (and planned again) finds
  ``set aside`` and commits nothing, so two plans of one batch never both commit;
- ``commits/<batch>.json``: written last, when every table of the batch is committed;
- ``operator.json``: what the recorded position refers to (operator id, main output,
  main input location and table id, the declaration the buffer was routed under),
  checked on every run so that a state can never be applied to other tables;
- ``buffer/`` and ``files_seen/``: Delta tables (the buffer, the landed files read).

Only the newest plans and commit records are kept (:data:`KEEP`): a run reads the last
committed batch and at most one pending plan, so listing stays cheap however long the
operator has run.
"""

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from dagster_sideinputs.core.state.plan import BatchPlan
from dagster_sideinputs.delta.store.files import TableFiles
from dagster_sideinputs.errors import OperatorStateError

KEEP = 20
IDENTITY_FILE = "operator.json"
COMMIT = "commit"
SET_ASIDE = "set aside"
_RESET_FIX = (
    "restore the operator's state folder from a backup, or start over explicitly with "
    "`operator.reset(...)` (docs/operations.md, 'Reset')"
)


@dataclass(frozen=True)
class Unreadable:
    """A plan or commit record that exists but cannot be parsed (truncated, edited)."""

    path: str
    problem: str


class OperatorState:
    """Reads and writes one operator's state folder."""

    def __init__(self, files: TableFiles, operator_id: str) -> None:
        self.files = files
        self.operator_id = operator_id

    @property
    def root(self) -> str:
        return self.files.root

    # --- listing ------------------------------------------------------------------------

    def _ids(self, folder: str) -> list[int]:
        ids = []
        for entry in self.files.list_files(folder):
            name = entry.path.rsplit("/", 1)[-1]
            if "/" in entry.path[len(folder) + 1 :]:
                continue  # discarded plans live in a subfolder
            if name.endswith(".json") and name[:-5].isdigit():
                ids.append(int(name[:-5]))
        return sorted(ids)

    def last_planned(self) -> int | None:
        ids = self._ids("plans")
        return ids[-1] if ids else None

    def last_committed(self) -> int | None:
        ids = self._ids("commits")
        return ids[-1] if ids else None

    def has_pending(self) -> bool:
        """Whether the newest plan has no commit record yet."""
        planned, committed = self.last_planned(), self.last_committed()
        return planned is not None and (committed is None or planned > committed)

    def is_empty(self) -> bool:
        return self.last_planned() is None and self.last_committed() is None

    # --- plans ---------------------------------------------------------------------------

    @staticmethod
    def _plan_path(batch_id: int) -> str:
        return f"plans/{batch_id:020d}.json"

    @staticmethod
    def _commit_path(batch_id: int) -> str:
        return f"commits/{batch_id:020d}.json"

    def create_plan(self, plan: BatchPlan) -> bool:
        """Write a new plan; False when a plan for that batch already exists."""
        return self.files.write_bytes_atomic(
            self._plan_path(plan.batch_id), plan.to_json().encode(), exclusive=True
        )

    def load_plan(self, batch_id: int) -> BatchPlan | Unreadable:
        path = self._plan_path(batch_id)
        try:
            raw = self.files.read_bytes(path)
        except FileNotFoundError:
            return Unreadable(f"{self.root}/{path}", "missing")
        try:
            plan = BatchPlan.from_json(raw.decode())
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            return Unreadable(f"{self.root}/{path}", f"{type(exc).__name__}: {exc}")
        if plan.batch_id != batch_id or plan.operator_id != self.operator_id:
            return Unreadable(
                f"{self.root}/{path}",
                f"it belongs to batch {plan.batch_id} of operator {plan.operator_id!r}",
            )
        return plan

    def plan(self, batch_id: int) -> BatchPlan:
        """A plan that must be readable (the last committed batch's)."""
        loaded = self.load_plan(batch_id)
        if isinstance(loaded, Unreadable):
            raise OperatorStateError(
                f"Operator {self.operator_id!r}: plan file {loaded.path} cannot be read "
                f"({loaded.problem}).",
                fix=_RESET_FIX,
            )
        return loaded

    def has_identity_era_plans(self) -> bool:
        """Whether the newest plan or commit record was written by a version that keeps
        ``operator.json`` (plans of format 2 and later, commit records with a routing):
        such a state cannot lack the file because it predates it."""
        for batch_id in reversed(self._ids("plans")):
            data = self._json(self._plan_path(batch_id))
            if data is not None:
                return int(data.get("format") or 1) >= 2
        for batch_id in reversed(self._ids("commits")):
            data = self._json(self._commit_path(batch_id))
            if data is not None:
                return "routing" in data or "reset" in data
        return False

    def _json(self, path: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self.files.read_bytes(path).decode())
        except (FileNotFoundError, ValueError, UnicodeDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def discard_plan(self, batch_id: int) -> None:
        """Set aside a plan no table committed, so the batch is planned again."""
        path = self._plan_path(batch_id)
        try:
            raw = self.files.read_bytes(path)
        except FileNotFoundError:
            return
        self.files.write_bytes_atomic(
            f"plans/discarded/{batch_id:020d}-{uuid.uuid4().hex[:8]}.json", raw
        )
        self.files.delete_file(path)

    # --- claims: which plan of a batch commits --------------------------------------------

    @staticmethod
    def _claim_path(plan: BatchPlan) -> str:
        # planned_by is unique per plan (host, pid and a random part); hashed, it is a key
        # every object store takes.
        digest = hashlib.sha256(plan.planned_by.encode()).hexdigest()[:16]
        return f"claims/{plan.batch_id:020d}-{digest}.json"

    def claim(self, plan: BatchPlan, action: str) -> str:
        """Decide, once and atomically, whether ``plan`` commits or is set aside.

        The first run to create the plan's claim (exclusively: an object store's
        put-if-absent, ``O_EXCL`` on a filesystem) decides; later runs read its decision.

        Args:
            plan: the batch plan.
            action: :data:`COMMIT` or :data:`SET_ASIDE`, what this run is about to do.

        Returns:
            The decision that holds: ``action`` when this run made it (or an earlier run
            made the same one), the other one when another run came first.
        """
        path = self._claim_path(plan)
        record = json.dumps({"batch_id": plan.batch_id, "action": action}).encode()
        if self.files.write_bytes_atomic(path, record, exclusive=True):
            return action
        found = self._json(path)
        if found is None or found.get("action") not in (COMMIT, SET_ASIDE):
            # Created, but not readable (yet): put-if-absent writes whole objects, so only a
            # damaged file gets here; committing on it could double a batch.
            raise OperatorStateError(
                f"Operator {self.operator_id!r}: the claim {self.root}/{path} of batch "
                f"{plan.batch_id} cannot be read: whether its plan commits is unknown.",
                fix="remove the claim file if no other run of this operator is running, then rerun",
            )
        return str(found["action"])

    # --- commit records --------------------------------------------------------------

    def commit(self, batch_id: int, record: dict[str, Any]) -> None:
        self.files.write_bytes_atomic(
            self._commit_path(batch_id), json.dumps(record, default=str, indent=1).encode()
        )

    def load_commit(self, batch_id: int) -> dict[str, Any] | Unreadable:
        path = self._commit_path(batch_id)
        try:
            record = json.loads(self.files.read_bytes(path).decode())
        except FileNotFoundError:
            return Unreadable(f"{self.root}/{path}", "missing")
        except (ValueError, UnicodeDecodeError) as exc:
            return Unreadable(f"{self.root}/{path}", f"{type(exc).__name__}: {exc}")
        if not isinstance(record, dict):
            return Unreadable(f"{self.root}/{path}", "not a JSON object")
        return record

    def drop_commit(self, batch_id: int) -> None:
        """Forget an unreadable commit record: the batch is then replayed (idempotently)
        and its record written again."""
        self.files.delete_file(self._commit_path(batch_id))

    def prune(self, *, keep: int | None = None) -> None:
        """Delete plans and commit records older than the newest ``keep`` (default
        :data:`KEEP`) committed batches."""
        keep = KEEP if keep is None else keep
        committed = self._ids("commits")
        if len(committed) <= keep:
            return
        cutoff = committed[-keep]
        for batch_id in committed:
            if batch_id >= cutoff:
                break
            self.files.delete_file(self._commit_path(batch_id))
        for batch_id in self._ids("plans"):
            if batch_id >= cutoff:
                break
            self.files.delete_file(self._plan_path(batch_id))
        for entry in self.files.list_files("claims"):
            name = entry.path.rsplit("/", 1)[-1]
            if name[:20].isdigit() and int(name[:20]) < cutoff:
                self.files.delete_file(entry.path)

    # --- identity ------------------------------------------------------------------------

    def identity(self) -> dict[str, Any] | None:
        try:
            raw = self.files.read_bytes(IDENTITY_FILE)
        except FileNotFoundError:
            return None
        try:
            data = json.loads(raw.decode())
        except (ValueError, UnicodeDecodeError) as exc:
            raise OperatorStateError(
                f"Operator {self.operator_id!r}: {self.root}/{IDENTITY_FILE} cannot be read "
                f"({exc}).",
                fix=_RESET_FIX,
            ) from exc
        return data if isinstance(data, dict) else None

    def write_identity(self, identity: dict[str, Any]) -> None:
        self.files.write_bytes_atomic(
            IDENTITY_FILE, json.dumps(identity, indent=1, sort_keys=True).encode()
        )

    def clear(self) -> None:
        """Delete plans, their claims, commit records and identity (the reset path)."""
        for folder in ("plans", "claims", "commits"):
            self.files.delete_dir(folder)
        self.files.delete_file(IDENTITY_FILE)

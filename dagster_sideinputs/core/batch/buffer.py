"""The buffer: main records waiting for readiness, stored durably in a Delta table.

Everything about buffering lives here: which slots a batch reads (slot choice), reading
them, the limits (rows, age) and overflow, the rows written back, and the buffer's
numbers after a batch.

The table is partitioned by *slot*: one slot per main namespace whose side inputs are
not ready (``ns=<namespace>``) and one per namespace for records waiting for the side
row of their key (``key=<namespace>``). A namespace becomes ready as a whole, so
releasing it removes its slot's files in the same commit that adds the batch's newly
buffered records: the cost is that of the released records, not of the whole buffer.
Key-waiting records are re-checked together (read and rewritten) when a keyed side
input changes or a timeout falls due.

Each buffered record keeps its main-input columns plus bookkeeping columns: its
namespace window, key group, when it was first seen, the batch that first saw it, a
deterministic fingerprint (for a stable order), and why it waits.
"""

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import Window as SparkWindow
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.columns import (
    BATCH,
    FINGERPRINT,
    FIRST_SEEN,
    KEY_GROUP,
    NS_END,
    NS_ID,
    NS_START,
    ORIGIN,
    REASON,
    ROUTE,
    SLOT,
    comparable,
    quoted,
)
from dagster_sideinputs.core.metrics import human_duration
from dagster_sideinputs.core.sideinputs.windows import as_utc, shifted, utc_of
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.state.plan import BatchPlan, NamespacePlan
from dagster_sideinputs.delta.engine import DataFile, TableSnapshot
from dagster_sideinputs.errors import BufferLimitExceededError

BUFFER_ROUTES = ("buffered", "key_wait")
BOOKKEEPING = (NS_START, NS_END, KEY_GROUP, FIRST_SEEN, BATCH, FINGERPRINT, REASON, SLOT)
Counts = dict[tuple[str, str], dict]


def namespace_slot(namespace: str) -> str:
    """The slot of records waiting for their namespace to become ready."""
    return f"ns={namespace}"


def keywait_slot(namespace: str) -> str:
    """The slot of records of a ready namespace waiting for the side row of their key."""
    return f"key={namespace}"


def slot_namespace(slot: str) -> str:
    return slot.split("=", 1)[1]


def is_keywait(slot: str) -> bool:
    return slot.startswith("key=")


def fingerprint(schema: T.StructType, columns: Sequence[str]) -> Column:
    """A deterministic 64-bit fingerprint of a record: the tie-breaker of buffer order.

    Spark refuses to hash maps and variants (anywhere in a column's type); such a column
    is hashed through its string form, which is as deterministic for one record."""
    return F.xxhash64(*[_hashable(c, schema[c].dataType) for c in columns])


def _hashable(column: str, data_type: T.DataType) -> Column:
    value = F.col(quoted(column))
    return value if comparable(data_type) else value.cast("string")


@dataclass(frozen=True)
class BufferState:
    """The buffer at a pinned version, from the Delta log only (no data read)."""

    snapshot: TableSnapshot | None

    @property
    def version(self) -> int:
        return -1 if self.snapshot is None else self.snapshot.version

    def slots(self) -> list[str]:
        if self.snapshot is None:
            return []
        return sorted({str(f.partition_values.get(SLOT)) for f in self.snapshot.files})

    def files(self, slots: Sequence[str] | None = None) -> list[DataFile]:
        if self.snapshot is None:
            return []
        wanted = None if slots is None else set(slots)
        return [
            f
            for f in self.snapshot.files
            if wanted is None or f.partition_values.get(SLOT) in wanted
        ]

    def rows(self, slots: Sequence[str] | None = None) -> int:
        return sum(f.num_records or 0 for f in self.files(slots))

    def oldest(self, slots: Sequence[str] | None = None) -> dt.datetime | None:
        """Earliest first-seen time, from file statistics."""
        stamps = [f.min_values.get(FIRST_SEEN) for f in self.files(slots)]
        present = [as_utc(s) for s in stamps if s is not None]
        return min(present) if present else None

    def namespaces(self) -> list[str]:
        """Every namespace with buffered records."""
        return sorted({slot_namespace(slot) for slot in self.slots()})

    def keywait_slots(self) -> list[str]:
        return [slot for slot in self.slots() if is_keywait(slot)]


def load_state(spec: OperatorSpec, version: int | None = None) -> BufferState:
    """The buffer at ``version`` (latest when None); empty when it does not exist yet."""
    if version is not None and version < 0:
        return BufferState(None)
    if version is None and not spec.engine.exists(spec.buffer_uri):
        return BufferState(None)
    name = f"{spec.operator_id} buffer"
    return BufferState(spec.engine.snapshot(spec.buffer_uri, version=version, name=name))


# --- slot choice (planning) -------------------------------------------------------------


def choose_slots(
    spec: OperatorSpec,
    buffer: BufferState,
    namespaces: Mapping[str, NamespacePlan],
    *,
    side_changed: bool,
    incoming: int | None,
    now: dt.datetime,
    reroute: bool,
) -> tuple[str, ...]:
    """The slots a batch reads: every slot when the declaration changed or the limits
    force an overflow; else the slots of ready namespaces (key-waiting ones only when a
    keyed side input changed or a timeout fell due)."""
    slots = buffer.slots()
    if not slots:
        return ()
    if reroute or _overflow_due(spec, buffer, incoming, now):
        return tuple(slots)
    ready = {ns for ns, plan in namespaces.items() if plan.ready}
    chosen = [namespace_slot(ns) for ns in ready if namespace_slot(ns) in slots]
    waiting = [keywait_slot(ns) for ns in ready if keywait_slot(ns) in slots]
    if waiting and _recheck_keys(spec, buffer, side_changed=side_changed, now=now):
        chosen.extend(waiting)
    return tuple(sorted(chosen))


def _recheck_keys(
    spec: OperatorSpec, buffer: BufferState, *, side_changed: bool, now: dt.datetime
) -> bool:
    waits = spec.keyed_waits
    temporal = [b for b in spec.sides if b.side.as_of is not None]
    if not (waits or temporal) or side_changed:
        return True  # no wait declared any more: let the records through once
    slots = buffer.keywait_slots()
    if waits:
        oldest = buffer.oldest(slots)
        shortest = min(b.side.timeout for b in waits if b.side.timeout is not None)
        if oldest is None or shifted(oldest, shortest) <= as_utc(now):
            return True
    if temporal:
        # Records waiting for an as-of side input's horizon: due when the grace after
        # their event time passed, or (Delta history, whose horizon is the clock) when
        # the clock reached their time.
        column = spec.window.time_column if spec.window is not None else spec.main.event_time
        # Statistics' minimums are lower bounds (time_stats): due no later than exact.
        times = [f.min_values.get(column) for f in buffer.files(slots)] if column else []
        if any(t is None for t in times):
            return True
        earliest = min((utc_of(t) for t in times), default=None)
        if earliest is None:
            return False
        for bound in temporal:
            history = bound.side.as_of is not None and bound.side.as_of.is_history
            grace = bound.side.grace
            if (history and earliest <= as_utc(now)) or (
                grace is not None and shifted(earliest, grace) <= as_utc(now)
            ):
                return True
    return False


def _overflow_due(
    spec: OperatorSpec, buffer: BufferState, incoming: int | None, now: dt.datetime
) -> bool:
    limits = spec.options.buffer
    if limits.on_exceed != "overflow":
        return False
    oldest = buffer.oldest()
    if (
        limits.max_age is not None
        and oldest is not None
        and oldest < shifted(now, limits.max_age, back=True)
    ):
        return True
    if limits.max_rows is None:
        return False
    if incoming is None:
        return buffer.rows() > 0
    # A record is buffered once per window it belongs to (several for sliding windows).
    rows_per_record = spec.window.size // spec.window.slide if spec.window is not None else 1
    return buffer.rows() + incoming * rows_per_record > limits.max_rows


# --- reading -----------------------------------------------------------------------------


def read_slots(
    spec: OperatorSpec, spark: SparkSession, plan: BatchPlan
) -> tuple[DataFrame | None, BufferState]:
    """The buffered records of the plan's slots (with their bookkeeping), and the buffer
    at the plan's pinned version."""
    state = load_state(spec, plan.buffer_version)
    files = state.files(plan.read_slots) if plan.read_slots else []
    if not files or state.snapshot is None:
        return None, state
    rows = spec.engine.read_snapshot(
        spark, state.snapshot, files=files, name=f"{spec.operator_id} buffer"
    )
    return rows.drop(SLOT, REASON).withColumn(ORIGIN, F.lit("buffer")), state


# --- after the batch ---------------------------------------------------------------------


@dataclass(frozen=True)
class AfterBatch:
    """The buffer once the batch commits: rows and the oldest first-seen time."""

    rows: int
    oldest: dt.datetime | None

    def age_s(self, now: dt.datetime) -> float | None:
        return None if self.oldest is None else (as_utc(now) - self.oldest).total_seconds()


def after_batch(plan: BatchPlan, state: BufferState, counts: Counts) -> AfterBatch:
    unread = [s for s in state.slots() if s not in plan.read_slots]
    incoming = sum(v["n"] for (route, _), v in counts.items() if route in BUFFER_ROUTES)
    stamps = [
        as_utc(v["oldest"])
        for (route, _), v in counts.items()
        if route in BUFFER_ROUTES and v["oldest"]
    ]
    unread_oldest = state.oldest(unread)
    if unread_oldest is not None:
        stamps.append(unread_oldest)
    return AfterBatch(state.rows(unread) + incoming, min(stamps, default=None))


# --- limits and overflow ----------------------------------------------------------------


def enforce_limits(
    spec: OperatorSpec,
    plan: BatchPlan,
    classified: DataFrame,
    counts: Counts,
    state: BufferState,
    recount: Callable[[DataFrame], Counts],
) -> tuple[DataFrame, Counts]:
    """Check the buffer's limits before anything is written: fail, or route the oldest
    records to the overflow tag (reclassified and recounted)."""
    limits = spec.options.buffer
    after = after_batch(plan, state, counts)
    too_many = limits.max_rows is not None and after.rows > limits.max_rows
    too_old = (
        limits.max_age is not None
        and after.oldest is not None
        and after.oldest < shifted(plan.now, limits.max_age, back=True)
    )
    if not (too_many or too_old):
        return classified, counts
    problem = (
        f"{after.rows} rows (limit {limits.max_rows})"
        if too_many
        else f"a record first seen {after.oldest.isoformat() if after.oldest else '?'} "
        f"(max age {human_duration(limits.max_age)})"
    )
    cutoff_time = None if limits.max_age is None else shifted(plan.now, limits.max_age, back=True)
    unread = [s for s in state.slots() if s not in plan.read_slots]
    unread_oldest = state.oldest(unread)
    # Overflow moves records this batch holds. The planner reads every slot when an
    # overflow may be due, so these include the oldest; should its estimate fall short,
    # the records of this batch still overflow as long as the unread ones fit (an error
    # here would be repeated by every rerun: the operator would be stuck).
    unread_fit = (limits.max_rows is None or state.rows(unread) <= limits.max_rows) and (
        cutoff_time is None or unread_oldest is None or unread_oldest >= cutoff_time
    )
    if limits.on_exceed == "fail" or not unread_fit:
        raise BufferLimitExceededError(
            f"The buffer of operator {spec.operator_id!r} would hold {problem} after batch "
            f"{plan.batch_id}. Nothing was written; buffered records are intact.",
            fix="make the side inputs ready (see the readiness reasons in the run metrics), "
            "raise BufferLimits(max_rows=..., max_age=...), or use on_exceed='overflow' with "
            "an overflow tag",
        )
    excess = max(0, after.rows - (limits.max_rows if limits.max_rows is not None else after.rows))
    order = SparkWindow.orderBy(F.col(FIRST_SEEN), F.col(BATCH), F.col(FINGERPRINT))
    waiting = F.col(ROUTE).isin(*BUFFER_ROUTES)
    rank = F.when(waiting, F.row_number().over(order.partitionBy(waiting)))
    overflow = waiting & (rank <= F.lit(excess))
    if cutoff_time is not None:
        cutoff = F.lit(cutoff_time).cast("timestamp")
        overflow = overflow | (waiting & (F.col(FIRST_SEEN) < cutoff))
    reclassified = (
        classified.withColumn(ROUTE, F.when(overflow, F.lit("overflow")).otherwise(F.col(ROUTE)))
        .withColumn(
            REASON, F.when(overflow, F.lit(f"buffer limit: {problem}")).otherwise(F.col(REASON))
        )
        .persist(StorageLevel.MEMORY_AND_DISK_DESER)
    )
    return reclassified, recount(reclassified)


# --- writing -----------------------------------------------------------------------------


def waiting_rows(classified: DataFrame, main_columns: Sequence[str]) -> DataFrame:
    """The batch's records that wait, as the buffer stores them (slot and reason included)."""
    waiting = classified.filter(F.col(ROUTE).isin(*BUFFER_ROUTES))
    slot = F.concat(
        F.when(F.col(ROUTE) == "key_wait", F.lit("key=")).otherwise(F.lit("ns=")), F.col(NS_ID)
    )
    return waiting.select(
        *[F.col(quoted(c)) for c in main_columns],
        NS_START,
        NS_END,
        KEY_GROUP,
        FIRST_SEEN,
        BATCH,
        FINGERPRINT,
        F.col(REASON).alias(REASON),
        slot.alias(SLOT),
    )


def released_files(state: BufferState, plan: BatchPlan) -> list[DataFile]:
    """The files the batch removes from the buffer: those of the slots it read."""
    return state.files(plan.read_slots) if plan.read_slots else []

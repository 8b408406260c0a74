"""The buffer: main records waiting for readiness, stored durably in a Delta table.

The table is partitioned by *slot*: one slot per main namespace whose side inputs
are not ready (``ns=<namespace>``) and one per namespace for records waiting for the
side row of their key (``key=<namespace>``). A namespace becomes ready as a whole, so releasing it
removes its slot's files in the same commit that adds the batch's newly buffered
records: the cost is that of the released records, not of the whole buffer.
Key-waiting records are re-checked together and rewritten when a keyed side input
changes or a timeout falls due.

Each buffered record keeps its main-input columns plus bookkeeping columns: its
namespace window, key group, when it was first seen, the batch that first saw it, a
deterministic fingerprint (for a stable order), and why it waits.
"""

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from dagster_sideinputs.core.windows import NS_END, NS_START
from dagster_sideinputs.delta.table import DataFile, TableSnapshot

SLOT = "_dsi_slot"
KEY_GROUP = "_dsi_key_group"
FIRST_SEEN = "_dsi_first_seen"
BATCH = "_dsi_batch"
FINGERPRINT = "_dsi_fingerprint"
REASON = "_dsi_reason"

BOOKKEEPING = (NS_START, NS_END, KEY_GROUP, FIRST_SEEN, BATCH, FINGERPRINT, REASON, SLOT)


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


def fingerprint(columns: Sequence[str]) -> Column:
    """A deterministic 64-bit fingerprint of a record: the tie-breaker of buffer order."""
    return F.xxhash64(*[F.col(f"`{c}`") for c in columns])


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
        present = [s for s in stamps if s is not None]
        return min(present) if present else None

    def namespaces(self) -> list[str]:
        """Every namespace with buffered records."""
        return sorted({slot_namespace(slot) for slot in self.slots()})

    def keywait_slots(self) -> list[str]:
        return [slot for slot in self.slots() if is_keywait(slot)]


def to_buffer_rows(df: DataFrame, main_columns: Sequence[str], reason: Column) -> DataFrame:
    """The buffer's view of records: main columns, bookkeeping, slot and reason."""
    return df.select(
        *[F.col(f"`{c}`") for c in main_columns],
        NS_START,
        NS_END,
        KEY_GROUP,
        FIRST_SEEN,
        BATCH,
        FINGERPRINT,
        reason.alias(REASON),
        F.col(SLOT),
    )

"""What every main-input source offers: the :class:`MainSource` protocol and the
:class:`SourceSlice` it hands the planner and the read stage.

The sources themselves: Delta tables and landing folders in
:mod:`~dagster_sideinputs.core.sources`, Kafka topics in
:mod:`~dagster_sideinputs.core.sources.kafka.source`.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from dagster_sideinputs.core.state.plan import MainRange
from dagster_sideinputs.delta.engine import AppTransaction, DataFile, TableSnapshot, WriteResult
from dagster_sideinputs.errors import DeclarationError

Caching = Literal["before_jobs", "several_jobs", "never"]
"""When a batch caches the main records it read (:meth:`MainSource.caching`)."""

StartFrom = Literal["beginning", "latest"] | int
"""Where a reset may start a main input: its beginning, its latest position, or (a Delta
table) the version after which to read."""


@dataclass(frozen=True)
class SourceSlice:
    """A slice of the main input with what was learned while finding it."""

    range: MainRange
    files: tuple[DataFile, ...] = ()
    snapshot: TableSnapshot | None = None


class MainSource(Protocol):
    """A main input: the planner finds its next slice, the read stage reads a pinned one."""

    def next_range(self, previous: MainRange | None) -> SourceSlice: ...

    def files(self, main: MainRange) -> SourceSlice: ...

    def read(self, spark: SparkSession, piece: SourceSlice) -> DataFrame: ...

    def statistics(self, piece: SourceSlice) -> Sequence[DataFile] | None:
        """The slice's new files with their row counts and null counts, when the source
        keeps them (a Delta log, landed parquet footers); an empty sequence when the
        slice holds no new record for sure; None when the source cannot tell (the
        batch's jobs then count its records). Asked only by a batch whose every record
        is plainly released."""
        ...

    def caching(self) -> Caching:
        """When a batch caches its records: ``before_jobs`` when each Spark job parses only
        the columns it reads (landed JSON and CSV: a record could be corrupt in one job
        and valid in another), ``several_jobs`` when reading again is costly (Kafka: a
        fetch from the brokers; its values decode whole whatever a job reads), ``never``
        when recomputing measured cheaper than building Spark's cache (Delta, parquet)."""
        ...

    def record_count(self, piece: SourceSlice) -> int | None:
        """How many records the slice holds, when the source knows without reading them
        and its :meth:`statistics` do not say (a Kafka range's offsets: more than the
        records of a compacted or transactional topic); None otherwise. A batch counting
        its routes in the job that writes its outputs trusts those counts only when their
        total is this (core/batch/route_counts.py)."""
        ...

    def record_count_missed(self, piece: SourceSlice) -> None:
        """The job writing ``piece``'s outputs saw another number of records than
        :meth:`record_count` said (a topic whose transaction markers take offsets; a
        user's function that ran an action first): the source may stop offering counts
        for what it reads next, whose batches would read it twice again."""
        ...

    def schema(self) -> T.StructType | None:
        """The declared schema (landing folders); None when slices carry it (Delta)."""
        ...

    def record_read(self, main: MainRange, txn: AppTransaction) -> WriteResult | None: ...

    def record_reset(self, main_from: StartFrom, txn: AppTransaction) -> None:
        """What a reset to ``main_from`` writes besides its plan, with the reset's
        transaction: nothing where the position lives in the plans (a Delta table,
        Kafka); a landing folder's ledger of files read."""
        ...

    def reset_to(self, main_from: StartFrom) -> MainRange:
        """Where the next batch reads from after a reset to ``main_from``: the beginning,
        the latest position, or (a Delta table) the version after which to read.

        Raises:
            DeclarationError: a position this source does not have.
        """
        ...

    def keep(self, kept: MainRange) -> tuple[MainRange, list[str]]:
        """A reset keeping the recorded position: it checked against the source now, with
        a note per part it had to move (what the source no longer holds)."""
        ...

    def invalid_fix(self, declare_route: str) -> str:
        """How to get past an invalid record of this source (``declare_route``: the words
        declaring the invalid route)."""
        ...

    def tidy(self) -> None:
        """Now-and-then housekeeping after a committed batch (a failure only costs time)."""
        ...


def no_version_position(kind: str, asset: str, main_from: StartFrom) -> None:
    """Refuse a Delta version as the start of a source that has none."""
    if isinstance(main_from, int):
        raise DeclarationError(
            f"main_from={main_from} is a Delta version, but main input {asset!r} is {kind}.",
            fix="pass main_from='beginning', 'latest' or 'keep'",
        )

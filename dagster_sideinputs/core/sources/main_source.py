"""What every main-input source offers: the :class:`MainSource` protocol and the
:class:`SourceSlice` it hands the planner and the read stage.

The sources themselves: Delta tables and landing folders in
:mod:`~dagster_sideinputs.core.sources`, Kafka topics in
:mod:`~dagster_sideinputs.core.sources.kafka.source`.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from dagster_sideinputs.core.state.plan import MainRange
from dagster_sideinputs.delta.engine import AppTransaction, DataFile, TableSnapshot, WriteResult


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

    def statistics(self, piece: SourceSlice) -> Sequence[DataFile]:
        """The slice's new files with their row counts and null counts, when the source
        keeps them (a Delta log, landed parquet footers); empty otherwise. Asked only by
        a batch whose every record is plainly released."""
        ...

    def schema(self) -> T.StructType | None:
        """The declared schema (landing folders); None when slices carry it (Delta)."""
        ...

    def record_read(self, main: MainRange, txn: AppTransaction) -> WriteResult | None: ...

"""The main windows (namespaces) a batch decides: those of its new records and, when
buffered records are routed again, of the buffered ones; from the files' event-time
statistics when they tell, else one small Spark job."""

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dagster_sideinputs.core.batch.buffer import BufferState
from dagster_sideinputs.core.columns import NS_START, quoted
from dagster_sideinputs.core.sideinputs.time_stats import time_span
from dagster_sideinputs.core.sideinputs.windows import (
    GLOBAL,
    WindowSpan,
    as_utc,
    assign_windows,
    check_time_column,
    is_window_start,
    namespace_id,
    parse_namespace_id,
    windows_between,
)
from dagster_sideinputs.core.sources.main_source import MainSource, SourceSlice
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.delta.engine import DataFile
from dagster_sideinputs.errors import SideInputDataError

MAX_ENUMERATED_WINDOWS = 2000

Namespaces = dict[str, tuple[dt.datetime | None, dt.datetime | None]]
"""Namespace id -> its window (start, end); ``global`` -> (None, None)."""


@dataclass(frozen=True)
class MainWindows:
    """Finds the main windows of one operator's batches (``spark`` None: peeking)."""

    spec: OperatorSpec
    source: MainSource
    spark: SparkSession | None

    def namespaces(self, piece: SourceSlice, buffer: BufferState, *, reroute: bool) -> Namespaces:
        """The namespaces of the slice's new records and of the buffered records."""
        spec = self.spec
        namespaces: Namespaces = {}
        if spec.window is None:
            if not piece.range.is_empty or buffer.slots():
                namespaces[GLOBAL] = (None, None)
            return namespaces
        if not piece.range.is_empty:
            for start, end in self.new_windows(piece):
                namespaces[namespace_id(start)] = (start, end)
        if reroute and buffer.slots():
            # Buffered records routed again get the windows of their event times under
            # the current declaration (read.py): decide those windows in this batch.
            for start, end in self.buffered_windows(buffer):
                namespaces[namespace_id(start)] = (start, end)
        for ns in buffer.namespaces():
            buffered = parse_namespace_id(ns)
            if buffered is None:
                if not reroute:  # left by an earlier, unwindowed declaration
                    namespaces[GLOBAL] = (None, None)
            elif not reroute or is_window_start(spec.window, buffered):
                namespaces[ns] = (buffered, buffered + spec.window.size)
        return namespaces

    def new_windows(self, piece: SourceSlice) -> list[WindowSpan]:
        """The windows new records fall in: from statistics when they suffice, else one job."""
        window = self.spec.window
        assert window is not None
        assert window.time_column is not None
        column = window.time_column
        if self.spark is None and piece.range.kind == "kafka":
            # Peeking (the sensor): Kafka keeps no statistics, and the offsets already say
            # there is work; the batch itself finds the windows.
            return []
        schema = piece.snapshot.schema if piece.snapshot is not None else self.source.schema()
        if schema is not None:  # a missing column must not reach Spark as a raw error
            check_time_column(schema, column, where=f"Main input {self.spec.main.asset!r}")
        return self._windows(
            piece.files,
            lambda: self.source.read(self.spark, piece),  # type: ignore[arg-type]
        )

    def buffered_windows(self, buffer: BufferState) -> list[WindowSpan]:
        """The windows of the buffered records' event times under the current window."""
        snapshot = buffer.snapshot
        column = self.spec.window.time_column  # type: ignore[union-attr]
        if snapshot is None or column not in snapshot.schema.fieldNames():
            return []  # records without the column are invalid when routed again
        name = f"{self.spec.operator_id} buffer"
        return self._windows(
            snapshot.files,
            lambda: self.spec.engine.read_snapshot(self.spark, snapshot, name=name),  # type: ignore[arg-type]
        )

    def _windows(
        self, files: Sequence[DataFile], rows: Callable[[], DataFrame]
    ) -> list[WindowSpan]:
        """The windows of the records in ``files``: from their statistics when they tell,
        else one Spark job over ``rows()``."""
        window = self.spec.window
        assert window is not None
        assert window.time_column is not None
        column = window.time_column
        # Statistics are bounds (rounded to milliseconds, see time_stats): the windows
        # of every instant they allow, a superset of the records' windows.
        span = time_span(files, column) if files else None
        if span is not None:
            spans = windows_between(window, span[0], span[1], MAX_ENUMERATED_WINDOWS)
            if spans is not None:
                return spans
        if self.spark is None:
            raise SideInputDataError(
                "Peeking at this batch needs Spark: the event-time windows of its records "
                "are not in the file statistics.",
                fix="run the operator instead of peeking",
            )
        framed = assign_windows(rows().select(quoted(column)), window, column)
        starts = [
            r[0]
            for r in framed.select(NS_START).where(F.col(NS_START).isNotNull()).distinct().collect()
        ]
        return sorted((as_utc(s), as_utc(s) + window.size) for s in starts)

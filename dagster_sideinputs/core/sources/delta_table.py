"""A Delta table growing by appends as the main input: a slice is a version range
``(start, end]``, its records the files the versions added (checked append-only)."""

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from dagster_sideinputs.core.keyed import check_pre_keyed
from dagster_sideinputs.core.sources.main_source import Caching, SourceSlice, StartFrom
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.state.plan import MainRange
from dagster_sideinputs.delta.engine import AppTransaction, DataFile, TableSnapshot, WriteResult
from dagster_sideinputs.errors import (
    DeclarationError,
    LogCleanedUpError,
    NonAppendOnlyChangeError,
    OperatorStateError,
    TableNotFoundError,
)


class DeltaTableSource:
    """A Delta table growing by appends; a slice is a version range ``(start, end]``."""

    def __init__(self, spec: OperatorSpec) -> None:
        self.spec = spec
        self.engine = spec.engine
        self.name = spec.main.asset

    def next_range(self, previous: MainRange | None) -> SourceSlice:
        spec = self.spec
        start = previous.end_version if previous is not None else -1
        known_id = previous.table_id if previous is not None else None
        try:
            latest = self.engine.snapshot(spec.main_uri, name=self.name)
        except TableNotFoundError:  # not materialized yet (a non-Delta folder is an error)
            if start >= 0:
                raise OperatorStateError(
                    f"Main input {self.name!r} ({spec.main_uri}) is gone, but the operator "
                    f"{spec.operator_id!r} has read it up to version {start}.",
                    fix="restore the table; if it was removed on purpose, "
                    "`operator.reset(main_from='beginning')` reads the table created there "
                    "next from its beginning (or main_from=<version> after a copy of the "
                    "rows already read) (docs/operations.md, 'Reset')",
                ) from None
            return SourceSlice(MainRange("delta", start, start))
        if known_id and latest.table_id and latest.table_id != known_id:
            raise OperatorStateError(
                f"Main input {self.name!r} ({spec.main_uri}) was deleted and created again "
                f"(table id {known_id} -> {latest.table_id}): the operator's position "
                f"(version {start}) refers to the old table, and reading on from it would "
                "skip the new table's first records.",
                fix="read the new table from its beginning with "
                "`operator.reset(main_from='beginning')` when it holds only new records "
                "(outputs keep the old table's records); when its first versions hold a "
                "copy of the rows already read, read only the versions after them with "
                "`operator.reset(main_from=<version>)` (the last version of the copy); "
                "or restore the old table",
            )
        if latest.version < start:
            raise OperatorStateError(
                f"Main input {self.name!r} is at version {latest.version}, before the "
                f"operator's position (version {start}): it was restored or replaced.",
                fix="when the table holds only rows already read up to some version, read "
                "on after it with `operator.reset(main_from=<version>)` (e.g. "
                f"main_from={latest.version}: only versions written from now on); when it "
                "holds only new records, `operator.reset(main_from='beginning')`",
            )
        end = latest.version
        if spec.main.max_versions_per_batch is not None:
            end = min(end, start + spec.main.max_versions_per_batch)
        if end <= start:
            return SourceSlice(
                MainRange("delta", start, start, table_id=latest.table_id), (), latest
            )
        snapshot = latest if end == latest.version else self._snapshot(end)
        main = MainRange("delta", start, end, table_id=latest.table_id)
        try:
            return SourceSlice(main, self._added(main, snapshot), snapshot)
        except NonAppendOnlyChangeError as exc:
            changed = exc.version
            if changed is None or changed <= start + 1:
                raise self._not_appended(exc, start) from exc
        # The appends before the change are read now; the next batch stops at the change.
        snapshot = self._snapshot(changed - 1)
        main = MainRange("delta", start, changed - 1, table_id=latest.table_id)
        return SourceSlice(main, self._added(main, snapshot), snapshot)

    def _not_appended(self, exc: NonAppendOnlyChangeError, start: int) -> NonAppendOnlyChangeError:
        """The error for a version right after the operator's position that removed or
        rewrote rows: it names the version and the explicit way past it."""
        version = exc.version
        skip = (
            f"`operator.reset(main_from={version})`"
            if version is not None
            else "`operator.reset(main_from=<version>)`"
        )
        error = NonAppendOnlyChangeError(
            f"Main input {self.name!r} ({self.spec.main_uri}) of operator "
            f"{self.spec.operator_id!r}: version {version} is not an append, and the operator "
            f"has read the table up to version {start}. {exc.message} Nothing was written.",
            fix="keep the main input append-only (write corrections to a new table); to go on "
            f"after reviewing the change, skip that version with {skip}: the rows it removed "
            "stay in the outputs, rows it added or rewrote are not read, later versions are",
        )
        error.version = version
        return error

    def _log_cleaned_up(self, exc: LogCleanedUpError, start: int) -> LogCleanedUpError:
        """The error for commits after the operator's position that the log no longer
        holds: it names them and the explicit way past them."""
        oldest = exc.oldest if exc.oldest is not None and exc.oldest > start + 1 else None
        if oldest is None:  # not listable, or a hole after the oldest commit left
            gone = f"versions after {start}"
        elif oldest - 1 == start + 1:
            gone = f"version {start + 1}"
        else:
            gone = f"versions {start + 1}-{oldest - 1}"
        skip = (
            f"`operator.reset(main_from={oldest - 1})`"
            if oldest is not None
            else "`operator.reset(main_from=<the oldest version left - 1>)`"
        )
        error = LogCleanedUpError(
            f"Main input {self.name!r} ({self.spec.main_uri}) of operator "
            f"{self.spec.operator_id!r}: the table's log no longer holds {gone} (log "
            f"retention cleaned them up), and the operator has read it up to version "
            f"{start}: the records those versions appended cannot be told apart from the "
            "others. Nothing was written.",
            fix=f"read on from the oldest version left with {skip}: the records the gone "
            "versions appended are not read (append them again if they matter); and keep "
            "the log longer than the operator's longest pause: ALTER TABLE ... SET "
            "TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 30 days') (Delta's "
            "default), or run the operator more often",
        )
        error.version, error.oldest = exc.version, oldest
        return error

    def _snapshot(self, version: int) -> TableSnapshot:
        return self.engine.snapshot(self.spec.main_uri, version=version, name=self.name)

    def _added(self, main: MainRange, snapshot: TableSnapshot) -> tuple[DataFile, ...]:
        if main.start_version < 0:
            files: Sequence[DataFile] = snapshot.files
        else:
            try:
                files = self.engine.added_files(
                    self.spec.main_uri, main.start_version, main.end_version, name=self.name
                )
            except LogCleanedUpError as exc:
                raise self._log_cleaned_up(exc, main.start_version) from exc
        keyed = self.spec.main.pre_keyed
        if keyed is not None and self.spec.main.key is not None:
            check_pre_keyed(files, keyed, key=self.spec.main.key, table=self.name)
        return tuple(files)

    def files(self, main: MainRange) -> SourceSlice:
        if main.end_version < 0:
            return SourceSlice(main)
        snapshot = self._snapshot(main.end_version)
        if main.table_id and snapshot.table_id and snapshot.table_id != main.table_id:
            raise OperatorStateError(
                f"Main input {self.name!r} was created again (table id {main.table_id} -> "
                f"{snapshot.table_id}) while batch records of the old table were pending.",
                fix="restore the old table to finish the batch, or start over with "
                "`operator.reset(main_from='beginning')`",
            )
        if main.is_empty:
            return SourceSlice(main, (), snapshot)  # keeps the schema for a buffer-only batch
        return SourceSlice(main, self._added(main, snapshot), snapshot)

    def read(self, spark: SparkSession, piece: SourceSlice) -> DataFrame:
        snapshot = piece.snapshot
        if piece.range.is_empty or snapshot is None:
            schema = snapshot.schema if snapshot is not None else T.StructType([])
            return spark.createDataFrame([], schema)
        return self.engine.read_snapshot(spark, snapshot, files=piece.files, name=self.name)

    def statistics(self, piece: SourceSlice) -> Sequence[DataFile] | None:
        return piece.files  # the log's added files, which the read reads: none, no record

    def caching(self) -> Caching:
        return "never"

    def record_count(self, piece: SourceSlice) -> int | None:
        return None  # its statistics count the records

    def record_count_missed(self, piece: SourceSlice) -> None:
        return None  # it offers no count

    def schema(self) -> T.StructType | None:
        return None  # each slice's snapshot has it

    def record_read(self, main: MainRange, txn: AppTransaction) -> WriteResult | None:
        return None  # the position lives in the plans

    def record_reset(self, main_from: StartFrom, txn: AppTransaction) -> None:
        return None  # the position lives in the plans

    def reset_to(self, main_from: StartFrom) -> MainRange:
        spec = self.spec
        exists = self.engine.exists(spec.main_uri)
        latest = self.engine.snapshot(spec.main_uri, name=self.name) if exists else None
        if isinstance(main_from, int):
            if latest is None or not -1 <= main_from <= latest.version:
                newest = "none" if latest is None else latest.version
                raise DeclarationError(
                    f"main_from={main_from}: main input {self.name!r} has no such version "
                    f"(latest: {newest}).",
                    fix="pass a version of the table (-1 reads it from its beginning)",
                )
            return MainRange("delta", main_from, main_from, table_id=latest.table_id)
        if main_from == "latest" and latest is not None:
            return MainRange("delta", latest.version, latest.version, table_id=latest.table_id)
        return MainRange("delta", -1, -1)

    def keep(self, kept: MainRange) -> tuple[MainRange, list[str]]:
        return kept, []  # the next batch checks the table's id and versions

    def invalid_fix(self, declare_route: str) -> str:
        # Correcting a Delta main input in place is a non-append change, which is refused.
        return (
            f"{declare_route} (a Delta main input is append-only: its records cannot be "
            "corrected in place)"
        )

    def tidy(self) -> None:
        return None

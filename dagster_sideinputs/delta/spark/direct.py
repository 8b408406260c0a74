"""The delta-spark engine's commit of a plain append with its application transaction,
through Delta's own transaction on a classic session.

Why: a ``format("delta")`` write with ``txnAppId`` / ``txnVersion`` first asks the table
whether it holds the transaction (``WriteIntoDelta.hasBeenExecuted``), and delta-spark
4.4 answers that by reconstructing the table's whole state: three Spark jobs per write,
whatever the table's size. ``bench/delta_commit.py`` (local[2], 10k rows a commit):
1.35 s a write (median), against 0.40 s for the same append without the transaction
and 0.34 s for this module's commit. The engine has already read the table's transactions from the
log (``holds``), so the lookup is spent twice.

What: for an append to an existing table whose schema, partitioning and columns the
write leaves as they are, the engine opens Delta's transaction itself (py4j), checks that
it reads the very version whose transactions the engine checked, has Delta write the
files (``writeFiles``: statistics, NOT NULL and CHECK constraints, column mapping, as in
any delta-spark write) and commits them with the ``SetTransaction`` and the commit's
``userMetadata`` in one commit: the commit Delta's writer makes (operation WRITE, a blind
append). The application id is registered as read, so a concurrent commit of the same
transaction makes this one fail (``ConcurrentTransactionException``) instead of
committing the batch twice.

Staging uses the same transaction when it can (:func:`stage_append`): Delta writes the
files when the batch stages its tables, and the commit later only adds them. Staging
otherwise persists the rows and counts them, and the commit writes them from the cache.
``bench/delta_commit.py`` (local[2], medians, one run each): stage and commit of 10k
computed rows 0.32 s against 0.47 s cached; of 4M rows 1.09 s against 2.09 s. Files
written for a batch that then commits
nothing are deleted; a commit that fails leaves them unreferenced (Delta's ``VACUUM``
removes them), never deleting a file a commit may reference.

Files removed by a commit (the buffer's released slots, a reset's outputs) are Delta's
``RemoveFile`` actions in that same transaction, beside the files added: the removal of
exactly those files (Delta's writer can only remove what a ``replaceWhere`` predicate
matches, whole partitions). Each is the live ``add`` action of the version the transaction
reads, parsed by Delta from the ``add`` as the log holds it (or, for a file with a
deletion vector, taken from the transaction's snapshot) and turned into its removal by
Delta (``AddFile.removeWithTimestamp``). Delta's conflict check fails the commit when
another writer removed one of them first. A removal commit measured 0.13 s against 1.8 s
for the ``replaceWhere`` write it replaces (local[2], warm, one after the other).

Everything else, and any session without a JVM (Spark Connect), goes through the
DataFrame writer: :func:`direct_append` then returns False having done nothing.
"""

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.delta.engine import (
    AppTransaction,
    DataFile,
    SchemaMode,
    StagedWrite,
    WriteMode,
)
from dagster_sideinputs.delta.log.state import COLUMN_MAPPING_KEYS, LiveFile, LogState
from dagster_sideinputs.delta.session import session_setting
from dagster_sideinputs.delta.store.files import spark_uri
from dagster_sideinputs.errors import ConcurrentWriteError

log = logging.getLogger(__name__)

# Delta's checksum (the .crc beside each commit) may list every live file of a small
# table. For a new table Delta lists them with a Spark job of their own (0.2-0.3 s of a
# 4M-row write), and a commit after one without the list rebuilds the table's state
# (two more jobs). The engine's commits leave the list out, every one of them: neither
# its reads nor its commits use it (docs/DECISIONS.md, "delta-spark split writes").
ALL_FILES_IN_CRC = "spark.databricks.delta.allFilesInCrc.enabled"


def without_file_list(spark: SparkSession) -> contextlib.AbstractContextManager[None]:
    """The session's commits, for the duration, write checksums without the file list."""
    return session_setting(spark, ALL_FILES_IN_CRC, "false")


# Table features an append through Delta's transaction handles as the writer does (the
# transaction's writeFiles and commit do the work for these); a table with any other
# writer feature goes through the writer.
SAFE_WRITER_FEATURES = frozenset(
    {
        "appendOnly",
        "invariants",
        "checkConstraints",
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "domainMetadata",
        "inCommitTimestamp",
        "typeWidening",
        "typeWidening-preview",
    }
)
# Legacy protocols: writer version 4 brings generated columns and change data feed, 6
# identity columns; those go through the writer (field metadata is checked too).
MAX_LEGACY_WRITER_VERSION = 3
_FIELD_KEYS = frozenset(COLUMN_MAPPING_KEYS) | {"comment"}


def qualifies(frame: DataFrame, target: StagedWrite, current: LogState) -> bool:
    """Whether writing ``frame`` to the table at ``current`` is a plain append (no files
    removed: the caller's check) the engine may commit through Delta's transaction."""
    return plain_append(
        frame, current, mode=target.mode, schema_mode=target.schema_mode,
        partition_by=target.partition_by,
    )  # fmt: skip


def plain_append(
    frame: DataFrame,
    current: LogState,
    *,
    mode: WriteMode,
    schema_mode: SchemaMode | None,
    partition_by: Sequence[str] | None,
) -> bool:
    """Whether writing ``frame`` so is an append that keeps the table at ``current`` as it
    is (schema, column order, partitions, no generated columns, known writer features),
    on a session with a JVM."""
    if mode != "append" or schema_mode == "overwrite":
        return False
    if getattr(frame.sparkSession, "_jvm", None) is None:
        return False  # Spark Connect: no JVM in this process
    if tuple(partition_by or ()) != tuple(current.partition_columns):
        return False
    if frame.schema.simpleString() != current.schema.simpleString():
        return False  # a schema change (or a reordering) is the writer's business
    if not _plain_fields(current.raw_schema):
        return False
    return plain_protocol(current.protocol)


def _plain_fields(schema: T.StructType) -> bool:
    """No generated, identity or default columns (at the top level, where they live)."""
    return all(set(f.metadata) <= _FIELD_KEYS for f in schema.fields)


def plain_protocol(protocol: Mapping[str, Any]) -> bool:
    writer = int(protocol.get("minWriterVersion") or 1)
    if writer < 7:
        return writer <= MAX_LEGACY_WRITER_VERSION
    return set(protocol.get("writerFeatures") or ()) <= SAFE_WRITER_FEATURES


def direct_append(
    frame: DataFrame,
    uri: str,
    current: LogState,
    app_transaction: AppTransaction | None,
    user_metadata: str,
    *,
    remove: Sequence[DataFile] = (),
    label: str = "",
    write_rows: bool = True,
) -> bool:
    """Append ``frame``'s rows (unless not ``write_rows``: removals alone) to the table at
    ``uri`` and remove the files ``remove``, in one commit with ``app_transaction``.

    Returns False, having written nothing, when Delta's classes are not as expected or
    the table moved past ``current`` (the caller then writes through the DataFrame
    writer, which checks the transaction itself). Errors of the write or the commit
    are raised as delta-spark raises them.

    Raises:
        ConcurrentWriteError: a file of ``remove`` is not live at ``current``.
    """
    commit = open_append(
        frame, uri, current, app_transaction, user_metadata,
        remove=remove, label=label, write_rows=write_rows,
    )  # fmt: skip
    if commit is None:
        return False
    commit()
    return True


def open_append(
    frame: DataFrame,
    uri: str,
    current: LogState,
    app_transaction: AppTransaction | None,
    user_metadata: str,
    *,
    remove: Sequence[DataFile] = (),
    label: str = "",
    write_rows: bool = True,
) -> Callable[[], None] | None:
    """Delta's transaction on the table, reading version ``current.version``, and the
    step that writes ``frame`` and commits; None when it cannot be opened so."""
    opened = open_transaction(frame, uri, current)
    if opened is None:
        return None
    _, txn = opened
    spark = frame.sparkSession
    removals = removal_actions(spark, txn, current, remove, label or uri)
    try:
        actions, operation = _commit_actions(spark, app_transaction, user_metadata, removals)
        if app_transaction is not None:
            txn.readTxn().addOne(app_transaction.app_id)
    except Exception as exc:  # py4j: a class or signature of another Delta release
        log.debug("delta-spark: appending through the writer (%s)", exc)
        return None

    def commit() -> None:
        written = txn.writeFiles(getattr(frame, "_jdf")) if write_rows else None  # noqa: B009
        with without_file_list(spark):
            txn.commit(_with(spark, written, actions), operation)

    return commit


def removal_actions(
    spark: SparkSession, txn: Any, current: LogState, files: Sequence[DataFile], label: str
) -> list[Any]:
    """Delta's ``RemoveFile`` actions of ``files``, which must be live at ``current``.

    A file's live ``add`` action, as the log holds it, is parsed by Delta and turned into
    its removal by Delta; one with a deletion vector is taken from Delta's own snapshot
    instead (the transaction's, by a small Spark job), so that its removal names the vector exactly.

    Raises:
        ConcurrentWriteError: a file is not live any more (another writer removed it).
    """
    if not files:
        return []
    live: dict[str, LiveFile] = {unquote(f.path): f for f in current.files.values()}
    gone = sorted(f.path for f in files if f.path not in live)
    if gone:
        raise ConcurrentWriteError(
            f"The files to remove from {label} are not all live any more (e.g. {gone[0]!r}): "
            "another writer changed the table. Nothing was committed.",
            fix="rerun (batches are idempotent)",
        )
    chosen = [live[f.path] for f in files]
    plain = [f for f in chosen if f.deletion_vector is None]
    with_vectors = [f.path for f in chosen if f.deletion_vector is not None]
    now = int(time.time() * 1000)
    removals = [
        parsed_action(spark, {"add": _add_of(f)}).removeWithTimestamp(now, True) for f in plain
    ]
    if with_vectors:
        wanted = F.col("path").isin(with_vectors)
        adds = txn.snapshot().allFiles().filter(getattr(wanted, "_jc"))  # noqa: B009
        removals.extend(add.removeWithTimestamp(now, True) for add in adds.collectAsList())
    if len(removals) != len(files):
        raise ConcurrentWriteError(
            f"Only {len(removals)} of the {len(files)} files to remove from {label} were "
            "found live. Nothing was committed.",
            fix="rerun (batches are idempotent)",
        )
    return removals


def _add_of(file: LiveFile) -> dict[str, Any]:
    """The ``add`` action of a live file without a deletion vector, as the log holds it."""
    action: dict[str, Any] = {
        "path": file.path,
        "partitionValues": dict(file.partition_values),
        "size": file.size,
        "modificationTime": file.modification_time or 0,
        "dataChange": True,
    }
    if file.stats is not None:
        action["stats"] = file.stats
    return action


def scala_seq(spark: SparkSession, items: Sequence[Any]) -> Any:
    """A Scala ``Seq`` of JVM objects (what Delta's transaction commits)."""
    jvm: Any = getattr(spark, "_jvm")  # noqa: B009 (a classic session's gateway)
    values = jvm.java.util.ArrayList()
    for item in items:
        values.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(values).toSeq()


def _with(spark: SparkSession, files: Any, actions: Sequence[Any]) -> Any:
    """The written files' actions (a Scala ``Seq``, or None: no rows written) followed by
    ``actions``, as one Scala ``Seq``."""
    extra = scala_seq(spark, actions)
    return extra if files is None else files.appendedAll(extra)


@dataclass
class DirectStage:
    """Files Delta's transaction wrote while the batch staged, not yet committed."""

    spark: SparkSession
    delta_log: Any
    txn: Any
    files: Any  # Scala Seq[FileAction]: the AddFile actions writeFiles returned
    paths: list[str]
    rows: int | None
    commit_tried: bool = False
    creating: str | None = None
    """For a table this commit creates: the local marker saying the table's folder holds
    an interrupted first write's files, removed once the commit made the table (a discard
    leaves it: files of an earlier interrupted write may still need it)."""


def stage_append(frame: DataFrame, uri: str, current: LogState) -> DirectStage | None:
    """Have Delta's transaction on the table (reading ``current.version``) write
    ``frame``'s files now, for :func:`commit_stage` to commit; None, having written
    nothing, when it cannot be opened so. Errors of the data (constraints) and of the
    code computing it are raised as delta-spark raises them."""
    opened = open_transaction(frame, uri, current)
    if opened is None:
        return None
    delta_log, txn = opened
    files = txn.writeFiles(getattr(frame, "_jdf"))  # noqa: B009
    paths: list[str] = []
    rows: int | None = 0
    actions = files.iterator()
    while actions.hasNext():
        action = actions.next()
        paths.append(str(action.path()))
        stats = action.stats() if action.getClass().getSimpleName() == "AddFile" else None
        records = json.loads(stats).get("numRecords") if stats else None
        rows = None if records is None or rows is None else rows + int(records)
    return DirectStage(frame.sparkSession, delta_log, txn, files, paths, rows)


def commit_stage(
    stage: DirectStage,
    app_transaction: AppTransaction | None,
    user_metadata: str,
    *,
    current: LogState | None = None,
    remove: Sequence[DataFile] = (),
    label: str = "",
) -> None:
    """Commit the staged files with the application transaction (if any), and remove
    ``remove`` (live at ``current``), as one commit (the application id registered as
    read: a concurrent commit of it fails this one)."""
    removals = []
    if remove:
        assert current is not None
        removals = removal_actions(stage.spark, stage.txn, current, remove, label)
    actions, operation = _commit_actions(stage.spark, app_transaction, user_metadata, removals)
    if app_transaction is not None:
        stage.txn.readTxn().addOne(app_transaction.app_id)
    stage.commit_tried = True
    with without_file_list(stage.spark):
        stage.txn.commit(_with(stage.spark, stage.files, actions), operation)
    _forget_marker(stage)


def discard_stage(stage: DirectStage) -> None:
    """Delete the staged files, unless a commit of them was tried (it may hold them)."""
    if stage.commit_tried or not stage.paths:
        return
    jvm: Any = getattr(stage.spark, "_jvm")  # noqa: B009
    hadoop_path = jvm.org.apache.hadoop.fs.Path
    conf = stage.delta_log.newDeltaHadoopConf()
    for relative in stage.paths:
        path = hadoop_path(jvm.java.net.URI(relative))
        if not path.isAbsolute():
            path = hadoop_path(stage.delta_log.dataPath(), path)
        try:
            path.getFileSystem(conf).delete(path, False)
        except Exception as exc:  # an unreferenced file left is harmless (VACUUM)
            log.debug("delta-spark: staged file %s not deleted (%s)", relative, exc)
    stage.paths = []


def _forget_marker(stage: DirectStage) -> None:
    if stage.creating is not None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(stage.creating)
        stage.creating = None


def open_transaction(frame: DataFrame, uri: str, current: LogState) -> tuple[Any, Any] | None:
    """(DeltaLog, OptimisticTransaction) reading ``current.version``; None when the
    table moved or Delta's classes are not as expected."""
    try:
        delta_log = delta_log_of(frame.sparkSession, uri)
        txn = delta_log.startTransaction()
        if txn.snapshot().version() != current.version:
            return None
    except Exception as exc:  # py4j: a class or signature of another Delta release
        log.debug("delta-spark: appending through the writer (%s)", exc)
        return None
    return delta_log, txn


def delta_log_of(spark: SparkSession, uri: str) -> Any:
    """Delta's ``DeltaLog`` of the table at ``uri`` (py4j; a classic session only)."""
    jvm: Any = getattr(spark, "_jvm")  # noqa: B009 (a classic session's gateway)
    return getattr(getattr(jvm.org.apache.spark.sql.delta, "DeltaLog$"), "MODULE$").forTable(
        getattr(spark, "_jsparkSession"),  # noqa: B009
        spark_uri(uri),
    )


def parsed_action(spark: SparkSession, action: Mapping[str, Any]) -> Any:
    """A Delta log action (``{"add": {...}}``, ``{"metaData": {...}}``) as Delta's own
    object, parsed by Delta (``Action.fromJson``)."""
    jvm: Any = getattr(spark, "_jvm")  # noqa: B009
    parse = getattr(getattr(jvm.org.apache.spark.sql.delta.actions, "Action$"), "MODULE$")
    return parse.fromJson(json.dumps(action))


def _commit_actions(
    spark: SparkSession,
    app_transaction: AppTransaction | None,
    user_metadata: str,
    removals: Sequence[Any] = (),
) -> tuple[list[Any], Any]:
    """(actions beside the written files, Delta's operation) of a commit: the removals and
    the ``SetTransaction``; the operation a write with ``user_metadata`` records (an
    append, or an overwrite of exactly the removed files)."""
    jvm: Any = getattr(spark, "_jvm")  # noqa: B009
    delta = jvm.org.apache.spark.sql.delta
    scala_option = jvm.scala.Option
    save_mode = jvm.org.apache.spark.sql.SaveMode
    predicate = f"the {len(removals)} file(s) removed" if removals else None
    operation = delta.DeltaOperations.Write(
        save_mode.Overwrite if removals else save_mode.Append,
        scala_option.empty(),
        scala_option.apply(predicate),
        scala_option.apply(user_metadata),
        scala_option.empty(),
        scala_option.empty(),
        scala_option.empty(),
        scala_option.empty(),
        scala_option.empty(),
    )
    actions = list(removals)
    if app_transaction is not None:
        actions.append(
            delta.actions.SetTransaction(
                app_transaction.app_id,
                app_transaction.version,
                scala_option.apply(jvm.java.lang.Long.valueOf(int(time.time() * 1000))),
            )
        )
    return actions, operation

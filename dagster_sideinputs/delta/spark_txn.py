"""Appends through delta-spark's own transaction, for classic (py4j) sessions only.

Staging writes the data files once, by ``OptimisticTransaction.writeFiles`` (a new table:
``WriteIntoDelta.write``, the DataFrame writer's own steps before its commit): delta-spark
normalizes the rows to the table's schema, enforces its constraints (NOT NULL) and
collects its statistics in the same job, and nothing is committed. Committing is
``txn.commit`` of the returned files, the removed files, the batch's ``SetTransaction``,
as a ``WRITE`` with the ``userMetadata`` a ``format("delta")`` write carries: delta-spark
checks the commit against every commit made since staging (conflicts raise). Files
written by a staged write that never commits are orphans: VACUUM removes them.

Spark Connect sessions have no py4j; :func:`transaction_session` says so and the engine
keeps its DataFrame-writer path. Every py4j access to Delta classes lives here.
"""

import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from py4j.protocol import Py4JJavaError
from pyspark.errors.exceptions.captured import convert_exception
from pyspark.sql import DataFrame, SparkSession

from dagster_sideinputs.delta.engine import (
    AppTransaction,
    DataFile,
    StagedWrite,
    TableSnapshot,
    WriteResult,
)
from dagster_sideinputs.delta.files import spark_uri
from dagster_sideinputs.delta.spark_commit import ENGINE_NAME, translated, user_metadata
from dagster_sideinputs.delta.spark_log_state import LogState
from dagster_sideinputs.delta.spark_predicates import removal_predicate
from dagster_sideinputs.errors import ConcurrentWriteError

_DELTA = "org.apache.spark.sql.delta"


@dataclass
class StagedFiles:
    """Data files written by an open delta-spark transaction, not committed yet.

    Attributes:
        txn: the ``OptimisticTransaction`` (JVM) that wrote them, read at ``read_version``.
        actions: its ``Seq[FileAction]`` (JVM), committed as they are.
        adds: the same add actions as JSON (path, size, stats).
    """

    txn: Any
    actions: Any
    adds: list[dict[str, Any]]
    read_version: int
    root: str

    def count_rows(self, frame: DataFrame) -> int:
        """Rows written, from delta-spark's statistics (``frame`` counted again when
        statistics are off)."""
        counts = [
            json.loads(a["stats"]).get("numRecords") if a.get("stats") else None for a in self.adds
        ]
        if any(c is None for c in counts):
            return frame.count()
        return sum(int(c or 0) for c in counts)


def transaction_session(spark: SparkSession) -> Any | None:
    """The JVM session of a classic SparkSession, None for a Spark Connect one."""
    try:
        jsession = getattr(spark, "_jsparkSession", None)
        jvm = getattr(spark, "_jvm", None)
    except Exception:  # Connect sessions refuse JVM attributes
        return None
    return jsession if jvm is not None else None


class _Java:
    """The JVM classes of one session, and conversions to Scala values."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.jvm: Any = spark._jvm
        self.session: Any = spark._jsparkSession

    def cls(self, name: str) -> Any:
        target = self.jvm
        for part in name.split("."):
            target = getattr(target, part)
        return target

    def seq(self, values: Sequence[Any]) -> Any:
        items = self.jvm.java.util.ArrayList()
        for value in values:
            items.add(value)
        return self.jvm.scala.jdk.javaapi.CollectionConverters.asScala(items).toList()

    def option(self, value: Any) -> Any:
        return self.jvm.scala.Option.apply(value)

    def path(self, uri: str) -> Any:
        return self.jvm.org.apache.hadoop.fs.Path(uri)


def _items(seq: Any) -> Iterator[Any]:
    iterator = seq.iterator()
    while iterator.hasNext():
        yield iterator.next()


def _raised(exc: Py4JJavaError) -> Exception:
    """A py4j failure as PySpark raises it from a DataFrame call (user errors keep their
    usual classes)."""
    return convert_exception(exc.java_exception)


def stage_files(
    frame: DataFrame, uri: str, read_version: int, partition_by: Sequence[str]
) -> StagedFiles | None:
    """Write ``frame`` (projected to the table's schema) as data files of the table at
    ``uri`` in a new transaction, or None when the table is no longer at ``read_version``
    (-1: no table yet; it changed since the write was planned: the caller takes its
    other path). A new table is written as delta-spark's DataFrame writer creates one
    (``WriteIntoDelta``: the same metadata and protocol), only not committed."""
    java = _Java(frame.sparkSession)
    try:
        log = java.cls(f"{_DELTA}.DeltaLog").forTable(java.session, java.path(spark_uri(uri)))
        txn = log.startTransaction()
        if txn.readVersion() != read_version:
            return None
        if read_version >= 0:
            actions = txn.writeFiles(frame._jdf)
        else:
            actions = _create(java, log, txn, frame, partition_by)
    except Py4JJavaError as exc:
        raise _raised(exc) from exc
    adds = [json.loads(a.json()).get("add") for a in _items(actions)]
    return StagedFiles(txn, actions, [a for a in adds if a], read_version, spark_uri(uri))


def _create(java: _Java, log: Any, txn: Any, frame: DataFrame, partition_by: Sequence[str]) -> Any:
    write = java.cls(f"{_DELTA}.commands.WriteIntoDelta")
    empty = getattr(java.cls("scala.collection.immutable.Map$"), "MODULE$").empty()
    command = write(
        log,
        java.jvm.org.apache.spark.sql.SaveMode.Append,
        java.cls(f"{_DELTA}.DeltaOptions")(empty, java.session.sessionState().conf()),
        java.seq(list(partition_by)),
        empty,
        frame._jdf,
        java.option(None),
        java.option(None),
        getattr(write, "apply$default$9")(),
    )
    return command.write(txn, java.session, java.option(None), False)


def stage_append(
    frame: DataFrame,
    uri: str,
    label: str,
    current: TableSnapshot | None,
    partition_by: Sequence[str],
) -> StagedFiles | None:
    """The data files of an append written once by a delta-spark transaction, or None:
    a Connect session, or the table moved on since the write was planned."""
    if transaction_session(frame.sparkSession) is None:
        return None
    try:
        return stage_files(frame, uri, -1 if current is None else current.version, partition_by)
    except Exception as exc:
        error = translated(exc, label, None)
        if error is exc:
            raise
        raise error from exc


def commit_staged(
    files: StagedFiles,
    staged: StagedWrite,
    current: LogState | None,
    *,
    remove_files: Sequence[DataFile],
    app_transaction: AppTransaction | None,
    commit_metadata: Mapping[str, Any] | None,
) -> WriteResult:
    """Commit the files a delta-spark transaction staged (errors as the project's)."""
    if current is None and files.read_version >= 0:
        raise ConcurrentWriteError(
            f"Table {staged.name} was deleted after this write was staged. This write "
            "was not committed.",
            fix="retry the write; for the operator, rerun the job (batches are idempotent)",
        )
    try:
        return commit_files(
            staged.handle.frame.sparkSession, files, staged, current,
            remove_files=remove_files, app_transaction=app_transaction,
            user_metadata=user_metadata(uuid.uuid4().hex, commit_metadata),
            num_rows=staged.num_rows or 0,
        )  # fmt: skip
    except Exception as exc:
        error = translated(exc, staged.name, None)
        if error is exc:
            raise
        raise error from exc


def delete_staged(spark: SparkSession, staged: StagedFiles) -> None:
    """Delete the data files of a staged write that will not commit (best effort)."""
    java = _Java(spark)
    try:
        root = java.path(staged.root)
        fs = root.getFileSystem(java.session.sessionState().newHadoopConf())
        for add in staged.adds:
            fs.delete(java.jvm.org.apache.hadoop.fs.Path(root, unquote(add["path"])), False)
    except Py4JJavaError:
        pass  # orphans: VACUUM removes them


def commit_files(
    spark: SparkSession,
    staged: StagedFiles,
    target: StagedWrite,
    current: LogState | None,
    *,
    remove_files: Sequence[DataFile],
    app_transaction: AppTransaction | None,
    user_metadata: str,
    num_rows: int,
) -> WriteResult:
    """Commit ``staged`` with the removal of ``remove_files`` and ``app_transaction``.

    Removals read the partitions they empty (delta-spark then refuses a concurrent append
    to them, as a ``replaceWhere`` would); ``app_transaction`` is read too, so a
    concurrent commit of the same application conflicts.
    """
    java = _Java(spark)
    txn = staged.txn
    actions = list(_items(staged.actions))
    now = int(time.time() * 1000)
    try:
        if remove_files:
            assert current is not None  # removals need an existing table (refused_removals)
            actions.extend(_removals(java, txn, current, remove_files, target.name, now))
        if app_transaction is not None:
            txn.txnVersion(app_transaction.app_id)
            txn_json = {
                "txn": {
                    "appId": app_transaction.app_id,
                    "version": app_transaction.version,
                    "lastUpdated": now,
                }
            }
            actions.append(java.cls(f"{_DELTA}.actions.Action").fromJson(json.dumps(txn_json)))
        operation = java.cls(f"{_DELTA}.DeltaOperations$Write")(
            java.jvm.org.apache.spark.sql.SaveMode.Append,
            java.option(java.seq(list(target.partition_by))),
            java.option(None),
            java.option(user_metadata),
            java.option(None),
            java.option(None),
            java.option(None),
            java.option(None),
            java.option(None),
        )
        version = txn.commit(java.seq(actions), operation)
    except Py4JJavaError as exc:
        raise _raised(exc) from exc
    return WriteResult(
        uri=target.uri,
        version=int(version),
        num_rows=num_rows,
        num_files=len(staged.adds),
        num_bytes=sum(int(a.get("size") or 0) for a in staged.adds),
        skipped=False,
        duration_s=0.0,
        engine=ENGINE_NAME,
    )


def _removals(
    java: _Java,
    txn: Any,
    current: LogState,
    remove_files: Sequence[DataFile],
    label: str,
    now: int,
) -> list[Any]:
    predicate = removal_predicate(current, remove_files, label)
    filters = (
        []
        if predicate is None
        else [java.session.sessionState().sqlParser().parseExpression(predicate)]
    )
    live = {unquote(add.path()): add for add in _items(txn.filterFiles(java.seq(filters), False))}
    missing = [f.path for f in remove_files if f.path not in live]
    if missing:
        raise ConcurrentWriteError(
            f"Files to remove from table {label} are not in the version this write was "
            f"staged against (e.g. {missing[0]}): another writer changed it. This write "
            "was not committed.",
            fix="retry the write; for the operator, rerun the job (batches are idempotent)",
        )
    return [live[f.path].removeWithTimestamp(now, True) for f in remove_files]

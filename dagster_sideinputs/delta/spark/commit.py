"""Committing for the delta-spark engine: one ``format("delta")`` write per commit (a
plain append with its transaction, on a classic session, through Delta's transaction:
:mod:`~dagster_sideinputs.delta.spark.direct`).

- The write carries the batch's application transaction (``txnAppId`` / ``txnVersion``):
  Delta skips it when the table already holds the transaction.
- Files to remove (the buffer's released slots, a reset's outputs) are removed exactly, in
  the same commit, by Delta's transaction (:mod:`~dagster_sideinputs.delta.spark.direct`).
  Without a JVM (Spark Connect) they must be whole partitions: the write becomes
  ``overwrite`` + ``replaceWhere`` on them, with Delta's replaceWhere constraint check off
  for that write only, so the rows of other partitions are appended in the same single
  commit. Removals alone are the same write with no rows.
- Each commit carries a unique token in ``userMetadata``, by which the engine finds the
  version it made. A failed write is translated to the project's errors.
"""

import dataclasses
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame

from dagster_sideinputs.delta.engine import AppTransaction, DataFile, StagedWrite, WriteResult
from dagster_sideinputs.delta.log.files import LogFiles, is_path_not_found
from dagster_sideinputs.delta.log.reader import READER
from dagster_sideinputs.delta.log.state import LogState
from dagster_sideinputs.delta.session import session_setting
from dagster_sideinputs.delta.spark.direct import (
    DirectStage,
    commit_stage,
    direct_append,
    qualifies,
    without_file_list,
)
from dagster_sideinputs.delta.spark.predicates import (
    removal_predicate,
    replace_predicate,
    sql_table,
)
from dagster_sideinputs.delta.staging import allowed_values
from dagster_sideinputs.delta.store.files import spark_uri
from dagster_sideinputs.errors import (
    ConcurrentWriteError,
    NotADeltaTableError,
    SchemaMismatchError,
)

ENGINE_NAME = "delta-spark"
CONSTRAINT_CHECK = "spark.databricks.delta.replaceWhere.constraintCheck.enabled"
_TOKEN = "dsi.write"
_CONCURRENT = (
    "DELTA_CONCURRENT",
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
)


def holds(state: LogState, app_transaction: AppTransaction | None) -> bool:
    """Whether the table at ``state`` already committed ``app_transaction`` (or later)."""
    if app_transaction is None:
        return False
    committed = state.txns.get(app_transaction.app_id)
    return committed is not None and committed >= app_transaction.version


def unchanged(uri: str, version: int, seconds: float, *, skipped: bool = True) -> WriteResult:
    """A write that committed nothing: skipped (the table holds its transaction) or empty."""
    return WriteResult(uri, version, 0, 0, 0, skipped, seconds, ENGINE_NAME)


def with_duration(result: WriteResult, seconds: float) -> WriteResult:
    return dataclasses.replace(result, duration_s=seconds)


def save(
    frame: DataFrame,
    target: StagedWrite,
    current: LogState | None,
    files: LogFiles,
    *,
    remove_files: Sequence[DataFile],
    app_transaction: AppTransaction | None,
    commit_metadata: Mapping[str, Any] | None,
    write_rows: bool = True,
) -> WriteResult:
    """One ``format("delta")`` write of ``frame``: the commit.

    Args:
        target: the table and how to write it (uri, name, mode, partitions, schema mode).
        current: the table's latest state (None: no table yet).
        files: the table's log files, to find the commit made.
        write_rows: False when ``frame`` holds no rows (removals alone).
    """
    uri, label, mode = target.uri, target.name, target.mode
    replace_partition, schema_mode = target.replace_partition, target.schema_mode
    token, user_metadata = _user_metadata(commit_metadata)
    before = -1 if current is None else current.version
    if (
        current is not None
        and (app_transaction is not None or remove_files)
        and qualifies(frame, target, current)
    ):
        try:
            committed = direct_append(
                frame, uri, current, app_transaction, user_metadata,
                remove=remove_files, label=label, write_rows=write_rows,
            )  # fmt: skip
        except ConcurrentWriteError:
            raise
        except Exception as exc:
            raise _translated(exc, label, replace_partition) from exc
        if committed:
            return _result_of(files, uri, label, before, token)
    writer = frame.write.format("delta").option("userMetadata", user_metadata)
    relax_constraint = False
    if remove_files:
        assert current is not None
        predicate = removal_predicate(current, remove_files, label)
        writer = writer.mode("overwrite")
        if predicate is not None:
            writer = writer.option("replaceWhere", predicate)
            relax_constraint = True
    elif mode == "overwrite":
        writer = writer.mode("overwrite")
        if replace_partition:
            writer = writer.option("replaceWhere", replace_predicate(replace_partition))
        elif schema_mode == "overwrite":
            writer = writer.option("overwriteSchema", "true")
    else:
        writer = writer.mode("append")
    if schema_mode == "merge":
        writer = writer.option("mergeSchema", "true")
    if target.partition_by:
        writer = writer.partitionBy(*target.partition_by)
    if app_transaction is not None:
        writer = writer.option("txnAppId", app_transaction.app_id).option(
            "txnVersion", str(app_transaction.version)
        )
    spark = frame.sparkSession
    try:
        if schema_mode is not None and current is not None:
            _support_timestamp_ntz(frame, current, uri)
        with (
            session_setting(spark, CONSTRAINT_CHECK, "false" if relax_constraint else None),
            without_file_list(spark),
        ):
            writer.save(spark_uri(uri))
    except Exception as exc:
        raise _translated(exc, label, replace_partition) from exc
    return _result_of(files, uri, label, before, token)


def _support_timestamp_ntz(frame: DataFrame, current: LogState, uri: str) -> None:
    """A schema change bringing the table its first ``timestamp_ntz`` column: Delta's
    writer wants the table feature enabled by hand first (a protocol-only commit, which
    a rerun finds done). Delta enables it itself when it creates a table."""
    features = set(current.protocol.get("writerFeatures") or ())
    if "timestampNtz" in features or "timestamp_ntz" not in frame.schema.simpleString():
        return
    feature = "'delta.feature.timestampNtz' = 'supported'"
    frame.sparkSession.sql(f"ALTER TABLE {sql_table(uri)} SET TBLPROPERTIES ({feature})")


def commit_staged_files(
    stage: DirectStage,
    target: StagedWrite,
    current: LogState | None,
    files: LogFiles,
    *,
    app_transaction: AppTransaction | None,
    commit_metadata: Mapping[str, Any] | None,
    remove_files: Sequence[DataFile] = (),
) -> WriteResult:
    """Commit the files staged for Delta's transaction (None: the commit creates the
    table), removing ``remove_files`` in the same commit."""
    token, user_metadata = _user_metadata(commit_metadata)
    try:
        commit_stage(
            stage, app_transaction, user_metadata,
            current=current, remove=remove_files, label=target.name,
        )  # fmt: skip
    except ConcurrentWriteError:
        raise
    except Exception as exc:
        raise write_error(exc, target.name) from exc
    before = -1 if current is None else current.version
    return _result_of(files, target.uri, target.name, before, token)


def write_error(exc: Exception, label: str) -> Exception:
    """A failed delta-spark append as the project's error when it is one of Delta's
    (conflict, constraint, schema); otherwise ``exc`` itself."""
    return _translated(exc, label, None)


def _user_metadata(commit_metadata: Mapping[str, Any] | None) -> tuple[str, str]:
    """(token, userMetadata): the token finds the commit this write made."""
    token = uuid.uuid4().hex
    user_metadata = json.dumps(
        {_TOKEN: token, "engineInfo.dsi": "dagster-sideinputs", **(commit_metadata or {})},
        default=str,
    )
    return token, user_metadata


def _result_of(files: LogFiles, uri: str, label: str, before: int, token: str) -> WriteResult:
    """The commit this write made (found by its token), or a skip: Delta skips a write
    whose application transaction the table already holds."""
    latest = READER.latest_version(files)
    if latest is None or latest <= before:
        return unchanged(uri, before, 0.0)
    versions = list(range(before + 1, latest + 1))
    actions = READER.commits(files, versions, table=label)
    for version in reversed(versions):
        info: dict[str, Any] = next(
            (a["commitInfo"] for a in actions[version] if "commitInfo" in a), {}
        )
        if token not in str(info.get("userMetadata") or ""):
            continue
        adds = [a["add"] for a in actions[version] if "add" in a]
        metrics = info.get("operationMetrics") or {}
        rows = metrics.get("numOutputRows")
        if rows is None:
            rows = sum(json.loads(a["stats"]).get("numRecords", 0) for a in adds if a.get("stats"))
        return WriteResult(
            uri=uri,
            version=version,
            num_rows=int(rows),
            num_files=len(adds),
            num_bytes=sum(int(a.get("size") or 0) for a in adds),
            skipped=False,
            duration_s=0.0,
            engine=ENGINE_NAME,
        )
    return unchanged(uri, latest, 0.0)


def _translated(
    exc: Exception, label: str, replace_partition: Mapping[str, Any] | None
) -> Exception:
    """A failed delta-spark write as the project's error (the Spark error stays the cause)."""
    text = str(exc)
    if any(marker in text for marker in _CONCURRENT):
        return ConcurrentWriteError(
            f"Another writer committed a conflicting change to table {label} first: "
            f"{_first_line(text)}. This write was not committed.",
            fix="retry the write; for the operator, rerun the job (batches are idempotent)",
        )
    if "DELTA_REPLACE_WHERE_MISMATCH" in text and replace_partition:
        shown = {c: sorted(v, key=str) for c, v in allowed_values(replace_partition).items()}
        return SchemaMismatchError(
            f"Overwriting partition(s) {shown} of table {label}, but the DataFrame also "
            f"holds rows of other partitions ({_first_line(text)}). The table is unchanged.",
            fix="filter the DataFrame to the partitions being replaced",
        )
    if "DELTA_NOT_NULL_CONSTRAINT_VIOLATED" in text or "DELTA_VIOLATE_CONSTRAINT" in text:
        return SchemaMismatchError(
            f"The data violates a constraint of table {label}: {_constraint_message(text)}. "
            "The table is unchanged.",
            fix="filter or fix the offending rows first",
        )
    if "DELTA_FAILED_TO_MERGE_FIELDS" in text or "DELTA_SCHEMA_" in text:
        return SchemaMismatchError(
            f"delta-spark refused the schema of the write to table {label}: "
            f"{_first_line(text)}. The table is unchanged.",
            fix='cast the columns to the table\'s types, or pass schema_mode="merge"',
        )
    if is_path_not_found(exc):
        return NotADeltaTableError(f"Cannot write table {label}: {_first_line(text)}")
    return exc


def _constraint_message(text: str) -> str:
    """Delta's own words about a violated constraint (which one, the row's values), found
    in a Java error whose first line is often py4j's "An error occurred while calling"."""
    found = re.search(
        r"\[DELTA_(?:VIOLATE_CONSTRAINT\w*|NOT_NULL_CONSTRAINT_VIOLATED)\].*?(?=\n\s*at |$)",
        text,
        re.S,
    )
    if found is None:
        return _first_line(text)
    return " ".join(found.group(0).split())[:500]


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line[:400]

"""Partition predicates for the delta-spark engine: SQL text for ``replaceWhere`` (which
partitions a commit replaces or removes) and Column filters selecting whole partitions of
a pinned version on read, plus Delta SQL's name of a path-based table."""

import datetime as dt
import decimal
import functools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from dagster_sideinputs.delta.engine import DataFile, TableSnapshot
from dagster_sideinputs.delta.log.state import LogState
from dagster_sideinputs.delta.schema import partition_key, quoted
from dagster_sideinputs.delta.staging import allowed_values
from dagster_sideinputs.delta.store.files import normalize_uri, spark_uri
from dagster_sideinputs.errors import ConcurrentWriteError, DeltaTableError


def sql_table(uri: str) -> str:
    """``delta.`<path>``` for Delta SQL on a path."""
    return "delta.`" + spark_uri(normalize_uri(uri)).replace("`", "``") + "`"


def sql_literal(value: Any) -> str:
    """A Python value as a Spark SQL literal (partition predicates)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | decimal.Decimal):
        return repr(value) if not isinstance(value, decimal.Decimal) else str(value)
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP'{value.isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE'{value.isoformat()}'"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def _in_predicate(column: str, values: Collection[Any]) -> str:
    present = sorted({v for v in values if v is not None}, key=repr)
    parts = []
    if present:
        parts.append(f"{quoted(column)} IN ({', '.join(sql_literal(v) for v in present)})")
    if any(v is None for v in values):
        parts.append(f"{quoted(column)} IS NULL")
    return "(" + " OR ".join(parts) + ")" if parts else "false"


def replace_predicate(replace: Mapping[str, Any]) -> str:
    """The ``replaceWhere`` of an overwrite of some partitions."""
    allowed = allowed_values(replace)
    return " AND ".join(_in_predicate(c, values) for c, values in allowed.items())


def removal_predicate(state: LogState, remove_files: Sequence[DataFile], label: str) -> str | None:
    """A replaceWhere predicate removing exactly ``remove_files``, which must be every
    live file of the partitions they belong to (None: every file of the table).

    Raises:
        ConcurrentWriteError: a file is not live any more, or its partitions hold more.
    """
    columns = state.partition_columns
    live = state.data_files()
    by_path = {f.path: f for f in live}
    removed = {f.path for f in remove_files}
    gone = sorted(removed - set(by_path))
    if gone:
        raise ConcurrentWriteError(
            f"The files to remove from {label} are not all live any more (e.g. {gone[0]!r}): "
            "another writer changed the table. Nothing was committed.",
            fix="rerun (batches are idempotent)",
        )

    def key(file: DataFile) -> tuple:
        return partition_key(file.partition_values, columns)

    partitions = {key(by_path[p]) for p in removed}
    extra = [f.path for f in live if key(f) in partitions and f.path not in removed]
    if extra or (not columns and len(removed) != len(live)):
        raise DeltaTableError(
            f"The delta-spark engine removes whole partitions only, and table {label} holds "
            f"other files in the partitions of the files to remove (e.g. {extra[:1]}).",
            fix="remove every file of a partition, or use the delta-rs bridge for this table",
        )
    if not columns or len(partitions) == len({key(f) for f in live}):
        return None
    typed = {key(by_path[p]): by_path[p].partition_values for p in removed}
    if len(columns) == 1:
        return _in_predicate(columns[0], [values.get(columns[0]) for values in typed.values()])
    clauses = []
    for _, values in sorted(typed.items(), key=lambda item: repr(item[0])):
        parts = [
            f"{quoted(c)} IS NULL"
            if values.get(c) is None
            else f"{quoted(c)} = {sql_literal(values.get(c))}"
            for c in columns
        ]
        clauses.append("(" + " AND ".join(parts) + ")")
    return " OR ".join(clauses)


def whole_partitions(snapshot: TableSnapshot, chosen: Sequence[DataFile]) -> Column | bool | None:
    """How Delta's reader selects ``chosen`` at this version: True (every file), a
    partition predicate (every file of some partitions), or None (not expressible)."""
    if len(chosen) == len(snapshot.files) and {f.path for f in chosen} == {
        f.path for f in snapshot.files
    }:
        return True
    columns = snapshot.partition_columns
    if not columns:
        return None

    def key(file: DataFile) -> tuple:
        return partition_key(file.partition_values, columns)

    wanted = {f.path for f in chosen}
    partitions = {key(f) for f in chosen}
    if any(key(f) in partitions and f.path not in wanted for f in snapshot.files):
        return None
    typed = {key(f): f.partition_values for f in chosen}
    if len(columns) == 1:
        column = columns[0]
        values = [typed[k].get(column) for k in partitions]
        present = [v for v in values if v is not None]
        condition = F.col(quoted(column)).isin(present) if present else F.lit(False)
        if len(present) != len(values):
            condition = condition | F.col(quoted(column)).isNull()
        return condition
    clauses = []
    for k in partitions:
        values_ = typed[k]
        parts = [
            F.col(quoted(c)).isNull()
            if values_.get(c) is None
            else F.col(quoted(c)) == F.lit(values_.get(c))
            for c in columns
        ]
        clauses.append(functools.reduce(lambda a, b: a & b, parts))
    return functools.reduce(lambda a, b: a | b, clauses)

"""Key groups and pre-keyed main inputs (Flink's reinterpretAsKeyedStream on Spark).

The key group of a key is ``pmod(hash(key), max_key_groups)`` with Spark's Murmur3
``hash``: the same function Spark uses for bucketing and hash partitioning, so any
Spark job can compute it and Spark itself can rely on it.

A pre-keyed main input promises that each data file holds one key group. The
operator checks that promise from the Delta log (partition values or min/max
statistics of the key-group column) before it writes anything. It then reads the
batch's files as a *bucketed* table (bucket = key group): Spark knows the main side
is already hash-partitioned by key, so a keyed join shuffles only the side input and
the main side's plan has no Exchange.

A keyed side input joined on the main key whose Delta table is partitioned by the same
key-group column is read as buckets too (:func:`side_splits`), once one Spark job has
checked that each of its rows sits in its key's group at the pinned version
(:func:`key_groups_hold`): the join then shuffles neither side. A side table that fails
the check is read normally; nothing about it was promised.

Spark reads a file's bucket id from its name. The operator therefore exposes the
batch's files to Spark through symbolic links named by key group, which needs a
local or shared filesystem; on object stores the operator reads normally (with a
shuffle) and says so in the batch metrics.
"""

import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.columns import quoted
from dagster_sideinputs.core.declarations import KeyGroups
from dagster_sideinputs.delta.engine import DataFile, TableSnapshot
from dagster_sideinputs.delta.store.files import is_local, normalize_uri
from dagster_sideinputs.errors import PreKeyedViolationError, preview


def key_group(key: str, max_key_groups: int) -> Column:
    """Spark expression of a key's key group."""
    return F.expr(f"pmod(hash({quoted(key)}), {max_key_groups})")


def _stat(file: DataFile, kind: str, column: str) -> Any:
    return (file.min_values if kind == "min" else file.max_values).get(column)


@dataclass(frozen=True)
class KeyedSplit:
    """A main-input file and the key group all its rows belong to."""

    uri: str
    key_group: int


def check_pre_keyed(
    files: Sequence[DataFile], groups: KeyGroups, *, key: str, table: str
) -> list[KeyedSplit]:
    """Verify the pre-keyed promise from metadata and give each file its key group.

    Raises:
        PreKeyedViolationError: naming the offending split(s) and their keys; raised
            before the batch writes anything.
    """
    splits: list[KeyedSplit] = []
    problems: list[str] = []
    for file in files:
        column = groups.column
        if column in file.partition_values:
            raw = file.partition_values[column]
            low = high = None if raw is None else int(raw)
        else:
            low, high = _stat(file, "min", column), _stat(file, "max", column)
        keys = f"keys {_stat(file, 'min', key)!r}..{_stat(file, 'max', key)!r}"
        if low is None or high is None:
            problems.append(f"{file.path} has no key-group statistics for {column!r} ({keys})")
        elif low != high:
            problems.append(f"{file.path} holds key groups {low}..{high} ({keys})")
        elif not 0 <= int(low) < groups.max_key_groups:
            problems.append(
                f"{file.path} is in key group {low}, outside 0..{groups.max_key_groups - 1}"
            )
        else:
            splits.append(KeyedSplit(file.uri, int(low)))
    if problems:
        raise PreKeyedViolationError(
            f"Main input {table} is declared pre-keyed (KeyGroups(max_key_groups="
            f"{groups.max_key_groups}, column={groups.column!r})), but {len(problems)} "
            f"split(s) break the promise that each holds exactly one key group: "
            f"{preview(problems, 3)}. Nothing was written.",
            fix=f"write the table partitioned by {groups.column!r} with "
            f"{groups.column} = pmod(hash({key}), {groups.max_key_groups}), or drop pre_keyed= "
            "to let the operator shuffle",
        )
    return splits


def side_splits(snapshot: TableSnapshot, groups: KeyGroups) -> list[KeyedSplit] | None:
    """A side table's files as key-group splits, when it is partitioned by the key-group
    column alone and every file's partition value is a group in range; else None."""
    if tuple(snapshot.partition_columns) != (groups.column,) or not snapshot.files:
        return None
    splits: list[KeyedSplit] = []
    for file in snapshot.files:
        raw = file.partition_values.get(groups.column)
        try:
            group = int(raw) if raw is not None else -1
        except ValueError:
            return None
        if not 0 <= group < groups.max_key_groups:
            return None
        splits.append(KeyedSplit(file.uri, group))
    return splits


def key_group_offenders(
    frame: DataFrame, *, key: str, groups: KeyGroups, limit: int = 1
) -> list[Row]:
    """Up to ``limit`` rows of ``frame`` (key, declared group, the key's group) whose
    key-group column is not their key's group (one Spark job reading the two columns; a
    null key is left out: it joins nothing wherever it sits, and has its own route)."""
    declared = F.col(quoted(groups.column))
    actual = key_group(key, groups.max_key_groups)
    wrong = F.col(quoted(key)).isNotNull() & (declared.isNull() | (declared != actual))
    return (
        frame.filter(wrong)
        .select(F.col(quoted(key)), declared, actual.alias("_dsi_actual"))
        .limit(limit)
        .collect()
    )


def key_groups_hold(frame: DataFrame, *, key: str, groups: KeyGroups) -> bool:
    """Whether every row of ``frame`` with a key sits in its key's group."""
    return not key_group_offenders(frame, key=key, groups=groups)


_SAFE_NAME = re.compile(r"[^A-Za-z0-9_]")


def _ddl(schema: T.StructType) -> str:
    return ", ".join(f"{quoted(f.name)} {f.dataType.simpleString()}" for f in schema.fields)


def bucketing_obstacle(snapshot: TableSnapshot, files: Sequence[DataFile]) -> str | None:
    """Why ``files`` (of ``snapshot``'s table) cannot be read as buckets by Spark's parquet
    reader, or None. Callers ask before :func:`bucketed_scan`."""
    if not files or not all(is_local(file.uri) for file in files):
        return "files are not on a local filesystem"
    if snapshot.configuration.get("delta.columnMapping.mode") not in (None, "none"):
        return "the table maps column names (delta.columnMapping.mode)"
    if any(file.deletion_vector for file in files):
        return "files carry deletion vectors"
    return None


def bucketed_scan(
    spark: SparkSession,
    splits: Sequence[KeyedSplit],
    *,
    snapshot: TableSnapshot,
    key: str,
    groups: KeyGroups,
    scratch_dir: str,
    label: str,
) -> tuple[DataFrame, str]:
    """Files of a table (at ``snapshot``) as a bucketed table, in the snapshot's columns;
    only for files :func:`bucketing_obstacle` finds no reason against.

    A key-group partition column gets the group each file declares (its partition value,
    which named its bucket link), not one recomputed from the key: a check comparing the
    two then finds a broken promise instead of rows joined in the wrong bucket.

    Returns:
        (DataFrame, catalog table name to drop after the batch).
    """
    folder = os.path.join(normalize_uri(scratch_dir), uuid.uuid4().hex)
    os.makedirs(folder)
    for index, split in enumerate(splits):
        # Spark parses the bucket id from the digits after the last underscore.
        os.symlink(
            normalize_uri(split.uri),
            os.path.join(folder, f"f{index:07d}_{split.key_group:05d}.parquet"),
        )
    name = f"dsi_prekeyed_{_SAFE_NAME.sub('_', label)}_{uuid.uuid4().hex[:12]}"
    spark.sql(
        f"CREATE TABLE `{name}` ({_ddl(snapshot.data_schema)}) USING parquet "
        f"CLUSTERED BY ({quoted(key)}) INTO {groups.max_key_groups} BUCKETS "
        f"LOCATION 'file://{folder}'"
    )
    frame = spark.table(f"`{name}`")
    if groups.column in snapshot.partition_columns:
        declared = F.regexp_extract(F.col("_metadata.file_name"), r"_(\d+)\.parquet$", 1)
        frame = frame.withColumn(
            groups.column, declared.cast(snapshot.schema[groups.column].dataType)
        )
    return frame.select(*[quoted(c) for c in snapshot.schema.fieldNames()]), name


def drop_bucketed_scan(spark: SparkSession, name: str) -> None:
    """Forget the temporary table (external: the data files are untouched)."""
    location = None
    try:
        rows = spark.sql(f"DESCRIBE TABLE EXTENDED `{name}`").collect()
        location = next((r.data_type for r in rows if r.col_name == "Location"), None)
    finally:
        spark.sql(f"DROP TABLE IF EXISTS `{name}`")
    if location:
        folder = normalize_uri(location)
        for entry in os.scandir(folder):
            os.remove(entry.path)
        os.rmdir(folder)

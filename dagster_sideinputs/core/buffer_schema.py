"""Buffered records across changes of the main input's schema.

A record waits in the buffer with the main input's columns as they were when it was read.
Should the main input's schema change meanwhile, the record is carried over to the new
schema as the main input itself would read it now (DECISIONS.md, "Buffering"):

- a column renamed under column mapping is followed by its field id (the Delta log of the
  main input at the version the buffer was last written in, and at the plan's version);
- a dropped column is dropped (a column dropped and added again under column mapping is
  another column: a new field id, null for the waiting records, as Delta reads it);
- an added column is null;
- a widened type (Delta's type widening: integers to wider integers or double, float to
  double, date to timestamp_ntz, wider decimals) is cast, which loses nothing;
- any other type change is cast only when every waiting value survives the cast and
  back; otherwise the batch stops, naming the main input and the column, with a fix that
  keeps the records;
- order and nullability do not matter (columns are matched by name, the buffer is
  nullable throughout).

When the buffer's columns no longer match the main input's (a rename, a drop, a type
change), the planner has the batch read every slot and write the buffer again whole, in
the main input's schema (an overwrite of the buffer table, schema included): the buffer
never holds two schemas, and the columns of its records are always those of the main
input at the version the buffer was last written in.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.buffer import BufferState
from dagster_sideinputs.core.columns import PREFIX, quoted
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.delta.schema import is_safe_widening, same_type
from dagster_sideinputs.errors import MainInputDataError, SideInputError

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


@dataclass(frozen=True)
class Carry:
    """How the buffered records meet the main input's current schema.

    Attributes:
        renames: buffered column -> the main input's column it now is, or None (gone).
        rewrite: the buffer must be read whole and written again in the current schema.
    """

    renames: Mapping[str, str | None]
    rewrite: bool


NO_CHANGE = Carry({}, False)


def stored_main_fields(buffer: BufferState) -> list[T.StructField]:
    """The main-input columns of the buffer table (its other columns are the operator's)."""
    if buffer.snapshot is None:
        return []
    return [f for f in buffer.snapshot.schema.fields if not f.name.startswith(PREFIX)]


def plan_carry(
    spec: OperatorSpec,
    buffer: BufferState,
    main_schema: T.StructType | None,
    *,
    ids_now: Mapping[str, int],
    ids_then: Mapping[str, int] | None,
    then_version: int | None,
) -> Carry:
    """Compare the buffer's columns with the main input's (``main_schema``, None when
    unknown before reading: nothing planned). ``ids_now`` / ``ids_then``: the main
    input's column-mapping ids at the plan's version and at ``then_version``, the
    version the buffer was last written in (None: that version's log is gone).

    Raises:
        MainInputDataError: under column mapping, a buffered column is not a column of
            the main input any more and its log no longer tells what became of it.
    """
    stored = stored_main_fields(buffer)
    if main_schema is None or not stored:
        return NO_CHANGE
    names = set(main_schema.fieldNames())
    by_id = {fid: name for name, fid in ids_now.items()}
    renames: dict[str, str | None] = {}
    for column in stored:
        if ids_now and ids_then is None and column.name not in names and buffer.rows():
            raise MainInputDataError(
                f"Main input {spec.main.asset!r} has no column {column.name!r} any more, "
                f"which {buffer.rows()} record(s) waiting in operator {spec.operator_id!r} "
                f"hold, and its Delta log no longer has version {then_version} to tell "
                "whether the column was renamed or dropped. Nothing was written.",
                fix=f"give the column its name {column.name!r} back in {spec.main.asset!r} "
                "(ALTER TABLE ... RENAME COLUMN ... TO ...) until the waiting records are "
                "released, then rename it again",
            )
        then = (ids_then or {}).get(column.name)
        target: str | None
        if ids_now and then is not None:
            target = by_id.get(then)  # the column with that field id now (None: dropped)
        else:
            target = column.name if column.name in names else None
        if target != column.name:
            renames[column.name] = target
    retyped = any(
        not same_type(column.dataType, main_schema[target].dataType)
        for column in stored
        if (target := renames.get(column.name, column.name)) is not None
    )
    return Carry(renames, bool(renames) or retyped)


def widens(source: T.DataType, target: T.DataType) -> bool:
    """Delta's type widening: every value of ``source`` is a value of ``target``."""
    if is_safe_widening(source, target):
        return True
    if isinstance(source, T.DateType) and isinstance(target, T.TimestampNTZType):
        return True
    if isinstance(source, (*_INTEGRAL[:3], T.FloatType)) and isinstance(target, T.DoubleType):
        return True
    if isinstance(source, _INTEGRAL) and isinstance(target, T.DecimalType):
        digits = {T.ByteType: 3, T.ShortType: 5, T.IntegerType: 10, T.LongType: 20}[type(source)]
        return target.precision - target.scale >= digits
    return False


def carried(
    spec: OperatorSpec,
    buffered: DataFrame,
    main_schema: T.StructType,
    renames: Mapping[str, str | None],
) -> DataFrame:
    """The buffered records in the main input's current schema (the module's rules),
    with their bookkeeping columns.

    Raises:
        MainInputDataError: a changed type cannot hold a waiting record's value.
    """
    stored = [f for f in buffered.schema.fields if not f.name.startswith(PREFIX)]
    if not renames and [(f.name, f.dataType) for f in stored] == [
        (f.name, f.dataType) for f in main_schema.fields
    ]:
        return buffered
    source: dict[str, T.StructField] = {}
    for column in buffered.schema.fields:
        if column.name.startswith(PREFIX):
            continue
        target = renames.get(column.name, column.name)
        if target is not None and target in main_schema.fieldNames():
            source[target] = column
    columns = []
    checks = []
    for field in main_schema.fields:
        old = source.get(field.name)
        if old is None:
            columns.append(F.lit(None).cast(field.dataType).alias(field.name))
            continue
        value = F.col(quoted(old.name))
        if same_type(old.dataType, field.dataType):
            columns.append(value.alias(field.name))
            continue
        if not widens(old.dataType, field.dataType):
            checks.append((old, field))
        columns.append(value.try_cast(field.dataType).alias(field.name))
    for old, field in checks:
        _check_lossless(spec, buffered, old, field)
    bookkeeping = [F.col(c) for c in buffered.columns if c.startswith(PREFIX)]
    return buffered.select(*columns, *bookkeeping)


def _check_lossless(
    spec: OperatorSpec, buffered: DataFrame, old: T.StructField, new: T.StructField
) -> None:
    value = F.col(quoted(old.name))
    back = value.try_cast(new.dataType).try_cast(old.dataType)
    try:
        lost = buffered.filter(value.isNotNull() & ~back.eqNullSafe(value))
        count = lost.count()
        sample = lost.select(value.cast("string")).limit(3).collect() if count else []
    except SideInputError:
        raise
    except Exception as exc:  # a type Spark cannot compare: no value can be vouched for
        count, sample = -1, []
        cause: Exception | None = exc
    else:
        cause = None
    if count == 0:
        return
    shown = ", ".join(repr(row[0]) for row in sample)
    held = f"{count} waiting record(s) hold values ({shown})" if count > 0 else "waiting records"
    raise MainInputDataError(
        f"Main input {spec.main.asset!r} changed column {new.name!r} from "
        f"{old.dataType.simpleString()} to {new.dataType.simpleString()} while records "
        f"waited in operator {spec.operator_id!r}: {held} that "
        f"{new.dataType.simpleString()} cannot hold. Nothing was written.",
        fix=f"give {new.name!r} a type that holds its {old.dataType.simpleString()} values "
        f"(declare it {old.dataType.simpleString()} again, or a wider type) until the "
        "waiting records are released, then change it",
    ) from cause

"""Buffered records across changes of the main input's schema.

A record waits in the buffer with the main input's columns as they were when it was read.
Should the main input's schema change meanwhile, the record is carried over to the new
schema as the main input itself would read it now (DECISIONS.md, "Buffering"), at every
depth: the fields of a struct column, of the structs in an array or a map, as its
top-level columns:

- a column or nested field renamed under column mapping is followed by its field id (the
  Delta log of the main input at the version the buffer was last written in, and at the
  plan's version: ``TableSnapshot.field_ids``, by column path);
- a dropped column or nested field is dropped (one dropped and added again under column
  mapping is another: a new field id, null for the waiting records, as Delta reads it);
- an added column or nested field is null (a struct is rebuilt field by field, an array
  element by element, a map key by key and value by value; a null stays null);
- a widened type (Delta's type widening: integers to wider integers or double, float to
  double, date to timestamp_ntz, wider decimals), at the top or at a nested leaf, is
  cast, which loses nothing;
- any other type change is cast only when every waiting value survives the cast and
  back; otherwise the batch stops, naming the main input and the column or nested field
  (``detail.amount``, ``items.element.qty``), with a fix that keeps the records;
- order and nullability do not matter (columns and fields are matched by name, the
  buffer is nullable throughout).

When the buffer's columns no longer match the main input's (a rename, a drop, a type
change, at any depth), the planner has the batch read every slot and write the buffer
again whole, in the main input's schema (an overwrite of the buffer table, schema
included): the buffer never holds two schemas, and the columns of its records are always
those of the main input at the version the buffer was last written in.
"""

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.batch.buffer import BufferState
from dagster_sideinputs.core.columns import PREFIX, quoted
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.delta.schema import is_safe_widening, same_type
from dagster_sideinputs.errors import MainInputDataError, SideInputError

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)

Path = tuple[str, ...]
"""A column's path: its name, then a nested field's name in each struct, ``ELEMENT`` in
an array, ``KEY`` / ``VALUE`` in a map (as the Delta engines' ``field_ids`` name paths)."""
ELEMENT, KEY, VALUE = "element", "key", "value"


def path_key(path: Path) -> str:
    """A path as a key of :attr:`Carry.renames` (and of the plan's JSON): a top-level
    column by its name, a nested field by the JSON list of its path."""
    return path[0] if len(path) == 1 else json.dumps(list(path))


def path_of(key: str) -> Path:
    """The path of a :func:`path_key`."""
    if key.startswith("["):
        try:
            path = json.loads(key)
        except ValueError:
            return (key,)
        if isinstance(path, list) and len(path) > 1 and all(isinstance(p, str) for p in path):
            return tuple(path)
    return (key,)


def shown(path: Path) -> str:
    """A path as messages name it: ``items.element.sku``."""
    return ".".join(path)


@dataclass(frozen=True)
class Carry:
    """How the buffered records meet the main input's current schema.

    Attributes:
        renames: buffered column or nested field (:func:`path_key` of its path in the
            buffer) -> its name in the main input now, or None (gone). Only those whose
            name changed.
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
    ids_now: Mapping[Path, int],
    ids_then: Mapping[Path, int] | None,
    then_version: int | None,
) -> Carry:
    """Compare the buffer's columns with the main input's (``main_schema``, None when
    unknown before reading: nothing planned), at every depth. ``ids_now`` / ``ids_then``:
    the main input's column-mapping ids by column path at the plan's version and at
    ``then_version``, the version the buffer was last written in (None: that version's
    log is gone).

    Raises:
        MainInputDataError: under column mapping, a buffered column or nested field is
            not one of the main input's any more and its log no longer tells what became
            of it.
    """
    stored = stored_main_fields(buffer)
    if main_schema is None or not stored:
        return NO_CHANGE
    renames: dict[str, str | None] = {}

    def follow(old: T.DataType, new: T.DataType, old_path: Path, new_path: Path) -> None:
        if isinstance(old, T.StructType) and isinstance(new, T.StructType):
            names = set(new.fieldNames())
            by_id = {ids_now[(*new_path, n)]: n for n in names if (*new_path, n) in ids_now}
            for column in old.fields:
                path = (*old_path, column.name)
                if ids_now and ids_then is None and column.name not in names and buffer.rows():
                    _log_gone(spec, buffer, path, then_version)
                then = (ids_then or {}).get(path)
                target: str | None
                if ids_now and then is not None:
                    target = by_id.get(then)  # the field with that id now (None: dropped)
                else:
                    target = column.name if column.name in names else None
                if target != column.name:
                    renames[path_key(path)] = target
                if target is not None:
                    follow(column.dataType, new[target].dataType, path, (*new_path, target))
        elif isinstance(old, T.ArrayType) and isinstance(new, T.ArrayType):
            follow(old.elementType, new.elementType, (*old_path, ELEMENT), (*new_path, ELEMENT))
        elif isinstance(old, T.MapType) and isinstance(new, T.MapType):
            follow(old.keyType, new.keyType, (*old_path, KEY), (*new_path, KEY))
            follow(old.valueType, new.valueType, (*old_path, VALUE), (*new_path, VALUE))

    follow(T.StructType(stored), main_schema, (), ())
    retyped = any(
        not same_type(column.dataType, main_schema[target].dataType)
        for column in stored
        if (target := renames.get(column.name, column.name)) is not None
    )
    return Carry(renames, bool(renames) or retyped)


def _log_gone(spec: OperatorSpec, buffer: BufferState, path: Path, version: int | None) -> None:
    kind = "column" if len(path) == 1 else "nested field"
    raise MainInputDataError(
        f"Main input {spec.main.asset!r} has no {kind} {shown(path)!r} any more, "
        f"which {buffer.rows()} record(s) waiting in operator {spec.operator_id!r} "
        f"hold, and its Delta log no longer has version {version} to tell "
        f"whether the {kind} was renamed or dropped. Nothing was written.",
        fix=f"give the {kind} its name {path[-1]!r} back in {spec.main.asset!r} "
        "(ALTER TABLE ... RENAME COLUMN ... TO ...) until the waiting records are "
        "released, then rename it again",
    )


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
    moves = {path_of(key): target for key, target in renames.items()}
    columns = []
    checks: list[tuple[str, Loss]] = []
    for field, old in _matched(T.StructType(stored), main_schema, (), moves):
        if old is None:
            columns.append(F.lit(None).cast(field.dataType).alias(field.name))
            continue
        value = F.col(quoted(old.name))
        path = (old.name,)
        columns.append(
            _conformed(value, old.dataType, field.dataType, path, moves).alias(field.name)
        )
        checks.extend(
            (old.name, loss) for loss in _losses(old.dataType, field.dataType, path, moves)
        )
    for column, loss in checks:
        _check_lossless(spec, buffered, column, *loss)
    bookkeeping = [F.col(c) for c in buffered.columns if c.startswith(PREFIX)]
    return buffered.select(*columns, *bookkeeping)


def _matched(
    old: T.StructType, new: T.StructType, path: Path, moves: Mapping[Path, str | None]
) -> list[tuple[T.StructField, T.StructField | None]]:
    """Each field of ``new`` with the field of ``old`` (at the buffer's ``path``) that it
    is now, by name after ``moves`` (None: none, a new field)."""
    source: dict[str, T.StructField] = {}
    for field in old.fields:
        target = moves.get((*path, field.name), field.name)
        if target is not None and target in new.fieldNames():
            source[target] = field
    return [(field, source.get(field.name)) for field in new.fields]


def _moved_under(path: Path, moves: Mapping[Path, str | None]) -> bool:
    return any(len(moved) > len(path) and moved[: len(path)] == path for moved in moves)


def _conformed(
    value: Column, old: T.DataType, new: T.DataType, path: Path, moves: Mapping[Path, str | None]
) -> Column:
    """``value`` (of type ``old``, at the buffer's ``path``) as the main input reads it
    now in type ``new``: structs field by field (new fields null, dropped ones gone),
    arrays element by element, maps key by key and value by value, leaves cast."""
    if same_type(old, new) and not _moved_under(path, moves):
        return value
    if isinstance(old, T.StructType) and isinstance(new, T.StructType):
        fields = [
            (
                F.lit(None).cast(field.dataType)
                if was is None
                else _conformed(
                    value.getField(was.name), was.dataType, field.dataType, (*path, was.name), moves
                )
            ).alias(field.name)
            for field, was in _matched(old, new, path, moves)
        ]
        return F.when(value.isNull(), F.lit(None).cast(new)).otherwise(F.struct(*fields))
    if isinstance(old, T.ArrayType) and isinstance(new, T.ArrayType):
        element = (*path, ELEMENT)
        return F.transform(
            value, lambda x: _conformed(x, old.elementType, new.elementType, element, moves)
        )
    if isinstance(old, T.MapType) and isinstance(new, T.MapType):
        key, item = (*path, KEY), (*path, VALUE)
        if not same_type(old.keyType, new.keyType) or _moved_under(key, moves):
            value = F.transform_keys(
                value, lambda k, _: _conformed(k, old.keyType, new.keyType, key, moves)
            )
        return F.transform_values(
            value, lambda _, v: _conformed(v, old.valueType, new.valueType, item, moves)
        )
    return value.try_cast(new)


Loss = tuple[Path, T.DataType, T.DataType, Callable[[Column], Column]]


def _losses(
    old: T.DataType, new: T.DataType, path: Path, moves: Mapping[Path, str | None]
) -> list[Loss]:
    """The leaves whose type changed other than by a widening: each with its path (the
    buffer's), both types, and a test of a value at ``path`` that holds a leaf value the
    new type cannot hold (true) or not."""
    if same_type(old, new):
        return []
    if isinstance(old, T.StructType) and isinstance(new, T.StructType):
        losses: list[Loss] = []
        for field, was in _matched(old, new, path, moves):
            if was is not None:
                inner = _losses(was.dataType, field.dataType, (*path, was.name), moves)
                losses.extend(_within(inner, _in_field(was.name)))
        return losses
    if isinstance(old, T.ArrayType) and isinstance(new, T.ArrayType):
        inner = _losses(old.elementType, new.elementType, (*path, ELEMENT), moves)
        return _within(inner, F.exists)
    if isinstance(old, T.MapType) and isinstance(new, T.MapType):
        keys = _losses(old.keyType, new.keyType, (*path, KEY), moves)
        values = _losses(old.valueType, new.valueType, (*path, VALUE), moves)
        return [
            *_within(keys, lambda v, lost: F.exists(F.map_keys(v), lost)),
            *_within(values, lambda v, lost: F.exists(F.map_values(v), lost)),
        ]
    if widens(old, new):
        return []
    return [
        (
            path,
            old,
            new,
            lambda v: v.isNotNull() & ~v.try_cast(new).try_cast(old).eqNullSafe(v),
        )
    ]


Test = Callable[[Column], Column]


def _within(losses: list[Loss], reach: Callable[[Column, Test], Column]) -> list[Loss]:
    """``losses`` of the values inside a value: ``reach(value, test)`` tests them."""

    def outer(lost: Test) -> Test:
        return lambda value: reach(value, lost)

    return [(leaf, old, new, outer(lost)) for leaf, old, new, lost in losses]


def _in_field(name: str) -> Callable[[Column, Test], Column]:
    return lambda value, lost: lost(value.getField(name))


def _check_lossless(
    spec: OperatorSpec,
    buffered: DataFrame,
    column: str,
    path: Path,
    old: T.DataType,
    new: T.DataType,
    lost: Callable[[Column], Column],
) -> None:
    value = F.col(quoted(column))
    try:
        losing = buffered.filter(lost(value))
        count = losing.count()
        sample = losing.select(value.cast("string")).limit(3).collect() if count else []
    except SideInputError:
        raise
    except Exception as exc:  # a type Spark cannot compare: no value can be vouched for
        count, sample = -1, []
        cause: Exception | None = exc
    else:
        cause = None
    if count == 0:
        return
    held = ", ".join(repr(row[0]) for row in sample)
    held = f"{count} waiting record(s) hold values ({held})" if count > 0 else "waiting records"
    name = shown(path)
    was, now = old.simpleString(), new.simpleString()
    raise MainInputDataError(
        f"Main input {spec.main.asset!r} changed column {name!r} from {was} to {now} while "
        f"records waited in operator {spec.operator_id!r}: {held} that {now} cannot hold. "
        "Nothing was written.",
        fix=f"give {name!r} a type that holds its {was} values (declare it {was} again, "
        "or a wider type) until the waiting records are released, then change it",
    ) from cause

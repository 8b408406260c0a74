"""Spark <-> Delta schemas, and the rules for appending a DataFrame to a table.

Delta's schema JSON is Spark's ``StructType`` JSON (Delta inherited it), so the
conversion is exact both ways: no type guessing through Arrow.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import deltalake
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.errors import DeltaTableError, SchemaMismatchError, did_you_mean

# Column metadata that Spark adds for its own bookkeeping and Delta must not store.
_SPARK_INTERNAL_METADATA_PREFIX = "__"

# Types a Delta partition column may have here: their string form in the Delta log and
# in Spark's partition directory names agree exactly (timestamps and floats do not).
PARTITION_TYPES: tuple[type[T.DataType], ...] = (
    T.StringType,
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.DateType,
    T.BooleanType,
)

_INTEGRAL_RANK: dict[type, int] = {T.ByteType: 1, T.ShortType: 2, T.IntegerType: 3, T.LongType: 4}


def as_nullable(data_type: T.DataType) -> T.DataType:
    """Every field nullable at every depth, without Spark's internal column metadata.

    Delta tables created from DataFrames are nullable throughout (delta-spark's
    ``asNullable``): Spark's file readers report every column nullable anyway.
    """
    if isinstance(data_type, T.StructType):
        return T.StructType(
            [
                T.StructField(
                    f.name,
                    as_nullable(f.dataType),
                    True,
                    {
                        k: v
                        for k, v in (f.metadata or {}).items()
                        if not k.startswith(_SPARK_INTERNAL_METADATA_PREFIX)
                    },
                )
                for f in data_type.fields
            ]
        )
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(as_nullable(data_type.elementType), True)
    if isinstance(data_type, T.MapType):
        return T.MapType(as_nullable(data_type.keyType), as_nullable(data_type.valueType), True)
    return data_type


def spark_to_delta_schema(schema: T.StructType, *, table: str = "") -> deltalake.Schema:
    """The Delta schema of a Spark schema, every column nullable (as delta-spark does).
    ``table`` names the table written, for the error.

    Raises:
        SchemaMismatchError: a column has a type Delta cannot store (``void``, intervals).
    """
    of_table = f" of table {table}" if table else ""
    for field in schema.fields:
        if isinstance(field.dataType, T.NullType):
            raise SchemaMismatchError(
                f"Column {field.name!r}{of_table} has type void (a bare `lit(None)`), which "
                "Delta cannot store. Nothing was written.",
                fix=f'give it a type, e.g. F.lit(None).cast("string").alias("{field.name}")',
            )
    try:
        return deltalake.Schema.from_json(as_nullable(schema).json())
    except Exception as exc:  # delta-rs raises a generic exception for unknown types
        raise SchemaMismatchError(
            f"This schema{of_table} cannot be stored in Delta: {exc}. Schema: "
            f"{schema.simpleString()}",
            fix="cast unsupported columns (intervals, variants, ...) to supported types",
        ) from exc


def delta_to_spark_schema(schema: deltalake.Schema) -> T.StructType:
    """The Spark schema of a Delta schema."""
    return T.StructType.fromJson(json.loads(schema.to_json()))


def check_partition_columns(schema: T.StructType, partition_by: list[str], *, table: str) -> None:
    """Fail clearly when partition columns are missing or of a type the bridge cannot encode."""
    names = schema.fieldNames()
    for column in partition_by:
        if column not in names:
            raise SchemaMismatchError(
                f"Partition column {column!r} of table {table} is not in the data "
                f"(columns: {names}).{did_you_mean(column, names)}",
                fix="add the column to the DataFrame or change partition_by",
            )
        data_type = schema[column].dataType
        if not isinstance(data_type, PARTITION_TYPES):
            raise SchemaMismatchError(
                f"Partition column {column!r} of table {table} has type "
                f"{data_type.simpleString()}, which the bridge cannot use as a partition "
                "value without losing precision.",
                fix=f"partition by a string, integer, boolean or date column, e.g. "
                f'F.date_format("{column}", "yyyy-MM-dd-HH").alias("{column}_hour")',
            )


def partition_string(value: Any) -> str | None:
    """A partition value as Delta logs it and Spark names its ``col=value`` folder.

    Delta and Spark both read an empty string partition value as null.
    """
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def quoted(column: str) -> str:
    """A column name as Spark SQL and ``F.col`` read it literally (dots, spaces, backticks)."""
    return "`" + column.replace("`", "``") + "`"


def partition_key(values: Mapping[str, Any], columns: Sequence[str]) -> tuple[str | None, ...]:
    """A file's partition (its values of ``columns``, as logged), to group files by."""
    return tuple(partition_string(values.get(c)) for c in columns)


def _without_metadata(data_type: T.DataType) -> T.DataType:
    if isinstance(data_type, T.StructType):
        return T.StructType(
            [T.StructField(f.name, _without_metadata(f.dataType), True) for f in data_type.fields]
        )
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(_without_metadata(data_type.elementType), True)
    if isinstance(data_type, T.MapType):
        return T.MapType(
            _without_metadata(data_type.keyType), _without_metadata(data_type.valueType), True
        )
    return data_type


def same_type(left: T.DataType, right: T.DataType) -> bool:
    """Equal types, ignoring nullability and field metadata."""
    return _without_metadata(as_nullable(left)) == _without_metadata(as_nullable(right))


def is_safe_widening(source: T.DataType, target: T.DataType) -> bool:
    """Whether values of ``source`` always fit ``target`` exactly (Delta's implicit upcasts)."""
    if type(source) in _INTEGRAL_RANK and type(target) in _INTEGRAL_RANK:
        return _INTEGRAL_RANK[type(source)] <= _INTEGRAL_RANK[type(target)]
    if isinstance(source, T.FloatType) and isinstance(target, T.DoubleType):
        return True
    if isinstance(source, T.DecimalType) and isinstance(target, T.DecimalType):
        return (
            target.scale >= source.scale
            and target.precision - target.scale >= source.precision - source.scale
        )
    return False


@dataclass(frozen=True)
class AppendPlan:
    """How to project a DataFrame onto an existing table for an append.

    Attributes:
        columns: expressions producing the table's columns in table order.
        new_fields: columns to add to the table first (schema merge only).
    """

    columns: list[Column]
    new_fields: list[T.StructField]


COMPUTED_COLUMN_KEYS = ("delta.generationExpression", "delta.identity.start")


def computed_by_delta(field: T.StructField) -> bool:
    """An identity or generated column, whose values Delta's writer computes."""
    return any(key in field.metadata for key in COMPUTED_COLUMN_KEYS)


def plan_append(
    data: T.StructType,
    table_schema: T.StructType,
    *,
    table: str,
    merge: bool,
    overwrite: bool = False,
) -> AppendPlan:
    """Match a DataFrame schema to a table schema, or explain precisely why it does not.

    Rules (those of delta-spark): columns match by name; a type must be equal or a
    safe widening (int -> long, float -> double, wider decimal); with ``merge`` new
    columns are added to the table and missing ones are written as nulls. Unlike
    delta-spark, a missing column is an error without ``merge`` (output schemas are
    strict), except an identity or generated column, which Delta's writer computes.

    ``overwrite``: the data replaces the table's rows (a full overwrite that keeps the
    schema): the error says so, and that ``schema_mode="overwrite"`` replaces the schema.

    Raises:
        SchemaMismatchError: naming every offending column, with the fix.
    """
    data_fields = {field.name: field for field in data.fields}
    table_names = table_schema.fieldNames()
    problems: list[str] = []
    columns: list[Column] = []
    for field in table_schema.fields:
        incoming = data_fields.get(field.name)
        if incoming is None and computed_by_delta(field):
            continue  # Delta's writer computes it (the bridge refuses such tables)
        if incoming is None:
            if merge:
                columns.append(F.lit(None).cast(field.dataType).alias(field.name))
            else:
                problems.append(
                    f"column {field.name!r} ({field.dataType.simpleString()}) is missing"
                    f"{did_you_mean(field.name, data_fields)}"
                )
            continue
        if same_type(incoming.dataType, field.dataType):
            columns.append(F.col(quoted(field.name)))
        elif is_safe_widening(incoming.dataType, field.dataType):
            columns.append(F.col(quoted(field.name)).cast(field.dataType).alias(field.name))
        else:
            problems.append(
                f"column {field.name!r} is {incoming.dataType.simpleString()} in the data "
                f"but {field.dataType.simpleString()} in the table"
            )
    retyped = bool(problems) and all(" in the data but " in p for p in problems)
    extra = [field for name, field in data_fields.items() if name not in table_names]
    if extra and not merge:
        retyped = False
        problems.extend(
            f"column {field.name!r} ({field.dataType.simpleString()}) is not in the table"
            f"{did_you_mean(field.name, table_names)}"
            for field in extra
        )
    if problems and overwrite:
        raise SchemaMismatchError(
            f"Cannot overwrite table {table} keeping its schema: "
            + "; ".join(problems)
            + ". The table is unchanged.",
            fix='pass schema_mode="overwrite" to replace the table\'s schema with the '
            "data's along with its rows, or cast or rename the columns to match the table",
        )
    if problems:
        raise SchemaMismatchError(
            f"Cannot append to table {table}: " + "; ".join(problems) + ". The table is unchanged.",
            # schema_mode="merge" adds and nulls columns; it changes no column's type.
            fix="cast the columns to the table's types (if a wider type is needed, write "
            "to a new table)"
            if retyped
            else "cast or rename the columns to match the table, or pass "
            'schema_mode="merge" to add new columns and write missing ones as nulls',
        )
    columns.extend(F.col(quoted(field.name)) for field in extra)
    return AppendPlan(columns=columns, new_fields=extra)


def delta_field(field: T.StructField) -> deltalake.Field:
    """One Spark field as a nullable Delta field (for schema evolution)."""
    nullable = as_nullable(T.StructType([field]))
    assert isinstance(nullable, T.StructType)
    return deltalake.Field.from_json(nullable.fields[0].json())


def _nullable_fields(fields: list[T.StructField]) -> list[T.StructField]:
    nullable = as_nullable(T.StructType(fields))
    assert isinstance(nullable, T.StructType)
    return nullable.fields


def plan_write_schema(
    df: DataFrame,
    existing: T.StructType | None,
    existing_partitions: list[str],
    *,
    mode: Literal["append", "overwrite"],
    partition_by: list[str],
    schema_mode: Literal["merge", "overwrite"] | None,
    label: str,
    replace_partition: Mapping[str, Any] | None,
) -> tuple[T.StructType, DataFrame, list[T.StructField], list[str]]:
    """How a write of ``df`` fits the table: (table schema after the write, the projected
    DataFrame, columns to add to the table, partition columns).

    Raises:
        SchemaMismatchError / DeltaTableError: naming the mismatch and the fix.
    """
    if replace_partition and mode != "overwrite":
        raise DeltaTableError(
            f"replace_partition is only meaningful with mode='overwrite' (table {label}).",
            fix='pass mode="overwrite" together with replace_partition',
        )
    full_replace = mode == "overwrite" and not replace_partition
    if existing is None or (full_replace and schema_mode == "overwrite"):
        check_partition_columns(df.schema, partition_by, table=label)
        if replace_partition:
            unknown = set(replace_partition) - set(partition_by)
            if unknown:
                raise SchemaMismatchError(
                    f"replace_partition names {sorted(unknown)}, which are not partition "
                    f"columns of table {label} (partition_by={partition_by}).",
                    fix="pass the table's partition columns in partition_by",
                )
        spark_to_delta_schema(df.schema, table=label)  # fail early: types Delta cannot store
        schema = as_nullable(df.schema)
        assert isinstance(schema, T.StructType)
        return schema, df, [], partition_by

    if partition_by and partition_by != existing_partitions:
        raise SchemaMismatchError(
            f"Table {label} is partitioned by {existing_partitions}, not {partition_by}.",
            fix=f"pass partition_by={existing_partitions} (or none), or write to a new table",
        )
    if replace_partition and set(replace_partition) != set(existing_partitions):
        shown = ", ".join(repr(c) + ": ..." for c in existing_partitions)
        raise SchemaMismatchError(
            f"replace_partition must give every partition column of table {label} "
            f"({existing_partitions}); got {sorted(replace_partition)}.",
            fix=f"pass replace_partition={{{shown}}}",
        )
    plan = plan_append(
        df.schema, existing, table=label, merge=schema_mode == "merge", overwrite=full_replace
    )
    schema = T.StructType(list(existing.fields) + list(_nullable_fields(plan.new_fields)))
    return schema, df.select(*plan.columns), plan.new_fields, existing_partitions


REFUSED_NAME_CHARACTERS = " ,;{}()\n\t="
"""Characters delta-spark refuses in column names (at any depth) of a table without
column mapping (``SchemaUtils.checkFieldNames``)."""


def refused_names(data_type: T.DataType, prefix: str = "") -> list[str]:
    """The column and nested field names (dotted paths) delta-spark refuses without
    column mapping."""
    found: list[str] = []
    if isinstance(data_type, T.StructType):
        for field in data_type.fields:
            path = f"{prefix}{field.name}"
            if any(c in REFUSED_NAME_CHARACTERS for c in field.name):
                found.append(path)
            found += refused_names(field.dataType, f"{path}.")
    elif isinstance(data_type, T.ArrayType):
        found += refused_names(data_type.elementType, f"{prefix[:-1]}[].")
    elif isinstance(data_type, T.MapType):
        found += refused_names(data_type.keyType, f"{prefix[:-1]}{{key}}.")
        found += refused_names(data_type.valueType, f"{prefix[:-1]}{{value}}.")
    return found


def check_column_names(
    schema: T.StructType, *, table: str, column_mapping: bool, mapping_writable: bool
) -> None:
    """Refuse, before any Spark job, names Delta refuses in a table without column mapping
    (delta-spark fails the write; delta-rs writes a table delta-spark cannot write to).

    Args:
        column_mapping: the table exists and maps column names (then any name is fine).
        mapping_writable: the engine can write a column-mapped table (delta-spark).

    Raises:
        SchemaMismatchError: naming the columns, what Delta refuses and both fixes.
    """
    if column_mapping:
        return
    refused = refused_names(schema)
    if not refused:
        return
    mapped = (
        "or create the output table with column mapping before the first run "
        "(delta-spark: `CREATE TABLE ... TBLPROPERTIES ('delta.columnMapping.mode' = "
        "'name', ...)`)"
    )
    if not mapping_writable:
        mapped += (
            " and write it with the delta-spark engine (DeltaStorage(engine='delta-spark'); "
            "the delta-rs bridge cannot write column-mapped tables)"
        )
    raise SchemaMismatchError(
        f"Output {table!r}: column name(s) {refused} contain characters Delta refuses in "
        "column names (space and , ; { } ( ) = newline tab) unless the table maps column "
        "names (delta.columnMapping.mode), which this table does not. Nothing was written.",
        fix="rename the column(s) in the function (e.g. `.withColumnRenamed(...)`, or the "
        f"dict keys / the output tag's schema in row mode), {mapped}",
    )

"""A Delta table at one version as its log describes it, for the delta-spark engine.

:class:`LogState` holds the replayed actions (live files, application transactions,
metadata, protocol); this module also types them: column mapping (physical and logical
names), typed partition values and statistics, :class:`~dagster_sideinputs.delta.engine.DataFile`.
"""

import datetime as dt
import decimal
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from pyspark.sql import types as T

from dagster_sideinputs.delta.engine import DataFile, TableSnapshot
from dagster_sideinputs.delta.log.lazy_files import LazyFiles
from dagster_sideinputs.delta.stats import typed_stats
from dagster_sideinputs.delta.store.files import join_uri

PHYSICAL_NAME = "delta.columnMapping.physicalName"
COLUMN_MAPPING_KEYS = ("delta.columnMapping.id", PHYSICAL_NAME, "delta.columnMapping.nested.ids")


@dataclass(frozen=True)
class LiveFile:
    """A live ``add`` action as the log holds it (names are physical under column mapping)."""

    path: str
    partition_values: Mapping[str, str | None]
    size: int
    modification_time: int | None
    stats: str | None
    deletion_vector: str | None


@dataclass(frozen=True)
class LogState:
    """A table at one version: what its log says, before any typing."""

    root: str
    version: int
    metadata: Mapping[str, Any]
    protocol: Mapping[str, Any]
    files: Mapping[tuple[str, str | None], LiveFile]
    txns: Mapping[str, int]
    commit_timestamp_ms: int
    signature: tuple[str, int, int]
    _schema: list[T.StructType] = field(default_factory=list, compare=False, repr=False)

    @property
    def table_id(self) -> str:
        return str(self.metadata.get("id", ""))

    @property
    def configuration(self) -> dict[str, str | None]:
        return dict(self.metadata.get("configuration") or {})

    @property
    def raw_schema(self) -> T.StructType:
        """The table schema with Delta's field metadata (column mapping included)."""
        if not self._schema:
            self._schema.append(T.StructType.fromJson(json.loads(self.metadata["schemaString"])))
        return self._schema[0]

    @property
    def schema(self) -> T.StructType:
        """The logical schema, without column-mapping metadata."""
        stripped = strip_column_mapping(self.raw_schema)
        assert isinstance(stripped, T.StructType)
        return stripped

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return tuple(self.metadata.get("partitionColumns") or ())

    @property
    def column_mapping(self) -> bool:
        return self.configuration.get("delta.columnMapping.mode") not in (None, "none")

    @property
    def has_deletion_vectors(self) -> bool:
        return any(f.deletion_vector for f in self.files.values())

    def table_snapshot(self) -> TableSnapshot:
        """This version as the engines describe a table version."""
        return TableSnapshot(
            uri=self.root,
            version=self.version,
            schema=self.schema,
            partition_columns=self.partition_columns,
            files=LazyFiles(self.data_files),  # type: ignore[arg-type]
            commit_timestamp=dt.datetime.fromtimestamp(
                self.commit_timestamp_ms / 1000, tz=dt.timezone.utc
            ),
            configuration=self.configuration,
            table_id=self.table_id,
            field_ids=self.field_ids,
        )

    @property
    def field_ids(self) -> dict[tuple[str, ...], int]:
        """Column path -> column-mapping id (empty without column mapping), at every
        depth: top-level columns as ``(name,)``, a struct's fields under its path, the
        element of an array under ``"element"``, a map's key and value under ``"key"`` and
        ``"value"`` (``("items", "element", "sku")``)."""
        if not self.column_mapping:
            return {}
        ids: dict[tuple[str, ...], int] = {}

        def walk(data_type: T.DataType, path: tuple[str, ...]) -> None:
            if isinstance(data_type, T.StructType):
                for f in data_type.fields:
                    if COLUMN_MAPPING_KEYS[0] in (f.metadata or {}):
                        ids[(*path, f.name)] = int(f.metadata[COLUMN_MAPPING_KEYS[0]])
                    walk(f.dataType, (*path, f.name))
            elif isinstance(data_type, T.ArrayType):
                walk(data_type.elementType, (*path, "element"))
            elif isinstance(data_type, T.MapType):
                walk(data_type.keyType, (*path, "key"))
                walk(data_type.valueType, (*path, "value"))

        walk(self.raw_schema, ())
        return ids

    def data_files(self) -> tuple[DataFile, ...]:
        """The live files, with typed partition values and statistics, by path."""
        return tuple(
            sorted(
                (to_data_file(self, f) for f in self.files.values()),
                key=lambda f: f.path,
            )
        )


def _map_fields(
    data_type: T.DataType, field_of: Callable[[T.StructField], T.StructField]
) -> T.DataType:
    """``data_type`` with ``field_of`` applied to every struct field, at every depth
    (inside arrays and maps too); ``field_of`` gets the field with its type mapped."""
    if isinstance(data_type, T.StructType):
        return T.StructType(
            [
                field_of(
                    T.StructField(f.name, _map_fields(f.dataType, field_of), f.nullable, f.metadata)
                )
                for f in data_type.fields
            ]
        )
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(_map_fields(data_type.elementType, field_of), data_type.containsNull)
    if isinstance(data_type, T.MapType):
        return T.MapType(
            _map_fields(data_type.keyType, field_of),
            _map_fields(data_type.valueType, field_of),
            data_type.valueContainsNull,
        )
    return data_type


def strip_column_mapping(data_type: T.DataType) -> T.DataType:
    """A type without Delta's column-mapping field metadata (at every depth)."""

    def stripped(f: T.StructField) -> T.StructField:
        metadata = {k: v for k, v in (f.metadata or {}).items() if k not in COLUMN_MAPPING_KEYS}
        return T.StructField(f.name, f.dataType, f.nullable, metadata)

    return _map_fields(data_type, stripped)


def physical_name(field_: T.StructField) -> str:
    return str((field_.metadata or {}).get(PHYSICAL_NAME) or field_.name)


def physical_type(data_type: T.DataType) -> T.DataType:
    """The type as stored in the data files: physical field names at every depth."""
    return _map_fields(data_type, lambda f: T.StructField(physical_name(f), f.dataType, f.nullable))


def _logical_stats(values: Any, schema: T.StructType) -> Any:
    """Statistics keyed by physical names, keyed by logical names instead."""
    if not isinstance(values, dict):
        return values
    by_physical = {physical_name(f): f for f in schema.fields}
    renamed = {}
    for key, value in values.items():
        target = by_physical.get(key)
        if target is None:
            continue
        nested = target.dataType
        renamed[target.name] = (
            _logical_stats(value, nested) if isinstance(nested, T.StructType) else value
        )
    return renamed


def typed_partition_value(raw: str | None, data_type: T.DataType) -> Any:
    """A partition value of the log (a string) as a typed Python value."""
    if raw is None or raw == "":
        return None
    try:
        if isinstance(data_type, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
            return int(raw)
        if isinstance(data_type, T.BooleanType):
            return raw.lower() == "true"
        if isinstance(data_type, T.DateType):
            return dt.date.fromisoformat(raw[:10])
        if isinstance(data_type, T.FloatType | T.DoubleType):
            return float(raw)
        if isinstance(data_type, T.DecimalType):
            return decimal.Decimal(raw)
        if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
            parsed = dt.datetime.fromisoformat(raw.replace(" ", "T").replace("Z", "+00:00"))
            if isinstance(data_type, T.TimestampType):
                if parsed.tzinfo is None:
                    return parsed.replace(tzinfo=dt.timezone.utc)
                return parsed.astimezone(dt.timezone.utc)
            return parsed
    except ValueError:
        return raw
    return raw


def to_data_file(state: LogState, live: LiveFile, *, version: int | None = None) -> DataFile:
    """One add action as a :class:`DataFile` (logical names, typed values)."""
    raw_schema = state.raw_schema
    schema = state.schema
    path = unquote(live.path)
    location = path if ("://" in path or path.startswith("/")) else join_uri(state.root, path)
    by_physical = {physical_name(f): f for f in raw_schema.fields}
    partitions = {}
    for key, raw in live.partition_values.items():
        target = by_physical.get(key)
        name = target.name if target is not None else key
        partitions[name] = (
            typed_partition_value(raw, schema[name].dataType) if target is not None else raw
        )
    stats = json.loads(live.stats) if live.stats else {}
    if state.column_mapping and stats:
        stats = {
            "numRecords": stats.get("numRecords"),
            "minValues": _logical_stats(stats.get("minValues") or {}, raw_schema),
            "maxValues": _logical_stats(stats.get("maxValues") or {}, raw_schema),
            "nullCount": _logical_stats(stats.get("nullCount") or {}, raw_schema),
        }
    records, mins, maxs, nulls = typed_stats(stats, schema)
    return DataFile(
        path=path,
        uri=location,
        size=live.size,
        partition_values=partitions,
        num_records=records,
        min_values=mins,
        max_values=maxs,
        null_count=nulls,
        version=version,
        modification_time_ms=live.modification_time,
        deletion_vector=live.deletion_vector is not None,
    )

"""How a row function's output for several tags travels as one flat DataFrame
(:class:`TaggedLayout`), and how it is split back into one DataFrame per tag."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from dagster_sideinputs.core.columns import TAG as TAG_COLUMN
from dagster_sideinputs.core.outputs import OutputTag
from dagster_sideinputs.errors import DeclarationError


class TaggedLayout:
    """How a row function's output for several tags travels as one flat DataFrame.

    One tag column (the index of the record's tag), then the union of the tags' fields:
    a field with the same name and type in several tags (a main and a side output
    sharing a schema, typically) is one column. Flat columns cost Spark far less than
    one struct per tag, both converting from Arrow and in the persisted result.
    """

    def __init__(self, tags: Sequence[OutputTag]) -> None:
        missing = [tag for tag in tags if tag.schema is None]
        if missing:
            raise DeclarationError(
                f"Row mode needs a schema for every output; missing for {missing}.",
                fix='declare OutputTag("name", schema=T.StructType([...])) (and main_output= '
                "an OutputTag with a schema)",
            )
        if len(tags) > 127:  # the tag column is a byte
            raise DeclarationError(
                f"Row mode supports at most 127 outputs; got {len(tags)}.",
                fix="emit fewer tags (for example one tag with a column saying which kind)",
            )
        self.tags = list(tags)
        columns: dict[tuple[str, T.DataType], str] = {}
        self.columns: list[list[str]] = []  # per tag: its fields' columns, in field order
        fields = [T.StructField(TAG_COLUMN, T.ByteType())]  # the index of the record's tag
        for tag in self.tags:
            assert tag.schema is not None
            mine = []
            for field in tag.schema.fields:
                column = columns.get((field.name, field.dataType))
                if column is None or column in mine:
                    column = f"_dsi_c{len(fields) - 1}"
                    columns.setdefault((field.name, field.dataType), column)
                    fields.append(T.StructField(column, field.dataType, nullable=True))
                mine.append(column)
            self.columns.append(mine)
        self.schema = T.StructType(fields)
        self.arrow_schema = to_arrow_schema(self.schema)
        self._record_types = [pa.struct(list(to_arrow_schema(t.schema))) for t in tags if t.schema]
        # Per tag and flat column: which field of the tag's records fills it (None: nulls).
        self._sources = [
            [mine.index(f.name) if f.name in mine else None for f in self.schema.fields[1:]]
            for mine in self.columns
        ]
        self._column_types = [self.arrow_schema.field(f.name).type for f in self.schema.fields[1:]]

    def batch(self, index: int, records: list[dict[str, Any]]) -> pa.RecordBatch:
        """One Arrow batch of records (dicts in the schema of ``tags[index]``)."""
        fields = pa.array(records, type=self._record_types[index]).flatten()
        size = len(records)
        arrays = [pa.repeat(pa.scalar(index, pa.int8()), size)]
        for source, kind in zip(self._sources[index], self._column_types, strict=True):
            arrays.append(pa.nulls(size, kind) if source is None else fields[source])
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)

    def shared(self, tagged: DataFrame, tags: Sequence[OutputTag]) -> DataFrame | None:
        """The rows of ``tags`` as one DataFrame: the tag column (each row's index in
        :attr:`tags`), then the fields the tags share, by name. None unless every one of
        ``tags`` has the same fields (names and types, in order)."""
        indexes = [self.tags.index(tag) for tag in tags]
        columns = {tuple(self.columns[i]) for i in indexes}
        names = {tuple(self.tags[i].schema.fieldNames()) for i in indexes}  # type: ignore[union-attr]
        if len(columns) != 1 or len(names) != 1:
            return None
        fields = self.tags[indexes[0]].schema.fields  # type: ignore[union-attr]
        return tagged.filter(F.col(TAG_COLUMN).isin(indexes)).select(
            F.col(TAG_COLUMN),
            *[
                F.col(column).alias(field.name)
                for column, field in zip(self.columns[indexes[0]], fields, strict=True)
            ],
        )

    def split(self, tagged: DataFrame) -> dict[OutputTag, DataFrame]:
        """The per-tag DataFrames of a tagged result."""
        return {
            tag: tagged.filter(F.col(TAG_COLUMN) == index).select(
                *[
                    F.col(column).alias(field.name)
                    for column, field in zip(columns, tag.schema.fields, strict=True)
                ]
            )
            for index, (tag, columns) in enumerate(zip(self.tags, self.columns, strict=True))
            if tag.schema is not None
        }


@dataclass(frozen=True)
class TaggedResult:
    """A row function's tagged result in one batch, not computed yet (its first write
    runs the function).

    Attributes:
        frame: the tagged DataFrame.
        layout: how its columns hold each tag's fields.
        pure: the tags whose output is exactly the function's records (no routed
            records added).
    """

    frame: DataFrame
    layout: TaggedLayout
    pure: frozenset[OutputTag]

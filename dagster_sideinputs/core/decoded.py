"""What an undecodable record is, for the sources whose records the operator decodes
(landed JSON and CSV files, Kafka values): the conditions and the words of the reason.

A decode that yields nothing is not a record. The rules (docs/DECISIONS.md, "A decode
that yields nothing is not a record"): a value that is missing (a Kafka tombstone),
empty or blank, not UTF-8 where text is expected (a Kafka key of
``key_format="string"`` too), not of the declared format, or that holds none of the
declared fields (every declared column null: ``{}``, an object whose names all differ
from the schema's, a CSV line of empty fields) is undecodable and goes to the
``invalid=`` route, or stops the batch naming it. A field that is present but cannot be
converted to its declared type makes the record undecodable; a field that is absent is
null.
"""

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.columns import CORRUPT, quoted

TOMBSTONE = "null value (a tombstone)"
EMPTY = "empty value"
BLANK = "blank value (whitespace only)"
NOT_UTF8 = "value is not UTF-8 text: 0x"
KEY_NOT_UTF8 = "key is not UTF-8 text: 0x"
CORRUPT_FORMATS = ("json", "csv", "xml")
"""Landed file formats Spark parses permissively, giving unparsable records a corrupt
text (``columnNameOfCorruptRecord``) instead of nulls."""


def no_field(columns: Sequence[Column]) -> Column:
    """Whether a decoded record holds none of the declared columns (all of them null)."""
    condition = F.lit(True)
    for column in columns:
        condition = condition & column.isNull()
    return condition


def columns_of(names: Sequence[str]) -> list[Column]:
    return [F.col(quoted(name)) for name in names]


def no_field_text(names: Sequence[str]) -> str:
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return (
        f"no field of the declared schema ({shown}): every column decodes to null "
        "(field names differ? the value is empty?)"
    )


def hex_prefix(value: Column, length: int = 32) -> Column:
    """The first bytes of a binary value in hex, for reasons."""
    return F.hex(F.substring(value, 1, length))


def _file_name() -> Column:
    return F.element_at(F.split(F.input_file_name(), "/"), -1)


def checked_lines(parsed: DataFrame, schema: T.StructType) -> DataFrame:
    """Landed records Spark parsed permissively (:data:`CORRUPT_FORMATS`), a record of
    none of the schema's fields ({}, other names, only separators) made corrupt too."""
    names = schema.fieldNames()
    nothing = F.when(
        no_field(columns_of(names)),
        F.concat(_file_name(), F.lit(": " + no_field_text(names))),
    )
    return parsed.withColumn(CORRUPT, F.coalesce(F.col(CORRUPT), nothing))


def checked_text(lines: DataFrame, schema: T.StructType) -> DataFrame:
    """Landed ``text`` lines: Spark keeps their bytes as they are, so a line that is not
    UTF-8 is corrupt (its bad bytes become U+FFFD: such strings break Delta's
    statistics). An empty line is a record (an empty string), as for Kafka strings."""
    (name,) = schema.fieldNames()
    line = F.col(quoted(name))
    bad = F.when(
        ~F.is_valid_utf8(line),
        F.concat(_file_name(), F.lit(": line " + NOT_UTF8[6:]), hex_prefix(line.cast("binary"))),
    )
    return lines.select(F.make_valid_utf8(line).alias(name), bad.alias(CORRUPT))

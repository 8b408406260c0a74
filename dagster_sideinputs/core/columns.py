"""Names of the columns the operator adds to records in flight, and the markers its
Spark-side checks put in error texts.

Every internal column starts with ``_dsi_``: user columns with that prefix are refused
up front (see :mod:`~dagster_sideinputs.core.spec`), so the two never collide.
"""

from pyspark.sql import types as T

PREFIX = "_dsi_"

# Namespaces (windows) of main records.
NS_START = "_dsi_ns_start"
NS_END = "_dsi_ns_end"
NS_ID = "_dsi_ns"

# Bookkeeping carried by buffered records.
SLOT = "_dsi_slot"
KEY_GROUP = "_dsi_key_group"
FIRST_SEEN = "_dsi_first_seen"
BATCH = "_dsi_batch"
FINGERPRINT = "_dsi_fingerprint"
REASON = "_dsi_reason"

# Records of one batch.
ORIGIN = "_dsi_origin"
ROUTE = "_dsi_route"
CORRUPT = "_dsi_corrupt_record"

# A pre-keyed Kafka read: each record's bucket (the partitioning Spark is told about),
# and the Spark task that read it (checked against its Kafka partition).
KAFKA_BUCKET = "_dsi_kafka_bucket"
KAFKA_TASK = "_dsi_kafka_task"

# Side views.
SIDE_NS = "_dsi_side_ns"
LOOKUP_PREFIX = "_dsi_lookup_"

# Row mode's tagged result.
TAG = "_dsi_tag"

# Markers of errors raised inside Spark jobs (``raise_error``) and recognised on the
# driver, which turns them back into the project's errors.
DUPLICATE_MARK = "dsi-duplicate-key"
PRE_KEYED_MARK = "dsi-pre-keyed-violation"
ROW_ERROR_MARK = "dsi-row-function-error"


def matched(side: str) -> str:
    """Per side input: whether the record found its side row (per-key waiting)."""
    return f"_dsi_matched_{side}"


def side_key(side: str) -> str:
    """Per side input: the join key column of its view."""
    return f"_dsi_key_{side}"


def forward_key(side: str) -> str:
    """Per forwarded side input: the shared column of its view."""
    return f"_dsi_fwd_{side}"


def quoted(column: str) -> str:
    """A column name as Spark SQL expressions need it (dots and spaces are not paths)."""
    return "`" + column.replace("`", "``") + "`"


def comparable(data_type: T.DataType) -> bool:
    """Whether Spark can compare, sort and hash values of this type: not a map or a
    variant anywhere in it."""
    if isinstance(data_type, T.MapType | T.VariantType):
        return False
    if isinstance(data_type, T.StructType):
        return all(comparable(f.dataType) for f in data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return comparable(data_type.elementType)
    return True

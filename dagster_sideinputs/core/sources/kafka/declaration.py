"""What users declare about a Kafka main input: :class:`KafkaInput`.

``MainInput.kafka(...)`` builds one and keeps it on the :class:`~dagster_sideinputs.MainInput`
(``main.kafka_input``). The declaration is a frozen, picklable value; its client
options may hold secrets (SASL passwords, key-store passwords), so its ``repr`` shows
them redacted and the operator never writes them to plans, commit records or metadata.

The records a Kafka main input gives the function are the decoded value's columns
(``value_format``) plus the record's coordinates: ``kafka_key``, ``kafka_topic``,
``kafka_partition``, ``kafka_offset`` and ``kafka_timestamp`` (the default event time).
"""

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pyspark.sql import types as T

from dagster_sideinputs.core.spark.packages import AVRO, KAFKA
from dagster_sideinputs.errors import DeclarationError

ValueFormat = Literal["json", "avro", "string", "bytes"]
KeyFormat = Literal["string", "bytes"]
StartingOffsets = Literal["earliest", "latest"]
OnDataLoss = Literal["fail", "skip"]

VALUE_FORMATS = ("json", "avro", "string", "bytes")

# The coordinates every Kafka record carries, as columns of the main records.
KEY = "kafka_key"
TOPIC = "kafka_topic"
PARTITION = "kafka_partition"
OFFSET = "kafka_offset"
TIMESTAMP = "kafka_timestamp"
METADATA_COLUMNS = (KEY, TOPIC, PARTITION, OFFSET, TIMESTAMP)
VALUE = "value"  # the one value column of the ``string`` and ``bytes`` formats

# Spark's Kafka connector and Avro module for this Spark line (4.1). 4.1.1 is the newest
# 4.1 release whose connector dependencies Maven Central serves (the connector also runs
# on later 4.1 patch releases).
SPARK_KAFKA_PACKAGE = KAFKA
SPARK_AVRO_PACKAGE = AVRO

# Connector options the operator sets itself: they decide which offsets a batch reads.
_RESERVED_READER_OPTIONS = {
    "assign",
    "subscribe",
    "subscribepattern",
    "startingoffsets",
    "endingoffsets",
    "startingoffsetsbytimestamp",
    "endingoffsetsbytimestamp",
    "startingtimestamp",
    "endingtimestamp",
    "failondataloss",
    "maxoffsetspertrigger",
    "minoffsetspertrigger",
    "includeheaders",
}
# Consumer settings the connector refuses or manages itself (it fails on most of them).
_RESERVED_CLIENT_OPTIONS = {
    "group.id",
    "auto.offset.reset",
    "key.deserializer",
    "value.deserializer",
    "enable.auto.commit",
    "interceptor.classes",
}
# Option names whose values are secrets: never shown, logged or written down.
_SECRET = re.compile(r"(password|secret|jaas|token|credential|sasl\.username|\.key$)", re.I)
REDACTED = "<redacted>"


def redacted(options: Mapping[str, str]) -> dict[str, str]:
    """The options with every secret value replaced by ``<redacted>``."""
    return {name: REDACTED if _SECRET.search(name) else value for name, value in options.items()}


def _options(value: Mapping[str, Any] | None, what: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise DeclarationError(
            f"MainInput.kafka: {what} must be a mapping of option name -> value, got "
            f"{type(value).__name__}."
        )
    return tuple(sorted((str(k), str(v)) for k, v in value.items()))


@dataclass(frozen=True)
class KafkaInput:
    """A Kafka main input: which topics, how to reach them, how to decode their records.

    Built by :meth:`~dagster_sideinputs.MainInput.kafka`, whose arguments are
    documented there. Client options are kept out of ``repr`` and equality shows them
    redacted.
    """

    bootstrap_servers: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    value_format: ValueFormat = "json"
    schema: T.StructType | str | None = field(default=None, compare=False, hash=False)
    avro_schema: str | None = None
    key_format: KeyFormat = "string"
    options: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    admin_options: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    reader_options: tuple[tuple[str, str], ...] = ()
    starting_offsets: StartingOffsets = "earliest"
    max_records_per_batch: int | None = None
    on_data_loss: OnDataLoss = "fail"
    poll_timeout: dt.timedelta = dt.timedelta(seconds=30)

    def __post_init__(self) -> None:
        where = f"MainInput.kafka({self.describe()!r})"
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers.strip():
            raise DeclarationError(
                f"{where}: bootstrap_servers is required.",
                fix='bootstrap_servers="broker1:9092,broker2:9092"',
            )
        if bool(self.topics) == bool(self.pattern):
            raise DeclarationError(
                f"{where}: name the topic(s) or a pattern, not both and not neither.",
                fix='MainInput.kafka("payments", ...) or '
                'MainInput.kafka(pattern="payments-.*", ...)',
            )
        if any(not isinstance(t, str) or not t for t in self.topics):
            raise DeclarationError(f"{where}: topic names must be non-empty strings.")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise DeclarationError(
                    f"{where}: pattern is not a regular expression: {exc}."
                ) from None
        _choice(self.value_format, VALUE_FORMATS, "value_format", where)
        _choice(self.key_format, ("string", "bytes"), "key_format", where)
        _choice(self.starting_offsets, ("earliest", "latest"), "starting_offsets", where)
        _choice(self.on_data_loss, ("fail", "skip"), "on_data_loss", where)
        if self.value_format == "json" and self.schema is None:
            raise DeclarationError(
                f"{where}: JSON values need a schema: records are decoded as they arrive, "
                "and an inferred schema would drift.",
                fix='schema="tx_id long, customer_id long, amount double, ts timestamp"',
            )
        if self.value_format == "avro" and not self.avro_schema:
            raise DeclarationError(
                f"{where}: Avro values need the writer's schema (JSON text).",
                fix='avro_schema=\'{"type": "record", "name": "Payment", "fields": [...]}\'',
            )
        if self.max_records_per_batch is not None and (
            not isinstance(self.max_records_per_batch, int) or self.max_records_per_batch < 1
        ):
            raise DeclarationError(
                f"{where}: max_records_per_batch must be an integer >= 1, got "
                f"{self.max_records_per_batch!r}."
            )
        if self.poll_timeout <= dt.timedelta(0):
            raise DeclarationError(f"{where}: poll_timeout must be positive.")
        if self.value_format == "json" and isinstance(self.schema, T.StructType):
            # (A DDL string is parsed by Spark: the read checks it then.)
            clashes = sorted(set(self.schema.fieldNames()) & set(METADATA_COLUMNS))
            if clashes:
                raise DeclarationError(
                    f"{where}: JSON field(s) {clashes} have the names of the Kafka coordinate "
                    "columns the operator adds.",
                    fix="rename the field(s) in the schema",
                )
        for name, _ in self.reader_options:
            if name.lower() in _RESERVED_READER_OPTIONS or name.lower().startswith("kafka."):
                raise DeclarationError(
                    f"{where}: reader option {name!r} is set by the operator (each batch reads "
                    "the exact offsets its plan pins) or belongs in options=.",
                    fix="drop it from reader_options; client settings go in options= without "
                    "the 'kafka.' prefix; batch sizes in max_records_per_batch=",
                )
        for name, _ in self.options:
            if name in _RESERVED_CLIENT_OPTIONS or name == "bootstrap.servers":
                raise DeclarationError(
                    f"{where}: client option {name!r} is managed by the operator and Spark's "
                    "connector (offsets are pinned by the batch plans, not committed to a "
                    "consumer group).",
                    fix="drop it from options="
                    + ("; pass bootstrap_servers=" if "boot" in name else ""),
                )

    def describe(self) -> str:
        """The topics (or pattern) in a few words, for messages."""
        if self.pattern is not None:
            return f"pattern {self.pattern!r}"
        return ", ".join(self.topics)

    @property
    def client_options(self) -> dict[str, str]:
        """Java client settings (what Spark's connector takes with a ``kafka.`` prefix)."""
        return {"bootstrap.servers": self.bootstrap_servers, **dict(self.options)}

    def decoded_schema(self) -> T.StructType:
        """The value columns the records get (metadata columns not included)."""
        if self.value_format == "string":
            return T.StructType([T.StructField(VALUE, T.StringType())])
        if self.value_format == "bytes":
            return T.StructType([T.StructField(VALUE, T.BinaryType())])
        if self.value_format == "json":
            schema = self.schema
            parsed = T.StructType.fromDDL(schema) if isinstance(schema, str) else schema
            assert isinstance(parsed, T.StructType)
            return parsed
        raise ValueError("an Avro schema is known once Spark has parsed it")

    def identity(self) -> dict[str, Any]:
        """What the operator's position refers to (no servers, no options: they may move)."""
        return {
            "topics": list(self.topics),
            "pattern": self.pattern,
            "value_format": self.value_format,
        }

    def __repr__(self) -> str:
        shown = f"pattern={self.pattern!r}" if self.pattern else repr(", ".join(self.topics))
        extras = [f"bootstrap_servers={self.bootstrap_servers!r}", f"format={self.value_format!r}"]
        if self.options:
            extras.append(f"options={redacted(dict(self.options))!r}")
        if self.max_records_per_batch is not None:
            extras.append(f"max_records_per_batch={self.max_records_per_batch}")
        if self.on_data_loss != "fail":
            extras.append(f"on_data_loss={self.on_data_loss!r}")
        return f"KafkaInput({shown}, {', '.join(extras)})"


def _choice(value: object, choices: tuple[str, ...], what: str, where: str) -> None:
    if value not in choices:
        raise DeclarationError(
            f"{where}: {what}={value!r} is not one of {list(choices)}.",
            fix=f"pass {what}= one of {', '.join(repr(c) for c in choices)}",
        )


def client_options_of(value: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return _options(value, "options")


def admin_options_of(value: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return _options(value, "admin_options")


def reader_options_of(value: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return _options(value, "reader_options")

"""What users declare about the main input and the buffer, and the shared vocabulary.

Every declaration is a frozen dataclass: immutable, hashable where it can be,
picklable (the operator ships some of them to executors), with a readable ``repr``.
Validation happens at construction, so a mistake fails where it was written. Side
inputs live in :mod:`~dagster_sideinputs.core.sideinputs.declaration`, windows in
:mod:`~dagster_sideinputs.core.sideinputs.windows`, output tags in
:mod:`~dagster_sideinputs.core.outputs`.
"""

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from pyspark.sql import Column, DataFrame
from pyspark.sql import types as T

from dagster_sideinputs.core.sources.kafka.declaration import (
    TIMESTAMP,
    KafkaInput,
    KeyFormat,
    OnDataLoss,
    StartingOffsets,
    ValueFormat,
    admin_options_of,
    client_options_of,
    reader_options_of,
)
from dagster_sideinputs.errors import DeclarationError

View = Literal["singleton", "list", "map", "multimap"]
Readiness = Literal["present", "complete", "fresh"]
Distribution = Literal["broadcast", "keyed", "forwarded"]
Missing = Literal["null", "wait", "unmatched"]
OnTimeout = Literal["unmatched", "null"]
OnEmpty = Literal["release", "unmatched"]
OnExceed = Literal["fail", "overflow"]
MainKind = Literal["delta", "files", "kafka"]
KeyTranslator: TypeAlias = str | Column | Callable[[DataFrame], Column]

READINESS = ("present", "complete", "fresh")
DISTRIBUTIONS = ("broadcast", "keyed", "forwarded")
MISSING = ("null", "wait", "unmatched")
ON_TIMEOUT = ("unmatched", "null")
ON_EMPTY = ("release", "unmatched")


def check_choice(value: object, choices: Sequence[str], what: str, where: str) -> None:
    if value is not None and value not in choices:
        raise DeclarationError(
            f"{where}: {what}={value!r} is not one of {list(choices)}.",
            fix=f"pass {what}= one of {', '.join(repr(c) for c in choices)}",
        )


def asset_path(name: str | Sequence[str]) -> tuple[str, ...]:
    """An asset name (``"payments/transactions"``) or key path as a tuple of parts."""
    parts = tuple(name.split("/")) if isinstance(name, str) else tuple(name)
    if not parts or any(not part or not isinstance(part, str) for part in parts):
        raise DeclarationError(
            f"{name!r} is not a valid asset name.", fix='use e.g. "transactions"'
        )
    return parts


@dataclass(frozen=True)
class KeyGroups:
    """Declares a main input already partitioned by key (Flink's reinterpretAsKeyedStream).

    The promise: every file (split) of the main input holds the rows of exactly one
    key group, ``pmod(hash(key), max_key_groups)`` with Spark's Murmur3 ``hash``, and
    the key-group column says which. The operator checks it from the Delta log before
    writing anything and then runs its keyed steps without shuffling the main input.

    Args:
        max_key_groups: number of key groups (Spark buckets).
        column: the column holding each row's key group (a Delta partition column or
            a data column whose per-file min == max).
    """

    max_key_groups: int = 128
    column: str = "key_group"

    def __post_init__(self) -> None:
        if not isinstance(self.max_key_groups, int) or self.max_key_groups < 1:
            raise DeclarationError(
                f"KeyGroups.max_key_groups must be an integer >= 1, got {self.max_key_groups!r}."
            )


FILE_SKIPPING_OPTIONS = frozenset(
    {
        "pathglobfilter",
        "modifiedbefore",
        "modifiedafter",
        "ignorecorruptfiles",
        "ignoremissingfiles",
    }
)
"""Spark file-source options (lower case) under which a read may skip a listed file."""


@dataclass(frozen=True)
class MainInput:
    """The high-throughput input, read incrementally.

    Args:
        asset: asset name of a Delta table that grows by appends.
        key: the key column (for keyed side inputs, per-key waiting, key groups).
        event_time: event-time column (for windows and lateness).
        pre_keyed: declare the table already partitioned by key group.
        path: table location when it is not ``<storage root>/<asset>``.
        max_versions_per_batch: most table versions one batch reads, so a backlog is
            worked through in bounded batches (default: all new versions).

    Examples:
        >>> MainInput("transactions", key="customer_id", event_time="ts")
        MainInput('transactions', key='customer_id', event_time='ts')
        >>> MainInput("transactions", max_versions_per_batch=10)
        MainInput('transactions', max_versions_per_batch=10)
    """

    asset: str
    key: str | None = None
    event_time: str | None = None
    pre_keyed: KeyGroups | None = None
    path: str | None = None
    format: str = "delta"
    schema: T.StructType | str | None = field(default=None, compare=False, hash=False)
    read_options: tuple[tuple[str, str], ...] = ()
    kafka_input: KafkaInput | None = None
    max_versions_per_batch: int | None = None
    max_files_per_batch: int | None = None

    def __post_init__(self) -> None:
        asset_path(self.asset)
        self._check_batch_limits()
        if self.format == "kafka" or self.kafka_input is not None:
            if self.format != "kafka" or self.kafka_input is None:
                raise DeclarationError(
                    f"MainInput {self.asset!r}: a Kafka main input is declared with "
                    "MainInput.kafka(...).",
                )
            return
        if self.pre_keyed is not None and self.key is None:
            raise DeclarationError(
                f"MainInput {self.asset!r} is declared pre_keyed but has no key.",
                fix="pass key=<the column the input is partitioned by>",
            )
        if self.format != "delta" and self.schema is None:
            raise DeclarationError(
                f"MainInput.files({self.path!r}) needs a schema: files are read as they "
                "land, and an inferred schema would drift.",
                fix="pass schema=T.StructType([...]) or a DDL string",
            )
        if self.format != "delta" and self.pre_keyed is not None:
            raise DeclarationError(
                f"MainInput.files({self.path!r}) cannot be pre_keyed: the key-group promise "
                "is checked from Delta statistics, which plain files do not have.",
                fix="land the files in a Delta table partitioned by key group",
            )

    def _check_batch_limits(self) -> None:
        """A batch's share of a backlog is counted in the source's own unit: Delta versions,
        landed files (Kafka records: ``MainInput.kafka(max_records_per_batch=)``)."""
        unit = "kafka" if self.format == "kafka" else self.kind
        allowed = {"delta": "max_versions_per_batch", "files": "max_files_per_batch"}.get(unit)
        for limit in ("max_versions_per_batch", "max_files_per_batch"):
            value = getattr(self, limit)
            if value is None:
                continue
            if limit != allowed:
                fix = {
                    "delta": "MainInput(..., max_versions_per_batch=N)",
                    "files": "MainInput.files(..., max_files_per_batch=N)",
                    "kafka": "MainInput.kafka(..., max_records_per_batch=N)",
                }[unit]
                raise DeclarationError(
                    f"MainInput {self.asset!r} ({unit}): {limit} does not apply to it.",
                    fix=f"bound its batches with {fix}",
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DeclarationError(
                    f"MainInput {self.asset!r}: {limit} must be an integer >= 1, got {value!r}.",
                    fix=f"pass {limit}=None (no limit) or an integer >= 1",
                )

    @classmethod
    def files(
        cls,
        path: str,
        *,
        format: str = "json",
        schema: T.StructType | str,
        key: str | None = None,
        event_time: str | None = None,
        asset: str | None = None,
        options: dict[str, str] | None = None,
        max_files_per_batch: int | None = None,
    ) -> "MainInput":
        """A landing folder: every new file is read once, in the micro-batch that finds it.

        Args:
            path: the folder (flat; files starting with ``.`` or ``_`` are ignored).
            format: a Spark file format (``json``, ``csv``, ``parquet``, ...).
            schema: the records' schema (a StructType, or a DDL string such as
                ``"tx_id long, customer_id long, amount double, ts timestamp"``).
            key / event_time: as for Delta main inputs.
            asset: the asset name shown in lineage (default: the folder's name).
            options: Spark reader options (e.g. ``{"header": "true"}`` for CSV).
            max_files_per_batch: most new files one batch reads, oldest first (default:
                every file found).
        """
        if not isinstance(schema, str | T.StructType):
            raise DeclarationError(
                f"MainInput.files({path!r}): schema must be a StructType or a DDL string."
            )
        name = asset or path.rstrip("/").rsplit("/", 1)[-1]
        skipping = sorted(o for o in options or {} if o.lower() in FILE_SKIPPING_OPTIONS)
        if skipping:
            raise DeclarationError(
                f"MainInput.files({path!r}) (asset {name!r}): reader option(s) {skipping} "
                "would let Spark skip files the operator lists as landed, and those files' "
                "records would be recorded as read without being read.",
                fix="leave them out: every file that lands in the folder is read exactly once "
                "(keep files you do not want out of the folder, or give them a name starting "
                "with '.' or '_')",
            )
        return cls(
            asset=name,
            key=key,
            event_time=event_time,
            path=path,
            format=format,
            schema=schema,
            read_options=tuple(sorted((options or {}).items())),
            max_files_per_batch=max_files_per_batch,
        )

    @classmethod
    def kafka(
        cls,
        topics: str | Sequence[str] | None = None,
        *,
        bootstrap_servers: str,
        pattern: str | None = None,
        format: ValueFormat = "json",
        schema: T.StructType | str | None = None,
        avro_schema: str | None = None,
        key: str | None = None,
        event_time: str | None = TIMESTAMP,
        key_format: KeyFormat = "string",
        options: Mapping[str, str] | None = None,
        admin_options: Mapping[str, str] | None = None,
        reader_options: Mapping[str, str] | None = None,
        starting_offsets: StartingOffsets = "earliest",
        max_records_per_batch: int | None = None,
        on_data_loss: OnDataLoss = "fail",
        poll_timeout: dt.timedelta = dt.timedelta(seconds=30),
        pre_keyed: KeyGroups | None = None,
        asset: str | None = None,
    ) -> "MainInput":
        """Kafka topics, read through Spark's Kafka connector over exact offset ranges.

        Every batch plan pins each partition's offset range ``[start, end)`` and the
        topics' ids; a replay reads exactly those offsets. Records are the decoded value's
        columns plus ``kafka_key``, ``kafka_topic``, ``kafka_partition``,
        ``kafka_offset`` and ``kafka_timestamp``.

        Needs Spark's Kafka connector in the session
        (``spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1``) and,
        on the driver, confluent-kafka (``pip install "dagster-sideinputs[kafka]"``) to
        read offsets and topic ids.

        Args:
            topics: a topic name or several.
            bootstrap_servers: ``host:port[,host:port...]``.
            pattern: a regular expression of topic names instead of ``topics`` (matched
                whole; internal topics excluded). Topics that appear later are read from
                their first offset.
            format: the record values: ``json`` (with ``schema``), ``avro`` (with
                ``avro_schema``; needs Spark's avro module), ``string`` or ``bytes`` (one
                ``value`` column).
            schema: the JSON values' schema (StructType or DDL string). Values that do not
                parse go to the ``invalid=`` route (or stop the batch when none is declared).
            avro_schema: the Avro writer schema, as JSON text (plain Avro binary values).
            key: the key column (``kafka_key`` or a value column).
            event_time: the event-time column; the Kafka record timestamp by default.
            key_format: decode ``kafka_key`` as ``string`` (UTF-8) or keep ``bytes``.
            options: Kafka client settings in the Java client's names (what Spark's
                connector takes after ``kafka.``): security settings, fetch sizes... They
                may hold secrets and are never shown or written down.
            admin_options: settings of the driver's metadata client (librdkafka names),
                when ``options`` cannot be translated (e.g. a JKS trust store).
            reader_options: options of Spark's connector (e.g. ``minPartitions``), but
                those that choose offsets.
            starting_offsets: where the first batch starts: ``earliest`` or ``latest``.
                Partitions and topics that appear later always start at their earliest.
            max_records_per_batch: most offsets a batch reads (like Spark's
                ``maxOffsetsPerTrigger``), shared among partitions by their backlog.
            on_data_loss: ``fail`` (default): offsets deleted (retention) before they were
                read stop the batch with an error naming them; ``skip``: they are skipped,
                counted and reported in the batch metrics.
            poll_timeout: how long a Spark task waits for records it was promised.
            pre_keyed: the topic is partitioned by Kafka's default partitioner on the
                record key (the string form of ``key``): keyed side inputs are joined
                without shuffling the main records. ``max_key_groups`` bounds the
                partition count; ``column`` is not used.
            asset: the asset name in lineage (default: the topic, or the pattern's
                letters).
        """
        names = (topics,) if isinstance(topics, str) else tuple(topics or ())
        if pre_keyed is not None and (len(names) != 1 or pattern is not None):
            raise DeclarationError(
                f"MainInput.kafka({names or pattern!r}): pre_keyed needs exactly one topic: "
                "key groups are the partitions of one topic.",
                fix="declare one topic, or drop pre_keyed=",
            )
        declared = KafkaInput(
            bootstrap_servers=bootstrap_servers,
            topics=names,
            pattern=pattern,
            value_format=format,
            schema=schema,
            avro_schema=avro_schema,
            key_format=key_format,
            options=client_options_of(options),
            admin_options=admin_options_of(admin_options),
            reader_options=reader_options_of(reader_options),
            starting_offsets=starting_offsets,
            max_records_per_batch=max_records_per_batch,
            on_data_loss=on_data_loss,
            poll_timeout=poll_timeout,
        )
        if pre_keyed is not None and key is None:
            raise DeclarationError(
                f"MainInput.kafka({declared.describe()!r}) is declared pre_keyed but has no key.",
                fix='pass key="kafka_key" (or the value column whose string form is the key)',
            )
        default_name = (
            names[0]
            if len(names) == 1
            else re.sub(r"[^A-Za-z0-9_]+", "_", pattern or "_".join(names)).strip("_")
        )
        return cls(
            asset=asset or default_name or "kafka",
            key=key,
            event_time=event_time,
            pre_keyed=pre_keyed,
            format="kafka",
            kafka_input=declared,
        )

    @property
    def kind(self) -> MainKind:
        """What the declaration reads: a Delta table, a landing folder or Kafka topics (its
        source: :func:`~dagster_sideinputs.core.sources.choice.source_for`)."""
        if self.kafka_input is not None:
            return "kafka"
        return "delta" if self.format == "delta" else "files"

    @property
    def keyed_by_partition(self) -> bool:
        """Whether the records are pre-keyed by the source's own partitions (a pre-keyed
        Kafka topic: a record's key group is its partition, checked on each record), rather
        than by the key-group column of a Delta table's files (checked from statistics)."""
        return self.kafka_input is not None and self.pre_keyed is not None

    def __repr__(self) -> str:
        if self.kafka_input is not None:
            head = f"MainInput.kafka({self.kafka_input!r}"
        elif self.kind == "files":
            head = f"MainInput.files({self.path!r}, format={self.format!r}"
        else:
            head = f"MainInput({self.asset!r}"
        extras = [
            f"{name}={value!r}"
            for name, value in (
                ("key", self.key),
                ("event_time", self.event_time),
                ("pre_keyed", self.pre_keyed),
                ("max_versions_per_batch", self.max_versions_per_batch),
                ("max_files_per_batch", self.max_files_per_batch),
            )
            if value is not None
        ]
        return head + "".join(", " + e for e in extras) + ")"


@dataclass(frozen=True)
class BufferLimits:
    """Bounds on the records waiting in the operator's buffer.

    Args:
        max_rows: most records the buffer may hold after a batch (0: none may wait).
        max_age: oldest a buffered record may get.
        on_exceed: ``fail`` stops the batch before it writes anything, with an error
            saying which limit and how to raise it; ``overflow`` routes the oldest
            records to the operator's overflow tag.
    """

    max_rows: int | None = 10_000_000
    max_age: dt.timedelta | None = dt.timedelta(days=7)
    on_exceed: OnExceed = "fail"

    def __post_init__(self) -> None:
        check_choice(self.on_exceed, ("fail", "overflow"), "on_exceed", "BufferLimits")
        if self.max_rows is not None and (not isinstance(self.max_rows, int) or self.max_rows < 0):
            raise DeclarationError(
                f"BufferLimits.max_rows must be an integer >= 0, got {self.max_rows!r}."
            )
        if self.max_age is not None and self.max_age < dt.timedelta(0):
            raise DeclarationError(f"BufferLimits.max_age must be >= 0, got {self.max_age}.")

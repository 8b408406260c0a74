"""The driver's view of Kafka: topics, partitions, topic ids and offsets.

Planning a batch needs, for every partition, the earliest and the end offset, and every
topic's id (it changes when a topic is deleted and created again, which offsets alone
cannot tell). This module asks the brokers through confluent-kafka's admin client
(librdkafka), an optional dependency (``pip install "dagster-sideinputs[kafka]"``)
imported only when a Kafka main input is planned. Why not the Java admin client that
Spark's connector brings (through py4j)? Planning must work where there is no JVM: the
Dagster sensor asks ``peek()`` every 30 seconds in the daemon, and a Spark Connect
client has no JVM at all. The price is one translation: users write the Java client's
settings (the ones Spark's connector takes), and :func:`admin_config` maps those with
an exact librdkafka equivalent; anything security related it cannot map is an error
naming the option, fixed with ``admin_options=`` in librdkafka's own names.
"""

import base64
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dagster_sideinputs.core.sources.kafka.declaration import KafkaInput
from dagster_sideinputs.errors import DeclarationError, KafkaSourceError

REQUEST_TIMEOUT_S = 30.0

LEADERSHIP_IN_FLUX = (
    "NOT_LEADER_FOR_PARTITION",
    "LEADER_NOT_AVAILABLE",
    "UNKNOWN_TOPIC_OR_PART",
    "UNKNOWN_LEADER_EPOCH",
    "FENCED_LEADER_EPOCH",
    "REPLICA_NOT_AVAILABLE",
    "ELIGIBLE_LEADERS_NOT_AVAILABLE",
)
"""librdkafka's names of the errors a partition answers with while its leadership is
still being set up or moving: just created, added, or recreated under the same name (the
metadata then names a leader, or a leader epoch, that the broker does not serve yet).
They pass within moments; librdkafka does not mark them retriable."""


def leadership_in_flux(error: Any) -> bool:
    """Whether a ``KafkaError`` is one of :data:`LEADERSHIP_IN_FLUX` (worth retrying)."""
    from confluent_kafka import KafkaError

    codes = {getattr(KafkaError, name, None) for name in LEADERSHIP_IN_FLUX}
    return error.code() in codes - {None}


# Java client settings with the same name and meaning in librdkafka.
_SAME = {
    "client.id",
    "security.protocol",
    "sasl.mechanism",
    "sasl.kerberos.service.name",
    "ssl.key.password",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.endpoint.identification.algorithm",
    "socket.connection.setup.timeout.ms",
    "reconnect.backoff.ms",
    "reconnect.backoff.max.ms",
    "client.dns.lookup",
}
_JAAS = re.compile(
    r"(?P<module>[\w.]+)\s+required(?P<args>.*?);?\s*$",
    re.S,
)
_JAAS_ARG = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _load_client() -> Any:
    try:
        import confluent_kafka
        from confluent_kafka import admin
    except ImportError as exc:
        raise DeclarationError(
            "A Kafka main input reads its offsets and topic ids with confluent-kafka, which "
            f"is not installed ({exc}).",
            fix='pip install "dagster-sideinputs[kafka]"  (or: pip install confluent-kafka)',
        ) from exc
    return confluent_kafka, admin


def _jaas_credentials(text: str, where: str) -> dict[str, str]:
    match = _JAAS.match(text.strip())
    module = match.group("module") if match else ""
    if not module.endswith(("PlainLoginModule", "ScramLoginModule")):
        raise DeclarationError(
            f"{where}: sasl.jaas.config uses login module {module or '?'!r}, which the "
            "driver's metadata client (librdkafka) cannot take over.",
            fix="pass the equivalent librdkafka settings in admin_options=, e.g. "
            '{"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc", ...}',
        )
    assert match is not None
    args = dict(_JAAS_ARG.findall(match.group("args")))
    if "username" not in args or "password" not in args:
        raise DeclarationError(
            f"{where}: sasl.jaas.config names no username and password.",
            fix='sasl.jaas.config=\'...PlainLoginModule required username="u" password="p";\'',
        )
    return {"sasl.username": args["username"], "sasl.password": args["password"]}


def admin_config(kafka: KafkaInput, where: str) -> dict[str, str]:
    """librdkafka settings for the metadata client, from the declared Java settings.

    ``admin_options`` (librdkafka names) win over translated ones, and once given, the
    settings that cannot be translated are left to them instead of being an error.

    Raises:
        DeclarationError: naming a security setting with no exact translation.
    """
    config = {"bootstrap.servers": kafka.bootstrap_servers}
    java = dict(kafka.options)
    explicit = dict(kafka.admin_options)
    for name, value in java.items():
        if name in _SAME:
            config[name] = value
        elif name == "sasl.jaas.config":
            try:
                config.update(_jaas_credentials(value, where))
            except DeclarationError:
                if not explicit:  # admin_options= take over what cannot be translated
                    raise
        elif name == "ssl.truststore.location":
            if java.get("ssl.truststore.type", "").upper() != "PEM":
                if explicit:
                    continue
                raise DeclarationError(
                    f"{where}: ssl.truststore.location is a Java key store, which the driver's "
                    "metadata client (librdkafka) cannot read.",
                    fix="export the CA certificate as PEM and pass "
                    'admin_options={"ssl.ca.location": "/path/ca.pem"}, or use '
                    "ssl.truststore.type=PEM",
                )
            config["ssl.ca.location"] = value
        elif name in ("ssl.truststore.type", "ssl.keystore.type", "ssl.truststore.password"):
            continue
        elif name.startswith(("sasl.", "ssl.")) and not explicit:
            raise DeclarationError(
                f"{where}: client option {name!r} has no exact equivalent in the driver's "
                "metadata client (librdkafka).",
                fix="pass the metadata client's settings in admin_options= (librdkafka names); "
                "they replace the translation of the security settings",
            )
        # Anything else tunes the consumers of Spark's tasks; it stays with the connector.
    config.update(explicit)
    return config


def topic_id_text(value: Any) -> str:
    """A Kafka ``Uuid`` as Java's ``Uuid.toString()`` prints it (URL-safe base64).

    confluent-kafka's ``str()`` uses the standard alphabet, so the same id would not
    compare equal to what Java tools (and Kafka's logs) show.
    """
    bits = (value.get_most_significant_bits() << 64) | (
        value.get_least_significant_bits() & 0xFFFFFFFFFFFFFFFF
    )
    raw = (bits & ((1 << 128) - 1)).to_bytes(16, "big")
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@dataclass(frozen=True)
class TopicInfo:
    """A topic as the brokers describe it now."""

    name: str
    topic_id: str
    partitions: tuple[int, ...]


class KafkaMetadata:
    """One admin client for the topics of a Kafka main input (driver side, no Spark).

    Args:
        kafka: the declaration.
        label: how messages name the main input.
    """

    def __init__(self, kafka: KafkaInput, label: str) -> None:
        self.kafka = kafka
        self.label = label
        self._module, admin = _load_client()
        self._admin = admin.AdminClient(admin_config(kafka, label))
        self._admin_module = admin
        self._read_committed = dict(kafka.options).get("isolation.level") == "read_committed"

    def _fail(self, what: str, exc: BaseException) -> KafkaSourceError:
        return KafkaSourceError(
            f"{self.label}: could not {what} from the Kafka brokers at "
            f"{self.kafka.bootstrap_servers} ({type(exc).__name__}: {exc}). Nothing was written.",
            fix="check that the brokers are reachable from the driver and that the client "
            "settings (options= / admin_options=) allow describing the topics",
        )

    def topics(self) -> list[str]:
        """The declared topics, or those the pattern matches now (whole names, sorted)."""
        if not self.kafka.pattern:
            return list(self.kafka.topics)
        try:
            listed = self._admin.list_topics(timeout=REQUEST_TIMEOUT_S).topics
        except Exception as exc:
            raise self._fail("list the topics", exc) from exc
        pattern = re.compile(self.kafka.pattern)
        return sorted(t for t in listed if not t.startswith("__") and pattern.fullmatch(t))

    def describe(self, topics: Iterable[str]) -> dict[str, TopicInfo]:
        """Each existing topic's id and partitions (a topic that does not exist is left out)."""
        wanted = sorted(set(topics))
        if not wanted:
            return {}
        found: dict[str, TopicInfo] = {}
        collection = self._module.TopicCollection(wanted)
        try:
            futures = self._admin.describe_topics(collection, request_timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:
            raise self._fail("describe the topics", exc) from exc
        for name, future in futures.items():
            try:
                description = future.result(timeout=REQUEST_TIMEOUT_S)
            except self._module.KafkaException as exc:
                if exc.args[0].code() == self._module.KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue
                raise self._fail(f"describe topic {name!r}", exc) from exc
            except Exception as exc:
                raise self._fail(f"describe topic {name!r}", exc) from exc
            partitions = tuple(sorted(p.id for p in description.partitions))
            found[name] = TopicInfo(name, topic_id_text(description.topic_id), partitions)
        return found

    def compacted(self, topics: Iterable[str]) -> set[str]:
        """The topics whose ``cleanup.policy`` compacts their log (their offsets then
        number more than the records they hold); a topic whose configuration cannot be
        read (an ACL without DescribeConfigs) counts as compacted."""
        wanted = sorted(set(topics))
        admin = self._admin_module
        resources = [admin.ConfigResource(admin.ResourceType.TOPIC, t) for t in wanted]
        compacted: set[str] = set()
        try:
            futures = self._admin.describe_configs(resources, request_timeout=REQUEST_TIMEOUT_S)
        except Exception:
            return set(wanted)
        for resource, future in futures.items():
            try:
                entries = future.result(timeout=REQUEST_TIMEOUT_S)
            except Exception:
                compacted.add(resource.name)
                continue
            policy = entries.get("cleanup.policy")
            if policy is None or "compact" in str(policy.value):
                compacted.add(resource.name)
        return compacted

    def offsets(
        self, partitions: Iterable[tuple[str, int]], which: str
    ) -> dict[tuple[str, int], int]:
        """The ``earliest`` (log start) or ``latest`` (log end, or the last stable offset
        under ``isolation.level=read_committed``) offset of each partition."""
        wanted = sorted(set(partitions))
        if not wanted:
            return {}
        admin = self._admin_module
        spec = admin.OffsetSpec.earliest() if which == "earliest" else admin.OffsetSpec.latest()
        extra = {}
        if self._read_committed:
            extra["isolation_level"] = self._module.IsolationLevel.READ_COMMITTED
        # A partition just created, added or recreated may name a leader (or a leader
        # epoch) that does not serve it yet.
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while True:
            request = {self._module.TopicPartition(t, p): spec for t, p in wanted}
            try:
                futures = self._admin.list_offsets(
                    request, request_timeout=REQUEST_TIMEOUT_S, **extra
                )
                done = {
                    (tp.topic, tp.partition): f.result(timeout=REQUEST_TIMEOUT_S)
                    for tp, f in futures.items()
                }
            except self._module.KafkaException as exc:
                if leadership_in_flux(exc.args[0]) and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise self._fail(f"read the {which} offsets", exc) from exc
            except Exception as exc:
                raise self._fail(f"read the {which} offsets", exc) from exc
            return {key: int(result.offset) for key, result in done.items()}


def by_topic(values: Mapping[tuple[str, int], int]) -> dict[str, dict[int, int]]:
    """``{(topic, partition): v}`` as ``{topic: {partition: v}}``."""
    out: dict[str, dict[int, int]] = {}
    for (topic, partition), value in sorted(values.items()):
        out.setdefault(topic, {})[partition] = value
    return out

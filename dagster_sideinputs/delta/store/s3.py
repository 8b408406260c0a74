"""S3 and S3-compatible stores: one set of settings for delta-rs and for Spark's s3a.

delta-rs (and the conditional writes of :mod:`~dagster_sideinputs.delta.store.object_store`)
reach S3 through ``storage_options`` (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...);
Spark reaches it through Hadoop's s3a filesystem (``fs.s3a.*`` settings). A table of
the lake is read and written by both, so both must see the same endpoint and
credentials. This module keeps one source: the delta-rs storage options (given
explicitly, by an :class:`S3Store`, or read from the ``AWS_*`` environment variables),
from which the s3a settings are derived per bucket and set on the Spark session that
touches the bucket (:func:`configure_spark`, called by the engine and the operator).

Why per-bucket runtime settings (``fs.s3a.bucket.<bucket>.endpoint`` set with
``spark.conf.set``) rather than session-wide ``spark.hadoop.fs.s3a.*`` at start-up:
Spark copies the session's SQL settings into the Hadoop configuration of every read and
write (driver and executors, and over Spark Connect too), so one session serves lakes
on several buckets or endpoints, and a session built elsewhere (a notebook, a cluster's
default) needs no s3a settings of its own. Hadoop caches one filesystem object per
bucket and JVM, built at the bucket's first use: the settings must be in place before
Spark first touches the bucket (they are, when the lake's own code touches it first).
"""

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlparse

from dagster_sideinputs.errors import DeclarationError

S3_SCHEMES = frozenset({"s3", "s3a"})

SIMPLE_CREDENTIALS = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
TEMPORARY_CREDENTIALS = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
DEFAULT_REGION = "us-east-1"  # object_store's (delta-rs's) default; s3a gets it too

# object_store's names for each setting (matched case-insensitively), first the one we
# write. Environment variables use the upper-case form of the first.
_ALIASES: Mapping[str, tuple[str, ...]] = {
    "endpoint": ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint"),
    "access_key_id": ("aws_access_key_id", "access_key_id"),
    "secret_access_key": ("aws_secret_access_key", "secret_access_key"),
    "session_token": ("aws_session_token", "aws_token", "session_token", "token"),
    "region": ("aws_region", "region", "aws_default_region", "default_region"),
    "allow_http": ("aws_allow_http", "allow_http"),
    "virtual_hosted_style": (
        "aws_virtual_hosted_style_request",
        "virtual_hosted_style_request",
    ),
}
_FIELD_OF = {alias: name for name, aliases in _ALIASES.items() for alias in aliases}
# Environment variables read by S3Store.from_env, in order of precedence per field
# (AWS_ENDPOINT_URL_S3 is the AWS SDKs' service-specific endpoint).
_ENVIRONMENT: Mapping[str, tuple[str, ...]] = {
    "endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"),
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "session_token": ("AWS_SESSION_TOKEN", "AWS_TOKEN"),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "allow_http": ("AWS_ALLOW_HTTP",),
    "virtual_hosted_style": ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST",),
}
ENVIRONMENT_VARIABLES: tuple[str, ...] = tuple(
    dict.fromkeys(name for names in _ENVIRONMENT.values() for name in names)
)
"""The ``AWS_*`` environment variables an S3 lake reads (see :meth:`S3Store.from_env`)."""
SECRET_FIELDS = ("access_key_id", "secret_access_key", "session_token")


def is_s3(uri: str) -> bool:
    """Whether a URI is on S3 (``s3://`` for delta-rs, ``s3a://`` for Spark: one store)."""
    return urlparse(uri).scheme.lower() in S3_SCHEMES


def bucket_of(uri: str) -> str:
    return urlparse(uri).netloc


def _flag(value: str | bool | None) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class S3Store:
    """An S3 or S3-compatible store (MinIO, Ceph, ...): endpoint, region and credentials.

    The same values reach delta-rs (:attr:`storage_options`) and Spark's s3a filesystem
    (:meth:`hadoop_settings`, set per bucket on the session by the operator and the
    Delta engine). Unset fields fall back to each library's own defaults: with no
    credentials, delta-rs and s3a both use AWS's default chain (instance profile, web
    identity, ...). Secrets are left out of the ``repr``.

    Args:
        endpoint: ``http(s)://host:port`` of an S3-compatible server; None for AWS.
        access_key_id: the access key.
        secret_access_key: its secret.
        session_token: for temporary credentials (STS).
        region: the region; ``us-east-1`` when an endpoint is given without one.
        allow_http: allow a plain-HTTP endpoint; by default true exactly when the
            endpoint starts with ``http://``.
        virtual_hosted_style: address buckets as ``bucket.host`` instead of
            ``host/bucket``; path style is the default with an endpoint (as in delta-rs).

    Examples:
        >>> store = S3Store(endpoint="http://127.0.0.1:9000", access_key_id="k",
        ...                 secret_access_key="s")
        >>> store
        S3Store(endpoint='http://127.0.0.1:9000', region=None, credentials='access key')
        >>> sorted(store.storage_options)  # doctest: +NORMALIZE_WHITESPACE
        ['AWS_ACCESS_KEY_ID', 'AWS_ALLOW_HTTP', 'AWS_ENDPOINT_URL', 'AWS_REGION',
         'AWS_SECRET_ACCESS_KEY']
    """

    endpoint: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str | None = None
    allow_http: bool | None = None
    virtual_hosted_style: bool | None = None

    def __repr__(self) -> str:
        if self.session_token:
            credentials = "temporary"
        elif self.access_key_id or self.secret_access_key:
            credentials = "access key"
        else:
            credentials = "default chain"
        return (
            f"S3Store(endpoint={self.endpoint!r}, region={self.region!r}, "
            f"credentials={credentials!r})"
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "S3Store":
        """The store the ``AWS_*`` environment variables describe.

        Reads ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT``,
        ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
        ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_ALLOW_HTTP`` and
        ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST``; empty variables count as unset.
        """
        env = os.environ if environ is None else environ
        found: dict[str, Any] = {}
        for name, variables in _ENVIRONMENT.items():
            value = next((env[v] for v in variables if env.get(v)), None)
            if value is not None:
                found[name] = value
        return cls._of(found)

    @classmethod
    def from_storage_options(cls, options: Mapping[str, str]) -> "S3Store":
        """The store delta-rs storage options describe (any of object_store's spellings:
        ``AWS_ENDPOINT_URL``, ``aws_endpoint``, ``endpoint``, ...); other keys are ignored."""
        found: dict[str, Any] = {}
        for key, value in options.items():
            name = _FIELD_OF.get(key.lower())
            if name is not None and value not in (None, ""):
                found[name] = value
        return cls._of(found)

    @classmethod
    def _of(cls, found: Mapping[str, Any]) -> "S3Store":
        values = dict(found)
        for flag in ("allow_http", "virtual_hosted_style"):
            if flag in values:
                values[flag] = _flag(values[flag])
        return cls(**values)

    def updated(self, other: "S3Store") -> "S3Store":
        """This store with every field ``other`` sets replaced by ``other``'s value."""
        changes = {
            name: getattr(other, name)
            for name in self.__dataclass_fields__
            if getattr(other, name) is not None
        }
        return replace(self, **changes)

    @property
    def effective_region(self) -> str | None:
        return self.region or (DEFAULT_REGION if self.endpoint else None)

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs (object_store) storage options."""
        options: dict[str, str] = {}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
        if self.access_key_id:
            options["AWS_ACCESS_KEY_ID"] = self.access_key_id
        if self.secret_access_key:
            options["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        if self.session_token:
            options["AWS_SESSION_TOKEN"] = self.session_token
        region = self.effective_region
        if region:
            options["AWS_REGION"] = region
        allow_http = self.allow_http
        if allow_http is None and self.endpoint:
            allow_http = self.endpoint.lower().startswith("http://")
        if allow_http:
            options["AWS_ALLOW_HTTP"] = "true"
        if self.virtual_hosted_style is not None:
            options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = str(self.virtual_hosted_style).lower()
        return options

    def hadoop_settings(self, bucket: str | None = None) -> dict[str, str]:
        """Hadoop s3a settings with the same values, for one bucket (``fs.s3a.bucket.<b>.*``)
        or, without a bucket, for every bucket (``fs.s3a.*``)."""
        prefix = f"fs.s3a.bucket.{bucket}." if bucket else "fs.s3a."
        settings: dict[str, str] = {}
        if self.endpoint:
            settings[prefix + "endpoint"] = self.endpoint
            # object_store addresses buckets by path when an endpoint is set; s3a must too.
            settings[prefix + "path.style.access"] = str(not self.virtual_hosted_style).lower()
            if self.endpoint.lower().startswith("http://"):
                settings[prefix + "connection.ssl.enabled"] = "false"
        region = self.effective_region
        if region:
            settings[prefix + "endpoint.region"] = region
        if self.access_key_id and self.secret_access_key:
            temporary = bool(self.session_token)
            settings[prefix + "aws.credentials.provider"] = (
                TEMPORARY_CREDENTIALS if temporary else SIMPLE_CREDENTIALS
            )
            settings[prefix + "access.key"] = self.access_key_id
            settings[prefix + "secret.key"] = self.secret_access_key
            if self.session_token:
                settings[prefix + "session.token"] = self.session_token
        return settings

    def spark_conf(self, bucket: str | None = None) -> dict[str, str]:
        """:meth:`hadoop_settings` as Spark configuration (``spark.hadoop.`` prefixed), for a
        session or a Spark Connect server started with them (``--conf``)."""
        return {f"spark.hadoop.{key}": value for key, value in self.hadoop_settings(bucket).items()}

    def secrets(self) -> tuple[str, ...]:
        """The credential values (to keep them out of anything shown)."""
        return tuple(v for v in (getattr(self, name) for name in SECRET_FIELDS) if v)


def store_label(uri: str, storage_options: Mapping[str, str] | None) -> str:
    """The store of a location, for messages: the URI, with its S3 endpoint when one is
    set (never a credential)."""
    if not is_s3(uri):
        return uri
    endpoint = S3Store.from_storage_options(storage_options or {}).endpoint
    return f"{uri} at {endpoint}" if endpoint else uri


def resolve_storage_options(
    uri: str, storage_options: Mapping[str, str] | None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The storage options of a lake root: on S3, the ``AWS_*`` environment overridden by
    the explicit options (what delta-rs does on its own), written out so that Spark gets
    the same values; elsewhere the explicit options unchanged."""
    explicit = dict(storage_options or {})
    if not is_s3(uri):
        return explicit
    store = S3Store.from_env(environ).updated(S3Store.from_storage_options(explicit))
    others = {key: value for key, value in explicit.items() if key.lower() not in _FIELD_OF}
    return {**others, **store.storage_options}


def _require_s3a(spark: Any, uri: str) -> None:
    """Fail clearly when a classic session has no s3a filesystem (hadoop-aws missing)."""
    if getattr(spark, "_jvm", None) is None:
        return  # Spark Connect: the server's class path; Spark's own error names the class
    try:
        # How Hadoop itself finds the filesystem of a scheme: Spark's class loader, and the
        # session's settings (an fs.s3a.impl among them).
        hadoop_conf = spark._jsparkSession.sessionState().newHadoopConf()
        spark._jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass("s3a", hadoop_conf)
    except Exception as exc:
        if not any(m in str(exc) for m in ("ClassNotFound", "No FileSystem for scheme")):
            raise
        raise DeclarationError(
            f"The lake is on S3 ({uri}) but this Spark session has no s3a filesystem "
            f"({S3A_FILESYSTEM}: hadoop-aws and the AWS SDK are not on its class path).",
            fix='start the session with them: dsi.build_spark_session(packages=["s3"]) or '
            'dsi.SparkResource(packages=["s3"]); '
            "`python -m dagster_sideinputs.core.spark.jars fetch` caches them once",
        ) from None


def configure_spark(spark: Any, uri: str, storage_options: Mapping[str, str] | None) -> None:
    """Give a Spark session the s3a settings of ``uri``'s bucket, from the storage options.

    A no-op for other URIs, and for settings the session already has. Runtime SQL
    settings, so this works on any session, including over Spark Connect.

    Raises:
        DeclarationError: the session has no s3a filesystem on its class path.
    """
    if not is_s3(uri):
        return
    _require_s3a(spark, uri)
    # Resolved like delta-rs resolves them (the environment fills what is not given).
    store = S3Store.from_storage_options(resolve_storage_options(uri, storage_options))
    with _py4j_quiet():
        for key, value in store.hadoop_settings(bucket_of(uri)).items():
            if spark.conf.get(key, None) != value:
                spark.conf.set(key, value)


@contextlib.contextmanager
def _py4j_quiet() -> Iterator[None]:
    """Keep py4j from logging the commands of the block: at DEBUG it logs each command it
    sends to the JVM with its arguments, here the credentials."""
    loggers = [logging.getLogger(name) for name in _PY4J_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logging.INFO, logger.getEffectiveLevel()))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


_PY4J_LOGGERS = ("py4j", "py4j.clientserver", "py4j.java_gateway")

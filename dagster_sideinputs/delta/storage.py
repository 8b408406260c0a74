"""Where tables live, and which Delta engine reads and writes them.

Everything above the ``delta`` package (the operator, the IO manager) talks to Delta
through :class:`~dagster_sideinputs.delta.engine.DeltaEngine`, reached as
``DeltaStorage.delta``.

Two engines implement it:

- ``delta-spark``: :class:`~dagster_sideinputs.delta.spark.engine.DeltaSparkEngine`,
  delta-spark itself (reads and writes ``format("delta")``); needs a session with Delta
  configured (its jar, SQL extension and catalog), locally or on a Spark Connect server.
- ``delta-rs``: :class:`~dagster_sideinputs.delta.bridge.engine.DeltaRsEngine`, Spark writes
  parquet and delta-rs commits; runs on any Spark, with delta-rs storage options.

``engine="auto"`` (the default) picks delta-spark when the session has Delta configured
and the bridge otherwise; the choice is made when a session is known
(:meth:`DeltaStorage.bind`, which the operator and the IO manager call) and logged once.
"""

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pyspark.sql import SparkSession

from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine
from dagster_sideinputs.delta.engine import DeltaEngine
from dagster_sideinputs.delta.session import active_session
from dagster_sideinputs.delta.spark.engine import DeltaSparkEngine
from dagster_sideinputs.delta.spark.setup import is_delta_configured
from dagster_sideinputs.delta.store.files import check_root, join_uri, normalize_uri
from dagster_sideinputs.delta.store.s3 import configure_spark, resolve_storage_options
from dagster_sideinputs.errors import DeclarationError

__all__ = [
    "ENGINE_CHOICES",
    "DeltaEngine",
    "DeltaRsEngine",
    "DeltaSparkEngine",
    "DeltaStorage",
    "EngineChoice",
    "default_engine",
]

EngineChoice = Literal["auto", "delta-spark", "delta-rs"]
ENGINE_CHOICES: tuple[str, ...] = ("auto", "delta-spark", "delta-rs")
ENGINE_ENV = "DSI_DELTA_ENGINE"
"""Environment variable giving the engine of storages that name none (default ``auto``)."""
log = logging.getLogger("dagster_sideinputs")
_logged: set[tuple[str, str]] = set()
_logged_lock = threading.Lock()


def default_engine() -> str:
    """The engine of a storage that names none: ``$DSI_DELTA_ENGINE``, else ``auto``."""
    return os.environ.get(ENGINE_ENV, "").strip() or "auto"


def _log_once(engine: str, reason: str) -> None:
    with _logged_lock:
        if (engine, reason) in _logged:
            return
        _logged.add((engine, reason))
    log.info("Delta engine: %s (%s)", engine, reason)


@dataclass(frozen=True)
class DeltaStorage:
    """Where Delta tables live: a root folder (or bucket prefix), its options, and the engine.

    A table's location is derived from its name or asset key path:
    ``DeltaStorage("/data").table_uri(["payments", "transactions"])`` is
    ``/data/payments/transactions``. Frozen and picklable (a bound session is not pickled).

    On S3 (``s3://`` or ``s3a://``, one store: see :class:`~dagster_sideinputs.S3Store`)
    the storage options are resolved once, here: the ``AWS_*`` environment variables,
    overridden by the explicit options. The same values reach delta-rs and, as s3a
    settings of the root's bucket, every Spark session the engine or the operator uses
    (:meth:`bind` gives them to the session, which is all delta-spark needs).

    Args:
        root: local folder, shared filesystem path, or object store URI.
        storage_options: object store options (for S3: ``AWS_ENDPOINT_URL``,
            ``AWS_ACCESS_KEY_ID``, ... or ``dsi.S3Store(...).storage_options``): delta-rs
            uses them, and :meth:`bind` sets them on the session for Spark and delta-spark.
        engine: ``"auto"`` (default: delta-spark when the session has Delta configured,
            else the delta-rs bridge), ``"delta-spark"``, ``"delta-rs"``, or an engine
            instance. None: ``$DSI_DELTA_ENGINE`` when set, else ``"auto"``.

    Raises:
        DeclarationError: a root with characters Spark or the object store would read
            as something else (``* ? [ ] { } \\ # %``), or an unknown engine.

    Examples:
        >>> storage = DeltaStorage(root="/tmp/lake")
        >>> storage.table_uri("transactions")
        '/tmp/lake/transactions'
        >>> DeltaStorage("/tmp/lake", engine="delta-rs").delta.name
        'delta-rs bridge'
    """

    root: str
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # secrets
    engine: DeltaEngine | EngineChoice | None = None

    def __post_init__(self) -> None:
        check_root(self.root)
        object.__setattr__(self, "root", normalize_uri(self.root))
        resolved = resolve_storage_options(self.root, self.storage_options)
        object.__setattr__(self, "storage_options", resolved)
        choice = default_engine() if self.engine is None else self.engine
        if isinstance(choice, str) and choice not in ENGINE_CHOICES:
            raise DeclarationError(
                f"DeltaStorage(engine={choice!r}) (or ${ENGINE_ENV}) is not an engine; "
                f"expected one of {list(ENGINE_CHOICES)} or a DeltaEngine.",
                fix='engine="auto" (delta-spark where the session has Delta), "delta-spark" '
                'or "delta-rs"',
            )
        object.__setattr__(self, "engine", choice)

    @property
    def choice(self) -> str:
        """The engine asked for: ``auto``, ``delta-spark``, ``delta-rs`` (or ``instance``)."""
        return self.engine if isinstance(self.engine, str) else "instance"

    def bind(self, spark: SparkSession) -> "DeltaStorage":
        """This storage with its engine resolved for ``spark`` (see the module docstring).

        Also gives the session this root's object store settings (:meth:`configure_spark`).

        Raises:
            DeclarationError: ``engine="delta-spark"`` and the session has no Delta.
        """
        self.configure_spark(spark)
        engine = self.engine
        if isinstance(engine, DeltaSparkEngine):
            return self if engine.session is spark else replace(self, engine=engine.bound(spark))
        if not isinstance(engine, str):
            return self  # an engine instance of the caller's
        return replace(self, engine=self._resolve(engine, spark))

    def _resolve(self, choice: str, spark: SparkSession | None) -> DeltaEngine:
        if choice == "delta-rs":
            _log_once("delta-rs bridge", "asked for: engine='delta-rs'")
            return DeltaRsEngine(dict(self.storage_options))
        configured = spark is not None and is_delta_configured(spark)
        if choice == "delta-spark":
            if spark is not None and not configured:
                raise DeclarationError(
                    "DeltaStorage(engine='delta-spark') needs a SparkSession with Delta Lake "
                    "configured (delta-spark's jar, io.delta.sql.DeltaSparkSessionExtension "
                    "and the DeltaCatalog as spark_catalog); this session has not.",
                    fix="start it with SparkResource(delta=True) / build_spark_session("
                    "delta=True) (a Spark Connect server: --packages io.delta:delta-spark_"
                    "4.1_2.13:<version> and the two settings), or use engine='auto'",
                )
            _log_once("delta-spark", "asked for: engine='delta-spark'")
            return DeltaSparkEngine(spark, dict(self.storage_options))
        if configured:
            _log_once("delta-spark", "the Spark session has Delta Lake configured")
            return DeltaSparkEngine(spark, dict(self.storage_options))
        _log_once(
            "delta-rs bridge",
            "no Spark session with Delta Lake (its SQL extension and catalog)"
            if spark is not None
            else "no Spark session yet",
        )
        return DeltaRsEngine(dict(self.storage_options))

    @property
    def delta(self) -> DeltaEngine:
        """The engine. An unbound ``auto`` storage resolves against the active session
        (the bridge when there is none: metadata reads need no Spark)."""
        engine = self.engine
        if not isinstance(engine, str):
            return engine  # type: ignore[return-value]
        cache: dict[Any, DeltaEngine] = self.__dict__.setdefault("_resolved", {})
        spark = active_session() if engine != "delta-rs" else None
        key = id(spark)
        resolved = cache.get(key)
        if resolved is None:
            resolved = self._resolve(engine, spark)
            cache.clear()  # one session at a time: never keep a stopped one alive
            cache[key] = resolved
        return resolved

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (DeltaStorage, (self.root, dict(self.storage_options), self.engine))

    def configure_spark(self, spark: Any) -> None:
        """Give a Spark session this root's object store settings (s3a, per bucket); a
        no-op on filesystems. The engine and the operator call it before Spark reads or
        writes here; call it yourself before reading the lake's files with plain Spark."""
        configure_spark(spark, self.root, self.storage_options)

    def table_uri(self, name: str | Sequence[str]) -> str:
        """Location of a table from its name or asset key path."""
        parts = [name] if isinstance(name, str) else list(name)
        return join_uri(self.root, *parts)

"""Where tables live, and which Delta engine reads and writes them.

Everything above the ``delta`` package (the operator, the IO manager) talks to Delta
through :class:`~dagster_sideinputs.delta.engine.DeltaEngine`, reached as
``DeltaStorage.delta``.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster_sideinputs.delta.bridge import DeltaRsEngine
from dagster_sideinputs.delta.engine import DeltaEngine
from dagster_sideinputs.delta.files import check_root, join_uri, normalize_uri
from dagster_sideinputs.delta.s3 import configure_spark, resolve_storage_options

__all__ = ["DeltaEngine", "DeltaRsEngine", "DeltaStorage"]


@dataclass(frozen=True)
class DeltaStorage:
    """Where Delta tables live: a root folder (or bucket prefix) and its options.

    A table's location is derived from its name or asset key path:
    ``DeltaStorage("/data").table_uri(["payments", "transactions"])`` is
    ``/data/payments/transactions``. Frozen and picklable.

    On S3 (``s3://`` or ``s3a://``, one store: see :class:`~dagster_sideinputs.S3Store`)
    the storage options are resolved once, here: the ``AWS_*`` environment variables,
    overridden by the explicit options. The same values reach delta-rs and, as s3a
    settings of the root's bucket, every Spark session the engine or the operator uses.

    Args:
        root: local folder, shared filesystem path, or object store URI.
        storage_options: delta-rs object store options (for S3: ``AWS_ENDPOINT_URL``,
            ``AWS_ACCESS_KEY_ID``, ... or ``dsi.S3Store(...).storage_options``).
        engine: the Delta implementation; the delta-rs bridge by default.

    Raises:
        DeclarationError: a root with characters Spark or the object store would read
            as something else (``* ? [ ] { } \\ # %``).

    Examples:
        >>> storage = DeltaStorage(root="/tmp/lake")
        >>> storage.table_uri("transactions")
        '/tmp/lake/transactions'
    """

    root: str
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # secrets
    engine: DeltaEngine | None = None

    def __post_init__(self) -> None:
        check_root(self.root)
        object.__setattr__(self, "root", normalize_uri(self.root))
        resolved = resolve_storage_options(self.root, self.storage_options)
        object.__setattr__(self, "storage_options", resolved)
        if self.engine is None:
            object.__setattr__(self, "engine", DeltaRsEngine(dict(self.storage_options)))

    @property
    def delta(self) -> DeltaEngine:
        """The engine (never None after construction)."""
        assert self.engine is not None
        return self.engine

    def configure_spark(self, spark: Any) -> None:
        """Give a Spark session this root's object store settings (s3a, per bucket); a
        no-op on filesystems. The engine and the operator call it before Spark reads or
        writes here; call it yourself before reading the lake's files with plain Spark."""
        configure_spark(spark, self.root, self.storage_options)

    def table_uri(self, name: str | Sequence[str]) -> str:
        """Location of a table from its name or asset key path."""
        parts = [name] if isinstance(name, str) else list(name)
        return join_uri(self.root, *parts)

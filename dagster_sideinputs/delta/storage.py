"""Where tables live, and which Delta engine reads and writes them.

Everything above the ``delta`` package (the operator, the IO manager) talks to Delta
through :class:`~dagster_sideinputs.delta.engine.DeltaEngine`, reached as
``DeltaStorage.delta``.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dagster_sideinputs.delta.bridge import DeltaRsEngine
from dagster_sideinputs.delta.engine import DeltaEngine
from dagster_sideinputs.delta.files import join_uri, normalize_uri

__all__ = ["DeltaEngine", "DeltaRsEngine", "DeltaStorage"]


@dataclass(frozen=True)
class DeltaStorage:
    """Where Delta tables live: a root folder (or bucket prefix) and its options.

    A table's location is derived from its name or asset key path:
    ``DeltaStorage("/data").table_uri(["payments", "transactions"])`` is
    ``/data/payments/transactions``. Frozen and picklable.

    Args:
        root: local folder, shared filesystem path, or object store URI.
        storage_options: delta-rs object store options.
        engine: the Delta implementation; the delta-rs bridge by default.

    Examples:
        >>> storage = DeltaStorage(root="/tmp/lake")
        >>> storage.table_uri("transactions")
        '/tmp/lake/transactions'
    """

    root: str
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # secrets
    engine: DeltaEngine | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", normalize_uri(self.root))
        if self.engine is None:
            object.__setattr__(self, "engine", DeltaRsEngine(dict(self.storage_options)))

    @property
    def delta(self) -> DeltaEngine:
        """The engine (never None after construction)."""
        assert self.engine is not None
        return self.engine

    def table_uri(self, name: str | Sequence[str]) -> str:
        """Location of a table from its name or asset key path."""
        parts = [name] if isinstance(name, str) else list(name)
        return join_uri(self.root, *parts)

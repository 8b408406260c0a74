"""The resolved, validated declaration of one operator bound to its storage (internal):
:class:`OperatorSpec` (with its :class:`BoundSide` side inputs, table locations and the
identity recorded in its state), built and checked by
:func:`~dagster_sideinputs.core.binding.build_spec`.
"""

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column

from dagster_sideinputs.core.declarations import MainInput, asset_path
from dagster_sideinputs.core.options import OperatorOptions
from dagster_sideinputs.core.outputs import MAIN, OutputTag
from dagster_sideinputs.core.sideinputs.declaration import SideInput
from dagster_sideinputs.core.sideinputs.readiness import ReadinessProvider
from dagster_sideinputs.core.sideinputs.windows import Window
from dagster_sideinputs.delta.engine import DeltaEngine
from dagster_sideinputs.delta.storage import DeltaStorage
from dagster_sideinputs.delta.store.files import join_uri, normalize_uri

STATE_FOLDER = "_sideinputs"


@dataclass(frozen=True)
class BoundSide:
    """A side input as an operator uses it: its handle, declaration and table."""

    name: str
    side: SideInput
    uri: str

    @property
    def label(self) -> str:
        return f"side input {self.name!r} (asset {self.side.asset!r})"


@dataclass(frozen=True)
class OperatorSpec:
    """One operator's declaration, resolved against its storage."""

    options: OperatorOptions
    operator_id: str
    main_uri: str
    sides: tuple[BoundSide, ...]
    window: Window | None
    side_tags: tuple[OutputTag, ...]
    storage: DeltaStorage
    readiness: ReadinessProvider

    # --- declaration shortcuts ------------------------------------------------------

    @property
    def main(self) -> MainInput:
        return self.options.main

    @property
    def main_tag(self) -> OutputTag:
        return self.options.tag

    @property
    def engine(self) -> DeltaEngine:
        return self.storage.delta

    # --- tables ------------------------------------------------------------------------

    @property
    def state_uri(self) -> str:
        return join_uri(self.storage.root, STATE_FOLDER, self.operator_id)

    @property
    def buffer_uri(self) -> str:
        return join_uri(self.state_uri, "buffer")

    @property
    def files_seen_uri(self) -> str:
        return join_uri(self.state_uri, "files_seen")

    def table_uri(self, tag: OutputTag) -> str:
        return self.storage.table_uri(asset_path(tag.name))

    def written_tables(self) -> list[str]:
        """Every table a batch may commit to: outputs, buffer, and a landing folder's ledger."""
        return [self.table_uri(tag) for tag in self.all_tags] + self.own_tables()

    def own_tables(self) -> list[str]:
        """The operator's own tables: the buffer, and a landing folder's ledger."""
        return [self.buffer_uri] + ([self.files_seen_uri] if self.main.kind == "files" else [])

    @property
    def all_tags(self) -> list[OutputTag]:
        """Every output: the main one first, then side outputs and routes in declaration order."""
        return [self.main_tag, *self.side_tags]

    @property
    def declared(self) -> dict[str, OutputTag]:
        """Tags the function may emit to, by name (MAIN stands for the main output)."""
        tags = {tag.name: tag for tag in self.side_tags}
        tags[MAIN.name] = self.main_tag
        return tags

    @property
    def routes(self) -> dict[str, OutputTag]:
        return self.options.routes.declared()

    def side(self, name: str) -> BoundSide:
        return next(b for b in self.sides if b.name == name)

    @property
    def keyed_waits(self) -> list[BoundSide]:
        return [b for b in self.sides if b.side.missing == "wait"]

    # --- identity ------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """What the operator's recorded position and transactions refer to: changing any
        of it under the same operator id would skip or repeat records."""
        main = self.main
        return {
            "operator_id": self.operator_id,
            "main_output": self.main_tag.name,
            "main_input": {
                "kind": main.kind,
                "uri": self.main_uri if main.kind == "kafka" else normalize_uri(self.main_uri),
                "format": main.format,
            },
        }

    def routing(self) -> dict[str, Any]:
        """What decides where a buffered record goes (namespaces, keys, readiness rules):
        when it changes, the next batch re-routes every buffered record."""
        window = self.window
        return {
            "key": self.main.key,
            "event_time": self.main.event_time,
            "pre_keyed": repr(self.main.pre_keyed),
            "window": None if window is None else _window_identity(window),
            "sides": {
                b.name: {
                    "view": b.side.view,
                    "asset": b.side.asset,
                    "key": b.side.key,
                    "key_translator": _translator_identity(b.side.key_translator),
                    "missing": b.side.missing,
                    "timeout": None if b.side.timeout is None else b.side.timeout.total_seconds(),
                    "on_timeout": b.side.on_timeout,
                    "window": None if b.side.window is None else _window_identity(b.side.window),
                    "mapping": b.side.window_mapping is not None,
                    "readiness": b.side.readiness,
                    # Only when declared, so older declarations keep their fingerprint.
                    **({"as_of": repr(b.side.as_of)} if b.side.as_of is not None else {}),
                }
                for b in self.sides
            },
            "routes": {route: tag.name for route, tag in sorted(self.routes.items())},
        }


def _translator_identity(translator: Any) -> str | None:
    """A stable description of a key translator: a column name, a Column's expression, a
    function's qualified name (its code may change unseen; its name is what is stable)."""
    if translator is None or isinstance(translator, str):
        return translator
    if isinstance(translator, Column):
        return str(translator)
    if hasattr(translator, "__qualname__"):
        return f"{getattr(translator, '__module__', '')}.{translator.__qualname__}"
    return str(translator)


def fingerprint(values: dict[str, Any]) -> str:
    """A short, stable digest of a JSON-able value."""
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _window_identity(window: Window) -> dict[str, Any]:
    return {
        "size": window.size.total_seconds(),
        "slide": window.slide.total_seconds(),
        "offset": window.offset.total_seconds(),
        "time_column": window.time_column,
    }

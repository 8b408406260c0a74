"""The resolved, validated configuration of one operator (internal).

:class:`~dagster_sideinputs.core.operator.SideInputOperator` turns its arguments into
an :class:`OperatorSpec` once: table locations, the effective main window, the
declared output tags, and every cross-declaration check (a route needs its tag, a
freshness rule needs a max age, row mode needs schemas...).
"""

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dagster_sideinputs.core.declarations import (
    MAIN,
    BufferLimits,
    MainInput,
    OutputTag,
    SideInput,
    Window,
    asset_path,
)
from dagster_sideinputs.core.readiness import DeltaReadiness, ReadinessProvider
from dagster_sideinputs.core.views import BoundSide
from dagster_sideinputs.delta.files import join_uri
from dagster_sideinputs.delta.storage import DeltaStorage
from dagster_sideinputs.errors import DeclarationError

Mode = Literal["frames", "rows"]
CachePolicy = Literal["auto", "always", "never"]
STATE_FOLDER = "_sideinputs"


@dataclass(frozen=True)
class Routes:
    """The built-in tags the operator itself emits to (None: not declared)."""

    late: OutputTag | None = None
    unmatched: OutputTag | None = None
    overflow: OutputTag | None = None
    invalid: OutputTag | None = None

    def declared(self) -> list[OutputTag]:
        return list(self.by_route().values())

    def by_route(self) -> dict[str, OutputTag]:
        """Route name -> its declared tag."""
        routes = {
            "late": self.late,
            "unmatched": self.unmatched,
            "overflow": self.overflow,
            "invalid": self.invalid,
        }
        return {route: tag for route, tag in routes.items() if tag is not None}


@dataclass(frozen=True)
class OperatorSpec:
    operator_id: str
    main: MainInput
    main_uri: str
    sides: tuple[BoundSide, ...]
    window: Window | None
    main_tag: OutputTag
    side_tags: tuple[OutputTag, ...]
    routes: Routes
    buffer: BufferLimits
    mode: Mode
    fn: Callable[..., Any]
    storage: DeltaStorage
    readiness: ReadinessProvider
    schema_mode: Literal["merge"] | None
    max_versions_per_batch: int | None
    max_files_per_batch: int | None
    future_tolerance: dt.timedelta | None = dt.timedelta(days=1)
    cache: CachePolicy = "auto"

    @property
    def state_uri(self) -> str:
        return join_uri(self.storage.root, STATE_FOLDER, self.operator_id)

    @property
    def buffer_uri(self) -> str:
        return join_uri(self.state_uri, "buffer")

    @property
    def files_seen_uri(self) -> str:
        return join_uri(self.state_uri, "files_seen")

    @property
    def all_tags(self) -> list[OutputTag]:
        """Every output: the main one first, then side outputs in declaration order."""
        return [self.main_tag, *self.side_tags]

    @property
    def declared(self) -> dict[str, OutputTag]:
        """Tags the function may emit to, by name (MAIN stands for the main output)."""
        tags = {tag.name: tag for tag in self.side_tags}
        tags[MAIN.name] = self.main_tag
        return tags

    def table_uri(self, tag: OutputTag) -> str:
        return self.storage.table_uri(asset_path(tag.name))

    def side(self, name: str) -> BoundSide:
        return next(b for b in self.sides if b.name == name)

    @property
    def keyed_waits(self) -> list[BoundSide]:
        return [b for b in self.sides if b.side.missing == "wait"]


def _main_tag(main_output: str | OutputTag) -> OutputTag:
    if isinstance(main_output, OutputTag):
        return main_output
    return OutputTag(main_output)


def _effective_window(
    window: Window | None, main: MainInput, sides: Sequence[BoundSide]
) -> Window | None:
    """The main window: the declared one, or the finest window of a windowed side input."""
    if window is None:
        windowed = [b.side.window for b in sides if b.side.window is not None]
        if not windowed:
            return None
        finest = min(windowed, key=lambda w: w.size)
        window = Window.tumbling(finest.size, offset=finest.offset)
    column = window.time_column or main.event_time
    if column is None:
        raise DeclarationError(
            f"Main input {main.asset!r} is processed in windows but has no event-time column.",
            fix='pass MainInput(..., event_time="ts") or window=Window...(time_column="ts")',
        )
    return window.with_time_column(column)


def build_spec(
    *,
    main: MainInput,
    side_inputs: Mapping[str, SideInput],
    fn: Callable[..., Any],
    main_output: str | OutputTag,
    side_outputs: Sequence[OutputTag],
    window: Window | None,
    routes: Routes,
    buffer: BufferLimits,
    mode: Mode,
    storage: DeltaStorage,
    operator_id: str | None,
    readiness: ReadinessProvider | None,
    schema_mode: Literal["merge"] | None,
    max_versions_per_batch: int | None,
    max_files_per_batch: int | None,
    future_tolerance: dt.timedelta | None = dt.timedelta(days=1),
    cache: CachePolicy = "auto",
) -> OperatorSpec:
    """Resolve and check an operator declaration; every inconsistency is a DeclarationError."""
    if mode not in ("frames", "rows"):
        raise DeclarationError(f"mode={mode!r} is not 'frames' or 'rows'.")
    if cache not in ("auto", "always", "never"):
        raise DeclarationError(f"cache={cache!r} is not 'auto', 'always' or 'never'.")
    if not callable(fn):
        raise DeclarationError(f"fn must be callable, got {type(fn).__name__}.")
    main_tag = _main_tag(main_output)
    tags: list[OutputTag] = list(side_outputs)
    for route in routes.declared():
        if route not in tags:
            tags.append(route)
    names = [main_tag.name, *[t.name for t in tags]]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise DeclarationError(
            f"Output names must be unique; {duplicates} appear more than once (main output "
            f"{main_tag.name!r}, side outputs {[t.name for t in tags]}).",
        )
    sides = tuple(
        BoundSide(name, side, side.path or storage.table_uri(asset_path(side.asset)))
        for name, side in side_inputs.items()
    )
    for bound in sides:
        _check_side(bound, main, routes, readiness)
    if buffer.on_exceed == "overflow" and routes.overflow is None:
        raise DeclarationError(
            "BufferLimits(on_exceed='overflow') needs an overflow tag.",
            fix='pass overflow=dsi.OutputTag("<name>") to the operator',
        )
    if mode == "rows":
        missing = [t for t in [main_tag, *tags] if t.schema is None and t not in routes.declared()]
        if missing:
            raise DeclarationError(
                f"Row mode builds records in Python, so every output needs a schema; "
                f"missing for {missing}.",
                fix='use OutputTag("name", schema=T.StructType([...])) for main_output and '
                "side_outputs",
            )
    return OperatorSpec(
        operator_id=operator_id or main_tag.name.replace("/", "__"),
        main=main,
        main_uri=main.path or storage.table_uri(asset_path(main.asset)),
        sides=sides,
        window=_effective_window(window, main, sides),
        main_tag=main_tag,
        side_tags=tuple(tags),
        routes=routes,
        buffer=buffer,
        mode=mode,
        fn=fn,
        storage=storage,
        readiness=readiness or DeltaReadiness(),
        schema_mode=schema_mode,
        max_versions_per_batch=max_versions_per_batch,
        max_files_per_batch=max_files_per_batch,
        future_tolerance=future_tolerance,
        cache=cache,
    )


def _check_side(
    bound: BoundSide, main: MainInput, routes: Routes, readiness: ReadinessProvider | None
) -> None:
    side = bound.side
    needs_unmatched = side.missing == "unmatched" or (
        side.missing == "wait" and side.on_timeout == "unmatched"
    )
    if needs_unmatched and routes.unmatched is None:
        raise DeclarationError(
            f"{bound.label} sends records without a side row to the unmatched tag, but the "
            "operator declares none.",
            fix='pass unmatched=dsi.OutputTag("unmatched_...") to the operator, or '
            'on_timeout="null" to join them with nulls',
        )
    if side.readiness == "fresh" and side.max_age is None and readiness is None:
        raise DeclarationError(
            f"{bound.label} has readiness='fresh' but no max_age; without Dagster the "
            "operator judges freshness from the table's last commit time.",
            fix="pass max_age=timedelta(hours=...) (Dagster supplies the asset's "
            "FreshnessPolicy instead)",
        )
    if side.timeout is not None and side.timeout <= dt.timedelta(0):
        raise DeclarationError(f"{bound.label}: timeout must be positive.")

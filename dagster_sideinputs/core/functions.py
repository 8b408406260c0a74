"""The user function: one protocol per mode (:class:`FramesFunction`,
:class:`RowsFunction`), and what a row function may ask while it runs
(:class:`RowContext`). How the operator runs each: :mod:`~dagster_sideinputs.core.batch.compute`
(frames) and :mod:`~dagster_sideinputs.core.rows` (rows)."""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias

from pyspark.sql import DataFrame

from dagster_sideinputs.core.outputs import (
    MAIN,
    Outputs,
    OutputTag,
    SideInputs,
    undeclared_tag_error,
)
from dagster_sideinputs.core.records import Record
from dagster_sideinputs.errors import DeclarationError, did_you_mean


class FramesFunction(Protocol):
    """The function of a frames-mode operator: the batch's released main records and the
    side inputs in, the main output (or every output by tag) out. Runs on the driver,
    building Spark plans; nothing is collected."""

    def __call__(self, main: DataFrame, sides: SideInputs, /) -> Outputs: ...


class RowsFunction(Protocol):
    """The function of a rows-mode operator, run on the executors once per released
    record: it yields the record's main-output records (dicts) and emits side outputs with
    ``ctx.output(tag, record)``."""

    def __call__(
        self, record: Record, ctx: "RowContext", /
    ) -> Iterable[Mapping[str, Any]] | None: ...


SideInputFunction: TypeAlias = FramesFunction | RowsFunction
"""The operator's function: one protocol per mode (``mode="frames"`` / ``"rows"``)."""


class RowContext:
    """What a row function may ask while processing one record (executor side)."""

    def __init__(
        self,
        tags: Mapping[str, OutputTag],
        broadcast_values: Mapping[str, Any],
        joined: Sequence[str],
        main: str,
        routes: Mapping[str, str] | None = None,
    ) -> None:
        self._tags = tags
        self._main = main
        self._routes = dict(routes or {})  # route tags it may not emit to -> their route
        self._broadcast = broadcast_values
        self._positions = {name: index for index, name in enumerate(joined)}
        self._values: Sequence[Any] = ()  # the joined side values of the current record
        self.emitted: dict[str, list[Any]] = {name: [] for name in tags}

    def side_input(self, name: str) -> Any:
        """A side input as this record sees it.

        Keyed map / multimap views give the row (list of rows) for the record's key (an
        as-of map: the row valid at the record's event time); singletons give their
        value; windowed views give the view of the record's own side window (a list of
        rows, or a dict key -> row / rows for maps and multimaps without a key
        relation); other views give the whole view (a list of rows, or a dict key -> row
        for maps without a key relation).
        """
        position = self._positions.get(name)
        if position is not None:
            return self._values[position]
        if name in self._broadcast:
            return self._broadcast[name]
        known = sorted({*self._positions, *self._broadcast})
        raise DeclarationError(
            f"The row function asked for side input {name!r}, which the operator does not "
            f"declare; declared: {known}.{did_you_mean(name, known)}",
            fix="use one of the names given in side_inputs={...}",
        )

    def output(self, tag: OutputTag | str, record: Any) -> None:
        """Emit a record to a declared side output (or to the main output: ``MAIN``)."""
        name = tag.name if isinstance(tag, OutputTag) else tag
        if name == MAIN.name:
            name = self._main
        if name in self._routes and name not in self.emitted:
            raise route_tag_error(name, self._routes[name])
        if name not in self.emitted:
            raise undeclared_tag_error(name, [n for n in self._tags if n != self._main])
        self.emitted[name].append(record)


def route_tag_error(name: str, route: str) -> DeclarationError:
    """The row function emitted to a route tag it cannot emit to (one without a schema)."""
    return DeclarationError(
        f"The row function emitted to output {name!r}, the operator's own {route} route "
        f"(declared as routes=dsi.Routes({route}=...)). In row mode the function may emit to a "
        "route tag only when the tag declares a schema (its records and the routed ones, the "
        "main columns plus 'reason', are written with it); this one declares none. Nothing "
        "was written.",
        fix=f'declare routes=dsi.Routes({route}=dsi.OutputTag("{name}", schema=<the main columns '
        "plus reason string>)) to emit there too, or emit to a side output of its own: "
        'side_outputs=[dsi.OutputTag("<other name>", schema=...)]',
    )

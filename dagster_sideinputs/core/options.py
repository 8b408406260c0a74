"""The operator's declaration, declared once: :class:`Declaration` and
:class:`OperatorOptions`.

``SideInputOperator(...)``, ``@side_input_assets(...)`` and Airflow's task take these
fields as their keyword arguments: each entry point is a dataclass that adds its own
fields to :class:`Declaration` (the operator: ``fn``, ``storage``, ``readiness``; the
Dagster factory: the asset group, resource keys, ...), and :func:`takes` gives the entry
point that dataclass's signature, for type checkers and ``help()`` alike. No entry point
lists the options again. Everything after that (validation, the Dagster layer, replays)
works on one :class:`OperatorOptions` value; a replay of a route derives its options
with ``dataclasses.replace``.

Options that belong together are one value, declared once and shared by every entry
point: where the operator's own routes go (:class:`~dagster_sideinputs.core.outputs.Routes`),
the buffer's bounds (:class:`~dagster_sideinputs.core.declarations.BufferLimits`), and a
batch's share of a backlog, which the main input declares in its own unit
(``MainInput(max_versions_per_batch=)``, ``MainInput.files(max_files_per_batch=)``,
``MainInput.kafka(max_records_per_batch=)``). The keywords these replaced still work
until 0.2 (:func:`declare`).
"""

import dataclasses
import datetime as dt
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

from dagster_sideinputs.core.declarations import BufferLimits, MainInput
from dagster_sideinputs.core.functions import SideInputFunction
from dagster_sideinputs.core.outputs import OutputTag, Routes
from dagster_sideinputs.core.sideinputs.declaration import SideInput
from dagster_sideinputs.core.sideinputs.windows import Window
from dagster_sideinputs.deprecations import warn_moved
from dagster_sideinputs.errors import DeclarationError, did_you_mean

Mode = Literal["frames", "rows"]
CachePolicy = Literal["auto", "always", "never"]
SchemaModeOption = Literal["merge"]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_D = TypeVar("_D")


@dataclass(frozen=True, kw_only=True)
class Declaration:
    """What every entry point declares an operator with: its inputs, outputs and
    options, but not its function (the Dagster factory gets it by decoration), where its
    tables live, or who decides readiness (a run supplies those).

    The fields are keyword arguments of :class:`~dagster_sideinputs.SideInputOperator`
    and of :func:`~dagster_sideinputs.side_input_assets`, documented on the operator.
    """

    main: MainInput
    side_inputs: Mapping[str, SideInput]
    main_output: OutputTag | str
    side_outputs: Sequence[OutputTag] = ()
    window: Window | None = None
    routes: Routes = field(default_factory=Routes)
    buffer: BufferLimits = field(default_factory=BufferLimits)
    mode: Mode = "frames"
    operator_id: str | None = None
    schema_mode: SchemaModeOption | None = None
    future_tolerance: dt.timedelta | None = dt.timedelta(days=1)
    cache: CachePolicy = "auto"

    def __post_init__(self) -> None:
        # Accept the loose forms users write (a name for the main output, lists, dicts)
        # and keep immutable ones.
        if isinstance(self.main_output, str):
            object.__setattr__(self, "main_output", OutputTag(self.main_output))
        if not isinstance(self.main, MainInput):
            raise DeclarationError(
                f"main= must be a dsi.MainInput, got {type(self.main).__name__}.",
                fix='main=dsi.MainInput("transactions", key="customer_id")',
            )
        if not isinstance(self.side_inputs, Mapping):
            raise DeclarationError(
                f"side_inputs= must be a mapping of name -> dsi.SideInput, got "
                f"{type(self.side_inputs).__name__}.",
                fix='side_inputs={"profile": dsi.SideInput.map("profiles", key="id")}',
            )
        for name, side in self.side_inputs.items():
            if not isinstance(name, str) or not isinstance(side, SideInput):
                raise DeclarationError(
                    f"side_inputs= must map names to dsi.SideInput values; got {name!r}: "
                    f"{type(side).__name__}.",
                    fix='side_inputs={"profile": dsi.SideInput.map("profiles", key="id")}',
                )
        object.__setattr__(self, "side_inputs", MappingProxyType(dict(self.side_inputs)))
        object.__setattr__(self, "side_outputs", tuple(self.side_outputs))
        if self.routes is None:
            object.__setattr__(self, "routes", Routes())
        if not isinstance(self.routes, Routes):
            raise DeclarationError(
                f"routes= takes a dsi.Routes, got {type(self.routes).__name__}.",
                fix='routes=dsi.Routes(unmatched=dsi.OutputTag("unmatched"))',
            )
        for tag in self.side_outputs:
            if tag is not None and not isinstance(tag, OutputTag):
                raise DeclarationError(
                    f"Outputs are declared with dsi.OutputTag, got {tag!r}.",
                    fix='side_outputs=[dsi.OutputTag("suspicious")]',
                )
        if self.buffer is None:
            object.__setattr__(self, "buffer", BufferLimits())
        window = self.window
        if window is not None and (window.grace is not None or window.mapping is not None):
            raise DeclarationError(
                "window=: grace= and mapping= belong to a side input's windows (when one is "
                "final, which one a main window reads); the main input's windows take "
                "watermark=.",
                fix="declare them on the side input: SideInput.map(..., "
                "window=dsi.Window.tumbling(..., grace=...))",
            )

    @property
    def tag(self) -> OutputTag:
        """The main output's tag (``main_output`` as declared may be its name)."""
        tag = self.main_output
        assert isinstance(tag, OutputTag)  # __post_init__ made it one
        return tag

    def __reduce__(self) -> Any:  # MappingProxyType does not pickle
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values["side_inputs"] = dict(self.side_inputs)
        return (_rebuild, (type(self), values))


@dataclass(frozen=True, kw_only=True)
class OperatorOptions(Declaration):
    """Everything a side-input operator is declared with, its function included: the
    value the core, the Dagster layer and Airflow's task build an operator from."""

    fn: SideInputFunction


MOVED_KEYWORDS: dict[str, str] = {
    "late": "routes=dsi.Routes(late=...)",
    "unmatched": "routes=dsi.Routes(unmatched=...)",
    "overflow": "routes=dsi.Routes(overflow=...)",
    "invalid": "routes=dsi.Routes(invalid=...)",
    "max_versions_per_batch": "main=dsi.MainInput(..., max_versions_per_batch=N)",
    "max_files_per_batch": "main=dsi.MainInput.files(..., max_files_per_batch=N)",
}
"""Keywords of ``SideInputOperator`` / ``side_input_assets`` before 0.2, and their new
spelling (:func:`declare`)."""


def declare(cls: Callable[..., _D], keywords: Mapping[str, Any], where: str) -> _D:
    """An entry point's arguments: ``cls`` (a :class:`Declaration` dataclass) of
    ``keywords``, with those of :data:`MOVED_KEYWORDS` folded into their groups (a
    ``DeprecationWarning`` once per keyword and entry point, with the new spelling).

    Raises:
        TypeError: a keyword that neither the entry point nor an older release took.
    """
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    declared = {name: value for name, value in keywords.items() if name in names}
    for name, value in keywords.items():
        if name in names:
            continue
        if name not in MOVED_KEYWORDS:
            raise TypeError(
                f"{where}() got an unexpected keyword argument {name!r}."
                + did_you_mean(name, [*names, *MOVED_KEYWORDS])
            )
        warn_moved(f"{where}({name}=...)", MOVED_KEYWORDS[name], stacklevel=3)
        if value is None:
            continue
        if name.startswith("max_"):
            if not isinstance(declared.get("main"), MainInput):
                continue  # the Declaration names what main= should be
            declared["main"] = dataclasses.replace(declared["main"], **{name: value})
        else:
            routes = declared.get("routes") or Routes()
            declared["routes"] = dataclasses.replace(routes, **{name: value})
    try:
        return cls(**declared)
    except TypeError as exc:  # a missing argument: name the entry point, not __init__
        raise TypeError(re.sub(r"\S*__init__\(\)", f"{where}()", str(exc))) from None


def takes(arguments: Callable[_P, Any]) -> Callable[[Callable[..., _R]], Callable[_P, _R]]:
    """Give a function the keyword arguments of ``arguments`` (a dataclass): its type
    for type checkers, its signature for ``help()``. The function takes ``**keywords``
    and builds the dataclass with :func:`declare`."""

    def apply(function: Callable[..., _R]) -> Callable[_P, _R]:
        function.__signature__ = _signature(arguments)  # type: ignore[attr-defined]
        return function

    return apply


def init_takes(
    arguments: Callable[_P, Any],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, _P], None]]:
    """:func:`takes` for a class's ``__init__`` (its ``self`` first)."""

    def apply(init: Callable[..., None]) -> Callable[Concatenate[Any, _P], None]:
        self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
        signature = _signature(arguments)
        init.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[self, *signature.parameters.values()]
        )
        return init

    return apply


def _signature(arguments: Callable[..., Any]) -> inspect.Signature:
    # Required ones first, as a reader expects; all are keyword-only.
    parameters = list(inspect.signature(arguments).parameters.values())
    ordered = sorted(parameters, key=lambda p: p.default is not inspect.Parameter.empty)
    return inspect.Signature(ordered, return_annotation=inspect.Signature.empty)


def _values(value: Any, cls: type) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(cls)}


def options_of(arguments: Declaration, fn: SideInputFunction) -> OperatorOptions:
    """The :class:`OperatorOptions` of an entry point's arguments and the function."""
    return OperatorOptions(fn=fn, **_values(arguments, Declaration))


def _rebuild(cls: type[Declaration], values: dict[str, Any]) -> Declaration:
    return cls(**values)

"""The operator's declaration as one value: :class:`OperatorOptions`.

``SideInputOperator(...)`` and ``@side_input_assets(...)`` take these as keyword
arguments (their public signatures), build one ``OperatorOptions``, and everything
after that (validation, the Dagster layer, replays) works on this value. A replay of a
route derives its options with ``dataclasses.replace``.

Options that belong together are one value, declared once and shared by every entry
point: where the operator's own routes go (:class:`~dagster_sideinputs.core.outputs.Routes`),
the buffer's bounds (:class:`~dagster_sideinputs.core.declarations.BufferLimits`), and a
batch's share of a backlog, which the main input declares in its own unit
(``MainInput(max_versions_per_batch=)``, ``MainInput.files(max_files_per_batch=)``,
``MainInput.kafka(max_records_per_batch=)``). The keywords these replaced still work
until 0.2 (:func:`fold_moved_keywords`).
"""

import dataclasses
import datetime as dt
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from dagster_sideinputs.core.declarations import BufferLimits, MainInput
from dagster_sideinputs.core.functions import SideInputFunction
from dagster_sideinputs.core.outputs import OutputTag, Routes
from dagster_sideinputs.core.sideinputs.declaration import SideInput
from dagster_sideinputs.core.sideinputs.windows import Window
from dagster_sideinputs.errors import DeclarationError, did_you_mean

Mode = Literal["frames", "rows"]
CachePolicy = Literal["auto", "always", "never"]
SchemaModeOption = Literal["merge"]


@dataclass(frozen=True)
class OperatorOptions:
    """Everything a side-input operator is declared with, but where its tables live and
    who decides readiness (a run supplies those).

    The fields are the keyword arguments of
    :class:`~dagster_sideinputs.SideInputOperator`, documented there.
    """

    main: MainInput
    side_inputs: Mapping[str, SideInput]
    fn: SideInputFunction
    main_output: OutputTag
    side_outputs: tuple[OutputTag, ...] = ()
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

    def __reduce__(self) -> Any:  # MappingProxyType does not pickle
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values["side_inputs"] = dict(self.side_inputs)
        return (_rebuild, (values,))


MOVED_KEYWORDS: dict[str, str] = {
    "late": "routes=dsi.Routes(late=...)",
    "unmatched": "routes=dsi.Routes(unmatched=...)",
    "overflow": "routes=dsi.Routes(overflow=...)",
    "invalid": "routes=dsi.Routes(invalid=...)",
    "max_versions_per_batch": "main=dsi.MainInput(..., max_versions_per_batch=N)",
    "max_files_per_batch": "main=dsi.MainInput.files(..., max_files_per_batch=N)",
}
"""Keywords of ``SideInputOperator`` / ``side_input_assets`` before 0.2, and their new
spelling."""
_WARNED: set[tuple[str, str]] = set()


def fold_moved_keywords(
    declared: dict[str, Any], moved: Mapping[str, Any], where: str
) -> dict[str, Any]:
    """``declared`` with the keywords of :data:`MOVED_KEYWORDS` folded into their groups
    (a ``DeprecationWarning`` once per keyword and entry point, with the new spelling).

    Raises:
        TypeError: a keyword that neither the entry point nor an older release took.
    """
    for name, value in moved.items():
        if name not in MOVED_KEYWORDS:
            raise TypeError(
                f"{where}() got an unexpected keyword argument {name!r}."
                + did_you_mean(name, [*declared, *MOVED_KEYWORDS])
            )
        if (where, name) not in _WARNED:
            _WARNED.add((where, name))
            warnings.warn(
                f"{where}({name}=...) is deprecated and goes in 0.2: use {MOVED_KEYWORDS[name]}",
                DeprecationWarning,
                stacklevel=3,
            )
        if value is None:
            continue
        if name.startswith("max_"):
            if not isinstance(declared.get("main"), MainInput):
                continue  # OperatorOptions names what main= should be
            declared["main"] = dataclasses.replace(declared["main"], **{name: value})
        else:
            routes = declared.get("routes") or Routes()
            declared["routes"] = dataclasses.replace(routes, **{name: value})
    return declared


def _rebuild(values: dict[str, Any]) -> OperatorOptions:
    return OperatorOptions(**values)

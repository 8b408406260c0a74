"""The operator's declaration as one value: :class:`OperatorOptions`.

``SideInputOperator(...)`` and ``@side_input_assets(...)`` take these as keyword
arguments (their public signatures), build one ``OperatorOptions``, and everything
after that (validation, the Dagster layer, replays) works on this value. A replay of a
route derives its options with ``dataclasses.replace``.
"""

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from dagster_sideinputs.core.declarations import BufferLimits, MainInput
from dagster_sideinputs.core.outputs import OutputTag
from dagster_sideinputs.core.sideinputs.declaration import SideInput
from dagster_sideinputs.core.sideinputs.windows import Window
from dagster_sideinputs.errors import DeclarationError

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
    fn: Callable[..., Any]
    main_output: OutputTag
    side_outputs: tuple[OutputTag, ...] = ()
    window: Window | None = None
    late: OutputTag | None = None
    unmatched: OutputTag | None = None
    overflow: OutputTag | None = None
    invalid: OutputTag | None = None
    buffer: BufferLimits = field(default_factory=BufferLimits)
    mode: Mode = "frames"
    operator_id: str | None = None
    schema_mode: SchemaModeOption | None = None
    max_versions_per_batch: int | None = None
    max_files_per_batch: int | None = None
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
        for tag in (*self.side_outputs, self.late, self.unmatched, self.overflow, self.invalid):
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

    @property
    def routes(self) -> dict[str, OutputTag]:
        """Built-in route -> its declared tag (only the declared ones)."""
        routes = {
            "late": self.late,
            "unmatched": self.unmatched,
            "overflow": self.overflow,
            "invalid": self.invalid,
        }
        return {route: tag for route, tag in routes.items() if tag is not None}


def _rebuild(values: dict[str, Any]) -> OperatorOptions:
    return OperatorOptions(**values)

"""What ``@side_input_assets`` was given, kept for jobs, sensors, checks and replays.

:class:`SideInputAssets` is the bridge between a Dagster asset definition and the
core operator: it holds the operator's :class:`~dagster_sideinputs.core.options.OperatorOptions`
and builds the operator for a run (or for a replay of one of its routes).
"""

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import dagster as dg

from dagster_sideinputs.core.declarations import MainInput, asset_path
from dagster_sideinputs.core.operator import POLL_INTERVAL, SideInputOperator
from dagster_sideinputs.core.options import OperatorOptions
from dagster_sideinputs.core.outputs import OutputTag, Routes
from dagster_sideinputs.core.sideinputs.declaration import SideInput
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.delta.storage import DeltaStorage
from dagster_sideinputs.errors import DeclarationError

KINDS = {"spark", "delta"}
CHECK_BUFFER = "buffer_within_limits"
CHECK_READY = "side_inputs_ready"
CHECK_ACCOUNTED = "records_accounted_for"
REPLAY_TIMEOUT = dt.timedelta(days=30)
_VALIDATION_ROOT = "/nonexistent/dagster-sideinputs/validation"

RUN_CONFIG = {
    "trigger": dg.Field(
        dg.Enum("SideInputTrigger", [dg.EnumValue("available_now"), dg.EnumValue("continuous")]),
        default_value="available_now",
        description="available_now: process all available main input, then finish. "
        "continuous: keep processing micro-batches until the run is terminated.",
    ),
    "interval_seconds": dg.Field(
        float,
        default_value=POLL_INTERVAL.total_seconds(),
        description="Polling interval of the continuous trigger (seconds).",
    ),
    "max_batches": dg.Field(
        int, is_required=False, description="Stop after this many micro-batches."
    ),
    "replay": dg.Field(
        str,
        is_required=False,
        description="Feed the records of this side output (e.g. 'unmatched_transactions') "
        "back through the operator, exactly once, instead of reading the main input.",
    ),
    "wait_for_lock_seconds": dg.Field(
        float, default_value=0.0, description="Wait this long for another run to finish."
    ),
}


@dataclass(frozen=True)
class SideInputAssets:
    """Everything ``@side_input_assets`` was given; kept for jobs, sensors and replays.

    Attributes:
        name: the op / multi-asset name.
        options: the operator's declaration (all but storage and readiness, which a run
            supplies).
        spark_resource_key / io_manager_key: the resources a run reads.
        group_name / tags: of the output assets.

    Its defaults are :class:`~dagster_sideinputs.dagster_layer.assets.AssetsArguments`'s.
    """

    name: str
    options: OperatorOptions
    spark_resource_key: str
    io_manager_key: str
    group_name: str | None
    tags: Mapping[str, str]

    def __post_init__(self) -> None:
        # Fail at import, where the declaration is written, not in the first run.
        validated = self.operator(DeltaStorage(_VALIDATION_ROOT), readiness=_NoReadiness())
        object.__setattr__(self, "_spec", validated.spec)

    @property
    def spec(self) -> OperatorSpec:
        """The resolved declaration (tables are not bound to a storage yet)."""
        spec: OperatorSpec = self.__dict__["_spec"]
        return spec

    @property
    def main(self) -> MainInput:
        return self.spec.main

    @property
    def side_inputs(self) -> dict[str, SideInput]:
        return {bound.name: bound.side for bound in self.spec.sides}

    @property
    def main_output(self) -> OutputTag:
        return self.spec.main_tag

    @property
    def all_tags(self) -> list[OutputTag]:
        """Every output: the main one, the side outputs, the declared routes."""
        return self.spec.all_tags

    @property
    def output_keys(self) -> list[dg.AssetKey]:
        return [dg.AssetKey(list(asset_path(tag.name))) for tag in self.all_tags]

    @property
    def input_keys(self) -> list[dg.AssetKey]:
        names = [self.main.asset, *[side.asset for side in self.side_inputs.values()]]
        return [dg.AssetKey(list(asset_path(name))) for name in dict.fromkeys(names)]

    def operator(
        self,
        storage: DeltaStorage,
        readiness: Any = None,
        *,
        replay: OutputTag | None = None,
    ) -> SideInputOperator:
        """The core operator of this declaration (or of its replay of a side output)."""
        if replay is None:
            return SideInputOperator.from_options(self.options, storage, readiness)
        return self._replay_operator(storage, readiness, replay)

    def _replay_operator(
        self, storage: DeltaStorage, readiness: Any, tag: OutputTag
    ) -> SideInputOperator:
        routes = self.spec.routes
        if tag not in routes.values():
            raise DeclarationError(
                f"Only the operator's own routes can be replayed; {tag.name!r} is not one "
                f"(declared routes: {[t.name for t in routes.values()]}).",
                fix="pass replay=<the name of the late / unmatched / overflow output>",
            )
        # Records still without a side row wait in the replay's own buffer instead of
        # going back to the side output they come from.
        sides = {
            name: (
                replace(side, missing="wait", timeout=REPLAY_TIMEOUT, on_timeout="null")
                if side.missing != "null"
                else side
            )
            for name, side in self.side_inputs.items()
        }
        fn = self.options.fn

        def without_reason(main: Any, *args: Any) -> Any:
            if hasattr(main, "columns") and "reason" in main.columns:
                main = main.drop("reason")
            return fn(main, *args)

        options = replace(
            self.options,
            main=MainInput(tag.name, key=self.main.key, event_time=self.main.event_time),
            side_inputs=sides,
            fn=without_reason if self.options.mode == "frames" else fn,
            side_outputs=tuple(t for t in self.options.side_outputs if t != tag),
            routes=Routes(invalid=routes.get("invalid") if tag != routes.get("invalid") else None),
            operator_id=f"{self.spec.operator_id}__replay__{tag.name.replace('/', '__')}",
        )
        return SideInputOperator.from_options(options, storage, readiness)


_DECLARATIONS: dict[str, SideInputAssets] = {}


def register(decl: SideInputAssets) -> None:
    """Remember a declaration under its op name (jobs, sensors and checks look it up)."""
    _DECLARATIONS[decl.name] = decl


def declaration_of(assets_def: dg.AssetsDefinition) -> SideInputAssets:
    """The declaration behind a multi-asset made by ``@side_input_assets``."""
    name = assets_def.op.name
    if name not in _DECLARATIONS:
        raise DeclarationError(
            f"Assets definition {name!r} was not made by @dsi.side_input_assets.",
            fix="pass the object returned by @dsi.side_input_assets(...)",
        )
    return _DECLARATIONS[name]


def output_role(decl: SideInputAssets, tag: OutputTag) -> str:
    """``main_output``, ``side_output``, or ``<route>_output`` for a built-in route."""
    if tag == decl.main_output:
        return "main_output"
    for route, route_tag in decl.spec.routes.items():
        if tag == route_tag:
            return f"{route}_output"
    return "side_output"


class _NoReadiness:
    """Placeholder provider for validating a declaration at import time."""

    def decide(self, facts: Any, windows: Any, now: Any) -> dict:
        return {}

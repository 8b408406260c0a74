"""``@side_input_assets``: an operator declaration as one Dagster multi-asset.

The multi-asset has one asset per output (the main output and each side-output tag),
each depending on the main input asset and every side-input asset, so the lineage
graph reads *main input + side inputs -> operator outputs*. Materializing it runs the
operator: every available micro-batch (or, in continuous mode, micro-batches until the
run is terminated), with readiness decided from the Dagster instance.
"""

import datetime as dt
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import dagster as dg

from dagster_sideinputs.core.declarations import BufferLimits, MainInput, asset_path
from dagster_sideinputs.core.operator import SideInputOperator
from dagster_sideinputs.core.options import CachePolicy, Mode, OperatorOptions
from dagster_sideinputs.core.outputs import OutputTag
from dagster_sideinputs.core.side_inputs import SideInput
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.windows import Window
from dagster_sideinputs.dagster_layer.describe import ROLE_TAG, input_metadata
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
        float, default_value=10.0, description="Polling interval of the continuous trigger."
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
    """

    name: str
    options: OperatorOptions
    spark_resource_key: str = "spark"
    io_manager_key: str = "io_manager"
    group_name: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

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
            late=None,
            unmatched=None,
            overflow=None,
            invalid=routes.get("invalid") if tag != routes.get("invalid") else None,
            operator_id=f"{self.spec.operator_id}__replay__{tag.name.replace('/', '__')}",
            max_versions_per_batch=None,
            max_files_per_batch=None,
        )
        return SideInputOperator.from_options(options, storage, readiness)


_DECLARATIONS: dict[str, SideInputAssets] = {}


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


def _specs(decl: SideInputAssets, description: str | None) -> list[dg.AssetSpec]:
    deps = decl.input_keys
    unmatched = decl.spec.routes.get("unmatched")
    inputs = input_metadata(
        decl.main, decl.side_inputs, unmatched.name if unmatched is not None else None
    )
    sides = ", ".join(f"{name} ({side.asset})" for name, side in decl.side_inputs.items())
    specs = []
    for tag in decl.all_tags:
        role = output_role(decl, tag)
        words = role.replace("_", " ")
        specs.append(
            dg.AssetSpec(
                key=dg.AssetKey(list(asset_path(tag.name))),
                deps=deps,
                description=(
                    tag.description
                    or f"{words.capitalize()} of side-input operator {decl.name!r}"
                    + (f": {description}" if description else "")
                )
                + f"\n\nMain input: {decl.main.asset}. Side inputs: {sides or 'none'}.",
                group_name=decl.group_name,
                kinds=KINDS,
                metadata={
                    "dsi/operator": decl.name,
                    "dsi/role": words,
                    **inputs,
                },
                tags={ROLE_TAG: role, "dsi/operator": decl.name, **decl.tags},
                # Materialized only by the runs that commit to its table.
                skippable=True,
            )
        )
    return specs


def _check_specs(decl: SideInputAssets) -> list[dg.AssetCheckSpec]:
    """The check a run of the operator reports; the others run on their own
    (:func:`~dagster_sideinputs.dagster_layer.checks.build_side_input_checks`)."""
    return [
        dg.AssetCheckSpec(
            CHECK_ACCOUNTED,
            asset=dg.AssetKey(list(asset_path(decl.main_output.name))),
            description="Every record the run looked at (new_records + from_buffer) went to "
            "exactly one route: released, buffered, late, unmatched, overflow or invalid.",
        ),
    ]


def side_input_assets(
    *,
    main: MainInput,
    side_inputs: Mapping[str, SideInput],
    main_output: str | OutputTag,
    side_outputs: Sequence[OutputTag] = (),
    window: Window | None = None,
    late: OutputTag | None = None,
    unmatched: OutputTag | None = None,
    overflow: OutputTag | None = None,
    invalid: OutputTag | None = None,
    buffer: BufferLimits | None = None,
    mode: Mode = "frames",
    name: str | None = None,
    group_name: str | None = None,
    description: str | None = None,
    operator_id: str | None = None,
    schema_mode: Literal["merge"] | None = None,
    max_versions_per_batch: int | None = None,
    max_files_per_batch: int | None = None,
    future_tolerance: dt.timedelta | None = dt.timedelta(days=1),
    cache: CachePolicy = "auto",
    spark_resource_key: str = "spark",
    io_manager_key: str = "io_manager",
    pool: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """Turn a side-input function into Dagster assets: one per output.

    The function is the operator's: frames mode ``fn(main, sides) -> Outputs``, or rows
    mode ``fn(record, ctx)``. Arguments are those of
    :class:`~dagster_sideinputs.SideInputOperator`; in addition:

    Args:
        name: the op / multi-asset name (default: the function's name).
        group_name: Dagster asset group of the outputs.
        description: shown on every output asset.
        spark_resource_key: resource giving the SparkSession (a ``SparkResource``).
        io_manager_key: the ``DeltaIOManager`` resource: where every table lives.
        pool: Dagster concurrency pool, to keep runs of this operator one at a time.

    Returns:
        A ``dagster.AssetsDefinition``; pass it to ``build_side_input_job`` and
        ``build_side_input_sensor``.

    Examples:
        .. code-block:: python

            @dsi.side_input_assets(
                main=dsi.MainInput("transactions", key="customer_id"),
                side_inputs={"profile": dsi.SideInput.map("customer_profiles", key="customer_id")},
                main_output="enriched_transactions",
            )
            def enrich(main, sides):
                return main
    """
    main_tag = main_output if isinstance(main_output, OutputTag) else OutputTag(main_output)

    def decorator(fn: Callable[..., Any]) -> dg.AssetsDefinition:
        op_name = name or fn.__name__
        decl = SideInputAssets(
            name=op_name,
            options=OperatorOptions(
                main=main,
                side_inputs=side_inputs,
                fn=fn,
                main_output=main_tag,
                side_outputs=tuple(side_outputs),
                window=window,
                late=late,
                unmatched=unmatched,
                overflow=overflow,
                invalid=invalid,
                buffer=buffer or BufferLimits(),
                mode=mode,
                operator_id=operator_id,
                schema_mode=schema_mode,
                max_versions_per_batch=max_versions_per_batch,
                max_files_per_batch=max_files_per_batch,
                future_tolerance=future_tolerance,
                cache=cache,
            ),
            spark_resource_key=spark_resource_key,
            io_manager_key=io_manager_key,
            group_name=group_name,
            tags=dict(tags or {}),
        )

        @dg.multi_asset(
            name=op_name,
            specs=_specs(decl, description or (fn.__doc__ or "").strip().split("\n")[0] or None),
            check_specs=_check_specs(decl),
            required_resource_keys={spark_resource_key, io_manager_key},
            config_schema=RUN_CONFIG,
            pool=pool,
            description=description or fn.__doc__,
        )
        def _operator(context: dg.AssetExecutionContext) -> Iterator[Any]:
            from dagster_sideinputs.dagster_layer.execution import execute

            yield from execute(context, decl)

        _DECLARATIONS[op_name] = decl
        return _operator

    return decorator


class _NoReadiness:
    """Placeholder provider for validating a declaration at import time."""

    def decide(self, facts: Any, windows: Any, now: Any) -> dict:
        return {}

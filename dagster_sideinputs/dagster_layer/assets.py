"""``@side_input_assets``: an operator declaration as one Dagster multi-asset.

The multi-asset has one asset per output (the main output and each side-output tag),
each depending on the main input asset and every side-input asset, so the lineage
graph reads *main input + side inputs -> operator outputs*. Materializing it runs the
operator: every available micro-batch (or, in continuous mode, micro-batches until the
run is terminated), with readiness decided from the Dagster instance.
"""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from dagster_sideinputs.core.declarations import asset_path
from dagster_sideinputs.core.functions import SideInputFunction
from dagster_sideinputs.core.options import Declaration, declare, options_of, takes
from dagster_sideinputs.dagster_layer.declaration import (
    CHECK_ACCOUNTED,
    KINDS,
    RUN_CONFIG,
    SideInputAssets,
    declaration_of,
    output_role,
    register,
)
from dagster_sideinputs.dagster_layer.describe import ROLE_TAG, input_metadata
from dagster_sideinputs.dagster_layer.execution import execute

__all__ = ["SideInputAssets", "declaration_of", "side_input_assets"]


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


@dataclass(frozen=True, kw_only=True)
class AssetsArguments(Declaration):
    """The keyword arguments of :func:`side_input_assets`: the operator's declaration
    (:class:`~dagster_sideinputs.core.options.Declaration`) and the Dagster ones."""

    name: str | None = None
    group_name: str | None = None
    description: str | None = None
    spark_resource_key: str = "spark"
    io_manager_key: str = "io_manager"
    pool: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)


@takes(AssetsArguments)
def side_input_assets(**arguments: Any) -> Callable[[SideInputFunction], dg.AssetsDefinition]:
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
    declared = declare(AssetsArguments, arguments, "side_input_assets")

    def decorator(fn: SideInputFunction) -> dg.AssetsDefinition:
        op_name: str = declared.name or getattr(fn, "__name__", None) or "side_inputs"
        decl = SideInputAssets(
            name=op_name,
            options=options_of(declared, fn),
            spark_resource_key=declared.spark_resource_key,
            io_manager_key=declared.io_manager_key,
            group_name=declared.group_name,
            tags=dict(declared.tags or {}),
        )
        description = declared.description

        @dg.multi_asset(
            name=op_name,
            specs=_specs(decl, description or (fn.__doc__ or "").strip().split("\n")[0] or None),
            check_specs=_check_specs(decl),
            required_resource_keys={declared.spark_resource_key, declared.io_manager_key},
            config_schema=RUN_CONFIG,
            pool=declared.pool,
            description=description or fn.__doc__,
        )
        def _operator(context: dg.AssetExecutionContext) -> Iterator[Any]:
            yield from execute(context, decl)

        register(decl)
        return _operator

    return decorator

"""Jobs that run a side-input operator: incremental, continuous, and replays of its routes."""

from collections.abc import Mapping
from typing import Any, TypeAlias

import dagster as dg

from dagster_sideinputs.core.operator import POLL_INTERVAL
from dagster_sideinputs.core.outputs import OutputTag
from dagster_sideinputs.dagster_layer.declaration import declaration_of

AssetJob: TypeAlias = Any
"""What ``dagster.define_asset_job`` returns (its class is not exported by Dagster)."""


ONE_PROCESS = dg.in_process_executor
"""The executor of the jobs built here: every step of a run (the operator, then its
checks) in the run's process, sharing one Spark session. Dagster's default executor
starts a process, and so a Spark JVM, per step (15-20 s each)."""


def _op_config(assets_def: dg.AssetsDefinition, config: Mapping[str, Any]) -> dict[str, Any]:
    return {"ops": {assets_def.op.name: {"config": dict(config)}}}


def build_side_input_job(
    assets_def: dg.AssetsDefinition,
    *,
    name: str | None = None,
    trigger: str = "available_now",
    interval_seconds: float = POLL_INTERVAL.total_seconds(),
    description: str | None = None,
    tags: Mapping[str, str] | None = None,
    executor_def: dg.ExecutorDefinition = ONE_PROCESS,
) -> AssetJob:
    """A job materializing every output of a ``@side_input_assets`` operator.

    Each run processes all main input not processed yet (exactly once across runs),
    releases the buffered records whose side inputs became ready, and reports per output
    asset rows written, Delta version, side-input versions, buffer size and age,
    readiness and throughput. Run config (``ops.<name>.config``) can switch a run to
    ``trigger: continuous`` (micro-batches until the run is terminated) or to
    ``replay: <side output>``.

    Args:
        assets_def: what ``@dsi.side_input_assets`` returned.
        name: job name (default ``<operator>_job``).
        trigger: default trigger of the job's runs.
        interval_seconds: default polling interval for continuous runs.
        executor_def: default: every step in the run's process, one Spark session per run
            (:data:`ONE_PROCESS`); ``dg.multiprocess_executor`` starts one per step.
    """
    decl = declaration_of(assets_def)
    return dg.define_asset_job(
        name=name or f"{decl.name}_job",
        selection=dg.AssetSelection.assets(*decl.output_keys),
        config=_op_config(assets_def, {"trigger": trigger, "interval_seconds": interval_seconds}),
        description=description
        or f"Runs side-input operator {decl.name!r} ({trigger.replace('_', ' ')}).",
        tags={"dsi/operator": decl.name, **(tags or {})},
        executor_def=executor_def,
    )


def build_replay_job(
    assets_def: dg.AssetsDefinition,
    replay: OutputTag | str,
    *,
    name: str | None = None,
    executor_def: dg.ExecutorDefinition = ONE_PROCESS,
) -> AssetJob:
    """A job feeding the records of a side output (``unmatched``, ``late``) back through
    the operator, exactly once: each replayed record is read once from the side output's
    table (the replay keeps its own offsets). Records whose side row is still missing
    wait in the replay's own buffer and are released by a later replay run.
    """
    decl = declaration_of(assets_def)
    tag = replay.name if isinstance(replay, OutputTag) else replay
    return dg.define_asset_job(
        name=name or f"{decl.name}_replay_{tag.replace('/', '_')}_job",
        selection=dg.AssetSelection.assets(*decl.output_keys),
        config=_op_config(assets_def, {"replay": tag}),
        description=f"Replays {tag!r} through side-input operator {decl.name!r}.",
        tags={"dsi/operator": decl.name, "dsi/replay": tag},
        executor_def=executor_def,
    )

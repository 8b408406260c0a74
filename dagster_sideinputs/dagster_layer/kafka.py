"""Kafka main inputs in Dagster: the topic as an external asset, offsets and lag as metadata.

The topic is not materialized by Dagster: :func:`kafka_topic_asset` declares it as an
external asset (kind ``kafka``), so the lineage shows *topic + side inputs -> outputs*.
Each run's materializations show the offsets it read per partition and the lag left:
the partition's end offset minus the offset the operator has committed, asked of the
brokers when the run ends.
"""

import logging
from collections.abc import Sequence
from typing import Any

import dagster as dg

from dagster_sideinputs.core.declarations import asset_path
from dagster_sideinputs.core.metrics import BatchMetrics
from dagster_sideinputs.core.operator import SideInputOperator
from dagster_sideinputs.core.sources.kafka.source import KafkaSource
from dagster_sideinputs.core.spark_errors import lake_storage_errors
from dagster_sideinputs.dagster_layer.declaration import declaration_of
from dagster_sideinputs.errors import DeclarationError, SideInputError

log = logging.getLogger("dagster_sideinputs")


def kafka_topic_asset(
    assets_def: dg.AssetsDefinition, *, description: str | None = None
) -> dg.AssetSpec:
    """The Kafka topic(s) an operator reads, as an external asset of kind ``kafka``.

    Put it in ``Definitions`` next to the operator: the operator's outputs already
    depend on its key (the main input's asset name), so the lineage shows the topic
    upstream of them. Client settings (which may hold secrets) are not shown.

    Args:
        assets_def: what ``@dsi.side_input_assets`` returned, with a ``MainInput.kafka``.
        description: shown on the asset (default: the topics and the brokers).

    Examples:
        .. code-block:: python

            defs = dg.Definitions(assets=[enrich, dsi.kafka_topic_asset(enrich)], ...)
    """
    decl = declaration_of(assets_def)
    kafka = decl.main.kafka_input
    if kafka is None:
        raise DeclarationError(
            f"Operator {decl.name!r} reads {decl.main!r}, not Kafka: there is no topic asset "
            "to declare.",
            fix="declare the main input with dsi.MainInput.kafka(...)",
        )
    topics = f"pattern {kafka.pattern!r}" if kafka.pattern else ", ".join(kafka.topics)
    return dg.AssetSpec(
        key=dg.AssetKey(list(asset_path(decl.main.asset))),
        description=description
        or f"Kafka topic(s) {topics} on {kafka.bootstrap_servers}: the main input of "
        f"operator {decl.name!r} ({kafka.value_format} values).",
        group_name=decl.group_name,
        kinds={"kafka"},
        metadata={
            "kafka/topics": list(kafka.topics),
            "kafka/pattern": kafka.pattern or "",
            "kafka/bootstrap_servers": kafka.bootstrap_servers,
            "kafka/value_format": kafka.value_format,
        },
    )


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def kafka_run_metadata(op: SideInputOperator, batches: Sequence[BatchMetrics]) -> dict[str, Any]:
    """Offsets read by a run's batches and the lag now, per partition (empty if not Kafka)."""
    if op.spec.main.kind != "kafka":
        return {}
    read: dict[tuple[str, int], dict[str, Any]] = {}
    for batch in batches:
        for r in batch.main_detail.get("offsets", []):
            key = (r["topic"], r["partition"])
            entry = read.setdefault(key, {"topic": key[0], "partition": key[1], "from": r["start"]})
            entry["to"] = r["end"]
    lag_rows = _lag_now(op)
    for row in lag_rows:
        entry = read.setdefault((row["topic"], row["partition"]), dict(row))
        entry.update(
            topic=row["topic"],
            partition=row["partition"],
            committed=row["committed"],
            log_end=row["log_end"],
            lag=row["lag"],
        )
        entry.setdefault("from", row["committed"])
        entry.setdefault("to", row["committed"])
    rows = [read[key] for key in sorted(read)]
    metadata: dict[str, Any] = {
        "kafka/offsets": dg.MetadataValue.md(
            _table(rows, ["topic", "partition", "from", "to", "committed", "log_end", "lag"])
        ),
        "kafka/lost_offsets": sum(b.lost_offsets for b in batches),
    }
    if lag_rows:
        metadata["kafka/lag"] = sum(row["lag"] for row in lag_rows)
    return metadata


def kafka_batch_metadata(metrics: BatchMetrics) -> dict[str, Any]:
    """One micro-batch's offsets and the lag it left when planned (continuous runs)."""
    detail = metrics.main_detail
    if "offsets" not in detail:
        return {}
    rows = [{**r, "from": r["start"], "to": r["end"]} for r in detail["offsets"] if r.get("topic")]
    return {
        "kafka/offsets": dg.MetadataValue.md(
            _table(rows, ["topic", "partition", "from", "to", "log_end", "lag"])
        ),
        "kafka/lag": int(detail.get("lag", 0)),
        "kafka/lost_offsets": int(detail.get("lost_offsets", 0)),
    }


def _lag_now(op: SideInputOperator) -> list[dict[str, Any]]:
    """Per partition: the committed end offset, the log end now and the lag (brokers or
    store unreachable: none, with a warning; metadata never fails a run that succeeded)."""
    try:
        committed = op.last_committed_batch()
        if committed is None:
            return []
        with lake_storage_errors(op.spec, "reading the batch plans"):
            plan = op.state.plan(committed)
        if plan is None or plan.main.kind != "kafka":
            return []
        return KafkaSource(op.spec).lag(plan.main)
    except SideInputError as exc:  # the brokers, or the store, failing after the run
        log.warning("%s: no Kafka lag in the metadata: %s", op.operator_id, exc.message)
        return []

"""What a run committed, per output: shared by the orchestrator layers (Dagster, Airflow).

A layer reports an output (a materialization, an asset event) only when the run's
batches committed to its table; these functions decide which, from the batches' own
write records (no table is read again).
"""

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from dagster_sideinputs.core.metrics import BatchMetrics, record_figures
from dagster_sideinputs.core.operator import SideInputOperator
from dagster_sideinputs.core.outputs import OutputTag
from dagster_sideinputs.core.sideinputs.windows import as_utc
from dagster_sideinputs.core.spark_errors import lake_storage_errors
from dagster_sideinputs.errors import StorageError

log = logging.getLogger("dagster_sideinputs")


def committed(
    batch: BatchMetrics, tag: str, version_before: int | None, *, creation_counts: bool = True
) -> bool:
    """Whether a batch committed to an output table.

    An output the batch wrote rows to, or whose commit it found already made by the
    interrupted run it replays (which never reported it), and, with ``creation_counts``,
    one it created (0 rows). A write with no rows to an existing table commits nothing
    and does not count.
    """
    write = batch.writes.get(tag)
    if write is None:
        return False
    return write.rows > 0 or write.skipped or (creation_counts and version_before is None)


def split_outputs(
    tags: Sequence[OutputTag],
    batches: Sequence[BatchMetrics],
    versions_before: Mapping[str, int | None],
    *,
    creation_counts: bool = True,
) -> tuple[list[OutputTag], list[OutputTag]]:
    """The outputs the batches committed to (:func:`committed`), and the others."""
    written, untouched = [], []
    for tag in tags:
        before = versions_before.get(tag.name)
        if any(committed(b, tag.name, before, creation_counts=creation_counts) for b in batches):
            written.append(tag)
        else:
            untouched.append(tag)
    return written, untouched


def table_versions(op: SideInputOperator) -> dict[str, int | None]:
    """The Delta version of every output table now (None: no table yet)."""
    engine = op.spec.storage.delta
    with lake_storage_errors(op.spec, "reading the output tables' versions"):
        return {
            name: engine.snapshot(uri, name=name).version if engine.exists(uri) else None
            for name, uri in op.output_tables.items()
        }


def after_commit(op: SideInputOperator, what: str, error: StorageError) -> dict[str, Any]:
    """Figures read after the run's batches committed that the store refused: left out
    (with the error's text), never failing a run whose batches are committed (its
    materializations, or asset events, are what the orchestrator must not lose)."""
    log.warning("%s: %s left out of the run's metadata: %s", op.operator_id, what, error.message)
    return {"figures_unavailable": f"{what}: {error.message}"[:1000]}


def buffer_figures(op: SideInputOperator) -> dict[str, Any]:
    """``buffered_rows`` and ``oldest_buffered_age_s`` now (left out, with the reason,
    when the store refuses)."""
    try:
        buffer = op.buffer()
    except StorageError as exc:
        return after_commit(op, "the buffer's figures", exc)
    oldest = buffer.oldest()
    return {
        "buffered_rows": buffer.rows(),
        "oldest_buffered_age_s": round(
            (dt.datetime.now(dt.timezone.utc) - as_utc(oldest)).total_seconds(), 1
        )
        if oldest is not None
        else 0.0,
    }


def run_figures(tag: OutputTag, batches: Sequence[BatchMetrics], seconds: float) -> dict[str, Any]:
    """What a run did for one output: ``rows_written``, where its records went
    (:func:`~dagster_sideinputs.core.metrics.record_figures`), ``batches``,
    ``run_seconds`` and ``throughput_records_per_s`` (the figures' names are defined in
    ``dagster_sideinputs.dagster_layer.figures.GLOSSARY``)."""
    figures = record_figures(batches)
    return {
        "rows_written": sum(b.emitted(tag.name) for b in batches),
        **figures,
        "batches": len(batches),
        "run_seconds": round(seconds, 3),
        "throughput_records_per_s": round(figures["records_processed"] / seconds, 1)
        if seconds > 0
        else 0.0,
    }


def main_range(batches: Sequence[BatchMetrics]) -> str:
    """The slices of the main input the last (up to three) batches read."""
    return ", ".join(b.main_range for b in batches[-3:])

"""The figures a side-input run reports, each defined once.

The same names, with the same meaning, appear in materialization and observation
metadata, in the asset checks, in the run's logs and in the example's demo output; the
The glossary of docs/operations.md is this table (a test keeps the two equal).

Accounting: every record a run looks at is either new (``new_records``) or read back
from the buffer (``from_buffer``); together they are ``records_processed``, and each of
them goes to exactly one route: ``released`` + ``buffered`` + ``late`` + ``unmatched`` +
``overflow`` + ``invalid`` = ``records_processed``.
"""

from dagster_sideinputs.core.metrics import ROUTES, figures_line, human_duration, record_figures

__all__ = ["GLOSSARY", "ROUTES", "figures_line", "human_duration", "record_figures"]

GLOSSARY: dict[str, str] = {
    "new_records": "main-input records read for the first time (once per window they fall in)",
    "from_buffer": "buffered records read back because their side inputs became ready, "
    "their key's side row arrived or their timeout passed",
    "records_processed": "new_records + from_buffer: every record the run routed",
    "released": "records passed to the function with their side inputs",
    "buffered": "records put in the buffer to wait (for a side input, or for the side row "
    "of their key)",
    "late": "records routed to the late output (behind the watermark)",
    "unmatched": "records routed to the unmatched output (no side row after waiting)",
    "overflow": "records pushed out of a full buffer to the overflow output",
    "invalid": "records routed to the invalid output (null key, unreadable)",
    "rows_written": "rows this run (or micro-batch) appended to this table",
    "dagster/row_count": "rows in the table after the write (its total; for a partition, "
    "the partition's total)",
    "delta_version": "the table's Delta version after the write",
    "delta_engine": "the Delta engine that wrote the table: delta-spark (native) or the "
    "delta-rs bridge",
    "buffered_rows": "records waiting in the buffer after the run (the buffer's total)",
    "oldest_buffered_age_s": "seconds the oldest buffered record has waited",
    "batches": "micro-batches the run committed",
    "run_seconds": "wall time of the run's micro-batches",
    "throughput_records_per_s": "records_processed / run_seconds",
    "batch_id": "the micro-batch (continuous runs report each one)",
    "batch_seconds": "wall time of one micro-batch",
    "main_range": "the slice of the main input read: Delta versions, files, or Kafka offsets",
    "kafka/offsets": "per Kafka partition: offsets read (from, to), committed, log end, lag",
    "kafka/lag": "Kafka records not read yet: log end minus committed offsets, all partitions",
    "kafka/lost_offsets": "Kafka offsets deleted before they were read and skipped "
    '(on_data_loss="skip")',
    "side_input_versions": "the Delta version of each side table read",
    "readiness": "per side input and window: ready or not, and why",
    "dsi/inputs": "the operator's inputs as the run declared them (key, readiness, timeout, "
    "window of each); the asset's definition shows the code location's",
    "not_ready": "the side inputs (per window) not ready, with the reason",
    "unaccounted_batches": "micro-batches whose routes do not add up (none if the check passes)",
    "max_rows": "the buffer's row limit (BufferLimits.max_rows; -1: none)",
    "max_age_s": "the buffer's age limit in seconds (BufferLimits.max_age; -1: none)",
    "files_added": "data files a write added",
    "bytes_added": "bytes a write added",
    "write_seconds": "wall time of a write",
    "figures_unavailable": "figures of the table or the buffer left out because the store "
    "failed when they were read, after the run's batches committed (the StorageError's text)",
    "error": "the class of the error that kept a check from being answered (its text is the "
    "check's description)",
}
"""Every figure, by the metadata label it is reported under."""

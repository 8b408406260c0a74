"""Counting a batch's routes: by a Spark job of their own before anything is written
(:func:`count_routes`), or inside the job that stages the outputs (:func:`observe_routes`).

The second is for a batch whose every record is released unless it is invalid (one ready
global namespace, nothing buffered read, no side input that can hold a record back) and
whose source cannot tell its invalid records without reading them (a Kafka topic; a
Delta table or parquet files whose statistics do not rule out null keys): counting them
first would read the main input twice, once to count and once to write. Instead the
records carry an observation (Spark's ``DataFrame.observe``) through the batch, and the
counts are taken once the outputs are staged, before anything commits: invalid records
still stop the batch with nothing written
(:func:`~dagster_sideinputs.core.batch.invalid_records.check_invalid`).

An observation holds what the first Spark action over the records saw: a user function's
own ``take(1)`` would show one record, a retried stage could count some twice. So the
counts are taken only when their total is the number of records the source says the
slice holds (:meth:`~dagster_sideinputs.core.sources.main_source.MainSource.record_count`);
otherwise one job counts the routes as before (a compacted topic's offsets, say, number
more records than it holds).
"""

import datetime as dt
import itertools
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from dagster_sideinputs.core.batch.buffer import Counts
from dagster_sideinputs.core.columns import FIRST_SEEN, ORIGIN, ROUTE, quoted
from dagster_sideinputs.core.sideinputs.windows import as_utc
from dagster_sideinputs.core.spec import OperatorSpec

OBSERVED_ROUTES = ("released", "invalid")
"""The routes a record of such a batch can take."""

_names = itertools.count()


def count_routes(spec: OperatorSpec, classified: DataFrame) -> Counts:
    """Records per (route, origin), with the oldest first-seen and newest event time."""
    time_column = spec.window.time_column if spec.window else spec.main.event_time
    aggregates = [F.count(F.lit(1)).alias("n"), F.min(FIRST_SEEN).alias("oldest")]
    if time_column is not None and time_column in classified.columns:
        # Of valid new records only: an invalid time (year 1, say) must not move the
        # watermark, nor even reach Python, whose datetimes cannot hold every timestamp.
        time = F.col(quoted(time_column)).cast("timestamp")  # dates too
        valid_new = (F.col(ORIGIN) == "new") & (F.col(ROUTE) != "invalid")
        aggregates.append(F.max(F.when(valid_new, time)).alias("max_time"))
    rows = classified.groupBy(ROUTE, ORIGIN).agg(*aggregates).collect()
    return {(r[ROUTE], r[ORIGIN]): r.asDict() for r in rows}


@dataclass(frozen=True)
class ObservedRoutes:
    """Routes observed by the job that stages a batch's outputs.

    Attributes:
        expected: the records the source says the slice holds.
        now: the batch's time, every record's first-seen time.
    """

    expected: int
    now: dt.datetime
    observation: Any = field(repr=False)  # pyspark's Observation (classic or Connect)

    @property
    def provisional(self) -> Counts:
        """The counts the batch goes by until the outputs are staged: every record
        released (what decides which tables the batch writes, and that the function runs)."""
        return {("released", "new"): self._entry("released", self.expected)}

    def counts(self) -> Counts | None:
        """The observed counts, when the staging job saw every record of the slice once;
        None otherwise (nothing observed yet, or another total)."""
        seen = _observed(self.observation)
        if not seen or seen.get("total") != self.expected:
            return None
        if sum(seen.get(route) or 0 for route in OBSERVED_ROUTES) != self.expected:
            return None  # a record took another route: such a batch is counted by a job
        counts = {
            (route, "new"): self._entry(route, n)
            for route in OBSERVED_ROUTES
            if (n := seen.get(route) or 0)
        }
        if seen.get("max_time") is not None and ("released", "new") in counts:
            counts["released", "new"]["max_time"] = seen["max_time"]
        return counts

    def _entry(self, route: str, n: int) -> dict[str, Any]:
        first_seen = as_utc(self.now).replace(tzinfo=None)  # as Spark returns the timestamp
        return {ROUTE: route, ORIGIN: "new", "n": n, "oldest": first_seen, "max_time": None}


def observe_routes(
    classified: DataFrame, expected: int, now: dt.datetime, *, time_column: str | None
) -> tuple[DataFrame, ObservedRoutes]:
    """``classified`` counting its routes (and the newest event time of its valid
    records, ``time_column``'s) as the first action over it runs."""
    observation = Observation(f"dsi_routes_{next(_names)}")
    aggregates = [F.count(F.when(F.col(ROUTE) == r, 1)).alias(r) for r in OBSERVED_ROUTES]
    if time_column is not None:  # as count_routes: of valid records only
        time = F.col(quoted(time_column)).cast("timestamp")
        aggregates.append(F.max(F.when(F.col(ROUTE) != "invalid", time)).alias("max_time"))
    observed = classified.observe(observation, F.count(F.lit(1)).alias("total"), *aggregates)
    return observed, ObservedRoutes(expected, now, observation)


def _observed(observation: Any) -> dict[str, Any] | None:
    """What an observation saw, without waiting for an action that may never run (a
    classic session's ``Observation.get`` blocks until one does; Connect's returns {})."""
    jvm_observation = getattr(observation, "_jo", None)
    if jvm_observation is not None and not jvm_observation.getRowOrEmpty().isDefined():
        return None
    try:
        return dict(observation.get)
    except Exception:  # nothing observed (Connect before any action)
        return None


__all__ = ["ObservedRoutes", "count_routes", "observe_routes"]

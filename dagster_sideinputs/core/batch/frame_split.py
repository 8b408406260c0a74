"""Frames-mode side outputs in one pass: outputs that are filters of one DataFrame.

A frames function typically returns its result and filters of it::

    return {dsi.MAIN: enriched, SUSPICIOUS: enriched.filter(F.col("amount") > limit)}

Written one by one, each output is its own Spark job: the main input is scanned, and
the side inputs joined, once per output. When every output is such a filter of the same
plan (with the same columns), :func:`one_pass` gives that plan once with a tag column:
each row once per output whose conditions it meets (Flink's one collector, records split
by tag), for the engine to write as one job (``DeltaEngine.stage_split``). The conditions
are the outputs' own, resolved by Spark (no SQL text is parsed again), so a row goes
exactly where the separate writes would have put it; a null condition keeps it out, as
``filter`` does.

Spark's analyzed plans are read through the classic session's JVM objects. Under Spark
Connect, or whenever anything about the outputs does not fit, the answer is None and the
outputs are written one by one, as before.
"""

import logging
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

log = logging.getLogger("dagster_sideinputs")


def _chain(frame: DataFrame) -> tuple[Any, list[Any]]:
    """The analyzed plan under ``frame``'s filters, and the filters' conditions."""
    plan = frame._jdf.queryExecution().analyzed()
    conditions = []
    while plan.getClass().getSimpleName() == "Filter":
        conditions.append(plan.condition())
        plan = plan.child()
    return plan, conditions


def one_pass(frames: Sequence[DataFrame], tag_column: str) -> DataFrame | None:
    """``frames``' rows as one DataFrame: the base plan's columns and ``tag_column``, the
    index in ``frames`` of the output each row goes to (a row meeting several outputs'
    conditions appears once per output). None unless every frame is the same plan, or
    filters of it, with the same columns; or on Spark Connect."""
    if len(frames) < 2 or not all(hasattr(frame, "_jdf") for frame in frames):
        return None
    try:
        chains = [_chain(frame) for frame in frames]
        base_plan = chains[0][0]
        if not all(plan.equals(base_plan) for plan, _ in chains[1:]):
            return None
        schema = frames[0].schema
        if any(frame.schema != schema for frame in frames[1:]):
            return None
        from pyspark.sql.classic.column import Column as ClassicColumn
        from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

        session = frames[0].sparkSession
        jvm = session._jvm
        if jvm is None:
            return None
        classic = jvm.org.apache.spark.sql.classic
        base = ClassicDataFrame(classic.Dataset.ofRows(session._jsparkSession, base_plan), session)
        if base.schema != schema:
            return None

        def condition(expressions: list[Any]) -> Column | None:
            columns: list[Column] = [
                ClassicColumn(classic.ExpressionUtils.column(e)) for e in expressions
            ]
            if not columns:
                return None
            joined = columns[0]
            for column in columns[1:]:
                joined = joined & column
            return joined

        # Each output's tag in an array of its own, or in an empty one where the row fails
        # its conditions; concatenated: arrays of literals and CASE compile to Java code,
        # where array_compact (a lambda) would be interpreted for every row.
        none = F.array().cast("array<tinyint>")
        tags = []
        for index, (_, expressions) in enumerate(chains):
            tag = F.array(F.lit(index).cast("tinyint"))
            held = condition(expressions)
            tags.append(tag if held is None else F.when(held, tag).otherwise(none))
        return base.select("*", F.explode(F.concat(*tags)).alias(tag_column))
    except Exception as exc:  # plans Spark will not rebuild this way: write one by one
        log.debug("outputs not written in one pass: %s", exc)
        return None


__all__ = ["one_pass"]

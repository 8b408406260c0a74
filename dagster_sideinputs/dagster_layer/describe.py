"""Readable descriptions of an operator's inputs, for asset metadata in the UI.

Each side input is described in words (view, key, readiness rule, what happens to a
record without a side row, window) instead of a Python repr, so that the asset page
says which input is the main one and how each side input is used.
"""

from collections.abc import Mapping

import dagster as dg

from dagster_sideinputs.core.declarations import MainInput
from dagster_sideinputs.core.metrics import human_duration
from dagster_sideinputs.core.sideinputs.declaration import SideInput
from dagster_sideinputs.core.sideinputs.windows import Window

ROLE_MAIN_INPUT = "main_input"
ROLE_SIDE_INPUT = "side_input"
ROLE_TAG = "dsi/role"
"""Tag key of an asset's role: ``main_input``, ``side_input``, ``main_output``,
``side_output``, or the route of a built-in output (``late_output``, ...)."""

_VIEWS = {
    "singleton": "one row",
    "list": "all rows, as a bag",
    "map": "one row per key",
    "multimap": "all rows of each key",
}


def describe_window(window: Window) -> str:
    """``tumbling windows of 1 hour on ts (watermark 2 hours)``."""
    kind = (
        f"tumbling windows of {human_duration(window.size)}"
        if window.is_tumbling
        else f"sliding windows of {human_duration(window.size)} every "
        f"{human_duration(window.slide)}"
    )
    if window.time_column:
        kind += f" on {window.time_column}"
    if window.watermark is not None:
        kind += f" (watermark {human_duration(window.watermark)})"
    return kind


def describe_main_input(main: MainInput) -> str:
    """``transactions: read incrementally (new Delta versions); key customer_id; ...``."""
    source = (
        f"each new {main.format} file landing in {main.path} read once"
        if main.kind == "files"
        else "new Delta versions (appends) read incrementally"
    )
    parts = [f"{main.asset}: {source}"]
    if main.key:
        parts.append(f"key {main.key}")
    if main.event_time:
        parts.append(f"event time {main.event_time}")
    if main.pre_keyed is not None:
        parts.append(
            f"pre-keyed in {main.pre_keyed.max_key_groups} key groups "
            f"({main.pre_keyed.column}): no shuffle"
        )
    return "; ".join(parts)


def readiness_rule(side: SideInput) -> str:
    """When the side input may be used, in words (the rules of ``SideInput.readiness``)."""
    rule = side.readiness
    if rule is None:
        rule = "complete" if side.window is not None else "fresh" if side.max_age else None
    if rule == "complete" and side.window is not None:
        return "ready per window: the partition of the record's window is materialized"
    if rule == "fresh":
        if side.max_age is not None:
            return (
                "ready while fresh: per its asset's FreshnessPolicy, else written less than "
                f"{human_duration(side.max_age)} ago"
            )
        return "ready while its asset's FreshnessPolicy passes"
    if rule is None:
        return "ready once materialized, and while its asset's FreshnessPolicy passes (if any)"
    return "ready once materialized"


def describe_side_input(
    name: str, side: SideInput, main: MainInput, unmatched: str = "the unmatched output"
) -> str:
    """One side input in words, e.g. ``profile: map of customer_profiles (one row per key),
    key customer_id joined on transactions.customer_id; ...``."""
    parts = [f"{name}: {side.view} of {side.asset} ({_VIEWS[side.view]})"]
    if side.key:
        if side.key_translator is None:
            on = f"{main.asset}.{side.key}"
        elif isinstance(side.key_translator, str):
            on = f"{main.asset}.{side.key_translator}"
        else:
            on = "an expression of the main record"
        parts.append(f"key {side.key} joined on {on}")
    parts.append(readiness_rule(side))
    if side.missing == "wait":
        then = "joined with nulls" if side.on_timeout == "null" else f"sent to {unmatched}"
        parts.append(
            f"a record whose key has no row waits up to {human_duration(side.timeout)}, "
            f"then is {then}"
        )
    elif side.missing == "unmatched":
        parts.append(f"a record whose key has no row goes to {unmatched}")
    elif side.key:
        parts.append("a record whose key has no row is joined with nulls")
    if side.window is not None:
        parts.append(describe_window(side.window))
    if side.distribution is not None:
        parts.append(f"distribution {side.distribution}")
    return "; ".join(parts)


def inputs_markdown(
    main: MainInput, side_inputs: Mapping[str, SideInput], unmatched: str = "the unmatched output"
) -> str:
    """A table of every input of the operator: role, asset, how it is used."""
    lines = ["| input | role | asset | how it is used |", "|---|---|---|---|"]
    main_text = describe_main_input(main).split(": ", 1)[1]
    lines.append(f"| main | main input | {main.asset} | {main_text} |")
    for name, side in side_inputs.items():
        text = describe_side_input(name, side, main, unmatched).split(": ", 1)[1]
        lines.append(f"| {name} | side input | {side.asset} | {text} |")
    return "\n".join(lines)


def input_metadata(
    main: MainInput, side_inputs: Mapping[str, SideInput], unmatched: str | None = None
) -> dict[str, object]:
    """Definition metadata of an output asset naming its main input and side inputs.

    Args:
        unmatched: the name of the unmatched output, if declared.
    """
    target = unmatched or "the unmatched output"
    metadata: dict[str, object] = {
        "dsi/main_input": describe_main_input(main),
        "dsi/inputs": dg.MetadataValue.md(inputs_markdown(main, side_inputs, target)),
    }
    for name, side in side_inputs.items():
        metadata[f"dsi/side_input/{name}"] = describe_side_input(name, side, main, target)
    return metadata

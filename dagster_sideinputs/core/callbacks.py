"""Callables a user hands the operator (the function, ``window_mapping``,
``key_translator``, a readiness provider, ``clock``, ``on_batch``): how errors name them.

The operator never lets a user callable's own exception escape raw, nor uses what it
returns before checking it: its errors become a :class:`~dagster_sideinputs.errors.
FunctionError` or :class:`~dagster_sideinputs.errors.DeclarationError` naming the
callable by its qualified name (and what it was given).
"""

import datetime as dt
from collections.abc import Callable
from typing import Any

from dagster_sideinputs.core.metrics import BatchMetrics
from dagster_sideinputs.core.sideinputs.windows import (
    LAST_INSTANT,
    Window,
    WindowMapping,
    WindowSpan,
    as_utc,
    default_side_window,
    describe,
    is_window_start,
    shifted,
    window_start_containing,
)
from dagster_sideinputs.errors import DeclarationError, FunctionError, SideInputError


def callable_name(fn: Any) -> str:
    """``module.qualname`` of a function, or of an object's class (a provider)."""
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    module = getattr(target, "__module__", None) or "?"
    return f"{module}.{getattr(target, '__qualname__', repr(fn))}"


def short(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters, with its type."""
    text = repr(value)
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{text} ({type(value).__name__})"


def prefixed(error: SideInputError, prefix: str) -> SideInputError:
    """The same error (same class and fix), its message starting with ``prefix``
    (unless it already names it)."""
    if error.message.startswith(prefix):
        return error
    renamed = type(error)(f"{prefix}{error.message}", fix=error.fix)
    renamed.__cause__ = error.__cause__
    return renamed


# --- window_mapping -----------------------------------------------------------------------


def map_to_side_window(
    side_window: Window,
    mapping: WindowMapping | None,
    main_start: dt.datetime,
    main_end: dt.datetime,
    *,
    label: str = "the side input",
) -> WindowSpan:
    """The side window a main window reads: by ``mapping`` when given, else Beam's default.

    A custom mapping is the user's: what it raises, and a result that is not one of
    ``side_window``'s windows (not a ``(start, end)`` pair of datetimes, empty or
    reversed, or off the side window grid, where no side row could be found), is a
    :class:`DeclarationError` naming it (by qualified name), ``label`` (the side input)
    and the main window it was given.
    """
    if mapping is None:
        return default_side_window(side_window, main_start, main_end)
    main = (as_utc(main_start), as_utc(main_end))
    try:
        result = mapping(*main)
    except SideInputError:
        raise
    except Exception as exc:
        raise _mapping_error(
            mapping, label, side_window, main, f"raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise _mapping_error(
            mapping, label, side_window, main,
            f"returned {short(result)}, not a (start, end) pair of datetimes",
        )  # fmt: skip
    if not all(isinstance(value, dt.datetime) for value in result):
        raise _mapping_error(
            mapping, label, side_window, main,
            f"returned {short(tuple(result))}: start and end must be datetimes",
        )  # fmt: skip
    start, end = as_utc(result[0]), as_utc(result[1])
    if start >= end:
        raise _mapping_error(
            mapping, label, side_window, main,
            f"returned {describe((start, end))}, which is empty or reversed (start >= end)",
        )  # fmt: skip
    if not is_window_start(side_window, start) or end - start != side_window.size:
        raise _mapping_error(
            mapping, label, side_window, main,
            f"returned {describe((start, end))}, which is not one of the side input's "
            f"windows ({side_window!r}): no side row is assigned to it, so every record "
            "would read an empty view",
        )  # fmt: skip
    return start, end


def _mapping_error(
    mapping: WindowMapping,
    label: str,
    side_window: Window,
    main: WindowSpan,
    what: str,
) -> DeclarationError:
    try:
        near = window_start_containing(side_window, main[1] - LAST_INSTANT)
        span = describe((near, shifted(near, side_window.size)))
        example = f"; e.g. the side window holding the main window's last instant is {span}"
    except (OverflowError, ValueError):
        example = ""
    return DeclarationError(
        f"The window_mapping {callable_name(mapping)} of {label}, given the main window "
        f"{describe(main)}, {what}. Nothing was written; buffered records are intact.",
        fix="make the side window's mapping= a function (start, end) -> (side_start, "
        "side_end) returning one of the side input's windows: side_start on its grid "
        "(epoch + offset + a "
        f"multiple of its slide {side_window.slide}) and side_end = side_start + its size "
        f"{side_window.size}{example}; or drop mapping= for the default mapping",
    )


# --- clock and on_batch ---------------------------------------------------------------------


def clock_time(clock: Callable[[], dt.datetime], operator_id: str) -> dt.datetime:
    """``clock()``, checked: the batch pins it in its plan, so it must be a datetime (a
    naive one is taken as UTC, like every naive time the operator meets)."""
    try:
        now = clock()
    except SideInputError:
        raise
    except Exception as exc:
        raise DeclarationError(
            f"Operator {operator_id!r}: the clock {callable_name(clock)} raised "
            f"{type(exc).__name__}: {exc}. Nothing was planned or written.",
            fix="pass clock= a function returning the current time as a datetime, e.g. "
            "lambda: datetime.now(timezone.utc) (the default)",
        ) from exc
    if not isinstance(now, dt.datetime):
        raise DeclarationError(
            f"Operator {operator_id!r}: the clock {callable_name(clock)} returned "
            f"{short(now)}, not a datetime. Nothing was planned or written.",
            fix="pass clock= a function returning the current time as a datetime, e.g. "
            "lambda: datetime.now(timezone.utc) (the default)",
        )
    return now


def report_batch(on_batch: Callable[[BatchMetrics], None], metrics: BatchMetrics, op: str) -> None:
    """``on_batch(metrics)``, called after the batch committed: what it raises stops the
    run as a :class:`FunctionError` saying the batch itself is committed."""
    try:
        on_batch(metrics)
    except SideInputError:
        raise
    except Exception as exc:
        raise FunctionError(
            f"Operator {op!r}: the on_batch callback {callable_name(on_batch)} raised "
            f"{type(exc).__name__}: {exc} after batch {metrics.batch_id} committed. The batch "
            "stays committed (its records are placed, none lost or written twice); the run "
            "stopped there.",
            fix="fix the callback, then rerun: the next run goes on after that batch (it is "
            "not called again for it)",
        ) from exc

"""Callables a user hands the operator (the function, ``window_mapping``,
``key_translator``, a readiness provider, ``clock``, ``on_batch``): how errors name them.

The operator never lets a user callable's own exception escape raw, nor uses what it
returns before checking it: its errors become a :class:`~dagster_sideinputs.errors.
FunctionError` or :class:`~dagster_sideinputs.errors.DeclarationError` naming the
callable by its qualified name (and what it was given).
"""

from typing import Any

from dagster_sideinputs.errors import SideInputError


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

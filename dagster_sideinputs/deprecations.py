"""Spellings that changed and still work until 0.2: a public name that left the top
level, an operator keyword that moved into a group, a side input's option that moved
into its window, as-of or wait, a ``defs.yaml`` key. Each warns once per process, at the
caller's line, naming the new spelling."""

import warnings

WARNED: set[str] = set()
"""The old spellings warned about so far (a test may discard one to see it again)."""


def warn_moved(old: str, new: str, *, stacklevel: int) -> None:
    """A ``DeprecationWarning``, once per ``old`` spelling: "``old`` is deprecated and
    goes in 0.2: use ``new``". ``stacklevel`` counts from the caller of this function, as
    :func:`warnings.warn`'s does from its own caller."""
    if old in WARNED:
        return
    WARNED.add(old)
    warnings.warn(
        f"{old} is deprecated and goes in 0.2: use {new}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )

"""What a store's failure is, whichever library met it, and cleanups that never hide one.

The lake's storage is reached outside Spark by three libraries, each failing its own way:
the filesystem (``OSError``), ``obstore`` (the lease, conditional writes, log reads:
``obstore.exceptions.BaseError`` subclasses, which are not ``OSError``) and delta-rs
(``OSError`` for its object store's failures, some as ``DeltaError`` text). The operator
turns all of them into one :class:`~dagster_sideinputs.errors.StorageError`; this module
tells them apart from the library's other errors (a refused commit, a schema mismatch)
and says what kind of fault each is, so that the error's fix says what to repair: the
credentials, the store's reachability, or a path.
"""

import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from deltalake.exceptions import DeltaError
from obstore.exceptions import (
    BaseError as ObstoreError,
)
from obstore.exceptions import (
    GenericError,
    PermissionDeniedError,
    UnauthenticatedError,
)

log = logging.getLogger("dagster_sideinputs")

Fault = Literal["credentials", "unreachable", "path"]

_CREDENTIALS = re.compile(
    r"PermissionDenied|Unauthenticated|lacked the necessary privileges|"
    r"InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|InvalidToken|AccessDenied|"
    r"\b40[13] (Forbidden|Unauthorized)|credential",
    re.IGNORECASE,
)
_UNREACHABLE = re.compile(
    r"error sending request|connection (refused|reset|closed)|connect(ion)? error|"
    r"timed out|timeout|dns error|failed to lookup|broken pipe|HTTP error|"
    r"after \d+ retries|\b50[0-4]\b|Service ?Unavailable|SlowDown",
    re.IGNORECASE,
)
# delta-rs's object store failures, when it raises them as DeltaError rather than OSError.
_DELTA_STORE = re.compile(r"Object ?Store|Generic \w+ error|Kernel error", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_S3_BODY = re.compile(
    r"<\?xml.*?<Code>(.*?)</Code>\s*<Message>(.*?)</Message>.*?(?:</Error>|$)", re.S
)


def is_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of the storage itself (filesystem or object store)
    raised by the filesystem, obstore or delta-rs, rather than another kind of error."""
    if isinstance(exc, OSError | ObstoreError):
        return True
    return isinstance(exc, DeltaError) and bool(_DELTA_STORE.search(str(exc)))


@dataclass(frozen=True)
class StoreFault:
    """A store failure, described: its kind, the path it names (if any), and its text
    cleaned for a message (one line, no terminal colours, bounded)."""

    fault: Fault
    path: str | None
    reason: str


def describe(exc: BaseException) -> StoreFault:
    """What kind of store failure ``exc`` is (see :func:`is_store_error`)."""
    text = _ANSI.sub("", str(exc))
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError) or _CREDENTIALS.search(text):
        fault: Fault = "credentials"
    elif isinstance(exc, GenericError | ObstoreError) or _UNREACHABLE.search(text):
        fault = "unreachable"
    else:
        fault = "path"
    path = exc.filename if isinstance(exc, OSError) and isinstance(exc.filename, str) else None
    if isinstance(exc, OSError) and exc.strerror and fault == "path":
        reason = exc.strerror
    else:
        reason = _first_lines(text) or type(exc).__name__
    return StoreFault(fault, path, f"{type(exc).__name__}: {reason}")


def _first_lines(text: str, limit: int = 600) -> str:
    """The informative head of a store error's text: its first lines joined, without the
    debug dump obstore appends, cut to ``limit`` characters."""
    head = text.split("\n\nDebug source:", 1)[0]
    # S3's XML error body: its code and message say it all.
    head = _S3_BODY.sub(lambda m: f"{m.group(1)}: {m.group(2)}", head)
    lines = [re.sub(r"^[\s↳]+", "", line).strip() for line in head.splitlines()]
    joined = " ".join(line for line in lines if line)
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."


def run_cleanup(
    action: Callable[[], object],
    *,
    during: BaseException | None,
    what: str,
    quiet: bool = False,
) -> None:
    """Run a cleanup (discarding staged files, releasing a lock) without ever hiding an
    error already in flight.

    Args:
        action: the cleanup.
        during: the error being raised when the cleanup runs, or None.
        what: what the cleanup does, for the log and the note.
        quiet: without an error in flight, log the cleanup's failure instead of raising it
            (a cleanup whose failure leaves only unreferenced files behind, after the work
            it cleans up after succeeded).

    With an error in flight, the cleanup's own failure is logged and attached to that
    error as a note, and the first error goes on; without one, it is raised (or logged,
    ``quiet``).
    """
    try:
        action()
    except Exception as failure:
        if during is None and not quiet:
            raise
        note = f"{what} failed: {type(failure).__name__}: {_first_lines(str(failure))}"
        if during is None:
            log.warning("%s; left behind, unreferenced by any table's log", note)
            return
        log.warning("%s (after %s)", note, type(during).__name__)
        during.add_note(note)


@contextlib.contextmanager
def cleaning_up(action: Callable[[], object], what: str, *, quiet: bool = True) -> Iterator[None]:
    """Run ``action`` after the block however it ends (:func:`run_cleanup`): never in
    place of the block's error; after a block that succeeded, its failure is logged
    (``quiet``) or raised."""
    try:
        yield
    except BaseException as exc:
        run_cleanup(action, during=exc, what=what)
        raise
    run_cleanup(action, during=None, what=what, quiet=quiet)

"""One run at a time per operator: a lock in the operator's state folder.

On local and shared filesystems it is an OS-level ``flock`` on a file: the kernel
releases it when the holding process dies, even by SIGKILL, so a crashed run never
leaves a stale lock behind (it needs a filesystem with POSIX locks).

On object stores (``s3://``, ``gs://``, ``az://``) it is a lease held in the object
``lock`` (``ObjectStoreLease``, built on the store's conditional writes): renewed by the
holder every third of the lease (:func:`lease_seconds`, 60 s unless
``DSI_LOCK_LEASE_SECONDS`` says otherwise), taken over by another run only once it has
expired. A crashed run's lock therefore blocks others for at most one lease. A holder
paused longer than its lease (SIGSTOP, a suspended VM) can be taken over while it still
runs: the lock alone cannot stop its late writes (docs/operations.md, "Guarantees").

A store that refuses the lock (credentials) or cannot be reached raises a
:class:`~dagster_sideinputs.errors.StorageError` naming the lock. A release that fails
after the run failed never hides the run's error (it is logged and noted on it); one that
fails after the run succeeded is a ``StorageError`` that says the batches are committed and
when the lock expires.
"""

import contextlib
import datetime as dt
import fcntl
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping

from dagster_sideinputs.core.spark_errors import storage_errors
from dagster_sideinputs.delta.store.errors import run_cleanup
from dagster_sideinputs.delta.store.files import is_local, normalize_uri
from dagster_sideinputs.delta.store.lease import ObjectStoreLease
from dagster_sideinputs.delta.store.s3 import store_label
from dagster_sideinputs.errors import DeclarationError, OperatorBusyError

log = logging.getLogger("dagster_sideinputs")

LEASE_S = 60.0
LEASE_ENV = "DSI_LOCK_LEASE_SECONDS"


def lease_seconds() -> float:
    """The lease of the object-store lock: ``DSI_LOCK_LEASE_SECONDS``, else :data:`LEASE_S`.

    Shorter leases let a crashed run's successor start sooner; every holder renews three
    times per lease, so a lease must comfortably exceed the longest stall of a healthy
    driver (a few seconds).
    """
    raw = os.environ.get(LEASE_ENV, "").strip()
    if not raw:
        return LEASE_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value < 1.0:
        raise DeclarationError(
            f"{LEASE_ENV}={raw!r} is not a number of seconds >= 1.",
            fix=f"unset {LEASE_ENV} (60 s) or set it to e.g. 30",
        )
    return value


@contextlib.contextmanager
def operator_lock(
    state_uri: str,
    *,
    operator_id: str,
    wait_s: float = 0.0,
    storage_options: Mapping[str, str] | None = None,
    lease_s: float | None = None,
) -> Iterator[None]:
    """Hold the operator's lock for the duration of the block.

    Args:
        state_uri: the operator's state folder.
        operator_id: for the error message.
        wait_s: how long to wait for another run to finish before giving up.
        storage_options: delta-rs storage options of the state folder (object stores).
        lease_s: on object stores, how long a lock outlives a holder that stops renewing
            (default :func:`lease_seconds`).

    Raises:
        OperatorBusyError: another process holds the lock (named in the message).
    """
    if not is_local(state_uri):
        lease = lease_seconds() if lease_s is None else lease_s
        with _object_store_lock(state_uri, operator_id, wait_s, storage_options, lease):
            yield
        return
    folder = normalize_uri(state_uri)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "lock")
    handle = open(path, "a+")  # noqa: SIM115 (held open for the whole block)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "another process"
                    raise OperatorBusyError(
                        f"Operator {operator_id!r} is already running ({holder}); two runs "
                        "must not process the same batches at once. Nothing was done.",
                        fix="wait for the other run to finish (or terminate it), or pass "
                        "wait_for_lock=<seconds>; in Dagster, limit the job's concurrency",
                    ) from None
                time.sleep(0.2)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}")
        handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


@contextlib.contextmanager
def _object_store_lock(
    state_uri: str,
    operator_id: str,
    wait_s: float,
    storage_options: Mapping[str, str] | None,
    lease_s: float,
) -> Iterator[None]:
    where = f"{state_uri}/lock"
    store = store_label(state_uri, storage_options)
    with storage_errors(operator_id, f"taking the operator's lock {where}", store=store):
        lease = ObjectStoreLease(state_uri, "lock", storage_options, lease_s=lease_s)
        acquired = lease.acquire(wait_s=wait_s)
        holder = None if acquired else lease.holder()
    if not acquired:
        if holder is None:
            described = "another process"
        else:
            until = dt.datetime.fromtimestamp(holder.expires_at, dt.timezone.utc)
            described = f"{holder.owner}, lease until {until:%Y-%m-%d %H:%M:%S} UTC unless renewed"
        raise OperatorBusyError(
            f"Operator {operator_id!r} is already running ({described}); two runs must not "
            f"process the same batches at once. Nothing was done. Lock: {where}.",
            fix="wait for the other run to finish (or terminate it: its lock expires "
            f"{lease_s:.0f}s after it stops renewing), or pass wait_for_lock=<seconds>; "
            "in Dagster, limit the job's concurrency",
        )
    try:
        yield
    except BaseException as first:
        # The run's own error goes up; a store that also refuses the release (it went
        # down mid-run) is logged and noted on it, never raised in its place.
        lost = not lease.held
        run_cleanup(lease.release, during=first, what=f"releasing the operator's lock {where}")
        _warn_if_lost(lost, operator_id, state_uri, lease_s)
        raise
    lost = not lease.held
    releasing = (
        f"releasing the operator's lock {where} (the run's batches are committed; the lock "
        f"expires {lease_s:.0f}s after its last renewal, then the next run takes it: "
        "pass wait_for_lock= to wait for it)"
    )
    with storage_errors(operator_id, releasing, store=store):
        lease.release()
    _warn_if_lost(lost, operator_id, state_uri, lease_s)


def _warn_if_lost(lost: bool, operator_id: str, state_uri: str, lease_s: float) -> None:
    if lost:
        # Another run took the lock over while this one was paused past its lease.
        log.warning(
            "Operator %r lost its lock %s/lock during the run (paused longer than "
            "the %ss lease?); batch plans are created exclusively, so no batch ran twice.",
            operator_id,
            state_uri,
            lease_s,
        )

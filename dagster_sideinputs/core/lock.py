"""One run at a time per operator: an OS-level lock on a file in the operator's state.

``flock`` is released by the kernel when the holding process dies, even by SIGKILL, so
a crashed run never leaves a stale lock behind. It works on local filesystems and on
shared ones that support POSIX locks; on object stores there is no lock here (rely on
Dagster run concurrency, and on the exclusive creation of batch plans).
"""

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator, Mapping

from dagster_sideinputs.delta.files import is_local, normalize_uri
from dagster_sideinputs.errors import OperatorBusyError


@contextlib.contextmanager
def operator_lock(
    state_uri: str,
    *,
    operator_id: str,
    wait_s: float = 0.0,
    storage_options: Mapping[str, str] | None = None,
) -> Iterator[None]:
    """Hold the operator's lock for the duration of the block.

    Args:
        state_uri: the operator's state folder.
        operator_id: for the error message.
        wait_s: how long to wait for another run to finish before giving up.
        storage_options: object store options of the state folder (object stores).

    Raises:
        OperatorBusyError: another process holds the lock (named in the message).
    """
    if not is_local(state_uri):
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

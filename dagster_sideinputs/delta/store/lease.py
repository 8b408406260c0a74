"""A lease lock on an object store, built on conditional writes (see :class:`ObjectStoreLease`)."""

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    NotFoundError,
    PreconditionError,
)

from dagster_sideinputs.delta.store.files import normalize_uri
from dagster_sideinputs.delta.store.object_store import (
    _put_matching,
    _version_of,
    open_object_store,
)


@dataclass(frozen=True)
class LeaseRecord:
    """The content of a lease object: who holds it, until when, and how often it changed.

    Attributes:
        owner: a readable description of the holder (process and host).
        token: unique per acquisition; the holder recognises its own record by it.
        generation: +1 on every acquisition; usable as a fencing token.
        expires_at: the holder's wall clock (epoch seconds) when the lease ends unless
            renewed.
        lease_s: the lease duration the holder uses.
        released: the holder let go; anyone may take it at once.
    """

    owner: str
    token: str
    generation: int
    expires_at: float
    lease_s: float
    released: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "LeaseRecord | None":
        try:
            fields = json.loads(raw)
            return cls(
                owner=str(fields["owner"]),
                token=str(fields["token"]),
                generation=int(fields["generation"]),
                expires_at=float(fields["expires_at"]),
                lease_s=float(fields["lease_s"]),
                released=bool(fields.get("released", False)),
            )
        except (ValueError, KeyError, TypeError):
            return None


class ObjectStoreLease:
    """A lock held in one object on an object store, as a lease renewed by its holder.

    Built only on the store's atomic conditional writes:

    - **acquire**: create the object if absent (``If-None-Match: *``); if it exists and
      its lease is over (released, expired by the record's clock, or unchanged for a whole
      lease as seen by this process), replace it with compare-and-swap on its ETag
      (``If-Match``; a generation on GCS). Of any number of racing processes exactly one
      wins each step, so a lease passes on only once it is released or over.
    - **renew**: compare-and-swap on the holder's last ETag; a failure means another
      process took the lease over, and the holder learns it has lost the lock.
    - **release**: compare-and-swap to a ``released`` record (not a DELETE: object_store
      has no conditional delete, and a plain delete by a holder whose lease ran out would
      remove the next holder's lock).

    Guarantees: no two processes hold an unexpired lease at once. A holder paused longer
    than its lease (GC, SIGSTOP, a suspended VM) can be taken over while it still runs;
    it finds out at its next renewal, or at :meth:`check`. The lock therefore cannot
    stop a paused holder's writes by itself; work it protects must also be safe against
    a late writer (the operator's plans are created exclusively and its Delta commits are
    idempotent). Expiry by the record's clock assumes the machines' clocks differ by less
    than ``clock_skew_s``; expiry by observation needs no clock agreement at all.
    """

    def __init__(
        self,
        root: str,
        key: str = "lock",
        storage_options: Mapping[str, str] | None = None,
        *,
        owner: str | None = None,
        lease_s: float = 60.0,
        clock_skew_s: float = 5.0,
    ) -> None:
        self.root = normalize_uri(root)
        self.key = key
        self.owner = owner or f"pid {os.getpid()} on {socket.gethostname()}"
        self.lease_s = lease_s
        self.clock_skew_s = clock_skew_s
        self._store = open_object_store(self.root, storage_options or {})
        self._version: dict[str, str] | None = None  # what the next CAS must match
        self._record: LeaseRecord | None = None
        self._lost = False
        self._seen: tuple[dict[str, str], float] | None = None  # (version, first seen)
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()
        self._mutex = threading.Lock()

    @property
    def held(self) -> bool:
        """Whether this process holds the lease (as far as it knows: see :meth:`check`)."""
        return self._version is not None and not self._lost

    @property
    def generation(self) -> int | None:
        """The generation of the held lease (a fencing token), or None."""
        return self._record.generation if self.held and self._record else None

    def holder(self) -> LeaseRecord | None:
        """The current record, whoever holds it (None when no lease object exists)."""
        current = self._read()
        return current[1] if current else None

    def try_acquire(self) -> bool:
        """Take the lease if it is free or over; False when someone else holds it."""
        with self._mutex:
            if self.held:
                return True
            record = self._new_record(generation=1)
            try:
                result = obstore.put(self._store, self.key, record.to_bytes(), mode="create")
            except AlreadyExistsError:
                return self._landed(record) or self._try_take_over()
            except PreconditionError:
                return self._landed(record)  # else another creation in flight wins
            self._hold(_version_of(result), record)
            return True

    def acquire(self, wait_s: float = 0.0, poll_s: float = 0.5) -> bool:
        """Try to take the lease until ``wait_s`` has passed; start renewing it when held."""
        deadline = time.monotonic() + wait_s
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())) or poll_s)
        self.start_renewing()
        return True

    def renew(self) -> bool:
        """Extend the lease; False (and :attr:`held` turns False) when it was taken over."""
        with self._mutex:
            if not self.held or self._record is None:
                return False
            record = self._record
            renewed = LeaseRecord(
                record.owner,
                record.token,
                record.generation,
                time.time() + self.lease_s,
                self.lease_s,
            )
            try:
                result = _put_matching(self._store, self.key, renewed.to_bytes(), self._version)
            except (PreconditionError, FileNotFoundError, NotFoundError):
                self._lost = not self._landed(renewed)
                return not self._lost
            except Exception:
                # A transient failure (network): the next tick retries, while time is left.
                if time.time() > record.expires_at:
                    self._lost = True
                return not self._lost
            self._hold(_version_of(result), renewed)
            return True

    def check(self) -> bool:
        """Ask the store whether this process still holds the lease (one request)."""
        current = self._read()
        with self._mutex:
            if current is None or self._record is None or current[1] is None:
                self._lost = self._version is not None or self._lost
            elif current[1].token != self._record.token or current[1].released:
                self._lost = True
            return self.held

    def release(self) -> None:
        """Stop renewing and let the lease go (only if this process still holds it)."""
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()
        self._renewer = None
        with self._mutex:
            if self.held and self._record is not None:
                record = self._record
                released = LeaseRecord(
                    record.owner, record.token, record.generation, time.time(), 0.0, True
                )
                with contextlib.suppress(PreconditionError, FileNotFoundError, NotFoundError):
                    _put_matching(self._store, self.key, released.to_bytes(), self._version)
            self._version, self._record = None, None

    def start_renewing(self) -> None:
        """Renew from a daemon thread, three times per lease, until released or lost."""
        if self._renewer is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(self.lease_s / 3) and self.renew():
                pass

        self._renewer = threading.Thread(target=loop, name=f"lease:{self.key}", daemon=True)
        self._renewer.start()

    # -- internals -----------------------------------------------------------------------

    def _new_record(self, generation: int) -> LeaseRecord:
        return LeaseRecord(
            self.owner, uuid.uuid4().hex, generation, time.time() + self.lease_s, self.lease_s
        )

    def _hold(self, version: dict[str, str], record: LeaseRecord) -> None:
        if not version:
            raise RuntimeError(
                f"the object store at {self.root} returns no ETag; it cannot hold a lease"
            )
        self._version, self._record, self._lost, self._seen = version, record, False, None

    def _read(self) -> tuple[dict[str, str], LeaseRecord | None] | None:
        try:
            result = obstore.get(self._store, self.key)
        except (FileNotFoundError, NotFoundError):
            return None
        return (_version_of(result.meta), LeaseRecord.from_bytes(bytes(result.bytes())))

    def _over(self, version: dict[str, str], record: LeaseRecord | None) -> bool:
        if record is None or record.released:
            return True  # unreadable (no live holder writes that) or let go
        if time.time() > record.expires_at + self.clock_skew_s:
            return True
        # Unchanged for a whole lease by our own clock: its holder stopped renewing.
        now = time.monotonic()
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, now)
            return False
        return now - self._seen[1] > record.lease_s

    def _try_take_over(self) -> bool:
        current = self._read()
        if current is None:
            return False  # deleted meanwhile: the next attempt creates it
        version, record = current
        if not self._over(version, record):
            return False
        generation = (record.generation if record else 0) + 1
        taken = self._new_record(generation)
        try:
            result = _put_matching(self._store, self.key, taken.to_bytes(), version)
        except (PreconditionError, FileNotFoundError, NotFoundError):
            return self._landed(taken)  # else someone else moved first
        self._hold(_version_of(result), taken)
        return True

    def _landed(self, attempted: LeaseRecord) -> bool:
        """Whether a conditional write that was answered "precondition failed" did land.

        The HTTP client retries a request whose answer was lost; the retry of a write
        that had succeeded then meets its own result and fails. The record's token
        tells: if the stored record is the one we wrote, we hold it.
        """
        current = self._read()
        if current is None or current[1] != attempted:
            return False
        self._hold(current[0], attempted)
        return True

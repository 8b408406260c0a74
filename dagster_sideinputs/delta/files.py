"""File operations under a table root, on a local path or through delta-rs's object store.

The bridge lists the files Spark staged, moves them into the table, reads parquet
footers and commit JSON. Local and shared filesystems use ``os`` directly (fast);
other URIs go through ``deltalake.fs.DeltaStorageHandler`` so they use exactly the
storage options delta-rs uses for the commit.

Conditional writes (create-only, compare-and-swap) are not exposed by delta-rs's
Python API; they go through ``obstore``, the Python binding of the same Rust
``object_store`` crate delta-rs uses, configured from the same storage options
(:func:`object_store_options`). S3 (``If-None-Match`` / ``If-Match``), GCS
(generations) and Azure (ETags) all evaluate those conditions atomically.
"""

import contextlib
import functools
import json
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import obstore
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.fs import DeltaStorageHandler
from obstore.exceptions import (
    AlreadyExistsError,
    NotFoundError,
    PreconditionError,
    UnknownConfigurationKeyError,
)
from obstore.store import from_url

# obstore types its settings as provider-specific TypedDicts; ours come as plain maps.
_store_from_url: Callable[..., Any] = from_url


def is_local(uri: str) -> bool:
    scheme = urlparse(uri).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def normalize_uri(uri: str) -> str:
    """Local paths become absolute paths without a scheme; other URIs are kept."""
    if is_local(uri):
        path = urlparse(uri).path if uri.startswith("file:") else uri
        return os.path.abspath(os.path.expanduser(path))
    return uri.rstrip("/")


def spark_uri(uri: str) -> str:
    """The URI Spark's Hadoop filesystems understand for a delta-rs table URI."""
    if is_local(uri):
        return "file://" + normalize_uri(uri)
    if uri.startswith("s3://"):
        return "s3a://" + uri[len("s3://") :]
    return uri


def join_uri(root: str, *parts: str) -> str:
    cleaned = [part.strip("/") for part in parts if part]
    if is_local(root):
        return os.path.join(normalize_uri(root), *cleaned)
    return "/".join([root.rstrip("/"), *cleaned])


def resolve_log_path(root: str, log_path: str) -> tuple[str, str]:
    """(decoded path relative to the root, absolute location) of a Delta log path.

    Paths in the Delta log are URI-encoded (a partition value ``a:b`` lives in the
    folder ``k=a%3Ab``, logged as ``k=a%253Ab``).
    """
    path = unquote(log_path)
    if "://" in path or path.startswith("/"):
        return path, path
    return path, join_uri(root, path)


@dataclass(frozen=True)
class FileEntry:
    """A file below a root: its path relative to the root and its size in bytes."""

    path: str
    size: int
    modification_time_ms: int


class TableFiles:
    """File operations relative to one table root."""

    def __init__(self, root: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.root = normalize_uri(root)
        self._local = is_local(self.root)
        self._storage_options = dict(storage_options or {})
        self._fs: pafs.FileSystem | None = None
        self._store: Any = None
        if not self._local:
            handler = DeltaStorageHandler(self.root, self._storage_options)
            self._fs = pafs.PyFileSystem(handler)

    def object_store(self) -> Any:
        """The ``obstore`` store rooted at this root (object stores only), built once."""
        if self._local:
            raise ValueError(f"{self.root} is a local path, not an object store")
        if self._store is None:
            self._store = open_object_store(self.root, self._storage_options)
        return self._store

    def _abs(self, relative: str) -> str:
        return os.path.join(self.root, relative) if self._local else relative

    def exists(self, relative: str = "") -> bool:
        if self._local:
            return os.path.exists(self._abs(relative))
        assert self._fs is not None
        info = self._fs.get_file_info(relative or ".")
        return info.type != pafs.FileType.NotFound

    def list_files(self, relative_dir: str) -> Iterator[FileEntry]:
        """Every file below a directory, recursively, paths relative to the root."""
        if self._local:
            base = self._abs(relative_dir)
            for directory, _, names in os.walk(base):
                for name in names:
                    full = os.path.join(directory, name)
                    stat = os.stat(full)
                    yield FileEntry(
                        os.path.relpath(full, self.root), stat.st_size, int(stat.st_mtime * 1000)
                    )
            return
        assert self._fs is not None
        selector = pafs.FileSelector(relative_dir, recursive=True, allow_not_found=True)
        for info in self._fs.get_file_info(selector):
            if info.type == pafs.FileType.File:
                mtime = int(info.mtime.timestamp() * 1000) if info.mtime else 0
                yield FileEntry(info.path, info.size or 0, mtime)

    def has_entries(self, relative_dir: str = "") -> bool:
        """Whether a directory exists and holds anything."""
        if self._local:
            path = self._abs(relative_dir)
            return os.path.isdir(path) and any(os.scandir(path))
        return next(self.list_files(relative_dir), None) is not None

    def move(self, source: str, target: str) -> None:
        if self._local:
            destination = self._abs(target)
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            os.replace(self._abs(source), destination)
            return
        assert self._fs is not None
        self._fs.move(source, target)

    def delete_file(self, relative: str) -> None:
        if self._local:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._abs(relative))
            return
        assert self._fs is not None
        self._fs.delete_file(relative)

    def delete_dir(self, relative: str) -> None:
        if self._local:
            shutil.rmtree(self._abs(relative), ignore_errors=True)
            return
        assert self._fs is not None
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_dir(relative)

    def read_bytes(self, relative: str) -> bytes:
        if self._local:
            with open(self._abs(relative), "rb") as handle:
                return handle.read()
        assert self._fs is not None
        with self._fs.open_input_stream(relative) as handle:
            return handle.read()

    def write_bytes_atomic(self, relative: str, data: bytes, *, exclusive: bool = False) -> bool:
        """Write a whole file so readers see all of it or nothing.

        Args:
            exclusive: only create the file when it does not exist yet.

        Returns:
            False when ``exclusive`` and the file already existed (nothing written).
        """
        if self._local:
            target = self._abs(relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            temp = f"{target}.{uuid.uuid4().hex}.tmp"
            with open(temp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            try:
                if exclusive:
                    try:
                        os.link(temp, target)  # atomic create-if-absent
                    except FileExistsError:
                        return False
                else:
                    os.replace(temp, target)
            finally:
                if os.path.exists(temp):
                    os.remove(temp)
            return True
        if exclusive:
            return put_if_absent(self.object_store(), relative, data)
        # One PUT: readers see the old object or the new one, never a part. (pyarrow's
        # output stream over DeltaStorageHandler refuses bytes: "'Buffer' object is not
        # an instance of 'bytes'".)
        obstore.put(self.object_store(), relative, data)
        return True

    def parquet_metadata(self, relative: str) -> pq.FileMetaData:
        if self._local:
            return pq.read_metadata(self._abs(relative))
        assert self._fs is not None
        with self._fs.open_input_file(relative) as handle:
            return pq.read_metadata(handle)


# --- conditional writes on object stores ---------------------------------------------------

# object_store's HTTP client settings; delta-rs takes them in the same flat map as the
# store's settings (with or without a provider prefix), obstore wants them apart.
_CLIENT_KEYS = frozenset(
    {
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "http1_only",
        "http2_only",
        "http2_keep_alive_interval",
        "http2_keep_alive_timeout",
        "http2_keep_alive_while_idle",
        "http2_max_frame_size",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "randomize_addresses",
        "read_timeout",
        "timeout",
        "user_agent",
    }
)
_PROVIDER_PREFIXES = ("aws_", "google_", "azure_")
_CONFLICT_RETRIES = 8


def _client_key(key: str) -> str | None:
    lowered = key.lower()
    for prefix in _PROVIDER_PREFIXES:
        if lowered.startswith(prefix):
            lowered = lowered[len(prefix) :]
            break
    return lowered if lowered in _CLIENT_KEYS else None


@functools.lru_cache(maxsize=256)
def _store_accepts(scheme_root: str, key: str, value: str) -> bool:
    """Whether obstore knows a configuration key (delta-rs accepts keys it does not)."""
    try:
        _store_from_url(scheme_root, config={key: value})
    except UnknownConfigurationKeyError:
        return False
    except Exception:
        # A known key whose companion is missing (a key id without its secret) fails to
        # build on its own: it is still a key of the store.
        return True
    except BaseException as exc:
        # obstore panics on an HTTP client key passed as store config; _CLIENT_KEYS routes
        # the known ones apart, and one it does not list is left out.
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return False
    return True


def object_store_options(
    uri: str, storage_options: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Split delta-rs storage options into obstore's store config and client options.

    Options only delta-rs understands (``AWS_S3_LOCKING_PROVIDER``,
    ``AWS_S3_ALLOW_UNSAFE_RENAME``, ``max_retries``, ...) are left out; they tune
    delta-rs's own commit loop, not how to reach the store.

    Returns:
        (config, client_options) for ``obstore.store.from_url``.
    """
    parsed = urlparse(uri)
    scheme_root = f"{parsed.scheme}://{parsed.netloc}"
    config: dict[str, str] = {}
    client: dict[str, str] = {}
    for key, value in storage_options.items():
        client_key = _client_key(key)
        if client_key is not None:
            client[client_key] = value
        elif _store_accepts(scheme_root, key, value):
            config[key] = value
    return config, client


def open_object_store(uri: str, storage_options: Mapping[str, str]) -> Any:
    """An ``obstore`` store rooted at ``uri`` (``s3://``, ``gs://``, ``az://``, ...)."""
    config, client = object_store_options(uri, storage_options)
    # s3a:// is Hadoop's name for s3://; obstore knows both, say it plainly anyway.
    if uri.startswith("s3a://"):
        uri = "s3://" + uri[len("s3a://") :]
    return _store_from_url(uri, config=config or None, client_options=client or None)


def put_if_absent(store: Any, path: str, data: bytes) -> bool:
    """Create an object only if it does not exist, atomically on the store's side.

    Of any number of racing writers exactly one gets True. A caller that gets False must
    read what is there: when the store's answer to a successful create is lost, the HTTP
    client's retry meets the object and reports it as existing, so it may be its own.

    Returns:
        False when the object already existed (nothing written).
    """
    for attempt in range(_CONFLICT_RETRIES):
        try:
            obstore.put(store, path, data, mode="create")
            return True
        except AlreadyExistsError:
            return False
        except PreconditionError:
            # S3 answers 409 ConditionalRequestConflict while another conditional write
            # of the same key is in flight; its outcome decides, so ask again.
            if attempt == _CONFLICT_RETRIES - 1:
                if _exists(store, path):
                    return False
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _version_of(meta: Mapping[str, Any]) -> dict[str, str]:
    """What a compare-and-swap must match: the ETag (S3, Azure) and the version (GCS's
    generation), as far as the store gives them."""
    return {key: str(meta[key]) for key in ("e_tag", "version") if meta.get(key)}


def _put_matching(store: Any, path: str, data: bytes, version: Mapping[str, str] | None) -> Any:
    """PUT only if the object is still at ``version`` (compare-and-swap)."""
    mode: Any = dict(version or {})  # obstore's UpdateVersion TypedDict
    return obstore.put(store, path, data, mode=mode)


def _exists(store: Any, path: str) -> bool:
    try:
        obstore.head(store, path)
    except (FileNotFoundError, NotFoundError):
        return False
    return True


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

"""File operations under a table root, on a local path or through delta-rs's object store.

The bridge lists the files Spark staged, moves them into the table, reads parquet
footers and commit JSON. Local and shared filesystems use ``os`` directly (fast);
other URIs go through ``deltalake.fs.DeltaStorageHandler`` so they use exactly the
storage options delta-rs uses for the commit. Create-only writes on object stores go
through :mod:`~dagster_sideinputs.delta.store.object_store`.
"""

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import obstore
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.fs import DeltaStorageHandler

from dagster_sideinputs.delta.store.object_store import open_object_store, put_if_absent
from dagster_sideinputs.errors import DeclarationError


def file_in_the_way(path: str) -> str | None:
    """The file at a local path, or at the nearest folder above it that exists, when it
    is not a folder: what keeps a table's folder from being read or created there."""
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return None if os.path.isdir(path) else path


def is_local(uri: str) -> bool:
    scheme = urlparse(uri).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def normalize_uri(uri: str) -> str:
    """Local paths become absolute paths without a scheme; other URIs are kept, except
    that ``s3a://`` (Hadoop's name for S3) becomes ``s3://``, delta-rs's: one table has
    one URI whichever name it was given by (:func:`spark_uri` turns it back for Spark)."""
    if is_local(uri):
        path = urlparse(uri).path if uri.startswith("file:") else uri
        return os.path.abspath(os.path.expanduser(path))
    if uri[:6].lower() == "s3a://":
        uri = "s3://" + uri[6:]
    return uri.rstrip("/")


# Characters a root or table path must not hold: Hadoop reads ``* ? [ ] { }`` (and ``\\``
# escapes) as glob patterns, URIs end their path at ``#`` (fragment) and ``?`` (query),
# and ``%`` starts an escape that delta-rs decodes and Spark does not (``a%20b`` is one
# folder to one and another folder to the other). Control characters (a tab, a newline)
# are not valid in paths at all.
UNSAFE_PATH_CHARACTERS = re.compile(r"[*?\[\]{}\\#%\x00-\x1f\x7f]")


def unsafe_characters(uri: str) -> list[str]:
    """The characters of a location's path that Spark or delta-rs would read as
    something else (sorted, each once)."""
    return sorted(set(UNSAFE_PATH_CHARACTERS.findall(uri.split("://", 1)[-1])))


def check_root(uri: str) -> None:
    """Refuse a storage root holding :data:`UNSAFE_PATH_CHARACTERS`.

    Raises:
        DeclarationError: naming the characters and the fix.
    """
    found = unsafe_characters(uri)
    if found:
        raise DeclarationError(
            f"The storage root {uri!r} holds the characters {found}, which Spark's file "
            "systems read as glob patterns, URI delimiters or escapes, and delta-rs "
            "decodes differently: tables there would be read or written at another path.",
            fix="use letters, digits, '_', '-', '.', '/' (and spaces) in the root",
        )


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

    @property
    def local(self) -> bool:
        return self._local

    def local_path(self, relative: str) -> str:
        """The absolute path of a file or folder of a local table."""
        if not self._local:
            raise ValueError(f"{self.root} is not a local table")
        return self._abs(relative)

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
            for directory, _, names in os.walk(base, onerror=_missing_is_empty):
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
            if info.type != pafs.FileType.File or self._is_folder_marker(info):
                continue
            mtime = int(info.mtime.timestamp() * 1000) if info.mtime else 0
            yield FileEntry(info.path, info.size or 0, mtime)

    def _is_folder_marker(self, info: pafs.FileInfo) -> bool:
        """Whether a listed empty object is a folder marker (a key ending in ``/``, as
        Hadoop's S3A writes for delta-spark's ``_delta_log/_staged_commits/``): the store
        lists it as an empty file under the folder's name, which names no object: asked
        about that name alone, the store answers that it is a folder."""
        if info.size:
            return False
        assert self._fs is not None
        return self._fs.get_file_info(info.path).type != pafs.FileType.File

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


def _missing_is_empty(error: OSError) -> None:
    """A folder that does not exist (yet, or any more) lists as empty; any other failure
    (a file where the folder should be, a permission) is raised, not read as "empty"."""
    if not isinstance(error, FileNotFoundError):
        raise error

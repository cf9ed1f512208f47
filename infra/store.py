"""Object stores: one small interface, backends chosen by URL.

Usage::

    >>> store = open_store(tempfile.mkdtemp())              # or "file:///abs/path", "s3://bucket/prefix"
    >>> store.put("experience/w0/000001.rxp", b"rows")     # atomic: readers see all of it or nothing
    >>> store.put_if_absent("params/000000000007.rpm", b"v7"), store.put_if_absent("params/000000000007.rpm", b"x")
    (True, False)
    >>> store.list("experience/")                          # sorted, relative to the store's root
    ['experience/w0/000001.rxp']
    >>> for key in store.list("experience/"):
    ...     data = store.get(key, max_bytes=64 << 20)      # ObjectTooLarge past the limit, nothing read
    ...     store.delete(key)
    >>> data, store.exists("experience/w0/000001.rxp")
    (b'rows', False)
    >>> store.get("params/000000000007.rpm", max_bytes=1)
    Traceback (most recent call last):
    rapid.infra.store.ObjectTooLarge: ...
    >>> store.put("../escape", b"")
    Traceback (most recent call last):
    rapid.infra.store.InvalidKey: ...

Keys are relative, '/'-separated, made of ``[A-Za-z0-9._-]`` segments; anything that could escape the
store's root (``..``, absolute paths, backslashes, empty segments) raises :class:`InvalidKey`. Reads are
bounded: the size is checked before anything is read, and only regular files are read (a FIFO, a device,
or a symbolic link named like an object is a :class:`BadObject`).
"""

from __future__ import annotations

import abc
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
MAX_KEY_LENGTH = 512
DEFAULT_MAX_BYTES = 4 << 30
"""What ``get`` reads at most unless told a smaller limit (the largest object format's limit)."""
TEMP_MAX_AGE_S = 3600.0
"""A write's temp file older than this was left by a killed writer: listing removes it."""


class StoreError(Exception):
    """The store could not do what was asked (unreachable, permission, I/O). Usually transient."""


class KeyNotFound(StoreError, KeyError):
    """No object under that key."""


class BadObject(StoreError):
    """An object the store will not read: not a regular file, a link out of the root, or too large.
    Unlike other store errors it is not transient: reading it again gives the same answer."""


class ObjectTooLarge(BadObject):
    """An object larger than the reader's ``max_bytes``; nothing of it was read."""


class InvalidKey(ValueError):
    """A key that is malformed or would escape the store's root."""


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise :class:`InvalidKey`."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"store key must be a non-empty string, got {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"store key longer than {MAX_KEY_LENGTH} characters")
    for segment in key.split("/"):
        if segment in ("", ".", "..") or not _SEGMENT.fullmatch(segment):
            raise InvalidKey(f"invalid store key {key!r}: segment {segment!r} is not allowed")
    return key


def validate_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a key optionally ending in '/'."""
    if prefix == "":
        return prefix
    validate_key(prefix.rstrip("/"))
    return prefix


class Store(abc.ABC):
    """Bytes under keys. Writes are atomic; listing is sorted; keys are validated."""

    url: str

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write (or replace) the object atomically."""

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write only if no object exists under ``key``; False (and nothing written) if one does."""

    @abc.abstractmethod
    def get(self, key: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
        """The object's bytes; :class:`KeyNotFound` if absent, :class:`ObjectTooLarge` (nothing read) if
        it is larger than ``max_bytes``, :class:`BadObject` if it is not a regular object."""

    @abc.abstractmethod
    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        """Every key that starts with ``prefix``, sorted; with ``start_after``, only keys after it (S3's
        ``StartAfter``: a reader that keeps a cursor lists only what is new, not the whole prefix)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; absent keys are not an error."""

    def exists(self, key: str) -> bool:
        try:
            self.get(key)
        except KeyNotFound:
            return False
        return True

    def describe(self) -> str:
        """Where the store is, safe to print (never credentials)."""
        return self.url


class LocalStore(Store):
    """A folder on a local (or shared) file system. Atomic writes by temp file + rename.

    Nothing outside the root is ever read, written, listed or deleted: a folder that is a symbolic link
    out of the root is refused, and object files are opened without following links."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()
        self._inside = str(self.root).rstrip(os.sep) + os.sep

    def _path(self, key: str) -> Path:
        path = self.root / validate_key(key)
        self._check_inside(path.parent, key)
        return path

    def _check_inside(self, folder: Path, what: str) -> None:
        real = os.path.realpath(folder)
        if real != str(self.root) and not real.startswith(self._inside):
            raise BadObject(f"{what!r} leads out of the store's root through a symbolic link")

    def _write_temp(self, path: Path, data: bytes) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            os.unlink(tmp)
            raise
        return tmp

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            tmp = self._write_temp(path, bytes(data))
            os.replace(tmp, path)
        except OSError as e:
            raise StoreError(f"cannot write {key}: {e.strerror}") from e

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        try:
            tmp = self._write_temp(path, bytes(data))
            try:
                os.link(tmp, path)  # fails if the target exists: an atomic create-if-absent
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        except OSError as e:
            raise StoreError(f"cannot write {key}: {e.strerror}") from e
        return True

    def get(self, key: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
        path = self._path(key)
        try:
            # O_NOFOLLOW: a link (to /dev/zero, to a file outside) is refused; O_NONBLOCK: a FIFO opens at
            # once instead of waiting for a writer, and is then refused as not a regular file.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise KeyNotFound(key) from e
        except OSError as e:
            if os.path.islink(path):
                raise BadObject(f"{key} is a symbolic link, not an object") from e
            raise StoreError(f"cannot read {key}: {e.strerror}") from e
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise KeyNotFound(key)
            if not stat.S_ISREG(info.st_mode):
                raise BadObject(f"{key} is not a regular file")
            if info.st_size > max_bytes:
                raise ObjectTooLarge(f"{key} is {info.st_size} bytes, more than the {max_bytes} allowed")
            os.set_blocking(fd, True)
            chunks, size = [], 0
            while size <= max_bytes:  # a file that grows after fstat is still read no further than the limit
                chunk = os.read(fd, min(max_bytes + 1 - size, 16 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if size > max_bytes:
                raise ObjectTooLarge(f"{key} grew past the {max_bytes} bytes allowed while being read")
            return b"".join(chunks)
        except OSError as e:
            raise StoreError(f"cannot read {key}: {e.strerror}") from e
        finally:
            os.close(fd)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        validate_prefix(prefix)
        # Walk only the deepest folder the prefix names, not the whole store.
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root / folder
        if not base.is_dir() or base.is_symlink():
            return []
        self._check_inside(base, prefix)
        keys = self._walk(base, folder, prefix, time.time() - TEMP_MAX_AGE_S)
        return sorted(k for k in keys if start_after is None or k > start_after)

    def _walk(self, folder: Path, rel: str, prefix: str, stale_before: float) -> Iterator[str]:
        """Regular files only: links (to files or folders) and FIFOs are not objects and not followed."""
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return  # removed while listing
        for entry in entries:
            key = f"{rel}/{entry.name}" if rel else entry.name
            if entry.name.startswith(".tmp-"):
                self._remove_if_stale(entry, stale_before)
            elif entry.is_dir(follow_symlinks=False):
                if not entry.name.startswith(".") and ((key + "/").startswith(prefix) or prefix.startswith(key + "/")):
                    yield from self._walk(Path(entry.path), key, prefix, stale_before)
            elif entry.is_file(follow_symlinks=False) and key.startswith(prefix):
                yield key

    @staticmethod
    def _remove_if_stale(entry: os.DirEntry, stale_before: float) -> None:
        """A killed writer's temp file: removed once it is old enough that no live write can own it."""
        try:
            if entry.name.endswith(".part") and entry.stat(follow_symlinks=False).st_mtime < stale_before:
                os.unlink(entry.path)
        except OSError:
            pass  # another lister removed it first

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StoreError(f"cannot delete {key}: {e.strerror}") from e

    def exists(self, key: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self._path(key)).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False


class ObservedStore(Store):
    """Any store, with every operation reported as ``observer(op, nbytes, seconds, ok)`` (for metrics).

    A missing key is an answer, not a failure: it is reported with ok=True.
    """

    def __init__(self, inner: Store, observer: Callable[[str, int, float, bool], None]):
        self.inner, self.observer = inner, observer
        self.url = inner.url

    def _timed(self, op: str, fn, nbytes: int = 0):
        start = time.perf_counter()
        ok = True
        try:
            result = fn()
            if isinstance(result, (bytes, bytearray)):
                nbytes = len(result)
            return result
        except KeyNotFound:
            raise
        except BaseException:
            ok = False
            raise
        finally:
            self.observer(op, nbytes, time.perf_counter() - start, ok)

    def put(self, key: str, data: bytes) -> None:
        self._timed("put", lambda: self.inner.put(key, data), len(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._timed("put_if_absent", lambda: self.inner.put_if_absent(key, data), len(data))

    def get(self, key: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
        return self._timed("get", lambda: self.inner.get(key, max_bytes))

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        return self._timed("list", lambda: self.inner.list(prefix, start_after))

    def delete(self, key: str) -> None:
        self._timed("delete", lambda: self.inner.delete(key))

    def exists(self, key: str) -> bool:
        return self._timed("exists", lambda: self.inner.exists(key))

    def describe(self) -> str:
        return self.inner.describe()


def open_store(url: str, **options) -> Store:
    """The store a URL names: a path or ``file://…`` (local), or ``s3://bucket/prefix``."""
    if url.startswith("s3://"):
        from rapid.infra.s3 import S3Store

        return S3Store(url, **options)
    if url.startswith("file://"):
        url = url[len("file://"):]
    elif "://" in url:
        raise InvalidKey(f"unsupported store URL scheme in {url!r} (use a path, file://… or s3://…)")
    return LocalStore(url)

"""Object stores: one small interface, backends chosen by URL (SPEC §4).

Usage::

    store = open_store("runs/demo")                 # or "file:///abs/path", "s3://bucket/prefix"
    store.put("experience/w0/000001.rxp", data)      # atomic: readers see all of it or nothing
    if store.put_if_absent("params/000000000007.rpm", blob): ...   # immutable objects
    for key in store.list("experience/"):            # sorted, relative to the store's root
        data = store.get(key)
        store.delete(key)

Keys are relative, '/'-separated, made of ``[A-Za-z0-9._-]`` segments; anything that could escape the
store's root (``..``, absolute paths, backslashes, empty segments) raises :class:`InvalidKey`.
"""

from __future__ import annotations

import abc
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
MAX_KEY_LENGTH = 512


class StoreError(Exception):
    """The store could not do what was asked (unreachable, permission, I/O). Usually transient."""


class KeyNotFound(StoreError, KeyError):
    """No object under that key."""


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
    def get(self, key: str) -> bytes:
        """The object's bytes; :class:`KeyNotFound` if absent."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every key that starts with ``prefix``, sorted."""

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
    """A folder on a local (or shared) file system. Atomic writes by temp file + rename."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

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

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise KeyNotFound(key) from e
        except OSError as e:
            raise StoreError(f"cannot read {key}: {e.strerror}") from e

    def list(self, prefix: str = "") -> list[str]:
        validate_prefix(prefix)
        # Walk only the deepest folder the prefix names, not the whole store.
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root / folder
        if not base.is_dir():
            return []
        keys = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if name.startswith(".tmp-"):
                    continue
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StoreError(f"cannot delete {key}: {e.strerror}") from e

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()


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

    def get(self, key: str) -> bytes:
        return self._timed("get", lambda: self.inner.get(key))

    def list(self, prefix: str = "") -> list[str]:
        return self._timed("list", lambda: self.inner.list(prefix))

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

"""One fetch per node, not per process: the rollout side's reads of parameters, snapshots and the pool go
through a folder shared by the processes of a node.

At the product card's scale every rollout process polling ``params/LATEST`` and downloading every version
itself is W GETs on one key per poll and W × the object's size per publish. Through a :class:`NodeCachedStore`
the first process of a node to need an object downloads it under a lock and writes it atomically into the
node's folder; the others read the file. Immutable objects (published versions, snapshots, pool revisions) are
kept until pruned; pointers (``params/LATEST``, ``league/pool.json``) are re-read from the store at most once
per ``ttl_s`` per node. Everything else, writes included, goes straight to the store.

The folder is ``<run dir>/node-cache/<run id>``: processes of one run on one node share it (MPI ranks, the
processes of ``rapid train``); in Kubernetes each pod is a node of its own unless its run dir is on a volume
shared by the pods of a node. The run id comes from ``layout.json``, so a new run in a reused store never reads
an old run's versions. What is read from the cache is decoded and checked like anything from the store.

Usage::

    >>> import tempfile
    >>> from rapid.infra.store import LocalStore
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> store.put("params/000000000001.rpm", b"v1"); store.put("params/LATEST", b"1")
    >>> cached = NodeCachedStore(store, tempfile.mkdtemp(), pointers={"params/LATEST": 5.0})
    >>> cached.get("params/LATEST"), cached.get("params/000000000001.rpm")   # fetched, then kept on the node
    (b'1', b'v1')
    >>> store.put("params/LATEST", b"2")
    >>> cached.get("params/LATEST")                      # within its 5 s: the node's copy
    b'1'
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rapid.infra.store import DEFAULT_MAX_BYTES, KeyNotFound, ObjectTooLarge, Store, validate_key
from rapid.store_map import PARAMS_LATEST, POOL_POINTER, POOL_REVISIONS_PREFIX, SNAPSHOTS_PREFIX

log = logging.getLogger(__name__)
IMMUTABLE = re.compile(r"params/[0-9]{12}\.rpm|" + re.escape(SNAPSHOTS_PREFIX) + r"[^/]+|"
                       + re.escape(POOL_REVISIONS_PREFIX) + r"[0-9]{12}\.json", re.ASCII)
MAX_FILES = 64
"""Immutable objects kept on a node; the least recently written go first."""


class NodeCachedStore(Store):
    def __init__(self, inner: Store, folder: str | os.PathLike, pointers: dict[str, float],
                 clock: Callable[[], float] = time.time, max_files: int = MAX_FILES):
        self.inner, self.url = inner, inner.url
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pointers, self.clock, self.max_files = dict(pointers), clock, max_files
        self.fetched = 0
        """Objects this process fetched from the store for the node (the others read them from the folder)."""

    def get(self, key: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
        ttl = self.pointers.get(key)
        if ttl is None and not IMMUTABLE.fullmatch(key):
            return self.inner.get(key, max_bytes)
        path = self.folder / hashlib.sha256(validate_key(key).encode()).hexdigest()[:32]
        data = self._shared(path, ttl, lambda: self._fetch(key, max_bytes, path))
        if len(data) > max_bytes:
            raise ObjectTooLarge(f"{key}: more than the {max_bytes} bytes allowed")
        return data

    def _shared(self, path: Path, ttl: float | None, fetch: Callable[[], bytes]) -> bytes:
        """The node's copy at ``path`` if fresh; else one process of the node runs ``fetch`` under a lock and
        writes the copy, and the others, waiting on the lock, read it."""
        data = self._fresh(path, ttl)
        if data is None:
            with open(path.with_name(f".{path.name}.lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                data = self._fresh(path, ttl)
                if data is None:
                    data = fetch()
                    self._write(path, data, immutable=ttl is None)
        return data

    def _fetch(self, key: str, max_bytes: int, path: Path) -> bytes:
        """From the store. A missing pointer (no pool yet) and the pool's next revision, which every reader
        probes at every refresh, are usually absent: their absence is remembered for the pointer's time to live
        (a missing version or snapshot is not)."""
        miss = path.with_name(f"{path.name}.missing")  # pruned like the objects
        miss_ttl = self.pointers.get(POOL_POINTER if key.startswith(POOL_REVISIONS_PREFIX) else key)
        if miss_ttl is not None and self._fresh(miss, miss_ttl) is not None:
            raise KeyNotFound(key)
        try:
            data = self.inner.get(key, max_bytes)
        except KeyNotFound:
            if miss_ttl is not None:
                self._write(miss, b"", immutable=False)
            raise
        self.fetched += 1
        return data

    def _fresh(self, path: Path, ttl: float | None) -> bytes | None:
        try:
            if ttl is not None and self.clock() - path.stat().st_mtime >= ttl:
                return None
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def _write(self, path: Path, data: bytes, immutable: bool) -> None:
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # atomic: a reader sees the whole object or none
            now = self.clock()
            os.utime(path, (now, now))  # freshness is the file's age on this cache's clock
            if immutable:
                self._prune()
        except OSError as e:  # a full or read-only folder costs the sharing, not the read
            log.warning("node cache %s not written: %s", self.folder, e)

    def _prune(self) -> None:
        files = [p for p in self.folder.iterdir() if not p.name.startswith(".")]
        if len(files) <= self.max_files + len(self.pointers):
            return
        files.sort(key=lambda p: p.stat().st_mtime)
        for p in files[:len(files) - self.max_files - len(self.pointers)]:
            p.unlink(missing_ok=True)

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.put_if_absent(key, data)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        """A reader of the pool lists its revisions when the pointer is missing: that listing is shared like
        the pointer; every other listing goes to the store."""
        ttl = self.pointers.get(POOL_POINTER)
        if prefix != POOL_REVISIONS_PREFIX or start_after is not None or ttl is None:
            return self.inner.list(prefix, start_after)
        data = self._shared(self.folder / "pool-revisions.list", ttl,
                            lambda: "\n".join(self.inner.list(prefix)).encode())
        return [k for k in data.decode().split("\n") if k]

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def describe(self) -> str:
        return self.inner.describe()


def rollout_store(store: Store, run_dir: str, run_id: str | None, setting: str, param_poll_s: float,
                  refresh_s: float) -> Store:
    """The store a rollout process reads through: node-cached unless ``setting`` is "off" or the run has no
    id (a layout of an older rapid)."""
    if setting == "off" or not run_id:
        return store
    folder = Path(setting or os.path.join(run_dir, "node-cache")) / run_id
    try:
        return NodeCachedStore(store, folder, {PARAMS_LATEST: param_poll_s, POOL_POINTER: refresh_s})
    except OSError as e:
        log.warning("no node cache (%s): every process reads the store itself", e)
        return store

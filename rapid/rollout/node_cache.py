"""One fetch per node, not per process: the rollout side's reads of parameters, snapshots and the pool go
through a folder shared by the processes of a node.

At the product card's scale every rollout process polling ``params/LATEST`` and downloading every version
itself is W GETs on one key per poll and W × the object's size per publish. Through a :class:`NodeCachedStore`
the first process of a node to need an object fetches it and writes it atomically into the node's folder; the
others read the file. Immutable objects (published versions, snapshots, pool revisions) are kept until pruned;
pointers (``params/LATEST``, ``league/pool.json``) are re-read from the store at most once per ``ttl_s`` per
node. Everything else, writes included, goes straight to the store.

No lock is held across a request to the store: a GET that hangs (up to the store's 60 s read timeout) must not
stall the node's other pollers. The process that fetches first *claims* the object (a claim file with the
claim's time, written under the folder's lock, which is held only for such file operations); while a claim is
younger than its lease the node's other processes serve their cached copy of a pointer, or wait for an object
they have no copy of. A claim older than its lease (a pointer's time to live; for other objects the shortest
one, the parameter poll interval) is taken over, so a hung GET costs the node at most one poll interval; the
late answer of a claim that was taken over is returned to its caller but not written (the node's copy is at
least as new). A download that legitimately takes longer than the lease is taken over too: at most one more
download per lease, never one per process.

The folder must be local to the node and shared by its rollout processes: ``rollout.node_cache_dir`` (default
``<run dir>/node-cache``) plus the run id. The shipped Kubernetes Deployment mounts one hostPath folder of the
node into every rollout pod; the Slurm script points it at the node's ``/tmp``, not at the run dir on the
shared file system (docs/cluster.md). The run id comes from ``layout.json``, so a new run in a reused store
never reads an old run's versions. What is read from the cache is decoded and checked like anything from the
store.

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

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from rapid.infra.store import DEFAULT_MAX_BYTES, KeyNotFound, ObjectTooLarge, Store, validate_key
from rapid.run.store_map import PARAMS_LATEST, POOL_POINTER, POOL_REVISIONS_PREFIX, SNAPSHOTS_PREFIX

log = logging.getLogger(__name__)
IMMUTABLE = re.compile(r"params/[0-9]{12}\.rpm|" + re.escape(SNAPSHOTS_PREFIX) + r"[^/]+|"
                       + re.escape(POOL_REVISIONS_PREFIX) + r"[0-9]{12}\.json", re.ASCII)
MAX_FILES = 64
"""Immutable objects kept on a node; the least recently written go first."""
DEFAULT_LEASE_S = 5.0
"""A claim's lease when the cache has no pointers to take it from (the default parameter poll interval)."""
WAIT_S = 0.05
"""How often a process waiting for an object another process has claimed looks again."""


class _Claim(NamedTuple):
    token: str
    at: float  # on the claimant's clock
    mine: bool


def _claim_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.claim")


class NodeCachedStore(Store):
    def __init__(self, inner: Store, folder: str | os.PathLike, pointers: dict[str, float],
                 clock: Callable[[], float] = time.time, max_files: int = MAX_FILES,
                 sleep: Callable[[float], None] = time.sleep):
        """``clock`` dates the node's copies and claims; ``sleep`` is how a process waits for an object another
        one has claimed (a simulation on one thread passes one that moves its simulated clock)."""
        self.inner, self.url = inner, inner.url
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pointers, self.clock, self.sleep, self.max_files = dict(pointers), clock, sleep, max_files
        self.lease_s = min(self.pointers.values(), default=DEFAULT_LEASE_S)
        """How long a claim on an object other than a pointer holds off the node's other processes."""
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
        """The node's copy at ``path`` if fresh; else this process claims it and runs ``fetch``, unless another
        process holds a live claim: then the node's copy, stale or not, or, with no copy yet, wait until the
        copy appears or the claim has lasted its lease and take it over. The lease runs on the clock and, for
        a clock that does not move while this thread waits (a simulation's), in the time waited."""
        lease = self.lease_s if ttl is None else ttl
        watching, waited, force = "", 0.0, None
        while (data := self._fresh(path, ttl)) is None:
            claim = self._claim(path, lease, force)
            if claim.mine:
                return self._fetch_claimed(path, ttl, claim.token, fetch)
            if (data := self._read(path)) is not None:
                return data  # a pointer another process is refreshing: the node's copy meanwhile
            if claim.token != watching:
                watching, waited = claim.token, 0.0  # a new claim (a takeover): its lease starts now
            self.sleep(WAIT_S)
            waited += WAIT_S
            force = watching if waited >= lease else None
        return data

    def _claim(self, path: Path, lease: float, force: str | None) -> _Claim:
        """Claims ``path`` for this process unless a claim younger than ``lease`` is held (``force``: that
        claim's token, taken over whatever its age). A folder that cannot be written gives an unshared claim:
        the fetch goes on, only the sharing is lost."""
        token = os.urandom(8).hex()
        try:
            with self._locked():
                held = self._held(path)
                if held is not None and held.token != force and self.clock() - held.at < lease:
                    return held
                _claim_path(path).write_text(f"{self.clock()!r} {token}")
        except OSError as e:
            log.warning("node cache %s: no claim (%s)", self.folder, e)
        return _Claim(token, 0.0, mine=True)

    def _fetch_claimed(self, path: Path, ttl: float | None, token: str, fetch: Callable[[], bytes]) -> bytes:
        """Fetches under this process's claim; the copy is written only if the claim is still this process's
        (one taken over after its lease leaves the node the taker's copy, at least as new)."""
        staged = None
        try:
            data = self._fresh(path, ttl)  # another process may have written it just before the claim
            if data is None:
                data = fetch()
                staged = self._stage(data)
            return data
        finally:
            self._release(path, token, staged, immutable=ttl is None)

    def _release(self, path: Path, token: str, staged: Path | None, immutable: bool) -> None:
        try:
            with self._locked():
                held = self._held(path)
                if held is not None and held.token == token:
                    if staged is not None:
                        self._place(staged, path)
                        staged = None
                        if immutable:
                            self._prune()
                    _claim_path(path).unlink()
        except OSError as e:  # a full or read-only folder costs the sharing, not the read
            log.warning("node cache %s not written: %s", self.folder, e)
        finally:
            if staged is not None:
                staged.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _locked(self):
        """The folder's lock: held only around claim and rename operations on local files, never across a
        request to the store."""
        with open(self.folder / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _held(self, path: Path) -> _Claim | None:
        try:
            at, token = _claim_path(path).read_text().split()
            return _Claim(token, float(at), mine=False)
        except (FileNotFoundError, ValueError):  # none, or one cut short by a full disk: nobody's
            return None

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
                try:
                    self._place(self._stage(b""), miss)
                except OSError as e:
                    log.warning("node cache %s not written: %s", self.folder, e)
            raise
        self.fetched += 1
        return data

    def _fresh(self, path: Path, ttl: float | None) -> bytes | None:
        try:
            if ttl is not None and self.clock() - path.stat().st_mtime >= ttl:
                return None
        except FileNotFoundError:
            return None
        return self._read(path)

    @staticmethod
    def _read(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def _stage(self, data: bytes) -> Path | None:
        """``data`` in a new file of the folder, to be renamed into place (None if it cannot be written)."""
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return Path(tmp)
        except OSError as e:
            log.warning("node cache %s not written: %s", self.folder, e)
            return None

    def _place(self, staged: Path | None, path: Path) -> None:
        if staged is None:
            return
        os.replace(staged, path)  # atomic: a reader sees the whole object or none
        now = self.clock()
        os.utime(path, (now, now))  # freshness is the file's age on this cache's clock

    def _prune(self) -> None:
        files = [p for p in self.folder.iterdir() if not p.name.startswith(".")]
        if len(files) <= self.max_files + len(self.pointers):
            return
        files.sort(key=lambda p: p.stat().st_mtime)
        for p in files[:len(files) - self.max_files - len(self.pointers)]:
            p.unlink(missing_ok=True)
            _claim_path(p).unlink(missing_ok=True)  # one left by a process that died while fetching

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

"""The optimizer's loader thread: lists new experience objects, takes this rank's share, downloads them
and has them decoded and validated (in worker processes when ``decode_workers`` > 0) into the buffer.

Bad objects are counted and skipped: undecodable, invalid, or stamped with a policy version the optimizer
has not reached yet (``current_version``). Their keys are remembered, so a poll never downloads or counts
one twice, and retention deletes them like consumed ones. No exception ends the loader thread: each is
counted, logged and skipped; if the thread dies anyway, ``failure`` says why and the role stops.

Usage::

    >>> import tempfile
    >>> import numpy as np
    >>> from rapid.formats.experience import ExperienceBatch, encode_experience
    >>> from rapid.infra.store import LocalStore
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> shape = Shape(bptt=4, obs_dim=3, mask_dim=2, heads=1, lstm=8)
    >>> arrays = {name: np.zeros((2, *dims), dtype) for name, (dtype, dims) in shape.fields().items()}
    >>> arrays["mask"][:] = True
    >>> game = {"learner_version": 0, "opponent": "latest", "learner_side": 0, "winner": "learner", "length": 9,
    ...         "learner_return": 1.0}
    >>> store.put("experience/w0/a1b2-00000000.rxp", encode_experience(ExperienceBatch(
    ...     "w0", 0, 0.0, arrays, ["latest"], episodes=[game])))             # what an Uploader writes
    >>> buffer = ExperienceBuffer(capacity=64, max_staleness=8)
    >>> loader = ExperienceLoader(store, shape, buffer, rank=0, world=1, poll_s=0.5, retention_s=600,
    ...                           decode_workers=0, current_version=lambda: 0)   # 0: decode inline
    >>> loader.poll_once()                 # what the loader thread does every poll_s: objects loaded
    1
    >>> buffer.stats().received, loader.stats.bad_objects
    (2, 0)
    >>> [g["winner"] for g in loader.take_episodes()]      # finished games reported with the experience
    ['learner']
    >>> loader.start()
    >>> loader.failure is None             # None while the thread runs (or was stopped)
    True
    >>> loader.stop()
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rapid.decode_pool import Decoded, DecodePool
from rapid.formats.experience import LIMITS, Shape
from rapid.infra.store import BadObject, InvalidKey, KeyNotFound, Store, StoreError
from rapid.opt.buffer import ExperienceBuffer

log = logging.getLogger(__name__)


@dataclass
class LoaderStats:
    objects: int = 0
    samples: int = 0
    bytes: int = 0
    bad_objects: int = 0
    store_errors: int = 0
    errors: int = 0
    """Unexpected exceptions caught in the loader thread (each logged, the thread went on)."""
    deleted: int = 0
    env_steps: int = 0


def owner_rank(key: str, world: int) -> int:
    """Which optimizer rank consumes an object: a stable, well-mixed hash, so shares are disjoint and
    consecutive objects of one worker spread over the ranks (crc32 keeps long runs on one rank)."""
    # surrogateescape: a listed file name that is not UTF-8 must not kill the loader thread here
    digest = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % world


class ExperienceLoader:
    def __init__(self, store: Store, shape: Shape, buffer: ExperienceBuffer, rank: int = 0, world: int = 1,
                 poll_s: float = 0.5, retention_s: float = 600.0, on_bad=None, on_load=None,
                 decode_workers: int = 0, current_version: Callable[[], int] | None = None):
        self.store, self.shape, self.buffer = store, shape, buffer
        self.rank, self.world = rank, world
        self.poll_s, self.retention_s = poll_s, retention_s
        self.on_bad, self.on_load = on_bad, on_load
        self.current_version = current_version
        self.decoder = DecodePool(shape, decode_workers)
        self.stats = LoaderStats()
        self.failure: str | None = None
        self._seen: set[str] = set()
        self._done_at: deque[tuple[float, str]] = deque()
        self._episodes: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"loader-{rank}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=30)
        self.decoder.close()

    def take_episodes(self) -> list[dict]:
        with self._lock:
            out, self._episodes = self._episodes, []
        return out

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self.poll_once()
                except StoreError as e:
                    self.stats.store_errors += 1
                    log.warning("listing experience failed: %s", e)
                except Exception as e:  # MemoryError included: count, log, go on
                    self.stats.errors += 1
                    log.error("loader: unexpected %s, going on: %s", type(e).__name__, e)
                self._stop.wait(self.poll_s)
        finally:
            if not self._stop.is_set():
                self.failure = "the experience loader thread ended unexpectedly"

    def poll_once(self) -> int:
        """Load every new object of this rank's share; returns how many were loaded."""
        loaded = 0
        pending: deque = deque()
        for key in self.store.list("experience/"):
            if key in self._seen or owner_rank(key, self.world) != self.rank or not key.endswith(".rxp"):
                continue
            if self._stop.is_set():
                break
            self._seen.add(key)
            try:
                started = self._start(key)
            except Exception as e:  # one object's trouble, whatever it is, costs that object only
                self.stats.errors += 1
                self._bad(key, f"unexpected {type(e).__name__}: {e}")
                continue
            if started:
                pending.append(started)
            while len(pending) >= self.decoder.max_pending:
                loaded += self._finish(*pending.popleft())
        while pending:
            loaded += self._finish(*pending.popleft())
        self._expire()
        return loaded

    def _start(self, key: str):
        """Download ``key`` and hand it to a decoder: (key, size, seconds, future), or None."""
        t0 = time.perf_counter()
        try:
            data = self.store.get(key, max_bytes=LIMITS.max_bytes)
        except KeyNotFound:
            return None  # deleted by retention elsewhere
        except (InvalidKey, BadObject) as e:  # BadObject: too large, not a regular file; nothing was read
            # A listed name the store refuses to read (odd characters put there behind rapid's back):
            # a bad object like any other, not a reason for the loader thread to die.
            self._bad(key, str(e))
            return None
        except StoreError as e:
            self.stats.store_errors += 1
            self._seen.discard(key)  # try again next poll
            log.warning("download of %s failed: %s", key, e)
            return None
        return key, len(data), time.perf_counter() - t0, self.decoder.submit(data)

    def _finish(self, key: str, size: int, seconds: float, future) -> int:
        try:
            result = self.decoder.result(future)
            if not isinstance(result, Decoded):
                return self._bad(key, result.why)
            if self.current_version is not None and result.max_version > self.current_version():
                return self._bad(key, f"future policy version {result.max_version} "
                                      f"(the optimizer is at {self.current_version()})")
            self.buffer.add(result.arrays)
        except Exception as e:
            self.stats.errors += 1
            return self._bad(key, f"unexpected {type(e).__name__}: {e}")
        self.stats.objects += 1
        self.stats.samples += result.num_samples
        self.stats.bytes += size
        self.stats.env_steps += result.env_steps
        with self._lock:
            self._episodes.extend(result.episodes)
        self._done_at.append((time.time(), key))
        if self.on_load:
            self.on_load(result.num_samples, size, seconds)
        return 1

    def _bad(self, key: str, why: str) -> int:
        self.stats.bad_objects += 1
        self._done_at.append((time.time(), key))  # retention removes it like a consumed object
        log.warning("skipping bad experience object %r: %s", key, why)
        if self.on_bad:
            self.on_bad(key, why)
        return 0

    def _expire(self) -> None:
        """Delete objects (loaded or bad) older than the retention time: a long run must not fill the bucket."""
        if self.retention_s <= 0:
            return
        cutoff = time.time() - self.retention_s
        removed = 0
        while self._done_at and self._done_at[0][0] < cutoff:
            _, key = self._done_at.popleft()
            try:
                self.store.delete(key)
                self.stats.deleted += 1
                removed += 1
                self._seen.discard(key)
            except (StoreError, InvalidKey) as e:
                self.stats.store_errors += 1
                log.warning("retention could not delete %s: %s", key, e)
        if removed:
            log.info("retention: deleted %d experience object(s) older than %gs (%d in all)",
                     removed, self.retention_s, self.stats.deleted)

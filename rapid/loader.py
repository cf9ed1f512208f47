"""The optimizer's loader thread: lists new experience objects, takes this rank's share, downloads,
decodes and validates them into the buffer; bad objects are counted and skipped.

Usage::

    loader = ExperienceLoader(store, shape, buffer, rank=0, world=1, poll_s=0.5, retention_s=600)
    loader.start()
    episodes = loader.take_episodes()      # finished games reported with the experience
    loader.stop()
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from rapid.errors import FormatError
from rapid.formats.experience import Shape, decode_experience
from rapid.infra.store import InvalidKey, KeyNotFound, Store, StoreError
from rapid.opt.buffer import ExperienceBuffer

log = logging.getLogger(__name__)


@dataclass
class LoaderStats:
    objects: int = 0
    samples: int = 0
    bytes: int = 0
    bad_objects: int = 0
    store_errors: int = 0
    deleted: int = 0
    env_steps: int = 0
    download_s: float = 0.0


def owner_rank(key: str, world: int) -> int:
    """Which optimizer rank consumes an object: a stable, well-mixed hash, so shares are disjoint and
    consecutive objects of one worker spread over the ranks (crc32 keeps long runs on one rank)."""
    # surrogateescape: a listed file name that is not UTF-8 must not kill the loader thread here
    digest = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % world


class ExperienceLoader:
    def __init__(self, store: Store, shape: Shape, buffer: ExperienceBuffer, rank: int = 0, world: int = 1,
                 poll_s: float = 0.5, retention_s: float = 600.0, on_bad=None, on_load=None):
        self.store, self.shape, self.buffer = store, shape, buffer
        self.rank, self.world = rank, world
        self.poll_s, self.retention_s = poll_s, retention_s
        self.on_bad, self.on_load = on_bad, on_load
        self.stats = LoaderStats()
        self._seen: set[str] = set()
        self._loaded_at: deque[tuple[float, str]] = deque()
        self._episodes: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"loader-{rank}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def take_episodes(self) -> list[dict]:
        with self._lock:
            out, self._episodes = self._episodes, []
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except StoreError as e:
                self.stats.store_errors += 1
                log.warning("listing experience failed: %s", e)
            self._stop.wait(self.poll_s)

    def poll_once(self) -> int:
        """Load every new object of this rank's share; returns how many were loaded."""
        loaded = 0
        for key in self.store.list("experience/"):
            if key in self._seen or owner_rank(key, self.world) != self.rank or not key.endswith(".rxp"):
                continue
            if self._stop.is_set():
                break
            loaded += self._load(key)
        self._expire()
        return loaded

    def _load(self, key: str) -> int:
        t0 = time.perf_counter()
        try:
            data = self.store.get(key)
        except KeyNotFound:
            self._seen.add(key)  # deleted by retention elsewhere
            return 0
        except InvalidKey as e:
            # A listed name the store refuses to read (odd characters put there behind rapid's back):
            # a bad object like any other, not a reason for the loader thread to die.
            self._seen.add(key)
            return self._bad(key, str(e))
        except StoreError as e:
            self.stats.store_errors += 1
            log.warning("download of %s failed: %s", key, e)
            return 0
        seconds = time.perf_counter() - t0
        self._seen.add(key)
        try:
            batch = decode_experience(data, self.shape)
        except FormatError as e:
            return self._bad(key, str(e))
        self.buffer.add(batch.arrays)
        self.stats.objects += 1
        self.stats.samples += batch.num_samples
        self.stats.bytes += len(data)
        self.stats.env_steps += batch.env_steps
        self.stats.download_s += seconds
        with self._lock:
            self._episodes.extend(batch.episodes)
        self._loaded_at.append((time.time(), key))
        if self.on_load:
            self.on_load(batch.num_samples, len(data), seconds)
        return 1

    def _bad(self, key: str, why: str) -> int:
        self.stats.bad_objects += 1
        log.warning("skipping bad experience object %r: %s", key, why)
        if self.on_bad:
            self.on_bad(key, why)
        return 0

    def _expire(self) -> None:
        """Delete loaded objects older than the retention time: a long run must not fill the bucket."""
        if self.retention_s <= 0:
            return
        cutoff = time.time() - self.retention_s
        removed = 0
        while self._loaded_at and self._loaded_at[0][0] < cutoff:
            _, key = self._loaded_at.popleft()
            try:
                self.store.delete(key)
                self.stats.deleted += 1
                removed += 1
                self._seen.discard(key)
            except StoreError as e:
                self.stats.store_errors += 1
                log.warning("retention could not delete %s: %s", key, e)
        if removed:
            log.info("retention: deleted %d consumed experience object(s) older than %gs (%d in all)",
                     removed, self.retention_s, self.stats.deleted)

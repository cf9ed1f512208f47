"""Uploads experience from a background thread, so stepping never waits on the store.

Usage::

    >>> import tempfile
    >>> from rapid.formats.experience import Shape
    >>> from rapid.infra.store import LocalStore
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> shape = Shape(bptt=4, obs_dim=3, mask_dim=2, heads=1, lstm=8)
    >>> arrays = {name: np.zeros((2, *dims), dtype) for name, (dtype, dims) in shape.fields().items()}
    >>> segment = Segment(arrays, opponents=["latest"])      # what RolloutWorker.collect returns: 2 samples
    >>> up = Uploader(store, worker="w0", interval_s=60, max_backlog=8)
    >>> up.start()
    >>> up.add(segment)            # from the stepping loop; returns at once
    >>> up.stop()                  # flushes what is pending (best effort) and joins
    >>> up.stats.objects, up.stats.samples, up.stats.dropped_objects
    (1, 2, 0)
    >>> store.list("experience/w0/")
    ['experience/w0/...-00000000.rxp']

Every ``interval_s`` the pending segments become one experience object. If the store is unreachable
the encoded objects wait in a backlog of at most ``max_backlog``; past that the oldest are dropped and
counted, so memory stays bounded through an outage and nothing newer is lost.

Sealing and uploading run on two threads: a store that hangs (a stopped server accepts connections but
never answers, and a read timeout can be a minute) holds up only the uploading thread, while sealing goes
on every ``interval_s`` and the bound holds: at most ``max_backlog`` objects waiting plus the one in flight.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass

import numpy as np

from rapid.formats.experience import ExperienceBatch, encode_experience
from rapid.infra.store import Store, StoreError
from rapid.rollout_worker import Segment
from rapid.store_map import experience_key

log = logging.getLogger(__name__)


@dataclass
class UploadStats:
    objects: int = 0
    samples: int = 0
    bytes: int = 0
    failures: int = 0
    dropped_objects: int = 0
    dropped_samples: int = 0
    backlog: int = 0
    last_upload_s: float = 0.0


class Uploader:
    def __init__(self, store: Store, worker: str, interval_s: float, max_backlog: int, on_upload=None,
                 on_episodes=None, on_failure=None, on_drop=None):
        self.store, self.worker = store, worker
        self.interval_s, self.max_backlog = interval_s, max_backlog
        self.incarnation = f"{int(time.time())}{os.getpid() % 100000:05d}{uuid.uuid4().hex[:6]}"
        self.on_upload, self.on_episodes = on_upload, on_episodes
        self.on_failure, self.on_drop = on_failure, on_drop
        self.stats = UploadStats()
        self._pending: list[Segment] = []
        self._backlog: collections.deque[tuple[str, bytes, int]] = collections.deque()
        self._episodes: list[tuple[list[dict], float]] = []  # match results for on_episodes, sealed not yet sent
        self._inflight = 0
        self._seq = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._sealer = threading.Thread(target=self._seal_loop, name=f"sealer-{worker}", daemon=True)
        self._thread = threading.Thread(target=self._drain_loop, name=f"uploader-{worker}", daemon=True)

    def start(self) -> None:
        self._sealer.start()
        self._thread.start()

    def add(self, segment: Segment) -> None:
        with self._lock:
            self._pending.append(segment)

    def _seal(self) -> None:
        """Turn pending segments into one encoded object at the back of the backlog."""
        with self._lock:
            segments, self._pending = self._pending, []
        segments = [s for s in segments if s.arrays["version"].size or s.episodes]
        if not segments:
            return
        opponents = sorted({o for s in segments for o in s.opponents})
        arrays = {}
        for key in segments[0].arrays:
            parts = []
            for s in segments:
                value = s.arrays[key]
                if key == "opponent":  # re-index into the merged opponent list
                    value = np.array([opponents.index(s.opponents[i]) for i in value], dtype=np.int32)
                parts.append(value)
            arrays[key] = np.concatenate(parts)
        batch = ExperienceBatch(worker=self.worker, seq=self._seq, created=time.time(), arrays=arrays,
                                opponents=opponents, episodes=[e for s in segments for e in s.episodes],
                                env_steps=sum(s.env_steps for s in segments))
        key = experience_key(self.worker, self.incarnation, self._seq)
        self._seq += 1
        data = encode_experience(batch)
        with self._wake:
            if self.on_episodes and batch.episodes:
                # Reported by the uploading thread: writing them is store I/O that may hang.
                self._episodes.append((batch.episodes, batch.created))
                del self._episodes[:-1000]  # bounded through a long outage
            self._backlog.append((key, data, batch.num_samples))
            self._trim()
            self._wake.notify_all()

    def _trim(self) -> None:
        """Drop the oldest waiting objects past the bound (caller holds the lock)."""
        while len(self._backlog) > self.max_backlog:
            _, _, samples = self._backlog.popleft()
            self.stats.dropped_objects += 1
            self.stats.dropped_samples += samples
            if self.on_drop:
                self.on_drop(samples)
            log.warning("upload backlog full: dropped the oldest experience object (%d samples)", samples)
        self.stats.backlog = len(self._backlog) + self._inflight

    def _report_episodes(self) -> None:
        with self._lock:
            batches, self._episodes = self._episodes, []
        for episodes, created in batches:
            self.on_episodes(episodes, created)

    def _upload_one(self) -> bool | None:
        """Upload the oldest waiting object: True if done, False if the store failed, None if none waits."""
        with self._wake:
            if not self._backlog:
                return None
            key, data, samples = item = self._backlog.popleft()
            self._inflight = 1
        t0 = time.perf_counter()
        try:
            self.store.put(key, data)
        except StoreError as e:
            with self._wake:
                self._inflight = 0
                self._backlog.appendleft(item)  # first in line again; the bound may now drop it
                self.stats.failures += 1
                self._trim()
            if self.on_failure:
                self.on_failure()
            log.warning("upload of %s failed (%s); %d object(s) waiting", key, e, self.stats.backlog)
            return False
        with self._wake:
            self._inflight = 0
            self.stats.backlog = len(self._backlog)
            self.stats.objects += 1
            self.stats.samples += samples
            self.stats.bytes += len(data)
            self.stats.last_upload_s = time.perf_counter() - t0
        if self.on_upload:
            self.on_upload(samples, len(data), self.stats.last_upload_s)
        return True

    def _drain(self) -> None:
        """Upload what waits, oldest first, until the backlog is empty or the store fails."""
        if self.on_episodes:
            self._report_episodes()
        while self._upload_one():
            pass

    def _seal_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._seal()

    def _drain_loop(self) -> None:
        while not self._stop.is_set():
            with self._wake:
                while not (self._backlog or self._episodes or self._stop.is_set()):
                    self._wake.wait()
            if self._stop.is_set():
                return  # stop() flushes what is left
            if self.on_episodes:
                self._report_episodes()
            if self._upload_one() is False:
                self._stop.wait(self.interval_s)  # botocore has retried already; try again next interval

    def flush(self) -> None:
        self._seal()
        self._drain()

    def stop(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        self._sealer.join(timeout=self.interval_s + 30)
        self._thread.join(timeout=30)  # a hung upload is abandoned (daemon thread); its object is lost
        self.flush()

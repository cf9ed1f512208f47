"""Uploads experience from a background thread, so stepping never waits on the store.

Usage::

    up = Uploader(store, worker="w0", interval_s=60, max_backlog=8)
    up.start()
    up.add(segment)            # from the stepping loop; returns at once
    up.stop()                  # flushes what is pending (best effort) and joins

Every ``interval_s`` the pending segments become one experience object. If the store is unreachable
the encoded objects wait in a backlog of at most ``max_backlog``; past that the oldest are dropped and
counted, so memory stays bounded through an outage and nothing newer is lost.
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

from rapid.experience import ExperienceBatch, encode_experience, experience_key
from rapid.infra.store import Store, StoreError
from rapid.rollout import Segment

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
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"uploader-{worker}", daemon=True)

    def start(self) -> None:
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
        if self.on_episodes and batch.episodes:
            self.on_episodes(batch.episodes, batch.created)
        key = experience_key(self.worker, self.incarnation, self._seq)
        self._seq += 1
        self._backlog.append((key, encode_experience(batch), batch.num_samples))
        while len(self._backlog) > self.max_backlog:
            _, _, samples = self._backlog.popleft()
            self.stats.dropped_objects += 1
            self.stats.dropped_samples += samples
            if self.on_drop:
                self.on_drop(samples)
            log.warning("upload backlog full: dropped the oldest experience object (%d samples)", samples)

    def _drain(self) -> None:
        while self._backlog:
            key, data, samples = self._backlog[0]
            t0 = time.perf_counter()
            try:
                self.store.put(key, data)
            except StoreError as e:
                self.stats.failures += 1
                if self.on_failure:
                    self.on_failure()
                log.warning("upload of %s failed (%s); %d object(s) waiting", key, e, len(self._backlog))
                self.stats.backlog = len(self._backlog)
                return
            self._backlog.popleft()
            self.stats.objects += 1
            self.stats.samples += samples
            self.stats.bytes += len(data)
            self.stats.last_upload_s = time.perf_counter() - t0
            if self.on_upload:
                self.on_upload(samples, len(data), self.stats.last_upload_s)
        self.stats.backlog = len(self._backlog)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._seal()
            self._drain()
            self.stats.backlog = len(self._backlog)

    def flush(self) -> None:
        self._seal()
        self._drain()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 30)
        self.flush()

"""Uploads experience from a background thread, so stepping never waits on the store.

Usage::

    >>> import tempfile
    >>> from rapid.formats.experience import Shape
    >>> from rapid.infra.store import LocalStore
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> shape = Shape(bptt=4, obs_dim=3, mask_dim=2, heads=1, lstm=8)
    >>> arrays = {name: np.zeros((2, *dims), dtype) for name, (dtype, dims) in shape.fields().items()}
    >>> arrays["mask"][:] = True     # readers refuse a step on which every action is forbidden
    >>> segment = Segment(arrays, opponents=["latest"])      # what RolloutWorker.collect returns: 2 samples
    >>> up = Uploader(store, worker="w0", interval_s=60, max_backlog=8, shards=1)   # shards: layout.json's
    >>> up.start()
    >>> up.add(segment)            # from the stepping loop; returns at once
    >>> up.stop()                  # flushes what is pending (best effort) and joins
    >>> up.stats.objects, up.stats.samples, up.stats.dropped_objects
    (1, 2, 0)
    >>> store.list("experience/s0000/")
    ['experience/s0000/...-w0-...-00000000.rxp']

Every ``interval_s`` (the first time as soon as a sample waits) the pending segments become one experience
object (several, if one would pass the readers' size limits). An object's key is named when its upload starts,
in one of the run's shards (``rapid.run.store_map``): the time in the name is the upload's, not the seal's, so
an object that waited out an outage is still listed by a reader's cursor. If the store is unreachable the encoded
objects wait in a backlog of at most ``max_backlog`` objects and ``max_backlog_bytes``; past either the oldest are
dropped and counted, so memory stays bounded through an outage and nothing newer is lost.

Sealing and uploading run on two threads: a store that hangs (a stopped server accepts connections but
never answers, and a read timeout can be a minute) holds up only the uploading thread, while sealing goes
on every ``interval_s`` and the bound holds: at most ``max_backlog`` objects waiting plus the one in flight.
Each thread's step is public (``seal``, ``upload_pending``): the scale model runs them in simulated time
instead of starting the threads.
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

from rapid.errors import FormatError
from rapid.formats.experience import ExperienceBatch, encode_experience, samples_per_object
from rapid.infra.store import Store, StoreError
from rapid.rollout.worker import Segment
from rapid.run.store_map import experience_key, object_shard

log = logging.getLogger(__name__)


@dataclass
class UploadStats:
    objects: int = 0
    samples: int = 0
    bytes: int = 0
    failures: int = 0
    dropped_objects: int = 0
    dropped_samples: int = 0
    refused_objects: int = 0
    """Objects the encoder refused (readers would): a bug in what the worker produced, never uploaded."""
    refused_samples: int = 0
    backlog: int = 0
    backlog_bytes: int = 0
    last_upload_s: float = 0.0


@dataclass
class _Waiting:
    """An encoded object in the backlog; its key is fixed at its first upload attempt (a retry after an
    ambiguous failure must not write the same object twice under two names)."""

    data: bytes
    samples: int
    seq: int
    key: str | None = None


class Uploader:
    def __init__(self, store: Store, worker: str, interval_s: float, max_backlog: int, shards: int = 1,
                 max_backlog_bytes: int = 256 << 20, on_upload=None, on_failure=None, on_drop=None,
                 clock=time.time, max_object_samples: int = 0, incarnation: str | None = None):
        self.store, self.worker, self.shards = store, worker, shards
        self.interval_s, self.max_backlog, self.max_backlog_bytes = interval_s, max_backlog, max_backlog_bytes
        # Unique to this process's life (a restarted worker's keys never collide with its old ones); a seeded
        # simulation passes its own to be repeatable.
        self.incarnation = incarnation or f"{int(time.time())}{os.getpid() % 100000:05d}{uuid.uuid4().hex[:6]}"
        self.on_upload, self.on_failure, self.on_drop = on_upload, on_failure, on_drop
        self.clock = clock
        self.max_object_samples = max_object_samples
        self.stats = UploadStats()
        self._pending: list[Segment] = []
        self._backlog: collections.deque[_Waiting] = collections.deque()
        self._inflight = 0
        self._seq = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._first_sample = threading.Event()
        """A sample is pending (or the uploader stops): the first object's seal waits for this, not the interval."""
        self._sealer = threading.Thread(target=self._seal_loop, name=f"sealer-{worker}", daemon=True)
        self._thread = threading.Thread(target=self._drain_loop, name=f"uploader-{worker}", daemon=True)

    def start(self) -> None:
        self._sealer.start()
        self._thread.start()

    def add(self, segment: Segment) -> None:
        with self._lock:
            self._pending.append(segment)
        if segment.arrays["version"].size:
            self._first_sample.set()

    def seal(self) -> None:
        """Turn pending segments into encoded objects at the back of the backlog."""
        with self._lock:
            segments, self._pending = self._pending, []
        segments = [s for s in segments if s.arrays["version"].size or s.episodes]
        if not any(s.arrays["version"].size for s in segments):
            # Games but no samples yet (a worker's first segment holds its samples back for GAE): an object
            # needs samples, so the games wait for the next one.
            with self._lock:
                self._pending[:0] = segments
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
        episodes = [e for s in segments for e in s.episodes]
        env_steps = sum(s.env_steps for s in segments)
        rows = int(arrays["version"].shape[0])
        step = self.max_object_samples or samples_per_object(arrays)
        for start in range(0, max(rows, 1), step):
            part = {k: v[start:start + step] for k, v in arrays.items()}
            first = start == 0  # the games and steps travel with the first part
            batch = ExperienceBatch(worker=self.worker, seq=self._seq, created=self.clock(), arrays=part,
                                    opponents=opponents, episodes=episodes if first else [],
                                    env_steps=env_steps if first else 0)
            try:
                waiting = _Waiting(encode_experience(batch), batch.num_samples, self._seq)
            except FormatError as e:  # every reader would refuse it: count it, never store it, keep sealing
                self.stats.refused_objects += 1
                self.stats.refused_samples += batch.num_samples
                log.error("experience object of %d samples refused before upload: %s", batch.num_samples, e)
                continue
            self._seq += 1
            with self._wake:
                self._backlog.append(waiting)
                self._trim()
                self._wake.notify_all()

    def _trim(self) -> None:
        """Drop the oldest waiting objects past either bound (caller holds the lock); the newest stays."""
        held = sum(len(w.data) for w in self._backlog)
        while len(self._backlog) > self.max_backlog or (held > self.max_backlog_bytes and len(self._backlog) > 1):
            dropped = self._backlog.popleft()
            held -= len(dropped.data)
            self.stats.dropped_objects += 1
            self.stats.dropped_samples += dropped.samples
            if self.on_drop:
                self.on_drop(dropped.samples)
            log.warning("upload backlog full: dropped the oldest experience object (%d samples)", dropped.samples)
        self.stats.backlog = len(self._backlog) + self._inflight
        self.stats.backlog_bytes = held

    def _key(self, waiting: _Waiting) -> str:
        if waiting.key is None:
            shard = object_shard(f"{self.worker}-{self.incarnation}", waiting.seq, self.shards)
            waiting.key = experience_key(shard, int(self.clock() * 1000), self.worker, self.incarnation, waiting.seq)
        return waiting.key

    def _upload_one(self) -> bool | None:
        """Upload the oldest waiting object: True if done, False if the store failed, None if none waits."""
        with self._wake:
            if not self._backlog:
                return None
            item = self._backlog.popleft()
            self._inflight = 1
        key, data, samples = self._key(item), item.data, item.samples
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
            self.stats.backlog_bytes = sum(len(w.data) for w in self._backlog)
            self.stats.objects += 1
            self.stats.samples += samples
            self.stats.bytes += len(data)
            self.stats.last_upload_s = time.perf_counter() - t0
        if self.on_upload:
            self.on_upload(samples, len(data), self.stats.last_upload_s)
        return True

    def upload_pending(self) -> None:
        """Upload what waits, oldest first, until the backlog is empty or the store fails."""
        while self._upload_one():
            pass

    def _seal_loop(self) -> None:
        # The first object goes as soon as a sample waits: a fresh run's first update waits for it, and a whole
        # interval (60 s at a cluster's cadence) would idle the optimizer. Later ones every interval_s.
        self._first_sample.wait(self.interval_s)
        while not self._stop.is_set():
            self.seal()
            self._stop.wait(self.interval_s)

    def _drain_loop(self) -> None:
        while not self._stop.is_set():
            with self._wake:
                while not (self._backlog or self._stop.is_set()):
                    self._wake.wait()
            if self._stop.is_set():
                return  # stop() flushes what is left
            if self._upload_one() is False:
                self._stop.wait(self.interval_s)  # botocore has retried already; try again next interval

    def flush(self) -> None:
        self.seal()
        self.upload_pending()

    def stop(self) -> None:
        self._stop.set()
        self._first_sample.set()
        with self._wake:
            self._wake.notify_all()
        self._sealer.join(timeout=self.interval_s + 30)
        self._thread.join(timeout=30)  # a hung upload is abandoned (daemon thread); its object is lost
        self.flush()

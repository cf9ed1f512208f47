"""The optimizer's loader thread: lists new experience objects of this rank's shards, downloads several
at a time, and has them decoded and validated (in worker processes when ``decode_workers`` > 0, which read
a local store's objects themselves and hand the arrays over in shared memory) into the buffer. The games
they carry are tallied for the league.

A rank lists only its own shards (``rapid.run.store_map.owned_shards``) and, each poll, only the keys named in
the last ``lookback_s`` (S3's ``StartAfter`` from a cursor): a poll costs one LIST page per shard, however
many objects the run keeps. A full listing every ``sweep_s`` finds what the cursor could not (a worker
clock far behind, an upload slower than the lookback). Between polls the wait follows the arrivals: about
one object a listing, from ``poll_s`` up to ``poll_max_s``.

Bad objects are counted and skipped: undecodable, invalid, or stamped with a policy version the optimizer
has not reached yet (``current_version``). Their keys are remembered, so a poll never downloads or counts
one twice, and retention deletes them like consumed ones. No exception ends the loader thread: each is
counted, logged and skipped; if the thread dies anyway, ``failure`` says why and the role stops.

Usage::

    >>> import tempfile
    >>> import numpy as np
    >>> from rapid.formats.experience import ExperienceBatch, encode_experience
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.run.store_map import experience_key
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> shape = Shape(bptt=4, obs_dim=3, mask_dim=2, heads=1, lstm=8)
    >>> arrays = {name: np.zeros((2, *dims), dtype) for name, (dtype, dims) in shape.fields().items()}
    >>> arrays["mask"][:] = True
    >>> game = {"learner_version": 0, "opponent": "latest", "learner_side": 0, "winner": "learner", "length": 9,
    ...         "learner_return": 1.0}
    >>> key = experience_key(0, time.time() * 1000, "w0", "a1b2", 0)       # what an Uploader writes
    >>> store.put(key, encode_experience(ExperienceBatch("w0", 0, 0.0, arrays, ["latest"], episodes=[game])))
    >>> buffer = ExperienceBuffer(capacity=64, max_staleness=8)
    >>> loader = ExperienceLoader(store, shape, buffer, rank=0, world=1, shards=1, poll_s=0.5, retention_s=600,
    ...                           decode_workers=0, current_version=lambda: 0)   # 0: decode inline
    >>> loader.poll_once()                 # what the loader thread does every poll: objects loaded
    1
    >>> buffer.stats().received, loader.stats.bad_objects
    (2, 0)
    >>> [g["winner"] for g in loader.take_episodes()]      # finished games reported with the experience
    ['learner']
    >>> loader.take_tally().counts                         # the same games for the league, taken at a publish
    {'latest': [1, 0, 0]}
    >>> loader.start()
    >>> loader.failure is None             # None while the thread runs (or was stopped)
    True
    >>> loader.stop()
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass

from rapid.errors import FormatError
from rapid.formats.experience import Shape
from rapid.infra.store import InvalidKey, Store, StoreError
from rapid.league.results import Tally
from rapid.opt.buffer import ExperienceBuffer
from rapid.optimizer.decode_pool import Decoded, DecodePool, Rejected, Unread, read_object
from rapid.run.quiet_log import QuietLog
from rapid.run.store_map import (
    experience_cursor,
    experience_shard_prefix,
    loader_mark_key,
    owned_shards,
    parse_experience_ms,
    read_loader_mark,
    shard_of,
    shard_split,
    write_loader_mark,
)

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
    lists: int = 0
    """Listings made (one per shard per poll; a listing may span pages on S3)."""
    swept: int = 0
    """Objects found only by a full listing: missed by the cursor (a clock far off, a very slow upload)."""
    backlog_samples: int = 0
    """Samples of objects uploaded before this loader started (while the run had no optimizer): trained on,
    but not rollout load (see :meth:`ExperienceLoader.loading_backlog`)."""


class ExperienceLoader:
    def __init__(self, store: Store, shape: Shape, buffer: ExperienceBuffer, rank: int = 0, world: int = 1,
                 shards: int = 1, poll_s: float = 0.5, retention_s: float = 600.0, on_bad=None, on_load=None,
                 decode_workers: int = 0, current_version: Callable[[], int] | None = None,
                 poll_max_s: float | None = None, lookback_s: float = 120.0, sweep_s: float = 300.0,
                 download_threads: int = 4, mark_s: float = 30.0, clock: Callable[[], float] = time.time,
                 downloads: Executor | None = None, decode_most: int | None = None):
        self.store, self.shape, self.buffer = store, shape, buffer
        self.rank, self.world, self.shards = rank, world, owned_shards(rank, world, shards)
        self.split = shard_split(rank, world, shards)
        self.poll_s, self.retention_s = poll_s, retention_s
        self.poll_max_s = poll_s if poll_max_s is None else max(poll_s, poll_max_s)
        self.lookback_s, self.sweep_s = lookback_s, sweep_s
        self.on_bad, self.on_load = on_bad, on_load
        self.current_version = current_version
        self.clock = clock
        self.decoder = DecodePool(shape, decode_workers, store, most=decode_most, clock=time.monotonic)
        self.downloads = downloads or ThreadPoolExecutor(max(1, download_threads),
                                                         thread_name_prefix=f"download-{rank}")
        self.max_downloads = max(1, download_threads)
        self.stats = LoaderStats()
        self.quiet = QuietLog(log, clock)
        self._started_ms = int(clock() * 1000)
        self._backlog_at: float | None = None
        self.failure: str | None = None
        self._seen: set[str] = set()
        self._done_at: deque[tuple[float, str]] = deque()
        self._episodes: list[dict] = []
        self._tally = Tally()
        self._next_sweep = clock()  # the first poll lists everything: what waited for this rank while it was away
        self._swept_once = False
        self.mark_s = mark_s
        self._next_mark = clock() + mark_s
        self._failed_downloads = 0
        # Objects per second arriving in this rank's shards (moving average); it starts as if they came every
        # poll_s, so a new rank looks often until its listings show otherwise.
        self._rate = 1.0 / poll_s
        self._last_poll = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"loader-{rank}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=30)
            if not self._thread.is_alive():
                self._mark_progress(self.clock(), final=True)
        self.downloads.shutdown(wait=False, cancel_futures=True)
        self.decoder.close()

    def mark_soon(self) -> None:
        """Note this rank's progress at the next poll, not ``mark_s`` after the last note (at a checkpoint)."""
        self._next_mark = -float("inf")

    def take_episodes(self) -> list[dict]:
        """Finished games loaded since the last call (for metrics)."""
        with self._lock:
            out, self._episodes = self._episodes, []
        return out

    def take_tally(self) -> Tally:
        """The league's counts of the games loaded since the last call (pooled across ranks at a publish)."""
        with self._lock:
            out, self._tally = self._tally, Tally()
        return out

    def loading_backlog(self, within_s: float) -> bool:
        """Whether objects uploaded before this loader started were loaded in the last ``within_s``: rates over
        that window count a backlog (a resumed run's), not what the rollouts produce."""
        return self._backlog_at is not None and self.clock() - self._backlog_at < within_s

    def next_wait(self) -> float:
        """Seconds until the next poll: about one new object a listing, within poll_s … poll_max_s."""
        if self._rate <= 0.0:
            return self.poll_max_s
        return min(self.poll_max_s, max(self.poll_s, 1.0 / self._rate))

    def step(self) -> float:
        """One poll, its failure counted and logged (the loader goes on); the seconds until the next. The
        loader's thread runs it in a loop; the scale model runs it in simulated time."""
        try:
            self.poll_once()
            self.quiet.recovered("list", "listing experience")
        except StoreError as e:
            self.stats.store_errors += 1
            self.quiet.warning("list", "listing experience failed: %s", e)
        except Exception as e:  # MemoryError included: count, log, go on
            self.stats.errors += 1
            log.error("loader: unexpected %s, going on: %s", type(e).__name__, e)
        return self.next_wait()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.step()):
                pass
        finally:
            if not self._stop.is_set():
                self.failure = "the experience loader thread ended unexpectedly"

    def poll_once(self) -> int:
        """Load every new object of this rank's shards; returns how many were loaded."""
        now = self.clock()
        sweep = now >= self._next_sweep
        if sweep:
            self._next_sweep = now + self.sweep_s
        listed = self._list_new(now, sweep)
        self._seen.update(k for k in listed if not k.endswith(".rxp"))  # not an object: never looked at again
        fresh = [k for k in listed if k.endswith(".rxp")]
        elapsed, self._last_poll = max(now - self._last_poll, 1e-3), now
        self._rate = 0.8 * self._rate + 0.2 * len(fresh) / elapsed
        loaded = 0
        downloads: deque[tuple[str, Future]] = deque()
        decoding: deque = deque()
        for key in fresh:
            if self._stop.is_set():
                break
            self._seen.add(key)
            if self.decoder.reads_store:  # a decode worker reads it: its bytes never enter this process
                decoding.append((key, self.decoder.submit_key(key)))
                loaded += self._finish_some(decoding)
                continue
            downloads.append((key, self.downloads.submit(self._download, key)))
            while len(downloads) >= 2 * self.max_downloads:  # a bounded window: memory stays small
                loaded += self._decode_next(downloads, decoding)
        while downloads:
            loaded += self._decode_next(downloads, decoding)
        while decoding:
            loaded += self._finish(*decoding.popleft())
        self._mark_progress(now)
        self._expire()
        return loaded

    def _mark_progress(self, now: float, final: bool = False) -> None:
        """Every mark_s (and at a clean stop), note per shard what is loaded: everything named before this
        poll's cursor, and the keys loaded since. Not while a download waits for its retry: a restart would
        skip it."""
        failed, self._failed_downloads = self._failed_downloads, 0
        if failed or self.mark_s <= 0 or (now < self._next_mark and not final):
            return
        self._next_mark = now + self.mark_s
        through_ms = int((now - self.lookback_s) * 1000)
        recent = [k for _, k in self._done_at if (ms := parse_experience_ms(k)) is not None and ms >= through_ms]
        for shard in self.shards:
            prefix = experience_shard_prefix(shard)
            try:
                write_loader_mark(self.store, loader_mark_key(shard, *self.split), through_ms,
                                  [k for k in recent if k.startswith(prefix)])
            except (StoreError, FormatError) as e:  # FormatError: a mark over its reader's 1 MiB, not written
                self.stats.store_errors += 1
                self.quiet.warning("mark", "could not note the loader's progress in shard %d: %s", shard, e)

    def _skip_loaded_before_restart(self, shard: int, keys: list[str]) -> list[str]:
        """On the first listing: what this shard's mark says was loaded before a restart is not loaded again,
        only deleted when retention says (a name without a time is loaded: it may be anything)."""
        try:
            mark = read_loader_mark(self.store, loader_mark_key(shard, *self.split))
        except (StoreError, FormatError) as e:
            log.warning("shard %d: no usable loader mark (%s); loading everything listed", shard, e)
            mark = None
        if mark is None:
            return keys
        through_ms, loaded = mark
        done = sorted((ms, k) for k in keys if (ms := parse_experience_ms(k)) is not None
                      and (ms < through_ms or k in loaded))
        for ms, key in done:
            self._seen.add(key)
            self._done_at.append((ms / 1000, key))
        if done:
            log.info("shard %d: %d object(s) loaded before the restart are not loaded again", shard, len(done))
        skipped = {k for _, k in done}
        return [k for k in keys if k not in skipped]

    def _list_new(self, now: float, sweep: bool) -> list[str]:
        """Keys of this rank's shards not seen yet: named in the last lookback_s, or all of them in a sweep."""
        since_ms = int((now - self.lookback_s) * 1000)
        out = []
        for shard in self.shards:
            cursor = experience_cursor(shard, since_ms)
            self.stats.lists += 1
            keys = [k for k in self.store.list(experience_shard_prefix(shard), start_after=None if sweep else cursor)
                    if k not in self._seen and self._mine(k)]
            if not self._swept_once:
                keys = self._skip_loaded_before_restart(shard, keys)
            if sweep and self._swept_once:
                missed = sum(k <= cursor for k in keys)
                if missed:
                    self.stats.swept += missed
                    log.warning("a full listing found %d experience object(s) the cursor missed (a clock far "
                                "off or an upload slower than %gs)", missed, self.lookback_s)
            out.extend(keys)
        self._swept_once = self._swept_once or sweep
        return out

    def _mine(self, key: str) -> bool:
        index, count = self.split
        return count == 1 or shard_of(key, count) == index

    def _decode_next(self, downloads: deque, decoding: deque) -> int:
        """Hand the oldest finished download to a decoder; finish decodes once enough are pending."""
        key, future = downloads.popleft()
        try:
            started = future.result()
        except Exception as e:  # one object's trouble, whatever it is, costs that object only
            self.stats.errors += 1
            return self._bad(key, f"unexpected {type(e).__name__}: {e}")
        if started is None:
            return 0
        decoding.append((key, self.decoder.submit(*started)))
        return self._finish_some(decoding)

    def _finish_some(self, decoding: deque) -> int:
        """Finish the oldest decodes until fewer than the decoder's window are pending."""
        return sum(self._finish(*decoding.popleft()) for _ in range(len(decoding) + 1 - self.decoder.max_pending))

    def _download(self, key: str) -> tuple[bytes, float] | None:
        """``key``'s bytes and the seconds they took, or None (counted) if there is nothing to decode."""
        t0 = time.perf_counter()
        data = read_object(self.store, key)
        if isinstance(data, bytes):
            return data, time.perf_counter() - t0
        self._unread(key, data)
        return None

    def _unread(self, key: str, result: Rejected | Unread) -> int:
        """An object not read: refused by the store (a bad object), gone, or the store failed (counted, and tried
        again at the next poll)."""
        if isinstance(result, Rejected):
            return self._bad(key, result.why)
        if result.why is not None:
            self.stats.store_errors += 1
            self._failed_downloads += 1
            self._seen.discard(key)
            self.quiet.warning("download", "download of %s failed: %s", key, result.why)
        return 0

    def _finish(self, key: str, future: Future) -> int:
        try:
            result = self.decoder.result(future)
            if isinstance(result, Unread):  # a worker's read: gone, or to be tried again
                return self._unread(key, result)
            self.quiet.recovered("download", "downloading experience")
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
        if (ms := parse_experience_ms(key)) is not None and ms < self._started_ms:
            if self._backlog_at is None:
                log.info("loading experience uploaded before this optimizer started (a backlog): trained on, "
                         "not counted as rollout load")
            self.stats.backlog_samples += result.num_samples
            self._backlog_at = self.clock()
        self.stats.bytes += result.nbytes
        self.stats.env_steps += result.env_steps
        with self._lock:
            self._episodes.extend(result.episodes)
            self._tally.add(result.episodes)
        self._done_at.append((self.clock(), key))
        if self.on_load:
            self.on_load(result.num_samples, result.nbytes, result.seconds)
        return 1

    def _bad(self, key: str, why: str) -> int:
        self.stats.bad_objects += 1
        self._done_at.append((self.clock(), key))  # retention removes it like a consumed object
        log.warning("skipping bad experience object %r: %s", key, why)
        if self.on_bad:
            self.on_bad(key, why)
        return 0

    def _expire(self) -> None:
        """Delete objects (loaded or bad) older than the retention time: a long run must not fill the bucket."""
        if self.retention_s <= 0:
            return
        cutoff = self.clock() - self.retention_s
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
                self.quiet.warning("delete", "retention could not delete %s: %s", key, e)
        if removed:
            self.quiet.info("retention", "retention: deleted experience objects older than %gs (%d in all)",
                            self.retention_s, self.stats.deleted)

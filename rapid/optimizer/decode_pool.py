"""Experience objects read, decoded and validated in worker processes, off the optimizer's Python thread.

With ``workers`` > 0 a worker process takes an object in and hands the optimizer only what it needs: the
arrays go through shared memory (:mod:`rapid.optimizer.shared_arrays`), and only their places, the validated
episode records and a few counts come back through the pipe, so the optimizer never unpickles an array. From a
``LocalStore`` the worker reads the object itself, by key (:meth:`DecodePool.submit_key`): its bytes never enter
the optimizer. Any other store (S3, a test's fake) is read by the loader, and the bytes go to a worker with the
job. Nothing from the store is ever unpickled: the worker decodes it with :mod:`rapid.formats`. Workers start
with 'forkserver' (or 'spawn'), never a fork of a process whose torch threads already run. With ``workers=0``
decoding runs inline in the caller's thread: one process, deterministic, for tests.

Usage::

    >>> from rapid.formats.experience import ExperienceBatch, encode_experience
    >>> shape = Shape(bptt=4, obs_dim=3, mask_dim=2, heads=1, lstm=8)
    >>> arrays = {name: np.zeros((2, *dims), dtype) for name, (dtype, dims) in shape.fields().items()}
    >>> arrays["mask"][:], arrays["version"][:] = True, 7
    >>> data = encode_experience(ExperienceBatch("w0", 0, 0.0, arrays, ["latest"]))   # one experience object
    >>> pool = DecodePool(shape, workers=0)      # inline here; the optimizer uses workers=2 or more
    >>> result = pool.result(pool.submit(data))  # Decoded, or Rejected(why) for a bad object
    >>> result.num_samples, result.max_version
    (2, 7)
    >>> pool.result(pool.submit(data[:-1]))
    Rejected(why='...')
    >>> pool.close()
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import select
import signal
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import numpy as np

from rapid.errors import FormatError
from rapid.formats.experience import LIMITS, Shape, decode_experience
from rapid.infra.identity import usable_cpus
from rapid.infra.store import BadObject, InvalidKey, KeyNotFound, LocalStore, ObservedStore, Store, StoreError
from rapid.optimizer import shared_arrays
from rapid.optimizer.shared_arrays import Field

log = logging.getLogger(__name__)


@dataclass
class Decoded:
    arrays: dict[str, np.ndarray]
    episodes: list[dict]
    env_steps: int
    max_version: int
    nbytes: int = 0
    """The object's size in the store."""
    seconds: float = 0.0
    """How long reading it from the store took."""
    busy_s: float = 0.0
    """How long a decode worker spent on it, reading, decoding and placing it (0 decoded inline)."""

    @property
    def num_samples(self) -> int:
        return int(self.arrays["version"].shape[0])


@dataclass
class Rejected:
    why: str


@dataclass
class Unread:
    """An object a worker did not read: gone (``why`` None: deleted by retention elsewhere), or the store failed
    (``why`` says how; the loader tries again at its next poll)."""
    why: str | None = None


@dataclass
class _Placed:
    """What a worker sends back for a Decoded whose arrays wait in shared memory: where they lie."""
    fields: list[Field]
    episodes: list[dict]
    env_steps: int
    max_version: int
    nbytes: int
    seconds: float
    busy_s: float


def auto_workers(cpus: int | None = None) -> int:
    """Decode processes when ``optimizer.decode_workers`` is -1: one on a small machine, one per eight
    usable cores on a large one (a GPU host's cores mostly decode), at most eight."""
    cpus = cpus or usable_cpus()
    return max(1, min(8, cpus // 8))


def auto_most(cpus: int | None = None) -> int:
    """The most decode processes ``optimizer.decode_workers = -1`` grows to while those there stay busy: one per
    four usable cores, at most eight, never fewer than it starts with.

    >>> auto_workers(16), auto_most(16), auto_most(2)
    (2, 4, 1)
    """
    cpus = cpus or usable_cpus()
    return max(auto_workers(cpus), min(8, cpus // 4))


GROW_EVERY_S = 10.0
"""Seconds of decoding over which the pool judges whether it needs another process."""
GROW_BUSY = 0.8
"""The decode processes' busy share past which another one starts: the arrivals outrun them."""


def decoders_wanted(workers: int, busy_share: float, most: int) -> int:
    """Decode processes for the next while: one more while those there were busy more than ``GROW_BUSY`` of the
    time (objects wait for them, grow stale meanwhile, and the rollouts are slowed to what they decode), up to
    ``most``; never fewer (a quiet while is no reason to stop a process the next burst needs).

    >>> decoders_wanted(2, busy_share=0.95, most=4), decoders_wanted(2, 0.5, 4), decoders_wanted(4, 0.99, 4)
    (3, 2, 4)
    """
    return min(most, workers + 1) if busy_share > GROW_BUSY else workers


def decode_job(data: bytes, shape: Shape, seconds: float = 0.0) -> Decoded | Rejected:
    """Decode one object; every failure is a Rejected, so no object can take a worker (or the loader) down."""
    try:
        batch = decode_experience(data, shape)
        episodes = [{key: value for key, value in ep.items()} for ep in batch.episodes]
        version = int(batch.arrays["version"].max()) if batch.num_samples else -1
        return Decoded(batch.arrays, episodes, int(batch.env_steps), version, len(data), seconds)
    except FormatError as e:
        return Rejected(str(e))
    except MemoryError:
        return Rejected("unexpected MemoryError while decoding")
    except Exception as e:  # a decoder bug must cost one object, not the run
        return Rejected(f"unexpected {type(e).__name__} while decoding: {e}")


def _decode_job(data: bytes, shape: Shape, path: str | None, seconds: float = 0.0,
                started: float | None = None) -> _Placed | Decoded | Rejected:
    """In a worker: decode, and leave the arrays in shared memory at ``path`` for the optimizer to map."""
    started = time.perf_counter() if started is None else started
    result = decode_job(data, shape, seconds)
    if isinstance(result, Rejected):
        return result
    try:
        fields = shared_arrays.write(path, result.arrays) if path is not None else None
    except OSError:  # shared memory full (a container's 64 MB /dev/shm): this object's arrays take the pipe
        fields = None
    result.busy_s = time.perf_counter() - started
    if fields is None:
        return result
    return _Placed(fields, result.episodes, result.env_steps, result.max_version, result.nbytes, seconds,
                   result.busy_s)


_stores: dict[str, LocalStore] = {}
"""A worker's stores, opened once: the root of each LocalStore it was asked to read."""


def read_object(store: Store, key: str) -> bytes | Rejected | Unread:
    """``key``'s bytes, read by the loader or by a worker. A name the store will not read (too large, not a
    regular file; odd characters put there behind rapid's back) is a bad object like any other, nothing read."""
    try:
        return store.get(key, max_bytes=LIMITS.max_bytes)
    except KeyNotFound:
        return Unread()  # deleted by retention elsewhere
    except (InvalidKey, BadObject) as e:
        return Rejected(str(e))
    except StoreError as e:
        return Unread(str(e))


def _read_job(root: str, key: str, shape: Shape, path: str | None) -> _Placed | Decoded | Rejected | Unread:
    """In a worker: read ``key`` from the LocalStore at ``root``, then decode it."""
    t0 = time.perf_counter()
    try:
        data = read_object(_stores.get(root) or _stores.setdefault(root, LocalStore(root)), key)
    except Exception as e:  # MemoryError included: one object's trouble costs that object only
        return Rejected(f"unexpected {type(e).__name__} while reading: {e}")
    if not isinstance(data, bytes):
        return data
    return _decode_job(data, shape, path, time.perf_counter() - t0, started=t0)


def _worker_init(owner_pid: int, folder: str | None) -> None:
    # Ctrl-C reaches the whole process group: the optimizer decides when its workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(owner_pid, folder), name="owner-watch", daemon=True).start()


def _exit_with(owner_pid: int, folder: str | None, poll_s: float = 1.0) -> None:
    """End this worker when the optimizer that owns it is gone, and remove the shared memory it can no longer
    free. A SIGKILLed optimizer (OOM, preemption) cannot shut its pool down, and a worker blocked on its task
    queue, holding the forkserver's alive pipe, would otherwise outlive it for good, and keep the forkserver
    alive too."""
    try:
        owner = os.pidfd_open(owner_pid)  # Linux: readable once the owner has exited, immune to pid reuse
    except (AttributeError, OSError):
        owner = None
    if owner is not None:
        select.select([owner], [], [])
    else:
        while True:
            try:
                os.kill(owner_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(poll_s)
    shared_arrays.remove_folder(folder)
    os._exit(0)


def _context():
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload([__name__])
    return ctx


def _readable(store: Store | None) -> tuple[str | None, Callable | None]:
    """The root of the LocalStore that a worker may open to read ``store``'s objects itself (None for any other
    store, a subclass included: its reads may do more), and the observer (metrics) its reads are reported to."""
    observe = store.observer if isinstance(store, ObservedStore) else None
    inner = store.inner if isinstance(store, ObservedStore) else store
    return (str(inner.root), observe) if isinstance(inner, LocalStore) and type(inner) is LocalStore else (None, None)


class DecodePool:
    """``store``: the loader's; with workers and a LocalStore, the workers read objects by key themselves.

    The arrays of a Decoded from a worker view a shared-memory slot, which no worker writes again until they are
    gone: take what you need (the buffer copies them) and drop them. While every slot is held, objects come
    back through the pipe instead (slower, never wrong).

    ``most``: the pool starts another process (up to this many) while those there are busy more than
    ``GROW_BUSY`` of the time (:func:`decoders_wanted`); None keeps ``workers``."""

    def __init__(self, shape: Shape, workers: int = 0, store: Store | None = None, most: int | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.shape = shape
        self.workers = workers
        self.most = max(workers, most or 0) if workers > 0 else 0
        self.clock = clock
        self._busy_s, self._busy_since = 0.0, clock()
        self.restarts = 0
        self._pool: ProcessPoolExecutor | None = None
        # The pool each future went to: a broken pool is restarted once, not again for each future it failed.
        self._pool_of: weakref.WeakKeyDictionary[Future, ProcessPoolExecutor] = weakref.WeakKeyDictionary()
        self._reads: weakref.WeakSet[Future] = weakref.WeakSet()
        self._folder = shared_arrays.make_folder() if workers > 0 else None
        # At close, or at exit without one: the folder goes with every slot in it.
        self._remove_folder = weakref.finalize(self, shared_arrays.remove_folder, self._folder)
        self._slot_of: weakref.WeakKeyDictionary[Future, str] = weakref.WeakKeyDictionary()
        self._writing: set[str] = set()
        """Slots a worker may be writing: their jobs' results are not taken yet."""
        self._slots: dict[str, shared_arrays.Slot] = {}
        """This generation's slots, as the optimizer maps them."""
        self._root, self._observe = _readable(store) if workers > 0 else (None, None)

    @property
    def max_pending(self) -> int:
        """Objects in flight at once: enough to keep every worker busy while the next one downloads."""
        return max(1, 2 * self.workers)

    @property
    def reads_store(self) -> bool:
        """Whether objects go to :meth:`submit_key` (the workers read them) rather than :meth:`submit`."""
        return self._root is not None

    def submit(self, data: bytes, seconds: float = 0.0) -> Future:
        """Decode ``data`` (downloaded in ``seconds``)."""
        if self.workers <= 0:
            done: Future = Future()
            done.set_result(decode_job(data, self.shape, seconds))
            return done
        return self._start(_decode_job, data, seconds=seconds)

    def submit_key(self, key: str) -> Future:
        """Read ``key`` in a worker and decode it there (only where :attr:`reads_store`)."""
        future = self._start(_read_job, self._root, key)
        self._reads.add(future)
        return future

    def _free_slot(self) -> str | None:
        """A slot no worker writes and no array views, or None. Its name carries the restart count: a worker of
        a broken pool, still being ended, may write the slots of its generation, never a live one."""
        if self._folder is None:
            return None
        for index in range(self.max_pending + 1):  # + 1: the last result's arrays may be in use at a submit
            slot = f"{self._folder}/{self.restarts}-{index}"
            if slot not in self._writing and self._slot(slot).free():
                return slot
        return None

    def _slot(self, path: str) -> shared_arrays.Slot:
        return self._slots.get(path) or self._slots.setdefault(path, shared_arrays.Slot(path))

    def _start(self, job, *args, **kwargs) -> Future:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=_context(), initializer=_worker_init,
                                             initargs=(os.getpid(), self._folder))
        slot = self._free_slot()
        try:
            future = self._pool.submit(job, *args, shape=self.shape, path=slot, **kwargs)
        except BrokenProcessPool:
            self.restart()
            return self._start(job, *args, **kwargs)
        self._pool_of[future] = self._pool
        if slot is not None:
            self._slot_of[future] = slot
            self._writing.add(slot)
        return future

    def result(self, future: Future) -> Decoded | Rejected | Unread:
        """The future's result; a worker that died on it (killed for memory, say) makes it a Rejected."""
        slot = self._slot_of.get(future)
        self._writing.discard(slot)
        try:
            out = future.result()
        except BrokenProcessPool:
            if self._pool_of.get(future) is self._pool:  # not one already replaced
                self.restart()
            return Rejected("a decode worker process died on this object")
        if isinstance(out, _Placed) and slot is not None:
            try:
                arrays = self._slot(slot).take(out.fields)
            except (OSError, ValueError) as e:  # its folder removed by a close: nothing to take in
                return Rejected(f"the decoded arrays were lost from shared memory: {e}")
            out = Decoded(arrays, out.episodes, out.env_steps, out.max_version, out.nbytes, out.seconds, out.busy_s)
        if isinstance(out, Decoded):
            self._busy_s += out.busy_s
            self._consider_growth()
        if self._observe is not None and future in self._reads:  # the read the store's metrics did not see
            if isinstance(out, Decoded):
                self._observe("get", out.nbytes, out.seconds, True)
            elif isinstance(out, Unread):
                self._observe("get", 0, 0.0, out.why is None)
        return out

    def _consider_growth(self) -> None:
        """Every ``GROW_EVERY_S``: one more process if those there were busy (:func:`decoders_wanted`). The old
        executor finishes what it holds and ends; the next object goes to a new one of one process more."""
        now = self.clock()
        span = now - self._busy_since
        if span < GROW_EVERY_S or self.workers >= self.most:
            return
        busy = self._busy_s / (span * self.workers)
        self._busy_s, self._busy_since = 0.0, now
        wanted = decoders_wanted(self.workers, busy, self.most)
        if wanted == self.workers:
            return
        log.info("decode processes busy %.0f%% of the last %.0f s: starting one more (%d, at most %d)",
                 100 * busy, span, wanted, self.most)
        self.workers = wanted
        if self._pool is not None:
            self._pool.shutdown(wait=False)  # its jobs still finish; their results come back as before
            self._pool = None

    def restart(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            self._remove_slots()
            self.restarts += 1
            log.warning("decode worker processes restarted (%d so far)", self.restarts)

    def _remove_slots(self) -> None:
        """Remove this generation's slots (arrays handed out stay readable: a mapping outlives its file's name)."""
        for index in range(self.max_pending + 1 if self._folder else 0):
            shared_arrays.remove(f"{self._folder}/{self.restarts}-{index}")
        self._slots.clear()
        self._writing.clear()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._slots.clear()
        self._remove_folder()

"""Experience objects decoded and validated in worker processes, off the optimizer's Python thread.

The bytes a loader downloaded go to a worker process, which decodes them with :mod:`rapid.formats` and
sends back numpy arrays and plain, validated episode records: nothing from the store is ever unpickled
(the process boundary carries our own arrays, the way any multiprocessing queue does). Workers start
with 'forkserver' (or 'spawn'), never a fork of a process whose torch threads already run. With
``workers=0`` decoding runs inline in the caller's thread: one process, deterministic, for tests.

With ``workers`` > 0 the same calls hand the bytes to worker processes and ``result`` waits for them.

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
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import numpy as np

from rapid.errors import FormatError
from rapid.formats.experience import Shape, decode_experience
from rapid.infra.identity import usable_cpus

log = logging.getLogger(__name__)


@dataclass
class Decoded:
    arrays: dict[str, np.ndarray]
    episodes: list[dict]
    env_steps: int
    max_version: int

    @property
    def num_samples(self) -> int:
        return int(self.arrays["version"].shape[0])


@dataclass
class Rejected:
    why: str


def auto_workers(cpus: int | None = None) -> int:
    """Decode processes when ``optimizer.decode_workers`` is -1: one on a small machine, one per eight
    usable cores on a large one (a GPU host's cores mostly decode), at most eight."""
    cpus = cpus or usable_cpus()
    return max(1, min(8, cpus // 8))


def decode_job(data: bytes, shape: Shape) -> Decoded | Rejected:
    """Decode one object; every failure is a Rejected, so no object can take a worker (or the loader) down."""
    try:
        batch = decode_experience(data, shape)
        episodes = [{key: value for key, value in ep.items()} for ep in batch.episodes]
        version = int(batch.arrays["version"].max()) if batch.num_samples else -1
        return Decoded(batch.arrays, episodes, int(batch.env_steps), version)
    except FormatError as e:
        return Rejected(str(e))
    except MemoryError:
        return Rejected("unexpected MemoryError while decoding")
    except Exception as e:  # a decoder bug must cost one object, not the run
        return Rejected(f"unexpected {type(e).__name__} while decoding: {e}")


def _worker_init(owner_pid: int) -> None:
    # Ctrl-C reaches the whole process group: the optimizer decides when its workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(owner_pid,), name="owner-watch", daemon=True).start()


def _exit_with(owner_pid: int, poll_s: float = 1.0) -> None:
    """End this worker when the optimizer that owns it is gone. A SIGKILLed optimizer (OOM, preemption)
    cannot shut its pool down, and a worker blocked on its task queue, holding the forkserver's alive pipe,
    would otherwise outlive it for good, and keep the forkserver alive too."""
    try:
        owner = os.pidfd_open(owner_pid)  # Linux: readable once the owner has exited, immune to pid reuse
    except (AttributeError, OSError):
        owner = None
    if owner is not None:
        select.select([owner], [], [])
        os._exit(0)
    while True:
        try:
            os.kill(owner_pid, 0)
        except ProcessLookupError:
            os._exit(0)
        time.sleep(poll_s)


def _context():
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload([__name__])
    return ctx


class DecodePool:
    def __init__(self, shape: Shape, workers: int = 0):
        self.shape = shape
        self.workers = workers
        self.restarts = 0
        self._pool: ProcessPoolExecutor | None = None
        # The pool each future went to: a broken pool is restarted once, not again for each future it failed.
        self._pool_of: weakref.WeakKeyDictionary[Future, ProcessPoolExecutor] = weakref.WeakKeyDictionary()

    @property
    def max_pending(self) -> int:
        """Objects in flight at once: enough to keep every worker busy while the next one downloads."""
        return max(1, 2 * self.workers)

    def submit(self, data: bytes) -> Future:
        if self.workers <= 0:
            done: Future = Future()
            done.set_result(decode_job(data, self.shape))
            return done
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=_context(), initializer=_worker_init,
                                             initargs=(os.getpid(),))
        try:
            future = self._pool.submit(decode_job, data, self.shape)
        except BrokenProcessPool:
            self.restart()
            return self.submit(data)
        self._pool_of[future] = self._pool
        return future

    def result(self, future: Future) -> Decoded | Rejected:
        """The future's result; a worker that died on it (killed for memory, say) makes it a Rejected."""
        try:
            return future.result()
        except BrokenProcessPool:
            if self._pool_of.get(future) is self._pool:  # not one already replaced
                self.restart()
            return Rejected("a decode worker process died on this object")

    def restart(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            self.restarts += 1
            log.warning("decode worker processes restarted (%d so far)", self.restarts)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

"""The optimizer's experience buffer: a ring of samples, with staleness and reuse measured and bounded.

Usage::

    >>> buf = ExperienceBuffer(capacity=8, max_staleness=2)
    >>> rng = np.random.default_rng(0)
    >>> buf.sample(2, 3, rng, max_reuse=1.0) is None      # None until enough fresh samples
    True
    >>> buf.add({"obs": np.zeros((4, 3), np.float32), "version": np.full(4, 3)})   # [S, ...] arrays, 'version'
    >>> batch, staleness = buf.sample(2, 4, rng, max_reuse=1.0)   # current version 4
    >>> batch["obs"].shape, staleness.tolist()
    ((2, 3), [1, 1])
    >>> buf.sample(4, 4, rng, max_reuse=1.0) is None      # 2 + 4 consumed would be reuse above 1.0
    True
    >>> s = buf.stats()
    >>> s.received, s.consumed, s.used, s.dropped_stale, s.reuse
    (4, 2, 2, 0, 0.5)
    >>> buf.sample(2, 6, rng) is None                     # at version 6 all are stale: dropped
    True
    >>> buf.stats().dropped_stale                         # the 2 never used were wasted
    2

Staleness = current version − the version that produced a sample; samples beyond ``max_staleness`` are
dropped (and counted) when a batch is drawn. Reuse = samples consumed by updates ÷ samples received.

``max_reuse`` bounds reuse twice: no sample is drawn more than ``ceil(max_reuse)`` times, and the samples
consumed never exceed ``max_reuse`` × the samples that could still be used (received, less those evicted
or gone stale before any use: wasted experience must not buy extra passes over the survivors).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Gather = Callable[[dict[str, np.ndarray], np.ndarray], dict[str, np.ndarray]]
"""Takes the drawn rows of the buffer's arrays out (under its lock) as a batch."""


@dataclass
class BufferStats:
    received: int = 0
    consumed: int = 0
    used: int = 0
    """Samples drawn by at least one update."""
    dropped_stale: int = 0
    """Samples that went stale before any update used them: experience wasted."""
    retired_stale: int = 0
    """Samples that went stale after being used: the normal end of a sample's life."""
    evicted_unused: int = 0
    """Samples overwritten before any update used them: experience wasted."""
    size: int = 0
    unused: int = 0
    """Samples in the buffer that no update has used yet: the backlog."""
    capacity: int = 0
    """Samples the buffer holds at most (it may have grown: :meth:`ExperienceBuffer.grow`)."""

    @property
    def reuse(self) -> float:
        return self.consumed / self.received if self.received else 0.0

    @property
    def usable(self) -> int:
        """Samples received that were used or still can be."""
        return self.received - self.dropped_stale - self.evicted_unused


def per_sample_cap(max_reuse: float) -> float:
    """How many times one sample may be drawn under ``max_reuse`` (at least once)."""
    return math.inf if math.isinf(max_reuse) else max(1, math.ceil(max_reuse - 1e-9))


class ExperienceBuffer:
    """``keep_reference``: every sample also holds ``reference_logp`` (NaN until :meth:`remember` sets it: the
    learner's log-probs at the sample's first use, ``ppo.proximal = "first_use"``), and a drawn batch carries
    ``slot`` and ``generation``, which :meth:`remember` takes back."""

    def __init__(self, capacity: int, max_staleness: int, keep_reference: bool = False):
        self.capacity = capacity
        self.max_staleness = max_staleness
        self.keep_reference = keep_reference
        self._arrays: dict[str, np.ndarray] | None = None
        self._valid = np.zeros(capacity, dtype=bool)
        self._uses = np.zeros(capacity, dtype=np.int64)
        self._generation = np.zeros(capacity, dtype=np.int64)
        """How many times each slot has been written: a reference comes back only to the sample it was for."""
        self._next = 0
        self._stats = BufferStats()
        self._lock = threading.Lock()
        self._added = threading.Condition(self._lock)

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        n = int(arrays["version"].shape[0])
        if n > self.capacity:  # keep the newest part of an oversized batch
            arrays = {k: v[-self.capacity:] for k, v in arrays.items()}
            n = self.capacity
        if self.keep_reference:
            arrays = {**arrays, "reference_logp": np.full(arrays["logp"].shape, np.nan, np.float32)}
        with self._lock:
            if self._arrays is None:
                self._arrays = {k: np.zeros((self.capacity, *v.shape[1:]), v.dtype) for k, v in arrays.items()}
            idx = (self._next + np.arange(n)) % self.capacity
            self._generation[idx] += 1
            self._stats.evicted_unused += int((self._valid[idx] & (self._uses[idx] == 0)).sum())
            # The rows land in at most two runs (the ring wraps once): block copies, 2.5× cheaper than
            # scattering rows by index where rows are small (connect four's).
            first = min(n, self.capacity - self._next)
            for key, value in arrays.items():
                self._arrays[key][self._next:self._next + first] = value[:first]
                self._arrays[key][:n - first] = value[first:]
            self._valid[idx] = True
            self._uses[idx] = 0
            self._next = int((self._next + n) % self.capacity)
            self._stats.received += n
            self._added.notify_all()

    def grow(self, capacity: int) -> bool:
        """Hold ``capacity`` samples from now on, if more than today (a ring never shrinks). What it holds stays,
        oldest first, with its uses; a batch drawn before keeps no claim on its slots (:meth:`remember` then
        finds none). Returns whether it grew."""
        with self._lock:
            old = self.capacity
            if capacity <= old:
                return False
            order = (self._next + np.arange(old)) % old  # oldest first: the ring unrolled
            if self._arrays is not None:
                grown = {k: np.zeros((capacity, *v.shape[1:]), v.dtype) for k, v in self._arrays.items()}
                for key, value in self._arrays.items():
                    grown[key][:old] = value[order]
                self._arrays = grown
            for name in ("_valid", "_uses"):
                values = getattr(self, name)
                setattr(self, name, np.concatenate([values[order], np.zeros(capacity - old, values.dtype)]))
            # Every slot moved: a generation above any handed out means no earlier batch matches a slot now.
            self._generation = np.full(capacity, int(self._generation.max(initial=0)) + 1, np.int64)
            self.capacity, self._next = capacity, old
            return True

    def _drop_stale(self, current_version: int) -> None:
        if self._arrays is None:
            return
        stale = self._valid & (current_version - self._arrays["version"] > self.max_staleness)
        unused = int((stale & (self._uses == 0)).sum())
        self._stats.dropped_stale += unused
        self._stats.retired_stale += int(stale.sum()) - unused
        self._valid &= ~stale

    def sample(self, batch: int, current_version: int, rng: np.random.Generator, max_reuse: float = np.inf,
               timeout: float = 0.0, into: Gather | None = None) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
        """``batch`` fresh samples (least-used first, ties at random) and their staleness, or None if
        there are too few, or consuming them would push reuse above ``max_reuse``, within ``timeout``. A batch
        of samples never used is always served: reuse is held back by refusing second uses, never first ones
        (a rank that reused samples while short, next to peers in lock step, must still train on what comes).
        ``into(arrays, rows)`` takes the drawn rows out of the buffer's arrays while the lock holds them (a
        learner that stages batches packs them straight where they go: ``Learner.gather``); it returns a dict
        with at least ``version``."""
        cap = per_sample_cap(max_reuse)
        with self._lock:
            ready = self._added.wait_for(lambda: self._ready(batch, current_version, max_reuse, cap), timeout)
            arrays = self._arrays
            if not ready or arrays is None:  # None: nothing was ever added (a batch of 0 is "ready" at once)
                return None
            candidates = np.flatnonzero(self._valid & (self._uses < cap))
            order = np.lexsort((rng.random(candidates.size), self._uses[candidates]))
            chosen = candidates[order[:batch]]
            self._stats.used += int((self._uses[chosen] == 0).sum())
            self._uses[chosen] += 1
            self._stats.consumed += batch
            out = into(arrays, chosen) if into else {k: v[chosen] for k, v in arrays.items()}  # one copy each way
            if self.keep_reference:
                out["slot"], out["generation"] = chosen, self._generation[chosen]
        return out, current_version - out["version"]

    def remember(self, batch: dict[str, np.ndarray], reference_logp: np.ndarray | None) -> None:
        """Keep the learner's ``reference_logp`` [S, T] for the samples of ``batch`` (drawn by :meth:`sample`)
        that have none yet and still sit in their slots. Nothing without ``keep_reference`` or references."""
        if not self.keep_reference or reference_logp is None or self._arrays is None:
            return
        with self._lock:
            here = self._generation[batch["slot"]] == batch["generation"]
            slots = batch["slot"][here]
            kept = self._arrays["reference_logp"]
            kept[slots] = np.where(np.isnan(kept[slots]), reference_logp[here], kept[slots])

    def _ready(self, batch: int, current_version: int, max_reuse: float, cap: float) -> bool:
        self._drop_stale(current_version)
        if int((self._valid & (self._uses < cap)).sum()) < batch:
            return False
        if int((self._valid & (self._uses == 0)).sum()) >= batch:
            return True  # a sample's first use is never refused: left unused it would only go stale
        return self._stats.consumed + batch <= max_reuse * self._stats.usable

    def stats(self) -> BufferStats:
        with self._lock:
            s = BufferStats(**vars(self._stats))
            s.size = int(self._valid.sum())
            s.unused = int((self._valid & (self._uses == 0)).sum())
            s.capacity = self.capacity
            return s

"""The box's cores and GPU in simulated time: ``BoxClock`` is the scale model's ``SimClock`` (one interpreter lock
per process, ``SimClock.cpu``) with two things a box adds.

- **C cores, shared fairly.** A process runs only on a core. Work charged at time t is stretched by
  max(1, R / C), R the processes that wanted a core over the second before t (each counted by the share of that
  second it was busy, at most one): the Linux scheduler gives R runnable processes C/R of a core each. A process's
  own threads still take turns under its lock, so a process never uses more than one core (decode processes are
  processes of their own).
- **One GPU**, a calendar of kernel time: work booked on it runs after what is booked before, and the caller goes
  on once both its host part and its kernels are done.

``book`` lays work on another process (the node's server, a decode process) without the caller waiting for it.
Busy seconds are kept per process in buckets, for the figures and for R.
"""

from __future__ import annotations

import collections
import math

from fleet.clock import SimClock

BUCKET_S = 0.1
WINDOW_BUCKETS = 10
"""R is measured over the last second (10 buckets of 0.1 s)."""
SLICE_S = 0.005
"""A process's lock is shared in slices of 5 ms (CPython's switch interval)."""
GPU = "gpu"


class BoxClock(SimClock):
    def __init__(self, cores: int):
        super().__init__()
        self.cores = cores
        self.used: dict[object, collections.defaultdict[int, float]] = collections.defaultdict(
            lambda: collections.defaultdict(float)
        )
        """process → bucket → busy seconds (the GPU's too)."""
        self._stretch: dict[int, float] = {}
        self.slices: dict[object, dict[int, float]] = collections.defaultdict(dict)
        """process → slice of its lock → seconds booked in it."""
        self.recent: dict[object, dict[tuple[str, int], float]] = collections.defaultdict(dict)
        """process → (thread, second) → seconds it booked then: the others' use of the lock, for a fair share."""
        self.tags: collections.defaultdict[str, float] = collections.defaultdict(float)
        """CPU seconds by what they were spent on ("intake", "update", …), for the figures."""

    def stretch(self, at: float) -> float:
        """How much longer work takes at ``at`` than on a core of its own: max(1, R / C) over the last second."""
        b = int(at / BUCKET_S)
        if b not in self._stretch:
            window = BUCKET_S * WINDOW_BUCKETS
            wanting = sum(
                min(1.0, sum(c.get(k, 0.0) for k in range(b - WINDOW_BUCKETS, b)) / window)
                for p, c in self.used.items()
                if p != GPU
            )
            self._stretch[b] = max(1.0, wanting / self.cores)
        return self._stretch[b]

    def _note(self, process: object, start: float, end: float) -> None:
        """Busy from ``start`` to ``end``, split over the buckets it covers."""
        counts = self.used[process]
        for b in range(int(start / BUCKET_S), int(end / BUCKET_S) + 1):
            overlap = min(end, (b + 1) * BUCKET_S) - max(start, b * BUCKET_S)
            if overlap > 0:
                counts[b] += overlap

    def cpu(self, seconds: float, process: object = None, tag: str = "") -> None:
        """``seconds`` of the running actor's process, stretched by the cores; the caller waits for it. The threads
        of a process share its lock fairly (:meth:`_lay`), not first come first served as ``SimClock.cpu`` has it:
        CPython hands the lock over every 5 ms, so a loader thread with a second of decoding booked does not hold
        an update of 12 ms back for that second."""
        process = process or getattr(self.actor, "process", None)
        wall = seconds * self.stretch(self.t())
        if process is None:
            self.elapsed += wall
        else:
            self.elapsed = self._lay(process, getattr(self.actor, "name", ""), wall) - self.now
        if tag:
            self.tags[tag] += seconds

    def _lay(self, process: object, thread: str, wall: float) -> float:
        """Lay ``wall`` seconds of ``thread``'s work on ``process``'s lock from now, in slices of ``SLICE_S``; returns
        when it ends. In each slice the thread takes what the process's other threads left, at most its fair share:
        half, or more if the others used less than half of the lock over the last second. Work the others booked
        earlier for later (a loader's whole poll) is not moved: that is the error of this model, in their favour."""
        lock, mine = self.slices[process], self.recent[process]
        t = self.t()
        others = sum(s for (th, at), s in list(mine.items()) if th != thread and at > t - 1.0) / 1.0
        share = max(0.5, 1.0 - others)
        b, left, end = int(t / SLICE_S), wall, t
        start = t - b * SLICE_S  # the part of the first slice already past
        while left > 1e-12:
            room = min(share * (SLICE_S - start), SLICE_S - start - lock.get(b, 0.0))
            take = min(left, room)
            if take > 0:
                lock[b] = lock.get(b, 0.0) + take
                self._note(process, b * SLICE_S + start, b * SLICE_S + start + take)
                left -= take
                end = b * SLICE_S + start + min(SLICE_S - start, take / share)
            b, start = b + 1, 0.0
        mine[thread, int(t)] = mine.get((thread, int(t)), 0.0) + wall
        for key in [k for k in mine if k[1] < t - 2.0]:
            del mine[key]
        return end

    def book(self, process: object, seconds: float, at: float, tag: str = "") -> float:
        """Lay ``seconds`` of ``process``'s work from ``at`` (after what that process has booked), the caller not
        waiting; returns when it ends. The GPU's kernel time is not stretched: it runs on no core."""
        wall = seconds if process == GPU else seconds * self.stretch(at)
        saved = self.elapsed
        self.elapsed = at - self.now
        SimClock.cpu(self, wall, process)
        end = self.t()
        self.elapsed = saved
        self._note(process, end - wall, end)
        if tag:
            self.tags[tag] += seconds
        return end

    def wait_until(self, at: float) -> None:
        """The running step goes on at ``at`` at the earliest."""
        self.elapsed = max(self.elapsed, at - self.now)

    def busy_share(self, process: object, until: float) -> float:
        """The share of [0, until) ``process`` was busy."""
        last = math.ceil(until / BUCKET_S)
        return sum(v for b, v in self.used.get(process, {}).items() if b < last) / until

    def mean_wanting(self, until: float) -> float:
        """The mean over [0, until) of the processes wanting a core (R)."""
        return sum(self.busy_share(p, until) for p in self.used if p != GPU)

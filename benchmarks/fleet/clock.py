"""Simulated time for the scale model.

The fleet is a discrete-event simulation: one OS thread drives every simulated worker and rank in order of
due time, so the clock the data-plane code reads must be the simulation's, not the wall's. This module is
the ONE place where rapid's modules are patched: :func:`installed` replaces the ``time`` module attribute of
every loaded ``rapid.*`` module that imported ``time`` with :class:`TimeShim`, whose ``time()`` and
``monotonic()`` read the simulated clock and whose every other attribute (``perf_counter``, ``sleep``,
``thread_time``…) is the real ``time`` module's.

While an actor (a worker, a rank, the writer) takes a step, the clock reads ``now + elapsed + skew``: the
step's start, plus the latency its store requests have been charged so far, plus that actor's clock error
(a worker whose clock runs 30 s fast). Requests charge their modelled latency to ``elapsed``.
"""

from __future__ import annotations

import sys
import time as _real_time
from contextlib import contextmanager

WALL_EPOCH = 1_700_000_000.0
"""What ``time.time()`` reads at simulated second 0: a plausible wall clock, so keys with times in them look
like a real run's."""
MONOTONIC_EPOCH = 100_000.0


class SimClock:
    def __init__(self):
        self.now = 0.0  # the scheduler's time: the start of the step being taken
        self.elapsed = 0.0  # latency charged by the running step's requests
        self.skew = 0.0  # the running actor's clock error (seconds)
        self.streams = 1  # requests in flight together (a loader's parallel downloads): each is charged 1/streams
        self.actor: object | None = None
        self.busy: dict[object, list[tuple[float, float]]] = {}  # process → its interpreter lock's busy spans

    def t(self) -> float:
        """Simulated seconds since the start, as the running step sees them (no skew: the true time)."""
        return self.now + self.elapsed

    def time(self) -> float:
        return WALL_EPOCH + self.t() + self.skew

    def monotonic(self) -> float:
        return MONOTONIC_EPOCH + self.t()

    def charge(self, seconds: float) -> None:
        self.elapsed += seconds / self.streams

    def cpu(self, seconds: float, process: object = None) -> None:
        """Charge ``seconds`` of CPU to the running actor's process. The threads of one process share one
        interpreter lock and take turns (every few ms): the work fills the gaps the process's other threads
        leave, so it ends ``seconds`` plus their overlapping work later. Busy spans are kept, not just the last
        end: a step that ends far ahead (a write retried through an outage) holds the lock only for its own CPU.
        ``process`` names another process whose CPU the running step waits for (a decode worker)."""
        process = process or getattr(self.actor, "process", None)
        if process is None:
            self.elapsed += seconds
            return
        spans = [(a, b) for a, b in self.busy.get(process, ()) if b > self.now]  # steps start in time order
        cursor, left, pieces = self.t(), seconds, []
        for a, b in spans:
            if b <= cursor:
                continue
            if a > cursor:
                run = min(left, a - cursor)
                pieces.append((cursor, cursor + run))
                left -= run
                if left <= 0:
                    break
            cursor = max(cursor, b)
        if left > 0:
            pieces.append((cursor, cursor + left))
        self.busy[process] = sorted(spans + pieces)
        self.elapsed = pieces[-1][1] - self.now if pieces else self.elapsed

    @contextmanager
    def acting(self, actor: object, at: float, skew: float = 0.0):
        """Run one step of ``actor`` starting at simulated time ``at``; yields, then ``elapsed`` holds the
        latency the step was charged."""
        self.actor, self.now, self.elapsed, self.skew = actor, at, 0.0, skew
        try:
            yield self
        finally:
            self.actor, self.skew = None, 0.0


class TimeShim:
    """Stands in for the ``time`` module inside rapid's modules: simulated wall and monotonic clocks."""

    def __init__(self, clock: SimClock):
        self._clock = clock

    def time(self) -> float:
        return self._clock.time()

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def __getattr__(self, name: str):
        return getattr(_real_time, name)


@contextmanager
def installed(clock: SimClock):
    """Point every loaded ``rapid.*`` module's ``time`` at the simulated clock while the block runs; yields
    the names of the modules patched. Enter it after importing everything the model drives (a module
    imported later keeps the real clock); leaving it gives every module the real clock back."""
    shim = TimeShim(clock)
    patched = [name for name, module in sorted(sys.modules.items())
               if name.startswith("rapid") and getattr(module, "time", None) is _real_time]
    for name in patched:
        vars(sys.modules[name])["time"] = shim
    try:
        yield patched
    finally:
        for name in patched:
            vars(sys.modules[name])["time"] = _real_time

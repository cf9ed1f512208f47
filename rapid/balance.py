"""Automatic balancing of the optimizer against its rollout workers: reuse held at a target, staleness
counted in the units OpenAI Five meant, and a plain line when the rollouts produce more than it can use.

The design (GA3C's run-time scheduling with Rapid's targets):

- **Reuse.** The buffer never lets consumed samples exceed ``target_reuse`` × the usable samples received,
  nor any sample be drawn more than ``ceil(target_reuse)`` times, so reuse cannot run above the target.
  To keep it from falling below (samples dropped unused), the optimizer must draw as fast as samples
  arrive: it adapts how much it trains per received sample through the batch size. A backlog of unused
  samples beyond two batches grows the batch (a larger batch amortizes the per-update overhead, so more
  samples per second go through); an optimizer that keeps waiting for data with little backlog shrinks
  it back towards the configured ``batch_samples``, never below, never above ``max_batch_samples``.
- **Staleness.** Rollouts upload every ``upload_interval_s`` and poll parameters every ``param_poll_s``; a
  version published after every update makes a sample look many versions old just by waiting for its
  upload (samples then go "stale" by the dozen). Versions are published by time instead, about once per
  upload interval (``publish_interval_s``), so a staleness of 1 means "one upload behind", as in OpenAI
  Five (uploads and versions about once a minute there, staleness ≈ 0–1).
- **Saying so.** Arrival and consumption rates are measured over a sliding window. When samples go unused
  at the largest batch allowed, the optimizer logs (at most once a minute) what it receives, what it can
  consume at the target and what to add: more optimizer ranks/GPUs, or fewer rollout workers.

Every decision is a small pure function below; :class:`Balancer` strings them together once per update.

The optimizer calls ``step`` once per update with the buffer's counts (``dropped_stale + evicted_unused`` as
``wasted``, ``unused`` as ``backlog``) and the seconds the update itself took.

Usage::

    >>> balancer = Balancer(BalanceSettings(batch=256, max_batch=1024, target_reuse=1.0, publish_interval_s=2.0))
    >>> d = balancer.step(0.0, received=0, consumed=0, wasted=0, backlog=0, busy_s=0.1)
    >>> d = balancer.step(1.0, received=1000, consumed=256, wasted=0, backlog=744, busy_s=0.5)
    >>> d.batch, d.arrival_per_s, d.capacity_per_s, d.message    # backlog > 2 batches: the batch grows
    (320, 1000.0, 512.0, None)
    >>> at_max = Balancer(BalanceSettings(batch=256, max_batch=256, target_reuse=1.0, publish_interval_s=2.0))
    >>> d = at_max.step(0.0, received=0, consumed=0, wasted=0, backlog=0, busy_s=0.1)
    >>> d = at_max.step(1.0, received=1000, consumed=256, wasted=500, backlog=244, busy_s=0.9)
    >>> print(d.message)                                         # None, or the one line to log
    rollouts outrun the optimizer: it receives 1,000 samples/s and can consume 284/s at reuse target 1 (50% ...
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

GROW, SHRINK = 1.25, 0.8
ADJUST_EVERY_S = 1.0
WARN_EVERY_S = 60.0
WASTE_TOLERANCE = 0.05


def next_batch(batch: int, backlog: int, idle_share: float, lo: int, hi: int, multiple: int = 1) -> int:
    """The batch for the next updates: grown when more than two batches wait unused, shrunk towards
    ``lo`` when the optimizer mostly waits for data and less than one batch waits; a multiple of
    ``multiple`` within [lo, hi]."""
    if backlog > 2 * batch:
        want = math.ceil(batch * GROW / multiple) * multiple
    elif idle_share > 0.5 and backlog < batch:
        want = math.floor(batch * SHRINK / multiple) * multiple
    else:
        return batch
    return max(lo, min(hi, want))


def publish_due(now: float, last_publish: float, interval_s: float) -> bool:
    """Publish by time: about one version per interval, however fast the updates run."""
    return now - last_publish >= interval_s


def rate(points: deque[tuple[float, float]]) -> float:
    """Per-second rate of a cumulative count sampled at (time, count) points."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return 0.0
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def overload_line(arrival: float, capacity: float, target: float, waste_share: float, at_max: bool) -> str | None:
    """The one line to log when rollouts outrun the optimizer, else None: samples go unused although the
    batch is already the largest allowed."""
    if not at_max or waste_share <= WASTE_TOLERANCE or arrival <= 0:
        return None
    need = arrival * target
    more = need / capacity if capacity > 0 else math.inf
    return (f"rollouts outrun the optimizer: it receives {arrival:,.0f} samples/s and can consume "
            f"{capacity:,.0f}/s at reuse target {target:g} ({waste_share:.0%} of samples went unused); "
            f"add optimizer ranks/GPUs (about {more:.1f}× the capacity) or run fewer rollout workers")


@dataclass
class BalanceSettings:
    batch: int
    """The configured batch size: the smallest the balancer uses."""
    max_batch: int
    target_reuse: float
    publish_interval_s: float
    multiple: int = 1
    """Batches stay a multiple of this (the microbatch size)."""
    window_s: float = 30.0
    """Rates are measured over this sliding window."""


@dataclass
class Decision:
    batch: int
    publish_interval_s: float
    arrival_per_s: float
    consumed_per_s: float
    capacity_per_s: float
    waste_share: float
    overloaded: bool
    target_reuse: float
    message: str | None = None


class Balancer:
    def __init__(self, settings: BalanceSettings, now: float = 0.0):
        self.s = settings
        self.batch = settings.batch
        self._received: deque[tuple[float, float]] = deque()
        self._consumed: deque[tuple[float, float]] = deque()
        self._wasted: deque[tuple[float, float]] = deque()
        self._busy: deque[tuple[float, float]] = deque()
        self._busy_total = 0.0
        self._last_adjust = now
        self._last_warn = -math.inf

    def _push(self, points: deque, now: float, value: float) -> None:
        points.append((now, value))
        while len(points) > 2 and points[1][0] <= now - self.s.window_s:
            points.popleft()

    def step(self, now: float, received: int, consumed: int, wasted: int, backlog: int,
             busy_s: float) -> Decision:
        """Once per update: ``busy_s`` is the time the update itself took (not waiting for data)."""
        self._busy_total += busy_s
        for points, value in ((self._received, received), (self._consumed, consumed), (self._wasted, wasted),
                              (self._busy, self._busy_total)):
            self._push(points, now, value)
        arrival, consumed_rate = rate(self._received), rate(self._consumed)
        span = self._busy[-1][0] - self._busy[0][0]
        busy_share = rate(self._busy) if span > 0 else 1.0
        capacity = consumed_rate / busy_share if busy_share > 0 else 0.0
        recv_window = self._received[-1][1] - self._received[0][1]
        waste_share = (self._wasted[-1][1] - self._wasted[0][1]) / recv_window if recv_window > 0 else 0.0
        if now - self._last_adjust >= ADJUST_EVERY_S:
            self.batch = next_batch(self.batch, backlog, 1.0 - busy_share, self.s.batch, self.s.max_batch,
                                    self.s.multiple)
            self._last_adjust = now
        line = overload_line(arrival, capacity, self.s.target_reuse, waste_share, self.batch >= self.s.max_batch)
        message = None
        if line and now - self._last_warn >= WARN_EVERY_S:
            message, self._last_warn = line, now
        return Decision(self.batch, self.s.publish_interval_s, arrival, consumed_rate, capacity, waste_share,
                        line is not None, self.s.target_reuse, message)

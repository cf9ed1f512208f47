"""Automatic balancing of the optimizer against its rollout workers: reuse held at a target, staleness
counted in the units OpenAI Five meant, and a plain line when the rollouts produce more than it can use.

The design (GA3C's run-time scheduling with Rapid's targets):

- **Reuse.** The buffer never lets consumed samples exceed ``target_reuse`` × the usable samples received,
  nor any sample be drawn more than ``ceil(target_reuse)`` times, so reuse cannot run above the target.
  To keep it from falling below (samples dropped unused), the optimizer must draw as fast as samples
  arrive: it adapts how much it trains per received sample through the batch size. A backlog of unused
  samples beyond two batches grows the batch: on a GPU a larger batch amortizes the per-update overhead,
  so more samples per second go through. Not always: on a CPU a batch of 1,024 cost 0.48 ms a sample and
  one of 128 0.27 ms. So each growth is a trial: once the new size is measured (``MEASURE_UPDATES`` updates
  and ``MEASURE_S`` busy seconds), the batch stays only if it moved more samples per busy second than before
  (:func:`growth_paid`); otherwise it goes back and that size becomes the ceiling for the run. Both sizes are
  judged by their quicker updates (:func:`samples_per_busy_s`), and nothing is tried in the first ``WARMUP_S``:
  on a laptop the other processes share the cores, and their start-up and evaluation rounds made a few
  updates at the old size look dear enough to keep a batch that costs more a sample. An optimizer that keeps
  waiting for data with little backlog shrinks the batch back towards the configured ``batch_samples``, never
  below, never above ``max_batch_samples``.
- **Staleness.** Rollouts upload every ``upload_interval_s`` and poll parameters every ``param_poll_s``; a
  version published after every update makes a sample look many versions old just by waiting for its
  upload (samples then go "stale" by the dozen). Versions are published by time instead, about once per
  upload interval (``publish_interval_s``), so a staleness of 1 means "one upload behind", as in OpenAI
  Five (uploads and versions about once a minute there, staleness ≈ 0–1).
- **Pace.** When samples pile up unused (more than ``PACE_HIGH`` batches, or half the buffer, above the two batches
  that grow the batch) and samples go to waste, the optimizer asks the rollout workers to play a smaller share of
  their time (the ``pace`` each published version carries; Sample Factory throttles its sampler the same way): ×
  ``PACE_DOWN`` at most every ``pace_every_s`` (as long as a change takes to show in what arrives), down to
  ``PACE_MIN``; once less than a batch waits, or the optimizer waited for data more than ``PACE_IDLE`` of the
  window (arrivals come in bursts, one upload at a time: a look just after one sees a backlog a fast learner eats
  at once), × ``PACE_UP`` back towards 1. What is produced is then trained rather than dropped stale or evicted
  unused.
- **Room.** A cut takes ``pace_every_s`` to show, and until it does the samples keep coming at the old pace: a
  buffer sized by hand (4,096 samples hold 0.3 s of what 14 workers of a GPU box send) overflows before any cut
  lands, and what it drops is wasted. So the buffer grows to hold what arrives over two looks of the pace
  (:func:`buffer_wanted`), but no more than the optimizer can train (its measured capacity) while a sample stays
  fresh: beyond that a sample kept is a sample gone stale instead of evicted. Up to ``max_buffer`` (the memory
  allowed); on a GPU the batch ceiling follows (half the buffer). It never shrinks: a paced run's arrivals fall,
  and the room for the next burst should stay.
- **Saying so.** Arrival and consumption rates are measured over a sliding window. When samples go unused
  at the largest batch allowed and what arrives (at the target reuse) is clearly more than the optimizer can
  consume (``OVERLOAD_MARGIN``), measured over a whole window, the optimizer logs (at most once a minute) what
  it receives, what it can consume at the target and what to add: more optimizer ranks/GPUs, or fewer rollout
  workers. Samples wasted while the optimizer keeps up (stale ones, a start-up burst) are not an overload.

Every decision is a small pure function below; :class:`Balancer` strings them together once per update.

The optimizer calls ``step`` once per update with the buffer's counts (``dropped_stale + evicted_unused`` as
``wasted``, ``unused`` as ``backlog``) and the seconds the update itself took.

Usage::

    >>> balancer = Balancer(BalanceSettings(batch=256, max_batch=1024, target_reuse=1.0, publish_interval_s=2.0))
    >>> for update in range(40):             # 10 s at 0.25 s an update (1,024 samples a busy second): past the warm-up
    ...     d = balancer.step(0.25 * update, received=250 * update, consumed=256 * update, wasted=0,
    ...                       backlog=600, busy_s=0.25)
    >>> d.batch, d.arrival_per_s, d.capacity_per_s, d.message    # backlog > 2 batches: the batch grows (a trial)
    (320, 1000.0, 1024.0, None)
    >>> at_max = Balancer(BalanceSettings(batch=256, max_batch=256, target_reuse=1.0, publish_interval_s=2.0))
    >>> d = at_max.step(0.0, received=0, consumed=0, wasted=0, backlog=0, busy_s=0.1)
    >>> d = at_max.step(30.0, received=30_000, consumed=7_680, wasted=15_000, backlog=244, busy_s=27.0)
    >>> print(d.message)                                         # None, or the one line to log (a full window)
    rollouts outrun the optimizer: it receives 1,000 samples/s and can consume 284/s at reuse target 1 (50% ...
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from dataclasses import dataclass

GROW, SHRINK = 1.25, 0.8
ADJUST_EVERY_S = 1.0
WARN_EVERY_S = 60.0
WASTE_TOLERANCE = 0.05
MEASURE_UPDATES = 8
MEASURE_S = 3.0
"""A batch size is measured once it ran ``MEASURE_UPDATES`` updates and this many busy seconds."""
WARMUP_S = 5.0
"""No growth is tried, and no update measured, in the first seconds after the first update."""
COSTS_KEPT = 256
"""A size's samples per busy second come from its last this many updates."""
MIN_GAIN_SHARE = 0.2
OVERLOAD_MARGIN = 1.1
"""Rollouts outrun the optimizer when arrival × target reuse exceeds its capacity by more than this factor:
rates measured over a window wobble by a few percent, and "add 1.0× the capacity" is no advice."""
WINDOW_S = 30.0
PACE_EVERY_S = 5.0
"""Least seconds between two changes of the rollouts' pace (see :attr:`BalanceSettings.pace_every_s`)."""
PACE_DOWN, PACE_UP = 0.7, 1.25
PACE_CUT = 0.25
"""The deepest cut of the pace at once."""
PACE_WASTE = 0.01
"""The share of samples going to waste (over the window) past which the rollouts are slowed."""
PACE_MIN = 0.05
PACE_IDLE = 0.25
"""The share of the window the optimizer waited for data past which it can take more: the pace goes back up."""
PACE_HIGH = 4
"""Batches of unused samples (at most half the buffer) past which the rollouts are slowed."""
ROOM_LOOKS = 2
"""The buffer holds what arrives over this many looks of the pace: a cut decided at one shows by the next."""
ROOM_STEP = 1024
"""The buffer grows in whole steps of this many samples (few reallocations)."""


def buffer_wanted(arrival_per_s: float, capacity_per_s: float, pace_every_s: float, fresh_s: float = math.inf) -> int:
    """Samples the buffer should hold for ``arrival_per_s`` arriving: what comes over ``ROOM_LOOKS`` looks of the
    pace, but no more than the optimizer trains (``capacity_per_s``) while a sample stays fresh (``fresh_s``:
    the rest would go stale unused), rounded up to ``ROOM_STEP``.

    >>> buffer_wanted(13_000, 50_000, pace_every_s=5.0, fresh_s=34.0)   # 14 workers of a GPU box, a GPU learner
    130048
    >>> buffer_wanted(13_000, 300, pace_every_s=5.0, fresh_s=34.0)      # a learner that trains 300/s of them
    10240
    >>> buffer_wanted(300, 1_000, pace_every_s=5.0, fresh_s=18.0)       # connect four on a laptop: 4,096 do
    3072
    """
    want = min(arrival_per_s * ROOM_LOOKS * pace_every_s, capacity_per_s * fresh_s)
    return max(ROOM_STEP, math.ceil(want / ROOM_STEP) * ROOM_STEP)


def next_pace(pace: float, backlog: float, batch: int, buffer: int, waste_share: float, falling: bool = False,
              trainable: float | None = None, idle_share: float = 0.0) -> float:
    """The share of their time the rollout workers should play: lower while more than ``PACE_HIGH`` batches (or half
    the buffer) wait unused and samples go to waste (a backlog a reuse target above 1
    keeps is no reason), unless that backlog is already ``falling``; higher once less than a batch waits, or the
    optimizer waited for data more than ``PACE_IDLE`` of the time (``idle_share``), and nothing goes to waste.
    A cut goes to ``trainable`` (the share of what arrives at this pace that the
    optimizer can train, when the arrivals measured were all played at it), at most ``PACE_CUT`` at once; else
    it is ``PACE_DOWN``.

    >>> next_pace(1.0, backlog=5000, batch=256, buffer=8192, waste_share=0.2)
    0.7
    >>> next_pace(1.0, backlog=5000, batch=256, buffer=8192, waste_share=0.2, trainable=0.4)
    0.4
    >>> next_pace(0.4, backlog=5000, batch=256, buffer=8192, waste_share=0.2, falling=True)
    0.4
    >>> next_pace(1.0, backlog=5000, batch=256, buffer=8192, waste_share=0.0)   # nothing wasted
    1.0
    >>> next_pace(0.4, backlog=100, batch=256, buffer=8192, waste_share=0.0)   # it drained
    0.5
    >>> next_pace(0.4, backlog=600, batch=256, buffer=8192, waste_share=0.0, idle_share=0.6)   # a burst, eaten
    0.5
    """
    high = min(PACE_HIGH * batch, buffer // 2)
    if backlog > high and waste_share > PACE_WASTE:
        if falling:
            return pace
        cut = PACE_DOWN if trainable is None else min(PACE_DOWN, max(PACE_CUT, trainable))
        return max(PACE_MIN, pace * cut)
    if (backlog < batch or idle_share > PACE_IDLE) and waste_share <= PACE_WASTE:  # no swing: not while it wastes
        return min(1.0, pace * PACE_UP)
    return pace


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


def growth_paid(before: int, before_per_busy_s: float, after: int, after_per_busy_s: float) -> bool:
    """A batch grown from ``before`` to ``after`` samples stays only if samples per busy second rose by at
    least ``MIN_GAIN_SHARE`` of the growth: where the per-update overhead dominates (a GPU), they rise about
    as much as the batch; where each sample costs the same or more (a CPU), not at all."""
    return after_per_busy_s >= before_per_busy_s * (1 + MIN_GAIN_SHARE * (after / before - 1))


def samples_per_busy_s(costs: deque[float] | list[float]) -> float:
    """Samples per busy second of a batch size from its updates' busy seconds per sample, at the lower quartile:
    other processes only ever slow an update (a start-up, an evaluation round), so the quicker updates show
    what the size itself costs, and a trial is not decided by what else the cores did meanwhile.

    >>> samples_per_busy_s([0.001, 0.001, 0.001, 0.004, 0.004])   # two of five updates slowed fourfold
    1000.0
    """
    return 1.0 / statistics.quantiles(costs, n=4, method="inclusive")[0] if len(costs) > 1 else 0.0


def publish_due(now: float, last_publish: float, interval_s: float) -> bool:
    """Publish by time: about one version per interval, however fast the updates run."""
    return now - last_publish >= interval_s


def interval_mark(last_mark: float, now: float, interval_s: float) -> float:
    """What the next interval counts from once a thing due every ``interval_s`` (a version, the ranks' pooling of
    games) is done at ``now``: the last time on the grid of intervals from ``last_mark`` that is not after ``now``.
    It keeps the configured cadence however long the rounds that do it take (counted from ``now``, a 5-s publish
    interval with 1-s updates gave one version every 6-7 s), and one done late takes the slots it missed: no burst
    to catch up.

    >>> interval_mark(100.0, 106.2, 5.0), interval_mark(100.0, 112.0, 5.0), interval_mark(100.0, 100.5, 5.0)
    (105.0, 110.0, 100.0)
    >>> interval_mark(100.0, 103.0, 0.0)   # no interval (optimizer.balance off: versions every publish_every updates)
    103.0
    """
    if interval_s <= 0:
        return now
    return last_mark + max(0.0, math.floor((now - last_mark) / interval_s)) * interval_s


def rate(points: deque[tuple[float, float]]) -> float:
    """Per-second rate of a cumulative count sampled at (time, count) points."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return 0.0
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def overload_line(arrival: float, capacity: float, target: float, waste_share: float, at_max: bool) -> str | None:
    """The one line to log when rollouts outrun the optimizer, else None: samples go unused although the
    batch is already the largest allowed, and more arrives than the optimizer can consume.

    >>> print(overload_line(1862, 1925, 1.0, 0.3, at_max=True))   # it keeps up: the waste has another cause
    None
    """
    need = arrival * target
    if not at_max or waste_share <= WASTE_TOLERANCE or arrival <= 0 or need <= capacity * OVERLOAD_MARGIN:
        return None
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
    window_s: float = WINDOW_S
    """Rates are measured over this sliding window; nothing is called an overload before one is full."""
    buffer: int = 0
    """The buffer's capacity in samples, with ``pace``: the rollouts are slowed past half of it (0: no pacing)."""
    pace_every_s: float = PACE_EVERY_S
    """Least seconds between two changes of the pace: about the time one takes to show in what arrives (the next
    version, the workers' poll, their next upload), so that the pace does not swing."""
    max_buffer: int = 0
    """The most samples the buffer may grow to from ``buffer`` (:func:`buffer_wanted`; 0 or ≤ buffer: it keeps its
    size)."""
    fresh_s: float = math.inf
    """Seconds a sample stays fresh (max_staleness + 1 publish intervals): room beyond what the optimizer trains
    meanwhile would hold samples that go stale unused."""
    batch_follows_buffer: bool = False
    """The batch may grow to half the buffer, as it grows (a GPU learner without optimizer.max_batch_samples)."""


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
    pace: float = 1.0
    """The share of their time rollout workers should play (1: full speed)."""
    buffer: int = 0
    """The samples each rank's buffer should hold, once more than it started with (0: as it started)."""


class Balancer:
    def __init__(self, settings: BalanceSettings, now: float = 0.0):
        self.s = dataclasses.replace(settings)  # its own: a batch ceiling may follow the buffer
        self.batch = settings.batch
        self.ceiling = settings.max_batch
        """The largest batch to try: lowered to a size whose growth did not pay (see :func:`growth_paid`)."""
        self._costs: deque[float] = deque(maxlen=COSTS_KEPT)
        """Busy seconds per sample of the updates at the current size (after the warm-up)."""
        self._size_busy_s = 0.0
        self._last_consumed: int | None = None
        self._first_step: float | None = None
        self._trial: tuple[int, float] | None = None  # (batch before a growth, its samples per busy second)
        self._received: deque[tuple[float, float]] = deque()
        self._consumed: deque[tuple[float, float]] = deque()
        self._wasted: deque[tuple[float, float]] = deque()
        self._busy: deque[tuple[float, float]] = deque()
        self._busy_total = 0.0
        self._last_adjust = now
        self._started = now
        self._last_warn = -math.inf
        self.pace = 1.0
        self._last_pace = now
        # (when, samples received then, whether the pace held over the two looks before: a change shows a look late)
        self._pace_mark = (now, 0, True)
        self._pace_held = True
        self._pace_backlog = 0.0
        self.buffer = settings.buffer

    def _push(self, points: deque, now: float, value: float) -> None:
        points.append((now, value))
        while len(points) > 2 and points[1][0] <= now - self.s.window_s:
            points.popleft()

    def _adjust(self, backlog: int, idle_share: float) -> None:
        """Shrink at once; grow, and judge a growth, only once the current size is measured."""
        measured = len(self._costs) >= MEASURE_UPDATES and self._size_busy_s >= MEASURE_S
        if self._trial is not None:
            if not measured:
                return
            before, before_per_busy_s = self._trial
            self._trial = None
            if not growth_paid(before, before_per_busy_s, self.batch, samples_per_busy_s(self._costs)):
                self.ceiling = before
                self._change(before)
                return
        batch = next_batch(self.batch, backlog, idle_share, self.s.batch, self.ceiling, self.s.multiple)
        if batch > self.batch:
            if not measured:
                return
            self._trial = (self.batch, samples_per_busy_s(self._costs))
        if batch != self.batch:
            self._change(batch)

    def _change(self, batch: int) -> None:
        self.batch = batch
        self._costs.clear()
        self._size_busy_s = 0.0

    def _measure(self, now: float, consumed: int, busy_s: float) -> None:
        """Records the update's busy seconds per sample it drew (after the warm-up)."""
        samples = consumed - (consumed if self._last_consumed is None else self._last_consumed)
        self._last_consumed = consumed
        self._first_step = now if self._first_step is None else self._first_step
        if now - self._first_step >= WARMUP_S and samples > 0 and busy_s > 0:
            self._costs.append(busy_s / samples)
            self._size_busy_s += busy_s

    def _pace_step(self, now: float, received: int, backlog: int, capacity: float, waste_share: float,
                   idle_share: float) -> None:
        """One look at the pace. Arrivals since the last look were all played at the pace in force if it had not
        changed in the look before (a change shows an upload later): then a cut can go straight to what trains."""
        since, got, held = self._pace_mark
        arrival = (received - got) / (now - since) if now > since else 0.0
        trainable = capacity / (arrival * self.s.target_reuse) if held and arrival > 0 and capacity > 0 else None
        pace = next_pace(self.pace, backlog, self.batch, self.buffer, waste_share,
                         falling=backlog < self._pace_backlog, trainable=trainable, idle_share=idle_share)
        self._pace_mark = (now, received, self._pace_held and pace == self.pace)
        self._pace_held = pace == self.pace
        self.pace, self._pace_backlog, self._last_pace = pace, backlog, now

    def _grow(self, want: int) -> None:
        """The buffer to ``want`` samples if larger; a batch ceiling that is half the buffer (a GPU learner's)
        follows, unless a growth trial lowered it."""
        if want <= self.buffer:
            return
        if self.s.batch_follows_buffer:
            hi = max(self.s.batch, want // 2 - want // 2 % self.s.multiple)
            self.ceiling = hi if self.ceiling == self.s.max_batch else self.ceiling
            self.s.max_batch = hi
        self.buffer = want

    def step(self, now: float, received: int, consumed: int, wasted: int, backlog: int,
             busy_s: float) -> Decision:
        """Once per update: ``busy_s`` is the time the update itself took (not waiting for data)."""
        self._busy_total += busy_s
        self._measure(now, consumed, busy_s)
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
            self._adjust(backlog, 1.0 - busy_share)
            self._last_adjust = now
            if self.s.max_buffer > self.buffer and arrival > 0:  # room before the first cut, not a look later
                self._grow(min(self.s.max_buffer, buffer_wanted(arrival, capacity, self.s.pace_every_s,
                                                                  self.s.fresh_s)))
        if self.s.buffer and now - self._last_pace >= self.s.pace_every_s:  # a start-up flood is the first to slow
            self._pace_step(now, received, backlog, capacity, waste_share, 1.0 - busy_share)
        measured = now - self._started >= self.s.window_s  # a start-up burst alone is no rate
        line = overload_line(arrival, capacity, self.s.target_reuse, waste_share,
                             self.batch >= self.ceiling) if measured else None
        message = None
        if line and now - self._last_warn >= WARN_EVERY_S:
            message, self._last_warn = line, now
        return Decision(self.batch, self.s.publish_interval_s, arrival, consumed_rate, capacity, waste_share,
                        line is not None, self.s.target_reuse, message, self.pace,
                        self.buffer if self.buffer > self.s.buffer else 0)

"""Driving rapid's own loop objects in simulated time.

A role's loop (``RolloutLoop.run()``, ``OptimizerLoop.run()``) yields requests (``rapid.roles.steps``); in a
role ``drive`` answers them with real time and the process group. Here :func:`loop_actor` answers them for the
scheduler: a ``Sleep`` or ``Until`` passes in simulated time, and a collective (``AllReduce``, ``AllGather``)
waits in a :class:`Group` until every rank has asked, then every rank goes on at the same moment: the last
arrival (the straggler sets the pace) plus the collective's cost in an α–β model (:class:`Links`).
"""

from __future__ import annotations

import math
from concurrent.futures import Executor, Future
from dataclasses import dataclass

from rapid.roles.steps import AllGather, AllReduce, Sleep, Until

UNTIL_POLL_S = 0.05
"""How often a simulated ``Until`` looks at its condition (a thread would be woken by a condition variable)."""


@dataclass
class Links:
    """The α–β cost of a collective over R ranks: ``alpha_s`` per message hop, ``bytes_per_s`` per link. Ring
    algorithms: an all-reduce of n bytes costs 2(R−1)·α + 2·(R−1)/R·n/β; an all-gather of n bytes a rank
    (R−1)·α + (R−1)·n/β. Defaults: NCCL over InfiniBand between nodes, ~10 µs a hop, ~10 GB/s."""

    alpha_s: float = 10e-6
    bytes_per_s: float = 10e9

    def all_reduce_s(self, ranks: int, nbytes: float) -> float:
        if ranks <= 1:
            return 0.0
        return 2 * (ranks - 1) * self.alpha_s + 2 * (ranks - 1) / ranks * nbytes / self.bytes_per_s

    def all_gather_s(self, ranks: int, nbytes: float) -> float:
        if ranks <= 1:
            return 0.0
        return (ranks - 1) * self.alpha_s + (ranks - 1) * nbytes / self.bytes_per_s


class Group:
    """The ranks' process group in simulated time: a collective completes once all ``size`` ranks have
    asked; each rank gets its answer at the last arrival plus the collective's cost."""

    def __init__(self, sched, clock, size: int, links: Links):
        self.sched, self.clock, self.size, self.links = sched, clock, size, links
        self._asked: dict[int, tuple[object, AllReduce | AllGather, float]] = {}  # rank → (actor, request, arrival)
        self._answers: dict[int, object] = {}
        self.collectives = 0
        self.gathers = 0  # all-gathers: the ranks pooling their games for the league
        self.seconds = 0.0  # simulated seconds all collectives cost (without the waits for stragglers)
        self.straggler_wait_s = 0.0  # summed over collectives: last arrival − first arrival

    def meet(self, rank: int, request: AllReduce | AllGather):
        """A generator for the rank's actor: parks until every rank has asked, returns this rank's answer."""
        self._asked[rank] = (self.clock.actor, request, self.clock.t())
        if len(self._asked) == self.size:
            self._complete()
        while rank not in self._answers:
            yield None  # parked; woken by the last arrival
        return self._answers.pop(rank)

    def _complete(self) -> None:
        asked, self._asked = self._asked, {}
        requests = [asked[r][1] for r in range(self.size)]
        first, last = min(a[2] for a in asked.values()), max(a[2] for a in asked.values())
        reduces = [req for req in requests if isinstance(req, AllReduce)]
        gathers = [req for req in requests if isinstance(req, AllGather)]
        answers: dict[int, object]
        if len(reduces) == self.size:
            keys = reduces[0].values
            summed = {k: math.fsum(req.values[k] for req in reduces) for k in keys}
            cost = self.links.all_reduce_s(self.size, 8 * len(keys))
            answers = {r: dict(summed) for r in range(self.size)}
        elif len(gathers) == self.size:
            self.gathers += 1
            blobs = [req.blob for req in gathers]
            cost = self.links.all_gather_s(self.size, max(len(b) for b in blobs))
            answers = {r: list(blobs) for r in range(self.size)}
        else:  # a real process group would hang or fail here
            raise RuntimeError(f"the ranks asked for different collectives: {requests}")
        self.collectives += 1
        self.seconds += cost
        self.straggler_wait_s += last - first
        done = last + cost
        for r, (actor, _, _) in asked.items():
            self._answers[r] = answers[r]
            if actor is not self.clock.actor:
                self.sched.wake(actor, done)
        self.clock.elapsed = max(self.clock.elapsed, done - self.clock.now)  # the last arrival goes on then too


def loop_actor(clock, loop, group: Group | None = None, rank: int = 0, on_end=None):
    """A scheduler actor that runs ``loop`` (a generator of ``rapid.roles.steps`` requests) in simulated time;
    ``on_end(value)`` gets what the loop returned."""
    reply: object = None
    while True:
        try:
            request = loop.send(reply)
        except StopIteration as end:
            if on_end is not None:
                on_end(end.value)
            return
        reply = None
        if isinstance(request, Sleep):
            yield clock.t() + request.seconds
        elif isinstance(request, Until):
            deadline = clock.t() + request.timeout_s
            while not request.ready() and clock.t() < deadline:
                yield min(clock.t() + UNTIL_POLL_S, deadline)
        elif isinstance(request, AllReduce | AllGather):
            if group is None:  # one rank: its own answer, as steps.answer gives without a process group
                reply = dict(request.values) if isinstance(request, AllReduce) else [request.blob]
            else:
                reply = yield from group.meet(rank, request)
        else:
            raise TypeError(f"not a loop request: {request!r}")


class SimStop:
    """A role's stop flag in simulated time: a wait between retries moves the clock."""

    def __init__(self, clock):
        self.clock, self.reason = clock, None

    def __bool__(self) -> bool:
        return self.reason is not None

    def set(self, reason: str) -> None:
        self.reason = self.reason or reason

    def wait(self, seconds: float) -> bool:
        self.clock.charge(seconds)
        return bool(self)


class InlineDownloads(Executor):
    """The loader's download pool, run inline; ``streams`` downloads in flight overlap, so each is charged
    1/streams of its modelled latency."""

    def __init__(self, clock, streams: int):
        self.clock, self.streams = clock, max(1, streams)

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        self.clock.streams = self.streams
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # the loader reads it from the future, as from a pool thread
            future.set_exception(e)
        finally:
            self.clock.streams = 1
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing runs in the background."""

"""The scheduler of the scale model: actors are generators that yield the simulated time they want to run
again (None: parked until woken); each step runs inside ``SimClock.acting``, so the code it calls reads the
simulated clock, plus the latency its requests were charged, plus its actor's clock error."""

from __future__ import annotations

import heapq


class OutOfTime(Exception):
    def __init__(self, at: float):
        super().__init__(f"stopped at simulated second {at:.0f}")
        self.at = at


class Actor:
    """One thread of the fleet; ``process`` names the process it belongs to (its threads share a CPU lock)."""

    def __init__(self, name: str, gen, skew: float = 0.0, process: object = None):
        self.name, self.gen, self.skew, self.dead, self.process = name, gen, skew, False, process


class Scheduler:
    def __init__(self, clock):
        self.clock = clock
        self._heap: list = []
        self._seq = 0
        self._parked: set[Actor] = set()
        self.steps = 0

    def start(self, actor: Actor, at: float) -> Actor:
        self._push(actor, at)
        return actor

    def _push(self, actor: Actor, at: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, actor))

    def wake(self, actor: Actor, at: float) -> None:
        if actor in self._parked:
            self._parked.discard(actor)
            self._push(actor, at)

    def run(self, until: float, tick=None) -> None:
        while self._heap and self._heap[0][0] <= until:
            at, _, actor = heapq.heappop(self._heap)
            if actor.dead:
                continue
            with self.clock.acting(actor, at, actor.skew):
                try:
                    wake = next(actor.gen)
                except StopIteration:
                    actor.dead = True
                    continue
            self.steps += 1
            if wake is None:
                self._parked.add(actor)
            else:
                self._push(actor, max(wake, at))
            if tick is not None:
                tick(at)

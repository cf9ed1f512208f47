"""A call of rapid's synchronous code that takes simulated time as it goes, not all at once.

The loader's ``step`` takes in every new object in one call. Run as one scheduler step, every object would enter
the buffer at the poll's start while the poll's CPU is booked far ahead: under a backlog the update loop would see
only the last few objects of a poll that took seconds. :class:`Stepped` runs the call on a thread of its own and
hands the scheduler back the simulated time at each :meth:`Stepped.pause` (after each object's intake), so the
other actors run in between, as the loader thread and the update loop interleave in the optimizer process. One
thread runs at a time, so the model stays deterministic.
"""

from __future__ import annotations

import queue
import threading


class Stepped:
    def __init__(self, clock):
        self.clock = clock
        self._to_sched: queue.Queue = queue.Queue()
        self._to_thread: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def pause(self) -> None:
        """On the call's thread: let the scheduler run until the step's clock, then go on there (elsewhere: none)."""
        if threading.current_thread() is not self._thread:
            return
        streams, self.clock.streams = self.clock.streams, 1  # the downloads in flight are this thread's
        self._to_sched.put(("wait", self.clock.t()))
        self._to_thread.get()
        self.clock.streams = streams

    def run(self, fn):
        """A generator for a scheduler actor: yields the times to go on at; returns what ``fn()`` returned."""

        def body() -> None:
            try:
                self._to_sched.put(("done", fn()))
            except BaseException as e:  # handed to the actor, which raises it in the scheduler's thread
                self._to_sched.put(("error", e))

        self._thread = threading.Thread(target=body, name="stepped", daemon=True)
        self._thread.start()
        while True:
            kind, value = self._to_sched.get()
            if kind == "wait":
                yield value
                self._to_thread.put(None)
            elif kind == "error":
                raise value
            else:
                self._thread.join()
                return value

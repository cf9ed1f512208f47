"""Parameter publishing and checkpoint writing on a background thread, so the update loop never waits on
the store.

Jobs run one at a time in the order given, so versions are published in order (each job writes its
version object before moving LATEST). At most one job waits behind the running one, so a store slower than
the updates never piles up copies of the weights: ``submit`` would block on a full queue, and the update loop
never lets it. It asks ``can_submit`` first and, while the writer is full, holds the version and goes on
training (:class:`rapid.roles.optimizer_loop.OptimizerLoop`); ``wait_for_room`` is how a thread waits for room
where nothing else waits on it (the loop's last publish). ``try_submit`` is for optional work, skipped while
anything is queued. The league has a thread of its own (``rapid.roles.league_keeper``).
A job's exception is kept and raised in the caller's thread by the next ``submit``/``check``/``close``; after one
(``failed``) the jobs still queued are skipped. With ``start=False`` no thread is started and whoever owns the
writer runs its jobs with ``run_next`` (the scale model does, in simulated time).

Usage (in the learner a job is ``lambda: params.publish(3, tensors, meta)``, with a copy of the tensors)::

    >>> done = []
    >>> writer = BackgroundWriter()
    >>> writer.submit("publish v3", lambda: done.append("v3"))
    >>> writer.drain()                       # wait for it here only to make try_submit's answer certain
    >>> writer.try_submit("optional", lambda: done.append("ckpt"))   # queued: nothing else was pending
    True
    >>> writer.check()                       # raises the first job error, if any
    >>> writer.close()                       # drains: every submitted job has run
    >>> done
    ['v3', 'ckpt']
    >>> failing = BackgroundWriter()
    >>> failing.submit("publish v4", lambda: 1 / 0)
    >>> failing.close()                      # the job's error, raised in the caller's thread
    Traceback (most recent call last):
    ZeroDivisionError: division by zero
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

MAX_JOBS = 2
"""Jobs alive at once: one running and one waiting behind it (each holds a copy of the weights)."""


class BackgroundWriter:
    def __init__(self, on_done: Callable[[str, float], None] | None = None, start: bool = True):
        self.on_done = on_done
        self._jobs: queue.Queue = queue.Queue()  # bounded by MAX_JOBS through _pending
        self._error: BaseException | None = None
        self._failed = False
        self._pending = 0
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True) if start else None
        if self._thread:
            self._thread.start()

    def _run(self) -> None:
        while self.run_next(block=True):
            pass

    def run_next(self, block: bool = False) -> bool:
        """Run the next queued job (waiting for one if ``block``); False once closed or, unblocked, when none
        is queued."""
        try:
            item = self._jobs.get(block=block)
        except queue.Empty:
            return False
        if item is None:
            return False
        name, job = item
        t0 = time.perf_counter()
        try:
            if not self._failed:  # after a failure nothing more is written: the caller ends the role
                job()
                if self.on_done:
                    self.on_done(name, time.perf_counter() - t0)
        except BaseException as e:  # kept for the caller's thread, which decides
            self._error, self._failed = e, True
        finally:
            with self._room:
                self._pending -= 1
                self._room.notify_all()
            self._jobs.task_done()
        return True

    @property
    def failed(self) -> bool:
        """A job raised: nothing more is written (its error is raised by the next ``submit``/``check``/``close``)."""
        return self._failed

    def can_submit(self) -> bool:
        """True if a ``submit`` now would not wait (fewer than ``MAX_JOBS`` are queued or running)."""
        return self._pending < MAX_JOBS

    def wait_for_room(self, timeout_s: float) -> None:
        """Block up to ``timeout_s`` for ``can_submit``."""
        with self._room:
            self._room.wait_for(self.can_submit, timeout_s)

    def submit(self, name: str, job: Callable[[], object]) -> None:
        """Queue ``job``; blocks while ``MAX_JOBS`` are queued or running (ask ``can_submit`` first not to)."""
        self.check()
        with self._room:
            self._room.wait_for(self.can_submit)
            self._pending += 1
        self._jobs.put((name, job))

    def try_submit(self, name: str, job: Callable[[], object]) -> bool:
        """Queue ``job`` only if nothing is running or waiting; True if queued."""
        self.check()
        with self._lock:
            if self._pending:
                return False
            self._pending += 1
        self._jobs.put((name, job))
        return True

    def check(self) -> None:
        """Raise a failed job's error (once; later jobs are skipped all the same)."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def drain(self) -> None:
        self._jobs.join()

    def close(self) -> None:
        """Run every queued job, stop the thread, then raise a job's error if one failed. It returns once the jobs
        have: a job that retries a store outage (``until_stored``) ends at its next failure once the role is
        asked to stop, so a role sets its stop flag before it closes the writer."""
        if self._thread is None:
            while self.run_next():
                pass
        else:
            self._jobs.join()
            self._jobs.put(None)
            self._thread.join()
        self.check()

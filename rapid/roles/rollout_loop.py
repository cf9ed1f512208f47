"""One rollout worker's loop: wait for the first version, then collect a segment, hand it to the uploader, swap
in a newer version between segments, and stop playing when the run's optimizer is gone.

The loop is an object whose clock, experience source, uploader and parameter poller are given to it, and its
body is a generator of requests (:mod:`rapid.roles.steps`). :func:`rapid.roles.rollout.run_rollout` wires it
with a real :class:`RolloutWorker` and the uploader's and poller's threads, and drives it with real time; the
scale model (``benchmarks/bench_fleet.py``) drives this very object for thousands of workers in simulated time,
with a source that makes samples without an env and runs the poller's ``poll_once`` and the uploader's
``seal``/``upload_pending`` on its own schedule.

How :func:`rapid.roles.rollout.run_rollout` wires and drives it::

    loop = RolloutLoop(worker, uploader, poller, RunWatch(store, quiet_s), metrics, agents_per_game, linger_s,
                       stop, log)
    exit_code = drive(loop.run(), wait=stop.wait)

``worker`` has ``collect() -> Segment``, ``set_params(version, tensors, meta)`` (raising ValueError for tensors
that do not fit) and ``version``.
"""

from __future__ import annotations

import time

from rapid.roles.steps import Sleep

FIRST_PARAMS_POLL_S = 0.2
MIN_PACE = 0.05
MAX_PAUSE_S = 30.0
"""The longest pause after one segment, whatever the pace: a worker stays responsive to a faster one."""


def pace_of(meta) -> float:
    """The share of its time a worker plays, as the version it plays says (optimizer.pace_rollouts); 1 for a
    version without one, or one whose value is not a number within [MIN_PACE, 1] (stored objects may be hostile).

    >>> pace_of({"pace": 0.25}), pace_of({}), pace_of({"pace": 0.0}), pace_of({"pace": "0.5"})
    (0.25, 1.0, 1.0, 1.0)
    """
    value = (meta or {}).get("pace")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and MIN_PACE <= value <= 1.0:
        return float(value)
    return 1.0


def pause_after(play_s: float, pace: float) -> float:
    """Seconds to pause after a segment that took ``play_s`` to play, so that playing is ``pace`` of the time.

    >>> pause_after(2.0, 1.0), pause_after(2.0, 0.25), pause_after(20.0, 0.05)
    (0.0, 6.0, 30.0)
    """
    return min(MAX_PAUSE_S, play_s * (1.0 / pace - 1.0)) if pace < 1.0 else 0.0


class RolloutLoop:
    def __init__(self, worker, uploader, poller, watch, metrics, agents_per_game: int, linger_s: float, stop, log,
                 clock=time, warmup_upload_s: float | None = None):
        """``warmup_upload_s``: the uploader's interval while the version played is stamped as the warm-up's
        (rollout.warmup_upload_interval_s; None: the uploader keeps its own throughout)."""
        self.worker, self.uploader, self.poller, self.watch = worker, uploader, poller, watch
        self.metrics, self.agents_per_game, self.linger_s = metrics, agents_per_game, linger_s
        self.stop, self.log, self.clock = stop, log, clock
        self.upload_intervals = None if warmup_upload_s is None else (warmup_upload_s, uploader.interval_s)
        """(in the warm-up, after it) seconds between uploads, or None."""
        self.version: int | None = None
        """The version the worker plays (None until the first has arrived)."""
        self.pace = 1.0
        """The share of its time the worker plays, as the optimizer asked in the version it plays."""
        self.paused_s = 0.0

    def run(self):
        """The loop, to its end: yields requests, returns the exit code."""
        yield from self._first_params()
        if self.version is None:
            return 0
        w, m = self.worker, self.metrics
        version_at, asked = self.clock.time(), False
        while not self.stop:
            gone = self.watch.optimizer_gone(version_at, self.clock.time(), force=not asked)  # at start, when quiet
            asked = True
            if gone and not (yield from self._linger(gone)):
                return 0
            began = self.clock.monotonic()
            segment = w.collect()
            pause = pause_after(self.clock.monotonic() - began, self.pace)
            self.uploader.add(segment)
            m.env_steps(segment.env_steps // self.agents_per_game)
            m.agent_steps(segment.env_steps)
            m.backlog(self.uploader.stats.backlog)
            for ep in segment.episodes:
                m.episode(ep["learner_return"], ep["length"])
            m.pace(self.pace)
            # At a slower pace the optimizer trains what is played instead of dropping it; the pause comes before
            # the swap, so the next segment plays the newest version, not one a pause old. At full pace it is zero,
            # still a turn for the threads beside the loop: its poller's fetch during the segment is taken now.
            self.paused_s += pause
            yield Sleep(pause)
            newer = self.poller.take()
            if newer is not None:  # swapped only between segments
                m.param_version(self._swap(newer))
                version_at = self.clock.time()
            m.params_behind(self.poller.behind_s())
            if not self.poller.alive():
                self.log.error("the parameter poller thread has died; stopping")
                return 1
        return 0

    def _first_params(self):
        """Wait for the first good version the poller fetches (none if stopped first)."""
        started, warned = self.clock.monotonic(), False
        while not self.stop and self.version is None:
            first = self.poller.take()
            if first is not None:
                self._swap(first)
                continue
            if not warned and self.clock.monotonic() - started > 2.0:
                self.log.info("waiting for the optimizer to publish parameters…")
                warned = True
            yield Sleep(FIRST_PARAMS_POLL_S)
        if self.version is not None:
            self.metrics.param_version(self.version)

    def _swap(self, new: tuple[int, dict, dict]) -> int | None:
        """The version the worker plays after trying ``new``: tensors that do not fit the model (names,
        shapes) are rejected like any bad object and the worker keeps the one it has."""
        try:
            self.worker.set_params(*new)
        except ValueError as e:
            self.poller.reject(new[0], self.version, str(e))
            return self.version
        self.version = new[0]
        self.pace = pace_of(new[2])
        if self.upload_intervals is not None:
            self.uploader.interval_s = self.upload_intervals[0 if (new[2] or {}).get("warmup") is True else 1]
        return self.version

    def _linger(self, gone: str):
        """Wait, playing no games (so uploading no experience), up to ``linger_s`` for an optimizer to take the
        run again (a ``--resume``); True if one did, False if this worker should stop."""
        self.log.warning("the run's optimizer %s; playing no more games%s", gone,
                         f", stopping in {self.linger_s:.0f}s unless an optimizer takes the run again"
                         if self.linger_s else "")
        deadline = self.clock.time() + self.linger_s
        for wait_s in self.watch.recheck_waits():
            if self.stop or self.clock.time() >= deadline:
                break
            yield Sleep(min(wait_s, max(deadline - self.clock.time(), 0.0)))
            if not self.watch.optimizer_gone(0.0, self.clock.time(), force=True):
                self.log.info("an optimizer holds the run again: playing on")
                return True
        if not self.stop:
            self.log.warning("no optimizer took the run within rollout.linger_s = %gs: this worker stops",
                             self.linger_s)
            self.stop.set("run stopped")
        return False

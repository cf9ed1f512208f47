"""Optimizer rank 0's side of the model: the ranks' update loop in lock step and the background writer.

The real ``BackgroundWriter`` runs jobs on a thread of its own, which a single-threaded simulation cannot
pause, so :class:`SimWriter` models it with the same discipline (one job running, at most one waiting,
``submit`` waits while one waits, ``try_submit`` skips when anything is pending). The jobs it runs are the
real ones (``rapid.roles.optimizer._publish``, checkpoints through ``_until_stored``, today's league fold).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np

from rapid.checkpoints import save_checkpoint
from rapid.formats.checkpoint import Checkpoint
from rapid.param_store import ParameterStore

from .plane import QUIET
from .sched import Actor

PARAM_TENSORS = {"w": np.zeros(1024, np.float32)}


class SimStop:
    """The optimizer's StopFlag as ``_until_stored`` uses it: never set; a wait between retries is simulated."""

    def __init__(self, clock):
        self.clock = clock

    def __bool__(self) -> bool:
        return False

    def wait(self, seconds: float) -> None:
        self.clock.charge(seconds)


class SimWriter:
    """Rank 0's BackgroundWriter, in simulated time (see the module docstring)."""

    def __init__(self, fleet):
        self.fleet, self.clock = fleet, fleet.clock
        self.waiting = None
        self.busy_until = 0.0
        self.jobs: collections.Counter = collections.Counter()
        self.job_s: dict[str, float] = collections.defaultdict(float)
        self.actor = fleet.sched.start(Actor("writer", self._run()), 0.0)

    def can_submit(self) -> bool:
        return self.waiting is None

    def submit(self, name: str, job) -> None:
        assert self.waiting is None, "the update loop submits only when can_submit()"
        self.waiting = (name, job)
        self.fleet.sched.wake(self.actor, max(self.clock.t(), self.busy_until))

    def try_submit(self, name: str, job) -> bool:
        if self.waiting is not None or self.busy_until > self.clock.t():
            return False
        self.submit(name, job)
        return True

    def _run(self):
        while True:
            if self.waiting is None:
                yield None
                continue
            (name, job), self.waiting = self.waiting, None
            start = self.clock.t()
            job()
            self.busy_until = self.clock.t()
            kind = name.split()[0]
            self.jobs[kind] += 1
            self.job_s[kind] = max(self.job_s[kind], self.busy_until - start)
            self.fleet.plane.after_writer_job()
            yield self.busy_until


@dataclass
class Figures:
    staleness: collections.Counter = field(default_factory=collections.Counter)
    update_wait_s: list = field(default_factory=list)
    writer_wait_s: list = field(default_factory=list)
    updates: int = 0


class Optimizer:
    """The ranks' update loop in lock step (sample → update → publish → league → checkpoint), rank 0's
    writer jobs real, the learner a stand-in that takes ``update_s``."""

    def __init__(self, fleet):
        self.fleet = fleet
        self.params = ParameterStore(fleet.store)
        self.keeper = fleet.plane.keeper(fleet.store, fleet.s)
        self.writer = SimWriter(fleet)
        self.stop = SimStop(fleet.clock)
        self.fig = Figures()
        self.rng = np.random.default_rng(fleet.s.seed)
        fleet.sched.start(Actor("optimizer", self._run()), 0.0)

    def _until_writer_free(self):
        t0 = self.fleet.clock.t()
        while not self.writer.can_submit():
            yield self.writer.busy_until + 1e-9
        self.fig.writer_wait_s.append(self.fleet.clock.t() - t0)

    def _run(self):
        fleet, s, clock = self.fleet, self.fleet.s, self.fleet.clock
        self.params.publish(0, PARAM_TENSORS, {"updates": 0})
        last_publish, last_ckpt, restarted = clock.t(), 0, False
        while True:
            if s.restart_at and not restarted and clock.t() >= s.restart_at:
                restarted = True
                yield from self._restart()
            t0 = clock.t()
            while not all(r.batch is not None for r in fleet.ranks):
                for r in fleet.ranks:
                    if r.batch is None:
                        r.batch = r.buffer.sample(fleet.batch, fleet.version, self.rng, s.max_reuse)
                if not all(r.batch is not None for r in fleet.ranks):
                    yield clock.t() + 0.1
            self.fig.update_wait_s.append(clock.t() - t0)
            for r in fleet.ranks:
                self.fig.staleness.update(r.batch[1].tolist())
                r.batch = None
                r.loader.take_episodes()  # what OptimizerReport does with them each update
            yield clock.t() + s.update_s  # the stand-in learner (the all-reduce included)
            self.fig.updates += clock.t() <= s.sim_s
            if clock.t() - last_publish >= s.publish_s:  # rank 0's clock decides; every rank agrees
                fleet.version += 1
                last_publish = clock.t()
                yield from self._until_writer_free()
                fleet.plane.publish(self.writer, self.params, self.keeper, PARAM_TENSORS, fleet.version,
                                    self.fig.updates, self.stop, QUIET)
                fleet.plane.after_publish(self)
            fleet.plane.after_update(self)
            if self.fig.updates - last_ckpt >= s.checkpoint_every:
                last_ckpt = self.fig.updates
                yield from self._until_writer_free()
                ckpt = Checkpoint(fleet.version, self.fig.updates, PARAM_TENSORS, {"state": {}, "param_groups": []})
                self.writer.submit(f"checkpoint v{ckpt.version}", lambda ckpt=ckpt: fleet.plane.until_stored(
                    f"checkpoint v{ckpt.version}", lambda: save_checkpoint(fleet.store, ckpt, 2), self.stop, QUIET))

    def _restart(self):
        """The optimizer job stops and comes back with --resume: every rank's loader and buffer start afresh."""
        fleet = self.fleet
        for r in fleet.ranks:
            r.actor.dead = True
            r.batch = None
        yield fleet.clock.t() + fleet.s.restart_down_s
        fleet.ranks = [fleet.new_rank(k, fleet.clock.t()) for k in range(fleet.s.ranks)]
        fleet.restarts += 1

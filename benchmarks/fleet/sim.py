"""The fleet: W simulated rollout workers and R optimizer ranks, driven in simulated time.

No threads are started for the fleet. Every actor is a generator that does one step of real rapid code
(an Uploader's seal and upload, a ParamPoller's poll, an ExperienceLoader's ``poll_once``, a writer job) and
yields the simulated time it wants to run again; :class:`Scheduler` runs the actors in order of that time.
A step is atomic: it sees the store as it is at the step's start, and its requests' modelled latency moves
its own clock (so a poll of 490 LIST pages ends ~49 s after it started and the rank polls again ``poll_s``
later, as the loader thread does).

Rank 0's ``BackgroundWriter`` is modelled by :class:`SimWriter` with the same discipline (one job running,
at most one waiting, ``submit`` waits while one waits, ``try_submit`` skips when anything is pending): the
real class runs jobs on a thread of its own, which a single-threaded simulation cannot pause. The jobs it
runs are the real ones (``rapid.roles.optimizer._publish``, ``LeagueKeeper.fold_if_due``, checkpoints).
"""

from __future__ import annotations

import collections
import heapq
import time
from dataclasses import dataclass, field

import numpy as np

from rapid.checkpoints import save_checkpoint
from rapid.formats.checkpoint import Checkpoint
from rapid.formats.experience import Shape
from rapid.infra.store import StoreError
from rapid.league import League, OpponentSampler
from rapid.league.pool import load_pool
from rapid.opt.buffer import ExperienceBuffer
from rapid.param_store import ParameterStore
from rapid.roles.rollout import ParamPoller
from rapid.rollout_worker import Segment
from rapid.store_map import POOL_POINTER

from .plane import QUIET

SHAPE = Shape(bptt=16, obs_dim=8, mask_dim=4, heads=1, lstm=8)
"""A small sample (~1 KB encoded): object sizes are scaled up to the target in the latency model."""
PARAM_TENSORS = {"w": np.zeros(1024, np.float32)}


def sample_arrays(n: int) -> dict[str, np.ndarray]:
    """Arrays of ``n`` valid samples of SHAPE (as rapid/loader.py's docstring builds them)."""
    arrays = {name: np.zeros((n, *dims), dtype) for name, (dtype, dims) in SHAPE.fields().items()}
    arrays["mask"][:] = True
    arrays["active"][:] = True
    return arrays


@dataclass
class Settings:
    workers: int = 64
    ranks: int = 4
    sim_s: float = 900.0
    upload_s: float = 60.0
    param_poll_s: float = 5.0
    poll_s: float = 0.5
    publish_s: float = 60.0
    update_s: float = 1.0
    retention_s: float = 600.0
    max_backlog: int = 8
    samples_per_object: int = 8
    games_per_object: int = 3
    snapshot_every: int = 10
    refresh_s: float = 30.0
    checkpoint_every: int = 100
    max_staleness: int = 8
    max_reuse: float = 2.0
    drain_s: float = 120.0
    seed: int = 0
    skew_s: float = 0.0  # fault: worker clocks off by up to ± this
    slow_upload_s: float = 0.0  # fault: this much extra on each experience PUT of 10% of the workers
    churn: float = 0.0  # fault: this share of the workers leaves (and is replaced) every upload interval
    restart_at: float = 0.0  # fault: the optimizer job restarts (--resume) at this simulated second
    restart_down_s: float = 30.0
    shards: int = 0  # experience shards of the sharded plane (0: one per rank, as store.experience_shards)


class OutOfTime(Exception):
    def __init__(self, at: float):
        super().__init__(f"stopped at simulated second {at:.0f}")
        self.at = at


class Actor:
    def __init__(self, name: str, gen, skew: float = 0.0):
        self.name, self.gen, self.skew, self.dead = name, gen, skew, False


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


class Worker:
    """One rollout worker: its Uploader (sealing + uploading real experience objects), ParamPoller and
    league OpponentSampler, with no env and no policy."""

    def __init__(self, fleet, index: int, at: float):
        s, rng = fleet.s, fleet.rng
        self.fleet, self.id = fleet, f"w{index}"
        self.uploader = fleet.plane.uploader(fleet.store, self.id, s)
        self.poller = ParamPoller(ParameterStore(fleet.store), s.param_poll_s, QUIET)
        league = League(fleet.store, clock=fleet.clock.time)
        self.sampler = OpponentSampler(league, fleet.league_cfg, clock=fleet.clock.monotonic)
        self.version: int | None = None
        self.rng = np.random.default_rng(int(rng.integers(1 << 31)))
        skew = float(rng.uniform(-s.skew_s, s.skew_s)) if s.skew_s else 0.0
        self.actor = fleet.sched.start(Actor(self.id, self._run(at), skew), at)
        if s.slow_upload_s and rng.random() < 0.1:
            fleet.meter.slow_put[self.actor] = s.slow_upload_s

    def _run(self, at: float):
        s, clock = self.fleet.s, self.fleet.clock
        next_poll = at + float(self.rng.uniform(0, s.param_poll_s))
        next_seal = at + float(self.rng.uniform(0, s.upload_s))
        while True:
            if clock.t() >= next_poll:
                self.poller.poll_once()
                newer = self.poller.take()
                if newer is not None:
                    self.version = newer[0]
                self.sampler.refresh()  # as choose() does at a game's start: the pool every refresh_s
                next_poll = clock.t() + s.param_poll_s
            if self.fleet.stopping:
                self.leave()
                return
            if clock.t() >= next_seal:
                if self.version is not None:  # a worker uploads once it holds its first params
                    self.seal()
                next_seal += s.upload_s
            yield min(next_poll, next_seal)

    def seal(self) -> None:
        s, fleet = self.fleet.s, self.fleet
        games = [self.sampler.choose(self.rng) for _ in range(s.games_per_object)]
        for g in games:
            if g.kind == "snapshot":
                try:
                    self.sampler.load_params(g.id)  # the snapshot's weights, from its LRU cache or the store
                except (StoreError, ValueError, KeyError):
                    fleet.snapshot_failures += 1
        opponents = sorted({g.id for g in games})
        arrays = {k: v.copy() for k, v in fleet.template.items()}
        arrays["version"][:] = self.version
        arrays["opponent"][:] = np.arange(s.samples_per_object) % len(opponents)
        episodes = [{"learner_version": self.version, "opponent": g.id, "learner_side": i % 2,
                     "winner": ("learner", "opponent", "draw")[int(self.rng.integers(3))], "length": 1000,
                     "learner_return": 0.0} for i, g in enumerate(games)]
        self.uploader.add(Segment(arrays, opponents, episodes, env_steps=16 * s.samples_per_object))
        self.uploader._seal()  # the sealer thread's step
        fleet.games_sealed.append((fleet.clock.t(), len(episodes)))
        self.uploader._drain()  # the uploading thread's step (and, today, the match-results writer)

    def leave(self) -> None:
        """A worker that stops: its Uploader flushes what it holds (as ``Uploader.stop`` does)."""
        if self.version is not None:
            self.uploader.flush()
        self.actor.dead = True


class Rank:
    """One optimizer rank: its ExperienceLoader (``poll_once`` every ``poll_s``) and ExperienceBuffer."""

    def __init__(self, fleet, rank: int, at: float):
        s = fleet.s
        self.fleet, self.rank = fleet, rank
        self.buffer = ExperienceBuffer(fleet.capacity, s.max_staleness)
        self.loader = fleet.plane.loader(fleet.store, SHAPE, self.buffer, rank, s, lambda: fleet.version)
        self.batch = None
        self.actor = fleet.sched.start(Actor(f"rank{rank}", self._run()), at)

    def _run(self):
        fleet = self.fleet
        while True:
            t0, store0 = time.thread_time(), fleet.meter.store_cpu
            start = fleet.clock.t()
            try:
                self.loader.poll_once()
            except StoreError:
                fleet.list_failures += 1  # the loader thread counts it and polls again
            if start < fleet.s.sim_s:  # the figures cover the run, not the drain after it
                cpu = time.thread_time() - t0
                fleet.poll_cpu.append(cpu - (fleet.meter.store_cpu - store0))
                fleet.poll_cpu_client.append(cpu)
                fleet.poll_s.append(fleet.clock.t() - start)
            yield fleet.clock.t() + fleet.plane.next_wait(self.loader)


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
        fleet.ranks = [Rank(fleet, k, fleet.clock.t()) for k in range(fleet.s.ranks)]
        fleet.restarts += 1


class Fleet:
    def __init__(self, s: Settings, store, meter, clock, plane):
        self.s, self.store, self.meter, self.clock, self.plane = s, store, meter, clock, plane
        self.rng = np.random.default_rng(s.seed)
        self.sched = Scheduler(clock)
        from rapid.config import LeagueConfig

        self.league_cfg = LeagueConfig(snapshot_every=s.snapshot_every, refresh_s=s.refresh_s)
        self.template = sample_arrays(s.samples_per_object)
        per_rank_per_s = s.workers * s.samples_per_object / s.upload_s / s.ranks
        self.batch = max(1, round(per_rank_per_s * s.update_s))  # reuse ≈ 1 when every sample arrives
        self.capacity = max(64, 4 * round(per_rank_per_s * s.upload_s))
        self.version = 0
        self.stopping = False
        self.games_sealed: list = []
        self.pool_games: list = []  # (time, games folded into the pool so far)
        self._pool_blob = None
        self.poll_cpu: list = []  # CPU seconds of rapid's code per poll (the store's own excluded)
        self.poll_cpu_client: list = []  # the same with the store client's (botocore's, on moto)
        self.poll_s: list = []
        self.snapshot_failures = self.list_failures = self.restarts = self.churned = 0
        with clock.acting("start", 0.0):  # what the roles do at start-up, before the first simulated step
            plane.start(self)
            self.ranks = [Rank(self, k, 0.0) for k in range(s.ranks)]
            self.optimizer = Optimizer(self)
            self.workers = {i: Worker(self, i, 0.0) for i in range(s.workers)}
        if s.churn:
            self.sched.start(Actor("churn", self._churn()), s.upload_s)

    def actor(self, name: str, gen) -> Actor:
        return Actor(name, gen)

    def _churn(self):
        while True:
            leaving = self.rng.choice(list(self.workers), size=max(1, round(self.s.churn * len(self.workers))),
                                      replace=False)
            for i in leaving:
                self.workers[i].leave()
                self.workers[i] = Worker(self, int(i), self.clock.t() + float(self.rng.uniform(0, 10)))
                self.churned += 1
            yield self.clock.t() + self.s.upload_s

    def observe_pool(self) -> None:
        """Games folded into the pool so far (read without a request: the model's own bookkeeping)."""
        blob = self.store.peek(POOL_POINTER)
        if blob is None or blob == self._pool_blob:
            return
        self._pool_blob = blob
        state = load_pool(blob, POOL_POINTER)
        games = state.latest_games + sum(m.games for m in state.members.values())
        self.pool_games.append((self.clock.t(), games))

    def _stop_workers(self):
        self.stopping = True  # each worker flushes at its next step and stops; ranks go on loading for drain_s
        yield None

    def _half(self):
        self.live_half = self.store.live()  # live objects at half time: growth shows against the end's
        yield None

    def run(self, progress=None) -> None:
        """Run the fleet; ``progress(at)`` after each step may raise :class:`OutOfTime` to end it early (the
        figures then cover the simulated time reached, and there is no drain)."""
        self.live_half: dict = {}
        self.sched.start(Actor("half", self._half()), self.s.sim_s / 2)
        self.sched.start(Actor("stop", self._stop_workers()), self.s.sim_s)
        try:
            self.sched.run(self.s.sim_s + self.s.drain_s, progress)
        except OutOfTime as e:
            self.reached = e.at
        else:
            self.reached = self.s.sim_s

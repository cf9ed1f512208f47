"""The fleet: W simulated rollout workers and R optimizer ranks, driven in simulated time.

No threads are started for the fleet. Every actor is a generator that does one step of real rapid code
(an Uploader's seal and upload, a ParamPoller's poll, an ExperienceLoader's ``poll_once``, a writer job) and
yields the simulated time it wants to run again; :class:`Scheduler` runs the actors in order of that time.
A step is atomic: it sees the store as it is at the step's start, and its requests' modelled latency moves
its own clock (so a poll of 490 LIST pages ends ~49 s after it started and the rank polls again ``poll_s``
later, as the loader thread does, or after ``next_wait()`` where the loader has one). The update loop and
rank 0's writer are in ``rank0.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

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
from .rank0 import Optimizer
from .sched import Actor, OutOfTime, Scheduler

SHAPE = Shape(bptt=16, obs_dim=8, mask_dim=4, heads=1, lstm=8)
"""A small sample (~1 KB encoded): object sizes are scaled up to the target in the latency model."""


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
    workers_per_node: int = 0  # workers sharing a node cache (rapid.node_cache; 0: none, every worker reads the store)


class Worker:
    """One rollout worker: its Uploader (sealing + uploading real experience objects), ParamPoller and
    league OpponentSampler, with no env and no policy."""

    def __init__(self, fleet, index: int, at: float):
        s, rng = fleet.s, fleet.rng
        self.fleet, self.id = fleet, f"w{index}"
        self.uploader = fleet.plane.uploader(fleet.store, self.id, s)
        reads = fleet.node_store(index)
        self.poller = ParamPoller(ParameterStore(reads), s.param_poll_s, QUIET)
        league = League(reads, clock=fleet.clock.time)
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

    def node_store(self, index: int):
        """What worker ``index`` reads parameters, snapshots and the pool through: its node's cache (rapid's
        NodeCachedStore on the simulated clock, one folder per ``workers_per_node`` workers) or the store."""
        if not self.s.workers_per_node:
            return self.store
        import tempfile

        from rapid.node_cache import NodeCachedStore
        from rapid.store_map import PARAMS_LATEST, POOL_POINTER

        if not hasattr(self, "_node_root"):
            self._node_root = tempfile.mkdtemp(prefix="fleet-nodes-")
        node = index // self.s.workers_per_node
        return NodeCachedStore(self.store, f"{self._node_root}/node{node}",
                               {PARAMS_LATEST: self.s.param_poll_s, POOL_POINTER: self.s.refresh_s},
                               clock=self.clock.time)

    def new_rank(self, rank: int, at: float) -> Rank:
        return Rank(self, rank, at)

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

"""The fleet: W rollout workers and R optimizer ranks of rapid's own loop objects, in simulated time.

No thread is started. Every thread a role would run is an actor of the scheduler (``sched.py``) that runs one
step of rapid's code and yields when it wants to run again:

- a rollout worker is rapid's ``RolloutLoop`` (driven by ``drive.loop_actor``) over a ``SimSource``, plus
  three actors for its threads: the ``ParamPoller``'s ``poll_once``/``next_wait``, the ``Uploader``'s ``seal``
  every upload interval and its ``upload_pending``;
- an optimizer rank is rapid's ``OptimizerLoop`` with a stand-in learner, its collectives met in a ``Group``
  (α–β cost, the straggler sets the pace), plus its ``ExperienceLoader``'s ``step``; rank 0 also runs its
  ``BackgroundWriter``'s ``run_next`` and its ``LeagueKeeper``'s ``step``.

Each actor belongs to a process; the CPU its process spends (decoding, listing, encoding, updates) is charged
under one interpreter lock (``SimClock.cpu``). Workers read parameters, snapshots and the pool through
rapid's ``NodeCachedStore``, one per node of ``workers_per_node`` workers (the shipped topologies), or the
store itself.
"""

from __future__ import annotations

import collections
import logging
import random
import shutil
import tempfile

import numpy as np

from rapid.league import League, OpponentSampler
from rapid.opt.buffer import ExperienceBuffer
from rapid.optimizer.loader import ExperienceLoader
from rapid.optimizer.publisher import BackgroundWriter
from rapid.roles.league_keeper import LeagueKeeper
from rapid.roles.optimizer_loop import OptimizerLoop, Timing
from rapid.roles.optimizer_parts import Parts
from rapid.roles.optimizer_settings import version_meta
from rapid.roles.rollout import ParamPoller
from rapid.roles.rollout_loop import RolloutLoop
from rapid.rollout.node_cache import NodeCachedStore
from rapid.rollout.uploader import Uploader
from rapid.run.param_store import ParameterStore
from rapid.run.run_watch import RunWatch
from rapid.run.store_map import PARAMS_LATEST, POOL_POINTER, read_layout, write_layout

from .checks import Asked
from .drive import Group, InlineDownloads, SimStop, loop_actor
from .faults import FAULT_AT_S, Faults
from .lease import LeaseKeeping
from .ledger import Ledger
from .node import NodeServer, ServerLink
from .realworker import RealSource
from .report import MEASURE_FROM_S
from .sched import Actor, OutOfTime, Scheduler
from .settings import SHAPE, Settings, sample_arrays
from .standins import PARAM_TENSORS, CpuCharged, NullMetrics, SimLearner, SimReport, SimSource, checkpoint_of

MONITOR_S = 5.0  # how often the share of workers on a current version is sampled
STOP_GRACE_S = 30.0  # after the ranks are stopped: their last publish and the league's last fold
QUIET = logging.getLogger("fleet.quiet")
QUIET.setLevel(logging.CRITICAL)  # thousands of simulated processes: failures are counted, not logged


class Worker:
    """One rollout process: rapid's RolloutLoop, ParamPoller and Uploader, over a SimSource."""

    def __init__(self, fleet: Fleet, index: int, at: float):
        s, clock = fleet.s, fleet.clock
        self.fleet, self.id, self.process = fleet, f"w{index}", f"w{index}-{at:.0f}"
        rng = np.random.default_rng(int(fleet.rng.integers(1 << 31)))
        store = fleet.charged(fleet.store)
        reads = Asked(fleet.node_store(index, store), fleet.asked)
        shards = 1 if fleet.faults.one_shard else (read_layout(store) or 1)
        self.uploader = Uploader(store, self.id, s.upload_s, s.max_backlog, shards=shards, clock=clock.time,
                                 on_drop=self._dropped,
                                 incarnation=f"{at:.0f}{int(rng.integers(1 << 24)):06x}")
        link = ServerLink(fleet.servers[index // s.workers_per_node]) if fleet.servers else None
        self.link = link
        self.poller = link.versions if link else ParamPoller(
            ParameterStore(reads), s.param_poll_s, QUIET, on_failure=fleet.poller_failed,
            rng=random.Random(int(rng.integers(1 << 31))))
        sampler = OpponentSampler(League(reads, clock=clock.time), fleet.cfg.league, clock=clock.monotonic)
        games = s.games_per_upload * s.segment_s / s.upload_s
        self.source: SimSource | RealSource = SimSource(
            clock, rng, fleet.template, sampler, s.segment_s, games, fleet.snapshot_failed, fleet.next_ids,
            link and (lambda seg: link.play(seg, s.decisions_per_segment))) if index >= s.real_workers else RealSource(
            clock, s, fleet.cfg, sampler, fleet.next_ids, fleet.snapshot_failed, int(rng.integers(1 << 31)))
        self.stop = SimStop(clock)
        watch = RunWatch(reads, quiet_s=max(60.0, 3 * s.publish_s), clock=clock.time)
        self.loop = RolloutLoop(self.source, self.uploader, self.poller, watch, NullMetrics(), 2, 0.0, self.stop,
                                QUIET, clock=clock)
        self.done = False
        self.started_at, self.left_at = at, None
        self.last_drop_at: float | None = None  # when its uploader last dropped an object (its backlog full)
        self.games_sealed = 0
        fleet.all_workers.append(self)
        skew = float(rng.uniform(-s.skew_s, s.skew_s)) if s.skew_s else 0.0
        start = fleet.sched.start
        self.actor = start(Actor(self.id, loop_actor(clock, self.loop.run(), on_end=self._ended), skew,
                                 self.process), at)
        if isinstance(self.poller, ParamPoller):  # under node inference the node's server is the one reader
            start(Actor(f"{self.id}-poller", self._poller(self.poller), skew, self.process), at)
        start(Actor(f"{self.id}-sealer", self._sealer(), skew, self.process), at + float(rng.uniform(0, s.upload_s)))
        self.upload_actor = start(Actor(f"{self.id}-uploader", self._uploads(), skew, self.process), at)
        if s.slow_upload_s and rng.random() < 0.1:
            fleet.meter.slow_put[self.upload_actor] = s.slow_upload_s

    def _poller(self, poller: ParamPoller):
        while not self.done:
            poller.poll_once()
            yield self.fleet.clock.t() + poller.next_wait()

    def _sealer(self):
        while not self.done:
            self.uploader.seal()
            self._sealed_games()
            self.fleet.sched.wake(self.upload_actor, self.fleet.clock.t())
            yield self.fleet.clock.t() + self.fleet.s.upload_s

    def _uploads(self):
        while not self.done:
            if not self.uploader.stats.backlog:
                yield None  # woken by the sealer
                continue
            failures = self.uploader.stats.failures
            self.uploader.upload_pending()
            # After a failure the uploading thread tries again an upload interval later (botocore retried already).
            yield self.fleet.clock.t() + (self.fleet.s.upload_s if self.uploader.stats.failures > failures else 0.0)

    def _dropped(self, samples: int) -> None:
        self.last_drop_at = self.fleet.clock.t()

    def leave(self) -> None:
        self.stop.set("stopped")
        self.left_at = self.fleet.clock.t()

    def _ended(self, code: int) -> None:
        """The loop returned: what run_rollout does then (its uploader's stop flushes what is pending)."""
        self.done = True
        self.uploader.flush()
        self._sealed_games()

    def _sealed_games(self) -> None:
        """The games of the segments just sealed travel in this object: their fold lag starts here."""
        self.fleet.games_played(self.source.games - self.games_sealed)
        self.games_sealed = self.source.games


class Rank:
    """One optimizer process: rapid's OptimizerLoop with a stand-in learner, its ExperienceLoader and buffer;
    rank 0 also its BackgroundWriter and LeagueKeeper."""

    def __init__(self, fleet: Fleet, rank: int):
        s, clock, cfg = fleet.s, fleet.clock, fleet.cfg
        self.fleet, self.rank, self.process = fleet, rank, f"rank{rank}"
        lead = rank == 0
        store = fleet.charged(fleet.store, decoder=f"{self.process}-decode")
        o = cfg.optimizer
        self.buffer = ExperienceBuffer(o.buffer_samples, o.max_staleness)
        self.loader = ExperienceLoader(store, SHAPE, self.buffer, rank, s.ranks, read_layout(store) or 1, s.poll_s,
                                       s.retention_s, decode_workers=0, current_version=lambda: self.loop.version,
                                       poll_max_s=o.poll_max_s, lookback_s=o.list_lookback_s, sweep_s=o.sweep_s,
                                       download_threads=o.download_threads, mark_s=o.mark_s, clock=clock.time,
                                       downloads=InlineDownloads(clock, o.download_threads))
        self.learner = SimLearner(clock, np.random.default_rng(s.seed * 1000 + rank), s.update_s, o.batch_samples,
                                  s.update_spread, s.ranks, s.grad_mb * 1e6, s.links, MEASURE_FROM_S, s.sim_s,
                                  version_now=lambda: self.loop.version)
        self.writer = BackgroundWriter(on_done=self._job_done, start=False) if lead else None
        self.writer_jobs: list[tuple[str, float]] = []  # (kind, simulated seconds) of each job
        self.publish_lags: list[float] = []  # simulated seconds from a version's decision to its LATEST
        self._job = ""
        self.job_done_at = 0.0  # when the writer's last job ended, in simulated time
        self.keeper = LeagueKeeper(store, cfg, start=False, clock=clock) if lead else None
        self.report = SimReport(clock)
        params = fleet.faults.params_store(store)
        parts = Parts(self.learner, self.buffer, self.loader, self.writer, params, self.keeper, self.report,
                      tensors=self.learner.weights, checkpoint=lambda v: checkpoint_of(v, self.learner.updates),
                      store=store)
        self.stop = SimStop(clock)
        self.loop = OptimizerLoop(cfg, parts, Timing(round_s=5.0, sample_wait_s=0.0, idle_s=0.25), self.stop,
                                  QUIET, lead, grouped=fleet.group is not None, version=0,
                                  rng=np.random.default_rng(s.seed + 7919 * rank), clock=clock)
        self.failure: str | None = None
        self.ended_at: float | None = None  # when the loop returned (ranks in lock step leave together)
        start = fleet.sched.start
        start(Actor(f"rank{rank}", self._loop(), process=self.process), 0.0)
        start(Actor(f"loader{rank}", self._loads(), process=self.process), 0.0)
        if lead:
            start(Actor("writer", self._writes(), process=self.process), 0.0)
            if not fleet.faults.keeper_stopped:
                start(Actor("league", self._league(), process=self.process), 0.0)

    def _loop(self):
        try:
            yield from loop_actor(self.fleet.clock, self.loop.run(), self.fleet.group, self.rank,
                                  on_end=self._ended)
        except Exception as e:  # noqa: BLE001 - a rank that raises ends (its peers then wait forever: counted)
            self.failure = f"{type(e).__name__}: {e}"

    def _ended(self, code: int) -> None:
        self.ended_at = self.fleet.clock.t()

    def _loads(self):
        fleet = self.fleet
        while True:
            start = fleet.clock.t()
            wait = self.loader.step()
            if start < fleet.s.sim_s:  # the figures cover the run, not the drain after it
                fleet.polls += 1
                fleet.poll_s.append(fleet.clock.t() - start)
            yield fleet.clock.t() + wait

    def _writes(self):
        writer = self.writer
        while writer is not None:  # rank 0's only
            start = self.fleet.clock.t()
            if writer.run_next():
                self.writer_jobs.append((self._job, self.fleet.clock.t() - start))
                yield self.fleet.clock.t()
            else:
                yield self.fleet.clock.t() + 0.1

    def _job_done(self, name: str, seconds: float) -> None:
        """From rank 0's writer at the end of a job: a version's publish lag is from the loop's decision to
        here (its object and LATEST stored)."""
        self._job = name.split()[0]
        self.job_done_at = self.fleet.clock.t()
        if name.startswith("publish v"):
            version = int(name.split()[1][1:])
            self.publish_lags.append(self.fleet.clock.t() - self.report.version_at[version])

    def _league(self):
        keeper = self.keeper
        while keeper is not None:  # rank 0's only
            if not keeper.has_work():
                yield self.fleet.clock.t() + 1.0
                continue
            if self.fleet.clock.t() < self.job_done_at:
                # A snapshot is handed over inside a writer job, whose step ran ahead of this actor in simulated
                # time: a thread would take it only once handed, after that version's PUT completed.
                yield self.job_done_at
                continue
            retry = keeper.step()
            yield self.fleet.clock.t() + (retry or 0.0)


class Fleet:
    def __init__(self, s: Settings, store, meter, clock, faults: Faults | None = None):
        self.s, self.store, self.meter, self.clock = s, store, meter, clock
        self.faults = faults or Faults()
        self.faults.apply(s, store)
        self.cfg = s.config()
        self.rng = np.random.default_rng(s.seed)
        self.sched = Scheduler(clock)
        self.template = sample_arrays(s.samples_per_segment)
        self.group = Group(self.sched, clock, s.ranks, s.links) if s.ranks > 1 else None
        self.stopping = False
        self.live_half: dict[str, tuple[int, float]] = {}  # live objects at half time (see _half)
        self.played: list[tuple[float, int]] = []  # (time, games) sealed into experience by the workers
        self.ledger = Ledger(SHAPE)  # what the store was given, read back for the figures
        meter.on_stored = self.ledger.stored
        self._ids = 0
        self.current: list[float] = []  # share of live workers on a current version (_monitor), per sample
        self.received_from = self.received_to = 0  # rank 0's samples received by the first minute, by the end
        self.poller_failures = self.snapshot_failures = self.churned = self.polls = 0
        self.asked: collections.Counter = collections.Counter()  # pointer GETs the workers asked for (Asked)
        self.poll_s: list[float] = []  # simulated seconds each loader poll took
        self.all_workers: list[Worker] = []  # every worker that ever ran (churn replaces some)
        self._node_root = tempfile.mkdtemp(prefix="fleet-nodes-") if s.workers_per_node else ""
        self._nodes: dict[int, NodeCachedStore] = {}
        with clock.acting("start", 0.0):  # what rank 0 does before the first version: the layout, then v0
            write_layout(store, s.shards or s.ranks)
            ParameterStore(store).publish(0, PARAM_TENSORS, {**version_meta(self.cfg, 0, 0.0), "env": "fleet"})
            self.ranks = [Rank(self, k) for k in range(s.ranks)]
            self.lease = LeaseKeeping(self, self.charged(store))
            per_node = s.workers_per_node or s.workers
            self.servers = [NodeServer(self, n, self.node_store(n * per_node, self.charged(store)))
                            for n in range(-(-s.workers // per_node))] if s.inference == "node" else []
            self.workers = {i: Worker(self, i, 0.0) for i in range(s.workers)}
        self.sched.start(Actor("monitor", self._monitor()), 60.0)
        if s.churn:
            self.sched.start(Actor("churn", self._churn()), s.upload_s)
        for name, actor in self.faults.actors(self):
            self.sched.start(Actor(name, actor), FAULT_AT_S)

    def charged(self, store, decoder: object = None):
        return CpuCharged(store, self.clock, self.meter.latency, self.s.costs, decoder)

    def node_store(self, index: int, store):
        """What worker ``index`` reads parameters, snapshots and the pool through: its node's cache (one folder
        per ``workers_per_node`` workers, as the shipped Slurm script and Kubernetes manifests give) or the store."""
        reads = self.faults.reads(store, index, self.s)
        if not self.s.workers_per_node:
            return reads
        node = index // self.s.workers_per_node
        return NodeCachedStore(reads, f"{self._node_root}/node{node}",
                               {PARAMS_LATEST: self.s.param_poll_s, POOL_POINTER: self.s.refresh_s},
                               clock=self.clock.time, sleep=self.clock.charge)

    def next_ids(self, n: int) -> np.ndarray:
        """Fleet-wide ids for ``n`` new samples."""
        self._ids += n
        return np.arange(self._ids - n, self._ids)

    def games_played(self, n: int) -> None:
        if n:
            self.played.append((self.clock.t(), n))

    def poller_failed(self, why: str) -> None:
        self.poller_failures += 1

    def snapshot_failed(self) -> None:
        self.snapshot_failures += 1

    @property
    def version(self) -> int:
        return self.ranks[0].loop.version

    def _monitor(self):
        first = self.ranks[0].buffer.stats()  # health is measured after the first minute
        self.received_from = first.received - first.unused  # what waited then is the window's to use
        # What a worker can have: a version is seen a poll and a node cache's copy of LATEST after it is named, and
        # played from the segment after; at a publish interval shorter than that, more than the previous version.
        lag_s = 2 * self.s.param_poll_s + self.s.segment_s
        while self.clock.t() < self.s.sim_s:
            live = [w.loop.version for w in self.workers.values() if not w.done]
            newest = self.ledger.newest_at(self.clock.t())  # LATEST as stored, not the loop's own count
            if live and newest is not None:
                current = min(newest - 1, self.ledger.newest_at(self.clock.t() - lag_s) or 0)
                self.current.append(sum(v is not None and v >= current for v in live) / len(live))
            yield self.clock.t() + MONITOR_S

    def _churn(self):
        while not self.stopping:
            leaving = self.rng.choice(list(self.workers), size=max(1, round(self.s.churn * len(self.workers))),
                                      replace=False)
            for i in leaving:
                self.workers[i].leave()
                self.workers[i] = Worker(self, int(i), self.clock.t() + float(self.rng.uniform(0, 10)))
                self.churned += 1
            yield self.clock.t() + self.s.upload_s

    def _stop_workers(self):
        self.stopping = True  # each worker's loop ends at its next step and flushes; ranks go on loading
        self.received_to = self.ranks[0].buffer.stats().received
        for w in self.workers.values():
            w.leave()
        yield None

    def _stop_ranks(self):
        """After the drain the optimizer job is stopped, as a signal stops it: every rank's loop agrees to leave,
        and on its way out publishes what is unpublished and hands the last games to the league."""
        for r in self.ranks:
            r.stop.set("stopped")
        yield None

    def _half(self):
        self.live_half = self.store.live()  # live objects at half time: growth shows against the end's
        yield None

    def close(self) -> None:
        """Remove the node caches' folders (the figures are read from the store and the stand-ins, not from them)."""
        if self._node_root:
            shutil.rmtree(self._node_root, ignore_errors=True)

    def run(self, progress=None) -> None:
        """Run the fleet; ``progress(at)`` after each step may raise :class:`OutOfTime` to end it early (the
        figures then cover the simulated time reached, and there is no drain)."""
        self.live_half = {}
        self.sched.start(Actor("half", self._half()), self.s.sim_s / 2)
        self.sched.start(Actor("stop", self._stop_workers()), self.s.sim_s)
        self.sched.start(Actor("stop ranks", self._stop_ranks()), self.s.sim_s + self.s.drain_s)
        try:
            self.sched.run(self.s.sim_s + self.s.drain_s + STOP_GRACE_S, progress)
        except OutOfTime as e:
            self.reached = e.at
        else:
            self.reached = self.s.sim_s

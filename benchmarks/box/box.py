"""One GPU box in simulated time: rapid's own loops and threads' steps, on C cores and one GPU.

What runs is rapid's: each rollout worker is a ``RolloutLoop`` with a real ``Uploader`` (its ``seal`` and
``upload_pending`` on actors of the worker's process) and the ``ServerVersions`` of node inference; the node's
server keeps its versions with a real ``ParamPoller``; the optimizer is an ``OptimizerLoop`` with rapid's
``ExperienceLoader``, ``ExperienceBuffer``, ``Balancer`` (its batch ceiling and the rollouts' pace,
``balance_settings`` of the run's config) and ``BackgroundWriter`` publishing to the store the server polls. The
stand-ins (``parts.py``) only cost time: env steps, the server's passes, decoding, the learner's update.

Processes (each under its own interpreter lock, ``fleet.clock.SimClock.cpu``; together on ``cores`` cores,
``cores.py``): w0 … w{N-1} (the loop, its sealing and uploading threads), ``server`` (its passes and poller),
``optimizer`` (the update loop, the loader with its download threads, the writer), ``decoder0`` … (the decode
pool), ``evaluator`` (``eval.core_share`` of a core, all the run).
"""

from __future__ import annotations

import logging

import numpy as np
from fleet.clock import installed
from fleet.drive import loop_actor
from fleet.sched import Actor, Scheduler
from fleet.settings import SHAPE, sample_arrays
from fleet.sim import InlineDownloads, SimStop
from fleet.standins import PARAM_TENSORS, NullMetrics, SimReport, checkpoint_of

from rapid.formats.experience import ExperienceBatch, Shape, encode_experience
from rapid.opt.buffer import ExperienceBuffer
from rapid.optimizer.loader import ExperienceLoader
from rapid.optimizer.publisher import BackgroundWriter
from rapid.roles.optimizer_loop import OptimizerLoop, Timing
from rapid.roles.optimizer_parts import Parts
from rapid.roles.optimizer_settings import version_meta
from rapid.roles.rollout_loop import RolloutLoop
from rapid.roles.startup import env_spec
from rapid.rollout.uploader import Uploader
from rapid.run.param_store import ParameterStore
from rapid.run.run_watch import RunWatch, quiet_s
from rapid.run.store_map import write_layout

from .cores import BoxClock
from .costs import AGENT_STEPS_PER_SEGMENT, BoxSettings
from .parts import BoxLearner, BoxServer, BoxSource, IntakeStore, MemStore, Sizes
from .threaded import Stepped

IDLE_S = 0.005
"""The update loop's pause between draws that found no batch (a thread waits on the buffer's condition instead)."""
WRITER_IDLE_S = 0.05
WORKER_SPREAD = 0.05
"""ASSUMED: lognormal σ of a worker's cost per agent-step around the measured mean."""


def sizes_of(scale: int) -> Sizes:
    """Encoded bytes per simulated sample, and an object's fixed part, from two objects encoded as workers do."""

    def encoded(n: int) -> int:
        return len(encode_experience(ExperienceBatch("w0", 0, 0.0, sample_arrays(n), ["latest"])))

    per_sample = (encoded(64) - encoded(32)) / 32
    return Sizes(scale, per_sample, encoded(32) - 32 * per_sample)


class Worker:
    """One rollout process: rapid's RolloutLoop over a BoxSource, its Uploader's two threads as actors."""

    def __init__(self, box: Box, index: int):
        self.box, self.process = box, f"w{index}"
        cfg, clock = box.cfg, box.clock
        r = cfg.rollout
        # Workers differ a little in speed and start (games of different lengths): without it they play in lock step
        # and their uploads reach the buffer in bursts no run has.
        speed = float(box.rng.lognormal(0.0, WORKER_SPREAD))
        self.source = BoxSource(box, box.server, r.samples_per_segment * 32 * 10 // box.s.scale, speed)
        self.uploader = Uploader(
            box.charged,
            self.process,
            r.upload_interval_s,
            r.max_backlog,
            shards=1,
            clock=clock.time,
            incarnation=f"{index:06x}",
        )
        self.stop = SimStop(clock)
        watch = RunWatch(box.store, quiet_s=quiet_s(cfg), clock=clock.time)
        self.loop = RolloutLoop(
            self.source,
            self.uploader,
            self.source.versions,
            watch,
            NullMetrics(),
            10,
            0.0,
            self.stop,
            box.quiet,
            clock=clock,
        )
        start = box.sched.start
        start(
            Actor(self.process, loop_actor(clock, self.loop.run()), process=self.process), float(box.rng.uniform(0, 1))
        )
        at = float(box.rng.uniform(0, r.upload_interval_s))
        start(Actor(f"{self.process}-sealer", self._sealer(), process=self.process), at)
        self.upload_actor = start(Actor(f"{self.process}-uploader", self._uploads(), process=self.process), at)

    def _sealer(self):
        clock = self.box.clock
        while True:
            self.uploader.seal()
            self.box.sched.wake(self.upload_actor, clock.t())
            yield clock.t() + self.uploader.interval_s

    def _uploads(self):
        while True:
            if not self.uploader.stats.backlog:
                yield None  # woken by the sealer
                continue
            self.uploader.upload_pending()
            yield self.box.clock.t()


class Optimizer:
    """The optimizer process: rapid's OptimizerLoop, its ExperienceLoader (the download threads inline) and buffer,
    the BackgroundWriter; a BoxLearner in place of the learner."""

    def __init__(self, box: Box):
        self.box, self.process = box, "optimizer"
        cfg, clock = box.cfg, box.clock
        o = cfg.optimizer
        self.buffer = ExperienceBuffer(o.buffer_samples, o.max_staleness)
        self.loader = ExperienceLoader(
            box.charged,
            SHAPE,
            self.buffer,
            0,
            1,
            1,
            o.poll_s,
            cfg.store.retention_s,
            decode_workers=0,
            current_version=lambda: self.loop.version,
            poll_max_s=o.poll_max_s,
            lookback_s=o.list_lookback_s,
            sweep_s=o.sweep_s,
            download_threads=o.download_threads,
            mark_s=o.mark_s,
            clock=clock.time,
            downloads=InlineDownloads(clock, o.download_threads),
        )
        self.learner = BoxLearner(clock, box.s.costs, box.s.scale)
        self.writer = BackgroundWriter(start=False)
        self.report = SimReport(clock)
        parts = Parts(
            self.learner,
            self.buffer,
            self.loader,
            self.writer,
            ParameterStore(box.store),
            None,
            self.report,
            tensors=self.learner.weights,
            checkpoint=lambda v: checkpoint_of(v, self.learner.updates),
            store=box.store,
        )
        self.loop = OptimizerLoop(
            cfg,
            parts,
            Timing(round_s=5.0, sample_wait_s=0.0, idle_s=IDLE_S),
            SimStop(clock),
            box.quiet,
            lead=True,
            grouped=False,
            version=0,
            rng=np.random.default_rng(box.s.seed),
            clock=clock,
            gpu=box.s.gpu_ceiling,
            # a simulated sample stands for `scale` real ones of the real game's shape: the buffer's memory bound
            sample_bytes=box.s.scale * Shape.of(env_spec(cfg), bptt=cfg.rollout.bptt, lstm=cfg.model.lstm).sample_bytes,
        )
        start = box.sched.start
        start(Actor("optimizer", loop_actor(clock, self.loop.run()), process=self.process), 0.0)
        start(Actor("loader", self._loads(), process=self.process), 0.0)
        start(Actor("writer", self._writes(), process=self.process), 0.0)

    def _loads(self):
        while True:
            wait = yield from self.box.stepped.run(self.loader.step)
            yield self.box.clock.t() + wait

    def _writes(self):
        clock = self.box.clock
        while True:
            yield clock.t() + (0.0 if self.writer.run_next() else WRITER_IDLE_S)


class Box:
    def __init__(self, s: BoxSettings):
        self.s, self.cfg = s, s.config()
        self.clock = BoxClock(s.cores)
        self.sched = Scheduler(self.clock)
        self.rng = np.random.default_rng(s.seed)
        self.quiet = logging.getLogger("box.quiet")
        self.quiet.setLevel(logging.CRITICAL)  # warnings of rapid's parts under overload are figures here
        self.store = MemStore()
        self.sizes = sizes_of(s.scale)
        decoders = [f"decoder{i}" for i in range(s.decoders)]
        self.stepped = Stepped(self.clock)
        self.charged = IntakeStore(self.store, self.clock, s.costs, self.sizes, decoders, self.stepped.pause)
        self._templates: dict[int, dict[str, np.ndarray]] = {}
        with self.clock.acting("start", 0.0):  # what rank 0 does before the first version: the layout, then v0
            write_layout(self.store, 1)
            ParameterStore(self.store).publish(0, PARAM_TENSORS, {**version_meta(self.cfg, 0, 0.0), "env": "box"})
            self.server = BoxServer(self, self.store)
            self.sched.start(Actor("server-poller", self.server.polls(), process="server"), 0.0)
            self.optimizer = Optimizer(self)
            self.workers = [Worker(self, i) for i in range(s.workers)]
        self.sched.start(Actor("evaluator", self._evaluates(), process="evaluator"), 0.0)

    def template(self, n: int) -> dict[str, np.ndarray]:
        if n not in self._templates:
            self._templates[n] = sample_arrays(n)
        return self._templates[n]

    def _evaluates(self):
        """The evaluator plays its rounds at ``eval.core_share`` of a core (capped, so always that much)."""
        while True:
            self.clock.cpu(self.s.costs.evaluator_core_share * 1.0, tag="evaluator")
            yield self.clock.t() + (1.0 - self.s.costs.evaluator_core_share)

    def run(self) -> dict:
        with installed(self.clock):  # rapid's modules read the simulated clock while the box runs
            self.sched.run(self.s.sim_s)
        return figures(self)


def percentile(hist: dict[int, int], q: float) -> float:
    total = sum(hist.values())
    if not total:
        return float("nan")
    seen = 0
    for value in sorted(hist):
        seen += hist[value]
        if seen >= q * total:
            return float(value)
    return float(max(hist))


WASTE_BOUND = 0.05
SATURATED = 0.8
RESOURCES = {
    "cores": "the cores",
    "optimizer": "the optimizer process's interpreter lock",
    "gpu": "the GPU",
    "server": "the node's inference server",
    "decoders": "the decode processes",
    "pace": "no resource (none is 80% busy): the rollouts' pace, held low",
    "none": "no resource (none is 80% busy)",
}


def figures(box: Box) -> dict:
    s, clock, opt = box.s, box.clock, box.optimizer
    until, k = s.sim_s, s.scale
    st = opt.buffer.stats()
    segments = sum(w.source.segments for w in box.workers)
    produced = segments * AGENT_STEPS_PER_SEGMENT // 16  # real samples of 16 steps
    busy = {
        "cores": min(1.0, clock.mean_wanting(until) / s.cores),
        "optimizer": clock.busy_share("optimizer", until),
        "gpu": clock.busy_share("gpu", until),
        "server": clock.busy_share("server", until),
        "decoders": max((clock.busy_share(f"decoder{i}", until) for i in range(s.decoders)), default=0.0),
    }
    # The optimizer's side bounds what is trained, the rollouts' side what is played: a run that wastes more than
    # 5% of what it loads is bounded by the busiest resource of the optimizer's side, otherwise by the rollouts'.
    wasted = (st.dropped_stale + st.evicted_unused) / st.received if st.received else 0.0
    side = ("optimizer", "gpu", "decoders") if wasted > WASTE_BOUND else ("cores", "server")
    bottleneck = max(side, key=lambda r: busy[r])
    if busy[bottleneck] < SATURATED:  # no resource is full: what holds the run back is the rollouts' pace, if cut
        bottleneck = "pace" if opt.loop.decision.pace < 0.9 else "none"
    tags = {t: v / until for t, v in clock.tags.items()}
    return {
        "setting": s.name,
        "workers": s.workers,
        "cores": s.cores,
        "sim_s": until,
        "agent_steps_per_s": segments * AGENT_STEPS_PER_SEGMENT / until,
        "produced": produced,
        "received": st.received * k,
        "consumed": st.consumed * k,
        "used": st.used * k,
        "dropped_stale": st.dropped_stale * k,
        "evicted_unused": st.evicted_unused * k,
        "wasted_share": wasted,
        "trained_share": st.used / st.received if st.received else 0.0,
        "stale_share": st.dropped_stale / st.received if st.received else 0.0,
        "loaded_share": st.received * k / produced if produced else 0.0,
        "staleness_p50": percentile(opt.report.staleness, 0.5),
        "staleness_p99": percentile(opt.report.staleness, 0.99),
        "versions": opt.loop.version,
        "updates": opt.learner.updates,
        "mean_batch": opt.learner.trained / max(1, opt.learner.updates),
        "batch_end": opt.loop.batch * k,
        "ceiling": (opt.loop.balancer.ceiling * k) if opt.loop.balancer else 0,
        "pace_end": opt.loop.decision.pace,
        "intake_mb_per_s": box.charged.mb_in / until,
        "busy": busy,
        "cpu_by_use": tags,
        "cores_wanted": clock.mean_wanting(until),
        "bottleneck": bottleneck,
        "bottleneck_text": RESOURCES[bottleneck],
    }

"""The rollout role: all the wiring of one rollout worker process, top to bottom (SPEC §3).

Rollout workers use no collectives: one dying or joining late disturbs nobody. Identity comes from the
config (``rollout.worker_id``), else the MPI rank when started by mpiexec, else the process id.
"""

from __future__ import annotations

import os
import threading

import torch

from rapid.config import Config
from rapid.envs.registry import make_env
from rapid.errors import FormatError
from rapid.infra.store import KeyNotFound, StoreError
from rapid.league import League
from rapid.monitoring.metrics import RolloutMetrics
from rapid.opponents import LeagueOpponents, ResultReporter
from rapid.param_store import ParameterStore
from rapid.roles.startup import StopFlag, build_policy, open_run_store, setup_logging, start_metrics
from rapid.rollout_worker import RolloutSettings, RolloutWorker
from rapid.uploader import Uploader


def rollout_settings(cfg: Config, seconds_per_step: float) -> RolloutSettings:
    d = cfg.derive(seconds_per_step)
    return RolloutSettings(bptt=cfg.rollout.bptt, segment_steps=d.segment_steps, gamma=d.gamma,
                           gae_lambda=cfg.ppo.gae_lambda, team_spirit=cfg.ppo.team_spirit, zero_sum=cfg.ppo.zero_sum)


def _wait_for_params(params: ParameterStore, stop: StopFlag, log) -> int | None:
    warned = False
    while not stop:
        try:
            version = params.latest_version()
        except (StoreError, FormatError) as e:
            version = None
            log.warning("cannot read the latest parameter version: %s", e)
        if version is not None:
            return version
        if not warned:
            log.info("waiting for the optimizer to publish parameters…")
            warned = True
        stop.wait(1.0)
    return None


def run_rollout(cfg: Config, worker_id: str, seed: int, stop: StopFlag | None = None, rank: int = 0,
                local_rank: int = 0) -> int:
    log = setup_logging(f"rollout-{worker_id}")
    stop = StopFlag() if stop is None else stop  # an unset flag is falsy
    torch.set_num_threads(cfg.rollout.torch_threads)
    torch.manual_seed(seed)
    metrics = start_metrics(RolloutMetrics, cfg, rank, local_rank)
    store = open_run_store(cfg, metrics)
    params = ParameterStore(store)
    env = make_env(cfg.env.name, num_games=cfg.env.num_games, seed=seed, options=cfg.env.options)
    policy = build_policy(cfg, env.spec)
    opponents = LeagueOpponents(League(store), cfg, env, lambda: build_policy(cfg, env.spec))
    worker = RolloutWorker(env, policy, rollout_settings(cfg, env.spec.seconds_per_step), opponents, seed=seed)
    uploader = Uploader(store, worker_id, cfg.rollout.upload_interval_s, cfg.rollout.max_backlog,
                        on_upload=metrics.samples_uploaded, on_episodes=ResultReporter(store, worker_id),
                        on_failure=metrics.upload_failed, on_drop=metrics.backlog_dropped)

    version = _wait_for_params(params, stop, log)
    if version is None:
        return 0
    worker.set_params(version, params.fetch(version).tensors)
    metrics.param_version(version)
    uploader.start()
    poller = ParamPoller(params, cfg.rollout.param_poll_s, version, log)
    poller.start()
    log.info("worker %s started: %d games of %s, params v%d, store %s", worker_id, env.num_games,
             cfg.env.name, version, store.describe())
    try:
        while not stop:
            segment = worker.collect()
            uploader.add(segment)
            metrics.env_steps(segment.env_steps // env.spec.num_agents)
            metrics.agent_steps(segment.env_steps)
            metrics.backlog(uploader.stats.backlog)
            for ep in segment.episodes:
                metrics.episode(ep["learner_return"], ep["length"])
            newer = poller.take()
            if newer is not None:  # swapped only between segments
                worker.set_params(*newer)
                metrics.param_version(worker.version)
    finally:
        poller.stop()
        uploader.stop()
        env.close()
        metrics.close()
        s = uploader.stats
        log.info("worker %s stopped: %d objects, %d samples uploaded, %d dropped, %d failures", worker_id,
                 s.objects, s.samples, s.dropped_samples, s.failures)
    return 0


class ParamPoller:
    """Fetches newer parameter versions on a thread of its own, every ``interval_s``: a store that hangs
    (a stopped server accepts connections and never answers) must not stop the stepping loop, which
    keeps playing its current version until a newer one has been downloaded and checked."""

    def __init__(self, params: ParameterStore, interval_s: float, version: int, log):
        self.params, self.interval_s, self.log = params, interval_s, log
        self._known = version
        self._ready: tuple[int, dict] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="param-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()  # not joined: it may be waiting on a hung store, and it holds nothing to flush

    def take(self) -> tuple[int, dict] | None:
        """(version, tensors) of a newer version than the last taken, or None."""
        with self._lock:
            ready, self._ready = self._ready, None
        return ready

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                latest = self.params.latest_version()
                if latest is not None and latest > self._known:
                    tensors = self.params.fetch(latest).tensors
                    with self._lock:
                        self._ready, self._known = (latest, tensors), latest
            except (StoreError, KeyNotFound, FormatError) as e:
                self.log.warning("parameter refresh failed, keeping v%d: %s", self._known, e)


def default_worker_id() -> str:
    for var in ("RAPID_WORKER_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if os.environ.get(var):
            return f"w{os.environ[var]}"
    return f"w{os.getpid()}"

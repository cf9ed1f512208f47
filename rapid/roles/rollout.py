"""The rollout role: all the wiring of one rollout worker process, top to bottom.

Rollout workers use no collectives: one dying or joining late disturbs nobody. Their names come from
:func:`worker_name`.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
from collections.abc import Mapping

import torch

from rapid.envs.base import VecMultiAgentEnv
from rapid.envs.registry import make_env
from rapid.errors import FormatError
from rapid.infra.distributed import Identity
from rapid.infra.identity import usable_cpus
from rapid.infra.store import BadObject, KeyNotFound, StoreError
from rapid.league import League
from rapid.monitoring.metrics import RolloutMetrics
from rapid.roles.rollout_loop import RolloutLoop
from rapid.roles.startup import StopFlag, build_policy, open_run_store, setup_logging, start_metrics
from rapid.roles.steps import drive
from rapid.rollout.inference import inference_mode
from rapid.rollout.inference_client import LOG_NAME, NodeClient, ServerVersions, node_folder, spawn_server
from rapid.rollout.inference_wire import SlotLayout
from rapid.rollout.node_cache import rollout_store
from rapid.rollout.opponents import LeagueOpponents
from rapid.rollout.uploader import Uploader
from rapid.rollout.worker import Lanes, RolloutSettings, RolloutWorker
from rapid.run.config import Config
from rapid.run.param_store import ParameterStore
from rapid.run.run_watch import RunWatch, quiet_s
from rapid.run.store_map import read_run

LANE_SEED_STEP = 1_000_003


def run_layout(store, stop: StopFlag, log) -> tuple[int, str | None] | None:
    """The run's shard count and id (``layout.json``, written by the optimizer before its first version); None
    if stopped first. A run of an older rapid has no layout once it has versions: one shard, no id."""
    started, warned = time.monotonic(), False
    while not stop:
        try:
            run = read_run(store)
            if run is not None:
                return run
            if ParameterStore(store).latest_version() is not None:
                return 1, None
        except StoreError as e:
            log.warning("cannot read the run's layout yet: %s", e)
        except FormatError as e:
            log.warning("%s; writing to one shard", e)
            return 1, None
        if not warned and time.monotonic() - started > 2.0:
            log.info("waiting for the optimizer to start the run…")
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
    layout = run_layout(store, stop, log)
    if layout is None:
        return 0
    shards, run_id = layout
    # Versions, snapshots and the pool are read through the node's cache: one fetch per node, not per process.
    reads = rollout_store(store, cfg.derive().run_dir, run_id, cfg.rollout.node_cache_dir, cfg.rollout.param_poll_s,
                          cfg.league.refresh_s)
    worker, envs, client = build_worker(cfg, seed, reads, run_id)
    poller: ParamPoller | ServerVersions = (ServerVersions(client) if client is not None else ParamPoller(
        ParameterStore(reads), cfg.rollout.param_poll_s, log, on_failure=metrics.param_refresh_failed))
    spec = envs[0].spec
    # Finished games travel inside the experience objects: the optimizer ranks tally them for the league.
    uploader = Uploader(store, worker_id, cfg.rollout.upload_interval_s, cfg.rollout.max_backlog,
                        shards=shards, max_backlog_bytes=cfg.rollout.max_backlog_mb << 20,
                        on_upload=metrics.samples_uploaded, on_failure=metrics.upload_failed,
                        on_drop=metrics.backlog_dropped)
    warmup_upload_s = cfg.rollout.warmup_upload_interval_s
    loop = RolloutLoop(worker, uploader, poller, RunWatch(store, quiet_s=quiet_s(cfg)), metrics,
                       spec.num_agents, cfg.rollout.linger_s, stop, log,
                       warmup_upload_s=warmup_upload_s if warmup_upload_s >= 0 else None)
    poller.start()
    uploader.start()
    log.info("worker %s started: %d games of %s, %s inference, store %s", worker_id, cfg.env.num_games,
             cfg.env.name, "local" if client is None else "node", store.describe())
    try:
        return drive(loop.run(), wait=stop.wait)
    finally:
        poller.stop()
        uploader.stop()
        for env in envs:
            env.close()
        if client is not None:
            client.close()
        metrics.close()
        s = uploader.stats
        log.info("worker %s stopped: %d objects, %d samples uploaded, %d dropped, %d failures; it played v%s; "
                 "paused %.0f s at the optimizer's pace", worker_id, s.objects, s.samples, s.dropped_samples,
                 s.failures, loop.version, loop.paused_s)


def build_worker(cfg: Config, seed: int, reads, run_id: str | None
                 ) -> tuple[RolloutWorker | Lanes, list[VecMultiAgentEnv], NodeClient | None]:
    """The worker, its envs and (under node inference) its connection to the node's server. Local inference: one
    env, the policy on this core. Node inference: the games in ``rollout.inference_lanes`` lanes with an env each,
    every lane deciding through the node's server (started by this worker if none answers)."""
    if inference_mode(cfg.rollout.inference, torch.cuda.is_available(), usable_cpus()) == "local":
        env = make_env(cfg.env.name, num_games=cfg.env.num_games, seed=seed, options=cfg.env.options)
        opponents = LeagueOpponents(League(reads), cfg, env, lambda: build_policy(cfg, env.spec))
        return (RolloutWorker(env, build_policy(cfg, env.spec), RolloutSettings.of(cfg, env.spec), opponents,
                              seed=seed), [env], None)
    lanes = cfg.rollout.inference_lanes
    folder = node_folder(cfg, run_id)
    envs = [make_env(cfg.env.name, num_games=cfg.env.num_games // lanes, seed=seed + LANE_SEED_STEP * i,
                     options=cfg.env.options) for i in range(lanes)]
    spec = envs[0].spec
    policy = build_policy(cfg, spec)
    layout = SlotLayout(lanes, envs[0].num_games * spec.num_agents, spec.obs_dim, spec.mask_dim,
                        len(spec.action_heads), cfg.model.lstm)
    spawn = functools.partial(spawn_server, cfg, folder) if cfg.rollout.inference_spawn else None
    client = NodeClient(str(folder), layout, spawn=spawn, log_path=str(folder / LOG_NAME))
    settings = RolloutSettings.of(cfg, spec)
    workers = [RolloutWorker(env, policy, settings,
                             LeagueOpponents(League(reads), cfg, env, remote=client.load_opponent, shared=str(folder)),
                             seed=seed + LANE_SEED_STEP * i, inference=client.lane(i)) for i, env in enumerate(envs)]
    return Lanes(workers), list(envs), client


class ParamPoller:
    """Fetches newer parameter versions on a thread of its own: a store that hangs (a stopped server
    accepts connections and never answers) must not stop the stepping loop, which keeps playing its
    current version until a newer one has been downloaded and checked.

    Nothing stops it: any failure (an unreadable pointer, a corrupt, oversized or hostile params object)
    is counted through ``on_failure(why)``, logged and skipped. A version that failed to decode is not
    fetched again; the newest good version between the one in use and it is taken instead. While a newer
    version is published but cannot be had, :meth:`behind_s` grows (the role exports it) and a warning is
    repeated every ``warn_every_s``, so a worker never keeps playing an old version silently.
    """

    def __init__(self, params: ParameterStore, interval_s: float, log, on_failure=None,
                 warn_every_s: float = 60.0, rng: random.Random | None = None):
        self.params, self.interval_s, self.log = params, interval_s, log
        self.rng = rng or random.Random()
        self.on_failure, self.warn_every_s = on_failure, warn_every_s
        self._known: int | None = None
        self._bad: set[int] = set()
        self._ready: tuple[int, dict, dict] | None = None
        self._behind_since: float | None = None
        self._warned_at = -float("inf")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="param-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()  # not joined: it may be waiting on a hung store, and it holds nothing to flush

    def alive(self) -> bool:
        """False once its thread has died (a poller driven without its thread never dies)."""
        return self._thread.is_alive() or self._stop.is_set() or self._thread.ident is None

    def take(self) -> tuple[int, dict, dict] | None:
        """(version, tensors, meta) of a newer version than the last taken, or None."""
        with self._lock:
            ready, self._ready = self._ready, None
        return ready

    def reject(self, version: int, in_use: int | None, why: str) -> None:
        """``version`` was fetched but cannot be played: never offer it again; look again from ``in_use``."""
        with self._lock:
            self._bad.add(version)
            self._known = in_use
        self._failed(f"v{version} does not fit the model, skipped: {why}")

    def behind_s(self) -> float:
        """Seconds since a newer version than the one fetched was known to exist (or since the newest
        could not even be looked up) without being fetched; 0 when up to date."""
        since = self._behind_since
        return 0.0 if since is None else time.monotonic() - since

    def _run(self) -> None:
        while True:
            try:
                self.poll_once()
            except Exception as e:  # noqa: BLE001 - this thread must outlive any one bad object or answer
                self._failed(f"{type(e).__name__}: {e}")
            behind, now = self.behind_s(), time.monotonic()
            if behind > self.warn_every_s and now - self._warned_at >= self.warn_every_s:
                self._warned_at = now
                self.log.warning("no newer parameters for %.0fs although newer ones exist or cannot be looked "
                                 "up; still playing %s", behind,
                                 "nothing" if self._known is None else f"v{self._known}")
            if self._stop.wait(self.next_wait()):
                return

    def next_wait(self) -> float:
        """Seconds to the next poll: jittered, so the processes of a fleet never poll in step; at most a second
        until the first version is had."""
        wait = self.interval_s * self.rng.uniform(0.8, 1.2)
        return wait if self._known is not None else min(wait, 1.0)

    def poll_once(self) -> None:
        try:
            latest = self.params.latest_version()
        except (StoreError, FormatError) as e:
            self._failed(f"cannot read the latest version: {e}")
            return
        if latest is None or (self._known is not None and latest <= self._known):
            self._behind_since = None
            return
        for version in self._candidates(latest):
            try:
                fetched = self.params.fetch(version)
            except KeyNotFound as e:
                self._failed(f"v{version} is published but missing: {e}")
                continue
            except (BadObject, FormatError) as e:
                self._bad.add(version)  # the same bytes would fail again: never download them twice
                self._failed(f"v{version} is a bad params object, skipped: {e}")
                continue
            with self._lock:
                self._ready, self._known = (version, fetched.tensors, fetched.meta), version
            if version == latest:
                self._behind_since = None
            return

    def _candidates(self, latest: int) -> list[int]:
        """``latest``, unless it is known bad; then the published versions newer than the one in use."""
        if latest not in self._bad:
            return [latest]
        floor = -1 if self._known is None else self._known
        return sorted((v for v in self.params.versions() if floor < v < latest and v not in self._bad),
                      reverse=True)

    def _failed(self, why: str) -> None:
        if self._behind_since is None:
            self._behind_since = time.monotonic()
        if self.on_failure is not None:
            self.on_failure(why)
        held = "no version yet" if self._known is None else f"keeping v{self._known}"
        self.log.warning("parameter refresh failed, %s: %s", held, why)


def worker_name(given: str, env: Mapping[str, str], identity: Identity) -> str:
    """A rollout worker's name, in the order docs/cluster.md gives: ``given`` (--worker-id, else
    rollout.worker_id) as is; else ``RAPID_WORKER_ID`` as is (a pod's name), suffixed ``-<rank>`` when several
    ranks share it; else ``w<rank>`` under MPI or Slurm; else ``w<pid>``.

    >>> from rapid.infra.distributed import ALONE
    >>> worker_name("", {"RAPID_WORKER_ID": "rapid-rollout-7d9f8c-xk2pq"}, ALONE)
    'rapid-rollout-7d9f8c-xk2pq'
    """
    if given:
        return given
    named = env.get("RAPID_WORKER_ID", "")
    if named:
        return named if identity.size == 1 else f"{named}-{identity.rank}"
    return f"w{identity.rank}" if identity.size > 1 else f"w{os.getpid()}"

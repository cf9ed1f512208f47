"""The optimizer role: experience in, published parameter versions out.

All the wiring of one optimizer rank, top to bottom, is :func:`run_optimizer`; its loop is five steps:
sample → update → publish → league → checkpoint. The loader thread (decoding in worker processes) fills
the buffer, a background writer publishes and checkpoints, :class:`OptimizerReport` does the metrics
and the JSON log, and :class:`Balancer` picks the batch size and publish cadence. With several ranks
every rank runs it in lock step; only rank 0 publishes, checkpoints and logs.
"""

from __future__ import annotations

import copy
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from rapid.balance import Balancer, BalanceSettings, publish_due
from rapid.checkpoints import newest_version_in_use, resume_point, save_checkpoint
from rapid.config import Config, to_toml
from rapid.decode_pool import auto_workers
from rapid.errors import FormatError, UsageError
from rapid.formats.checkpoint import Checkpoint
from rapid.formats.experience import Shape
from rapid.infra.distributed import ALONE, Identity, LayoutError, choose_device_and_backend
from rapid.infra.store import StoreError
from rapid.league import Tally
from rapid.lease import RunLease
from rapid.loader import ExperienceLoader
from rapid.monitoring.metrics import OptimizerMetrics
from rapid.opt.buffer import ExperienceBuffer
from rapid.opt.learner import Learner, allow_tf32, precision_settings
from rapid.opt.losses import linear_schedule
from rapid.param_store import ParameterStore
from rapid.publisher import BackgroundWriter
from rapid.roles.league_keeper import LeagueKeeper
from rapid.roles.lockstep import Agreement, WaitNotice, wait_for_batch, wait_round_s
from rapid.roles.optimizer_report import OptimizerReport
from rapid.roles.startup import JsonlLog, StopFlag, build_policy, env_spec, open_run_store, setup_logging, start_metrics
from rapid.store_map import EXPERIENCE_PREFIX, read_layout, write_layout

MAX_FAILED_IN_ROW = 50  # a bad batch is skipped; this many in a row is a broken learner, not bad data


def pick_device(cfg: Config, rank: Identity) -> tuple[torch.device, str]:
    """This rank's learner device and collective backend, one decision (see choose_device_and_backend)."""
    try:
        where, backend = choose_device_and_backend(cfg.optimizer.device, rank.local_rank, rank.local_size,
                                                   torch.cuda.is_available(), torch.cuda.device_count())
    except LayoutError as e:
        raise UsageError(str(e)) from None
    return torch.device(where), backend


@dataclass
class Position:
    """Where training stands: shared with the loader, which rejects experience from future versions."""

    version: int
    updates: int


def balance_settings(cfg: Config) -> BalanceSettings:
    o = cfg.optimizer
    multiple = o.microbatch_samples or 1
    if not o.balance:
        return BalanceSettings(o.batch_samples, o.batch_samples, o.max_reuse, 0.0, multiple)
    hi = o.max_batch_samples or max(o.batch_samples, min(4 * o.batch_samples, o.buffer_samples // 2))
    hi = max(o.batch_samples, hi - hi % multiple)
    interval = o.publish_interval_s or cfg.rollout.upload_interval_s
    return BalanceSettings(o.batch_samples, hi, o.target_reuse, interval, multiple)


def run_progress(cfg: Config, elapsed_s: float, updates: int) -> float:
    """The share of the run's budget done: of run.minutes or run.updates, whichever is further along (0 without
    a budget). The learning-rate and entropy schedules follow it.

    >>> from rapid.config import RunConfig
    >>> run_progress(Config(run=RunConfig(minutes=5.0, updates=1000)), elapsed_s=60.0, updates=500)
    0.5
    """
    done = [elapsed_s / (60.0 * cfg.run.minutes)] if cfg.run.minutes else []
    done += [updates / cfg.run.updates] if cfg.run.updates else []
    return min(1.0, max(done, default=0.0))


def decode_workers(cfg: Config) -> int:
    n = cfg.optimizer.decode_workers
    return auto_workers() if n < 0 else n


def run_optimizer(cfg: Config, resume: bool = False, rank: Identity = ALONE, ctx=None,
                  stop: StopFlag | None = None) -> int:
    log = setup_logging(f"optimizer-{rank.rank}")
    stop = StopFlag() if stop is None else stop  # an unset flag is falsy
    torch.set_num_threads(cfg.optimizer.torch_threads)
    torch.manual_seed(cfg.run.seed)
    lead = rank.rank == 0
    derived = cfg.derive()
    metrics = start_metrics(OptimizerMetrics, cfg, rank.rank, rank.local_rank)
    store = open_run_store(cfg, metrics)
    lease = RunLease(store).acquire() if lead else None  # a second optimizer on this run stops here, writing nothing
    params = ParameterStore(store)
    spec = env_spec(cfg)
    policy = build_policy(cfg, spec)
    device, _ = pick_device(cfg, rank)
    precision = cfg.optimizer.precision
    bf16, tf32 = precision_settings(precision, device)
    allow_tf32(tf32)
    learner = Learner(policy, cfg.ppo, device, microbatch_samples=cfg.optimizer.microbatch_samples, bf16=bf16,
                      all_reduce=ctx.all_reduce_gradients if ctx else None,
                      all_reduce_mean=ctx.all_reduce_mean_ if ctx else None, world_size=rank.size)
    if lead:
        log.info("learner on %s in %s (optimizer.precision = %s)", device, "bfloat16" if bf16 else "float32",
                 precision)

    # Where this run stands: a fresh start publishes version 0; a resume loads the newest usable checkpoint
    # and continues after the newest version in use anywhere in the store, so no version is used twice.
    version = 0
    try:
        if resume:
            point = resume_point(store, policy, learner.adam, log)
            version, learner.updates = point.version, point.updates
            log.info("resumed from %s (update %d); next version %d", point.source, learner.updates, version + 1)
        elif newest_version_in_use(store) is not None:
            raise UsageError(f"{store.describe()} already holds published parameters; use --resume or a new run dir")
        if lead:
            _write_layout(store, cfg, rank.size, resume, log)
    except UsageError:
        if lease:
            lease.abandon()  # this optimizer never started: the store is left as it was
        raise
    if lease:
        lease.keep(stop)
    if ctx is not None:
        ctx.broadcast_parameters(policy, src=0)  # also the barrier after which every rank reads the layout
    if lead and not resume:
        params.publish(version, policy.tensors(), {**version_meta(cfg, learner.updates, 0.0), "env": cfg.env.name})
    league = LeagueKeeper(store, cfg) if lead else None
    metrics.param_version(version)

    shape = Shape.of(spec, bptt=cfg.rollout.bptt, lstm=cfg.model.lstm)
    buffer = ExperienceBuffer(cfg.optimizer.buffer_samples, cfg.optimizer.max_staleness)
    pos = Position(version, learner.updates)
    o = cfg.optimizer
    loader = ExperienceLoader(store, shape, buffer, rank.rank, rank.size, read_layout(store) or 1, o.poll_s,
                              cfg.store.retention_s, on_bad=lambda key, why: metrics.bad_object(_reason(why)),
                              on_load=lambda n, nbytes, s: metrics.samples_downloaded(n, nbytes, s),
                              decode_workers=decode_workers(cfg), current_version=lambda: pos.version,
                              poll_max_s=o.poll_max_s, lookback_s=o.list_lookback_s, sweep_s=o.sweep_s,
                              download_threads=o.download_threads, mark_s=o.mark_s)
    loader.start()
    oplog = JsonlLog(f"{derived.run_dir}/logs/optimizer.jsonl") if lead else None
    if lead and not os.path.exists(f"{derived.run_dir}/config.toml"):
        # A cluster run has no launcher: keep the config beside the logs so `rapid eval --run-dir` works.
        with open(f"{derived.run_dir}/config.toml", "w") as f:
            f.write(to_toml(cfg))
    report = OptimizerReport(metrics, oplog, buffer, loader, skipped=lambda: learner.skipped)
    writer = BackgroundWriter(on_done=report.writer_done)
    settings = balance_settings(cfg)
    balancer = Balancer(settings, time.monotonic())
    agree = Agreement(ctx, lead)
    rng = np.random.default_rng(cfg.run.seed + 7919 * rank.rank)
    started, last_publish = time.time(), time.monotonic()
    last_ckpt_updates = published_updates = learner.updates
    failed_in_row, exit_code = 0, 0
    round_s = wait_round_s(ctx.timeout_s if ctx is not None else math.inf)
    deadline = started + 60 * cfg.run.minutes if cfg.run.minutes else math.inf
    pending = None  # a batch held while another rank has none yet
    t_wait = None  # when the wait for the next batch began
    waiting = WaitNotice(log, store.describe(), time.monotonic())
    try:
        while True:
            # 1. sample: a batch of fresh experience (waits for the loader at most a round; stops on request or
            # limits)
            t_wait = t_wait or time.perf_counter()
            batch = pending or wait_for_batch(buffer, balancer.batch, pos.version, rng, settings.target_reuse,
                                               stop, loader, min(deadline, time.time() + round_s))
            if loader.failure and not stop:
                report.loader_failed(loader.failure)
                stop.set("loader thread died")
                exit_code = 1
            if cfg.run.updates and learner.updates >= cfg.run.updates:
                stop.set("updates")
            if cfg.run.minutes and time.time() - started >= 60 * cfg.run.minutes:
                stop.set("minutes")
            due = (publish_due(time.monotonic(), last_publish, settings.publish_interval_s) if cfg.optimizer.balance
                   else (learner.updates + 1) % cfg.optimizer.publish_every == 0)
            leave, publish, everyone_ready = agree.decide(bool(stop), due, ready=batch is not None)
            if leave:
                if learner.updates > published_updates:  # so the final checkpoint holds a published version
                    version += 1
                    if lead:
                        _publish(writer, params, league, policy.tensors(), version,
                                 version_meta(cfg, learner.updates, time.time() - started), stop, log,
                                 o.keep_versions, deadline)
                    report.version(version)
                _pool_games(loader, ctx, league, log)
                break
            if not everyone_ready:
                pending = batch
                waiting.still(loader.stats.objects, time.monotonic())
                continue
            pending = None
            waiting.over(time.monotonic())
            arrays, staleness = batch
            wait_s, t_wait = time.perf_counter() - t_wait, None
            # 2. update: one bad batch is skipped, never the end of the job
            t_update = time.perf_counter()
            try:
                stats = learner.update(arrays, run_progress(cfg, time.time() - started, learner.updates))
            except Exception as e:
                if ctx is not None:  # the other ranks wait in this update's all-reduce: end the job instead
                    raise
                report.update_failed(e)
                failed_in_row += 1
                if failed_in_row >= MAX_FAILED_IN_ROW:
                    log.error("%d updates in a row failed (last: %s: %s); stopping the optimizer",
                              failed_in_row, type(e).__name__, e)
                    exit_code = 1
                    break
                continue
            failed_in_row = 0
            busy_s = time.perf_counter() - t_update
            if stats["skipped"]:
                report.skipped_nonfinite(learner.skipped)
                continue
            pos.updates = learner.updates
            # 3. publish (rank 0, on the background writer; the loop goes on training)
            if publish:
                version += 1
                pos.version = version
                last_publish, published_updates = time.monotonic(), learner.updates
                if lead:
                    _publish(writer, params, league, policy.tensors(), version,
                             version_meta(cfg, learner.updates, time.time() - started), stop, log,
                             o.keep_versions, deadline)
                report.version(version)
                # 4. league: every rank's games since the last version, pooled; rank 0 folds them off this thread
                _pool_games(loader, ctx, league, log)
            # 5. checkpoint (rank 0, background)
            if lead and learner.updates - last_ckpt_updates >= cfg.optimizer.checkpoint_every:
                ckpt = _snapshot(learner, version)
                writer.submit(f"checkpoint v{version}", lambda ckpt=ckpt: _until_stored(
                    f"checkpoint v{ckpt.version}", lambda: save_checkpoint(store, ckpt, o.keep_checkpoints),
                    stop, log, deadline))
                last_ckpt_updates = learner.updates
            decision = balancer.step(time.monotonic(), **_balance_inputs(buffer.stats()), busy_s=busy_s)
            report.update(learner.updates, version, stats, staleness, decision, wait_s)
    finally:
        loader.stop()
        # After an unexpected error the weights may be what broke: the last good checkpoint stays the newest.
        clean = sys.exc_info()[0] is None
        try:
            writer.close()  # drains: every queued version and checkpoint is stored, in order
            if league:
                league.close()
        finally:
            report.close()
            metrics.close()
        if lead and clean and lease.held:
            _checkpoint(store, cfg, learner, version)
            log.info("stopped (%s) at version %d after %d updates; final checkpoint written; the update loop "
                     "waited at most %.0f ms on the background writer", stop.reason or "done", version,
                     learner.updates, 1000 * writer.longest_wait_s)
        elif lead:
            log.warning("stopped (%s) at version %d after %d updates; no final checkpoint",
                        stop.reason or "error", version, learner.updates)
        if lease:
            lease.release()
        if oplog:
            oplog.close()
    return exit_code


def _balance_inputs(b) -> dict[str, int]:
    return {"received": b.received, "consumed": b.consumed, "wasted": b.dropped_stale + b.evicted_unused,
            "backlog": b.unused}


def version_meta(cfg: Config, updates: int, elapsed_s: float) -> dict:
    """What a published version says besides its weights: its update count, and the team spirit its games are to
    be played with (the ppo.team_spirit schedule at this point of the run's budget).

    >>> from rapid.config import RunConfig
    >>> from rapid.opt.config import PPOConfig
    >>> version_meta(Config(run=RunConfig(updates=100), ppo=PPOConfig(team_spirit=0.3, team_spirit_final=0.8)), 50, 9.0)
    {'updates': 50, 'team_spirit': 0.55}
    """
    progress = run_progress(cfg, elapsed_s, updates)
    return {"updates": updates, "team_spirit": linear_schedule(cfg.ppo.team_spirit, cfg.ppo.team_spirit_final,
                                                                progress)}


def _publish(writer: BackgroundWriter, params: ParameterStore, league, tensors, version: int, meta: dict,
             stop: StopFlag, log, keep: int, deadline: float = math.inf) -> None:
    """Queue version ``version`` (a copy of the weights): the object, then LATEST, then the league snapshot;
    versions older than the newest ``keep`` are deleted (0: none)."""
    def job():
        _until_stored(f"publishing v{version}", lambda: params.publish(version, tensors, meta),
                      stop, log, deadline)
        league.after_publish(version, tensors)
        try:
            params.prune(version, keep)
        except StoreError as e:  # an old version left behind costs storage, nothing else: the next prune retries
            log.warning("old parameter versions not deleted yet: %s", e)
    writer.submit(f"publish v{version}", job)


def _snapshot(learner: Learner, version: int) -> Checkpoint:
    """A checkpoint of the live weights and Adam state, copied to host memory (a GPU's moments are not
    duplicated on the GPU first): the writer encodes it while training goes on."""
    adam = learner.adam.state_dict()
    state = {k: {name: (v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v) for name, v in s.items()}
             for k, s in adam["state"].items()}
    return Checkpoint.from_torch(version, learner.updates, learner.policy.tensors(),
                                 {"state": state, "param_groups": copy.deepcopy(adam["param_groups"])})


def _write_layout(store, cfg: Config, world: int, resume: bool, log) -> None:
    """Fix the run's experience shard count before the first version (workers read it then). A run of an older
    rapid has none: its objects under experience/<worker>/ are left alone and not read."""
    try:
        legacy = resume and read_layout(store) is None and bool(store.list(EXPERIENCE_PREFIX))
        shards = write_layout(store, cfg.store.experience_shards or world)
    except FormatError as e:
        raise UsageError(f"{e} in {store.describe()}: restore it or start a new run") from e
    log.info("experience in %d shard(s); %d per rank", shards, math.ceil(shards / world))
    if legacy:
        log.warning("this run began under an older rapid: experience objects in the old layout are ignored "
                    "(delete %s<worker>/ to reclaim them); restart rollout workers to write the new one",
                    EXPERIENCE_PREFIX)


def _pool_games(loader: ExperienceLoader, ctx, league: LeagueKeeper | None, log) -> None:
    """Every rank's tally of games loaded since the last call, summed on rank 0 for the league (a collective:
    every rank calls it on the same iteration)."""
    mine = loader.take_tally()
    blobs = [mine.encode()] if ctx is None else ctx.all_gather_bytes(mine.encode())
    if league is None:
        return
    tallies = []
    for rank, blob in enumerate(blobs):
        try:
            tallies.append(Tally.decode(blob))
        except FormatError as e:
            log.warning("rank %d's game tally is unreadable, skipped: %s", rank, e)
    league.fold(Tally.merge(tallies))


def _reason(message: str) -> str:
    """A small fixed label set for the bad-object counter."""
    if "non-finite" in message:
        return "nonfinite"
    if "future policy version" in message:
        return "future"
    if message.startswith("unexpected"):
        return "error"
    if "checksum" in message or "not a" in message or "malformed" in message:
        return "decode"
    return "invalid"


def _until_stored(what: str, write, stop: StopFlag, log, deadline: float = math.inf, first_wait_s: float = 1.0,
                  max_wait_s: float = 30.0):
    """Retry ``write`` through a store outage, with doubling waits: botocore's own retries cover seconds,
    an outage can last minutes, and giving up would lose the version (or crash the job). Once asked to
    stop, the next failure is raised instead (the role then exits with one line). Past ``deadline`` (the
    run's time limit, wall clock) that is a request to stop: the update loop may be held at its next
    ``submit`` behind this write, where it cannot see the limit itself."""
    wait = first_wait_s
    while True:
        try:
            return write()
        except StoreError as e:
            if not stop and time.time() >= deadline:
                stop.set("minutes")
            if stop:
                raise
            log.warning("%s failed, retrying in %.0fs: %s", what, wait, e)
        stop.wait(wait)
        wait = min(2 * wait, max_wait_s)


def _checkpoint(store, cfg: Config, learner: Learner, version: int) -> None:
    ckpt = Checkpoint.from_torch(version, learner.updates, learner.policy.tensors(), learner.adam.state_dict())
    save_checkpoint(store, ckpt, cfg.optimizer.keep_checkpoints)

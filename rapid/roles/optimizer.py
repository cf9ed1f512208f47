"""The optimizer role: experience in, published parameter versions out (SPEC §3).

All the wiring of one optimizer rank, top to bottom, is :func:`run_optimizer`. With several ranks every
rank runs it in lock step; only rank 0 publishes, checkpoints and logs.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from rapid.checkpoints import newest_version_in_use, resume_point, save_checkpoint
from rapid.config import Config, to_toml
from rapid.errors import FormatError, UsageError
from rapid.formats.checkpoint import Checkpoint
from rapid.formats.experience import Shape
from rapid.formats.params import ParamsObject
from rapid.infra.store import StoreError
from rapid.league import League, PoolConflict, ResultFolder, ensure_bots
from rapid.lease import RunLease
from rapid.loader import ExperienceLoader
from rapid.monitoring.metrics import OptimizerMetrics
from rapid.opt.buffer import ExperienceBuffer
from rapid.opt.learner import Learner, LearnerSettings
from rapid.param_store import ParameterStore
from rapid.roles.startup import JsonlLog, StopFlag, build_policy, env_spec, open_run_store, setup_logging, start_metrics

FOLD_EVERY_S = 5.0
LEAGUE_ERRORS = (StoreError, FormatError, PoolConflict, ValueError, ArithmeticError)


@dataclass
class RankInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0


def learner_settings(cfg: Config) -> LearnerSettings:
    p = cfg.ppo
    return LearnerSettings(lr=p.lr, clip=p.clip, value_coef=p.value_coef, entropy_coef=p.entropy_coef,
                           entropy_final=p.entropy_final, entropy_anneal_updates=p.entropy_anneal_updates,
                           max_grad_norm=p.max_grad_norm, betas=(p.adam_beta1, p.adam_beta2), eps=p.adam_eps,
                           microbatch=cfg.optimizer.microbatch_samples, normalize_returns=p.normalize_returns)


def pick_device(cfg: Config, local_rank: int) -> torch.device:
    wanted = cfg.optimizer.device
    if wanted == "cuda" or (wanted == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise UsageError("optimizer.device='cuda' but CUDA is not available")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def summarize_episodes(episodes: list[dict]) -> dict[str, float]:
    """Win rates of the learner by opponent kind, and mean game length/return."""
    out: dict[str, float] = {}
    if not episodes:
        return out
    out["episodes"] = float(len(episodes))
    out["episode_length"] = float(np.mean([e["length"] for e in episodes]))
    out["episode_return"] = float(np.mean([e["learner_return"] for e in episodes]))
    for kind, match in (("latest", lambda o: o == "latest"), ("bots", lambda o: o.startswith("bot:")),
                        ("pool", lambda o: o != "latest" and not o.startswith("bot:"))):
        games = [e for e in episodes if match(e["opponent"])]
        if games:
            score = [1.0 if e["winner"] == "learner" else 0.5 if e["winner"] == "draw" else 0.0 for e in games]
            out[f"win_rate_{kind}"] = float(np.mean(score))
    return out


class StopAgreement:
    """Every rank must leave the update loop on the same iteration, or the others hang in a collective."""

    def __init__(self, ctx):
        self.ctx = ctx

    def any(self, local_stop: bool) -> bool:
        if self.ctx is None:
            return local_stop
        return self.ctx.all_reduce_scalars({"stop": float(local_stop)})["stop"] > 0.0


def run_optimizer(cfg: Config, resume: bool = False, rank: RankInfo = RankInfo(), ctx=None,
                  stop: StopFlag | None = None) -> int:
    log = setup_logging(f"optimizer-{rank.rank}")
    stop = stop or StopFlag()
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
    device = pick_device(cfg, rank.local_rank)
    learner = Learner(policy, learner_settings(cfg), device,
                      all_reduce=ctx.all_reduce_gradients if ctx else None,
                      all_reduce_scalars=ctx.all_reduce_scalars if ctx else None, world_size=rank.world)

    # Where this run stands: a fresh start publishes version 0; a resume loads the newest usable checkpoint
    # and continues after the newest version in use anywhere in the store, so no version is used twice.
    version, updates = 0, 0
    try:
        if resume:
            point = resume_point(store, policy, learner.adam, log)
            version, updates = point.version, point.updates
            learner.updates = updates
            log.info("resumed from %s (update %d); next version %d", point.source, updates, version + 1)
        elif newest_version_in_use(store) is not None:
            raise UsageError(f"{store.describe()} already holds published parameters; use --resume or a new run dir")
    except UsageError:
        if lease:
            lease.abandon()  # this optimizer never started: the store is left as it was
        raise
    if lease:
        lease.keep(stop)
    if ctx is not None:
        ctx.broadcast_parameters(policy, src=0)
    if lead and not resume:
        params.publish(version, policy.tensors(), {"updates": updates, "env": cfg.env.name})
    league = LeagueKeeper(store, cfg) if lead else None
    metrics.param_version(version)

    shape = Shape.of(spec, bptt=cfg.rollout.bptt, lstm=cfg.model.lstm)
    buffer = ExperienceBuffer(cfg.optimizer.buffer_samples, cfg.optimizer.max_staleness)
    loader = ExperienceLoader(store, shape, buffer, rank.rank, rank.world, cfg.optimizer.poll_s,
                              cfg.store.retention_s, on_bad=lambda key, why: metrics.bad_object(_reason(why)),
                              on_load=lambda n, nbytes, s: metrics.samples_downloaded(n, nbytes, s))
    loader.start()
    oplog = JsonlLog(f"{derived.run_dir}/logs/optimizer.jsonl") if lead else None
    if lead and not os.path.exists(f"{derived.run_dir}/config.toml"):
        # A cluster run has no launcher: keep the config beside the logs so `rapid eval --run-dir` works.
        with open(f"{derived.run_dir}/config.toml", "w") as f:
            f.write(to_toml(cfg))
    agree = StopAgreement(ctx)
    rng = np.random.default_rng(cfg.run.seed + 7919 * rank.rank)
    started = time.time()
    last_ckpt_updates = updates
    dropped_seen = 0
    try:
        while True:
            batch = None
            t_load = time.perf_counter()
            while batch is None and not stop:
                batch = buffer.sample(cfg.optimizer.batch_samples, version, rng, cfg.optimizer.max_reuse, timeout=0.5)
            if cfg.run.updates and updates >= cfg.run.updates:
                stop.set("updates")
            if cfg.run.minutes and time.time() - started >= 60 * cfg.run.minutes:
                stop.set("minutes")
            if agree.any(bool(stop)):
                break
            arrays, staleness = batch
            metrics.update_phase("load", time.perf_counter() - t_load)
            stats = learner.update(arrays)
            for phase in ("forward", "backward", "allreduce", "step"):
                metrics.update_phase(phase, stats[f"{phase}_s"])
            if stats["skipped"]:
                metrics.nonfinite_skipped()
                log.warning("non-finite loss or gradients: update skipped (%d so far)", learner.skipped)
                continue
            updates += 1
            if updates % cfg.optimizer.publish_every == 0:
                version += 1
                if lead:
                    t_pub = time.perf_counter()
                    tensors, meta = policy.tensors(), {"updates": updates}
                    _until_stored(f"publishing v{version}", lambda: params.publish(version, tensors, meta), stop, log)
                    league.after_publish(version, policy)
                    metrics.update_phase("publish", time.perf_counter() - t_pub)
                metrics.param_version(version)
            b = buffer.stats()
            metrics.update(stats)
            metrics.staleness(staleness)
            metrics.samples_consumed(len(staleness))
            metrics.samples_dropped_stale(b.dropped_stale - dropped_seen)
            dropped_seen = b.dropped_stale
            metrics.sample_reuse(b.reuse)
            metrics.buffer_size(b.size)
            episodes = summarize_episodes(loader.take_episodes())
            for kind in ("latest", "pool", "bots"):
                if f"win_rate_{kind}" in episodes:
                    metrics.win_rate(kind, episodes[f"win_rate_{kind}"])
            if "episode_return" in episodes:
                metrics.episode(episodes["episode_return"], int(episodes["episode_length"]))
            if league:
                league.fold_if_due()
            if lead and updates - last_ckpt_updates >= cfg.optimizer.checkpoint_every:
                _until_stored(f"checkpoint v{version}", lambda: _checkpoint(store, cfg, learner, version, updates),
                              stop, log)
                last_ckpt_updates = updates
            if oplog:
                oplog.write({"update": updates, "version": version, **stats,
                             "staleness_mean": float(staleness.mean()), "staleness_max": int(staleness.max()),
                             "sample_reuse": b.reuse, "samples_received": b.received,
                             "samples_consumed": b.consumed, "samples_dropped_stale": b.dropped_stale,
                             "buffer_size": b.size, "env_steps": loader.stats.env_steps,
                             "bad_objects": loader.stats.bad_objects, "skipped_updates": learner.skipped,
                             "elapsed_s": time.time() - started,
                             "samples_per_s": loader.stats.samples / max(time.time() - started, 1e-6), **episodes})
    finally:
        loader.stop()
        metrics.close()
        # After an unexpected error the weights may be what broke: the last good checkpoint stays the newest.
        clean = sys.exc_info()[0] is None
        if lead and clean and lease.held:
            _checkpoint(store, cfg, learner, version, updates)
            log.info("stopped (%s) at version %d after %d updates; final checkpoint written",
                     stop.reason or "done", version, updates)
        elif lead:
            log.warning("stopped (%s) at version %d after %d updates; no final checkpoint",
                        stop.reason or "error", version, updates)
        if lease:
            lease.release()
        if oplog:
            oplog.close()
    return 0


class LeagueKeeper:
    """Rank 0's league duties: snapshots every ``snapshot_every`` versions, match results folded into
    quality scores. League trouble is logged, never fatal to training."""

    def __init__(self, store, cfg: Config):
        self.league = League(store)
        self.cfg = cfg
        self.folder = ResultFolder(self.league, cfg.league.eta)
        self.next_fold = 0.0
        self.log = setup_logging("league")
        if cfg.league.bots:
            bots = [b if b.startswith("bot:") else f"bot:{b}" for b in cfg.league.bots]
            self.league.update(lambda s: ensure_bots(s, bots, time.time()))

    def after_publish(self, version: int, policy) -> None:
        every = self.cfg.league.snapshot_every
        if every and version % every == 0:
            try:
                self.league.add_snapshot(ParamsObject(version, policy.tensors(), {"source": "optimizer"}))
                self.log.info("snapshot of v%d joined the pool", version)
            except LEAGUE_ERRORS as e:
                self.log.warning("snapshot of v%d not added: %s", version, e)

    def fold_if_due(self) -> None:
        if time.monotonic() < self.next_fold:
            return
        self.next_fold = time.monotonic() + FOLD_EVERY_S
        try:
            report = self.folder.fold_pending()
        except LEAGUE_ERRORS as e:
            self.log.warning("match results not folded yet: %s", e)
            return
        if report.bad_objects:
            self.log.warning("skipped %d bad match-result objects", report.bad_objects)


def _reason(message: str) -> str:
    """A small fixed label set for the bad-object counter."""
    if "non-finite" in message:
        return "nonfinite"
    if "checksum" in message or "not a" in message or "malformed" in message:
        return "decode"
    return "invalid"


def _until_stored(what: str, write, stop: StopFlag, log, first_wait_s: float = 1.0, max_wait_s: float = 30.0):
    """Retry ``write`` through a store outage, with doubling waits: botocore's own retries cover seconds,
    an outage can last minutes, and giving up would lose the version (or crash the job). Once asked to
    stop, the next failure is raised instead (the role then exits with one line)."""
    wait = first_wait_s
    while True:
        try:
            return write()
        except StoreError as e:
            if stop:
                raise
            log.warning("%s failed, retrying in %.0fs: %s", what, wait, e)
        stop.wait(wait)
        wait = min(2 * wait, max_wait_s)


def _checkpoint(store, cfg: Config, learner: Learner, version: int, updates: int) -> None:
    ckpt = Checkpoint.from_torch(version, updates, learner.policy.tensors(), learner.adam.state_dict())
    save_checkpoint(store, ckpt, cfg.optimizer.keep_checkpoints)

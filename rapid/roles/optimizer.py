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

import numpy as np
import torch

from rapid.errors import FormatError, UsageError
from rapid.formats.checkpoint import Checkpoint
from rapid.formats.experience import Shape
from rapid.infra.distributed import ALONE, Identity, LayoutError, choose_device_and_backend
from rapid.infra.store import StoreError
from rapid.league import League
from rapid.monitoring.optimizer_metrics import OptimizerMetrics
from rapid.opt.buffer import ExperienceBuffer
from rapid.opt.learner import Learner, allow_tf32, precision_settings
from rapid.optimizer.checkpoints import save_checkpoint
from rapid.optimizer.decode_pool import auto_most, auto_workers
from rapid.optimizer.loader import ExperienceLoader
from rapid.optimizer.publisher import BackgroundWriter
from rapid.roles.curves import open_curves
from rapid.roles.league_keeper import LeagueKeeper
from rapid.roles.lockstep import wait_round_s
from rapid.roles.optimizer_loop import OptimizerLoop, Timing
from rapid.roles.optimizer_parts import Parts
from rapid.roles.optimizer_report import OptimizerReport
from rapid.roles.optimizer_settings import version_meta
from rapid.roles.pbt_member import EXPLOIT, MemberState, PbtWatch, apply_exploit, ensure_population, open_population
from rapid.roles.restarts import EXPLOITED
from rapid.roles.start_point import Resume, agree_on_start
from rapid.roles.startup import JsonlLog, StopFlag, build_policy, env_spec, open_run_store, setup_logging, start_metrics
from rapid.roles.steps import drive
from rapid.run.config import Config
from rapid.run.config_files import to_toml
from rapid.run.lease import RunLease
from rapid.run.param_store import ParameterStore
from rapid.run.run_owner import Owner, write_owner
from rapid.run.store_map import EXPERIENCE_PREFIX, read_layout, write_layout


def pick_device(cfg: Config, rank: Identity) -> tuple[torch.device, str]:
    """This rank's learner device and collective backend, one decision (see choose_device_and_backend)."""
    try:
        where, backend = choose_device_and_backend(cfg.optimizer.device, rank.local_rank, rank.local_size,
                                                   torch.cuda.is_available(), torch.cuda.device_count())
    except LayoutError as e:
        raise UsageError(str(e)) from None
    return torch.device(where), backend


def decode_workers(cfg: Config) -> tuple[int, int]:
    """The decode processes to start with, and the most they may grow to (as many: a number the config sets)."""
    n = cfg.optimizer.decode_workers
    return (auto_workers(), auto_most()) if n < 0 else (n, n)


def run_optimizer(cfg: Config, resume: Resume = False, rank: Identity = ALONE, ctx=None,
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

    # A population member first takes the leader a decided round gave it, if it has not yet (docs/pbt.md).
    pops = open_population(cfg, log) if cfg.pbt.member >= 0 else None
    pop = ensure_population(pops, cfg) if pops else None
    if pops and pop and lead:
        apply_exploit(pops, pop, cfg.pbt.member, store, cfg.optimizer.keep_checkpoints, log)

    # Where this run stands: a fresh start publishes version 0; a resume loads the newest usable checkpoint
    # and continues after the newest version in use anywhere in the store, so no version is used twice. Rank 0
    # chooses, every rank loads exactly that point, and the ranks compare digests of their state before starting.
    try:
        start = agree_on_start(ctx, store, policy, learner.adam, resume, rank.rank, log,
                               prepare=(lambda resumed: _write_layout(store, cfg, rank.size, resumed, log))
                               if lead else None, owner=Owner(cfg.run.name, cfg.env.name))
    except UsageError:
        if lease:
            lease.abandon()  # this optimizer never started: the store is left as it was
        raise
    version, learner.updates = start.version, start.updates
    member = MemberState.of(start.meta, pop, cfg.pbt.member) if pop else None
    if member:
        learner.ppo = member.ppo(cfg.ppo)  # the member's hyperparameters, the same on every rank: they come
        log.info("pbt member m%d (round %d): %s", cfg.pbt.member, member.round, member.hparams)  # with the start
    if start.resumed:
        log.info("resumed from %s (update %d); next version %d; state digest %s, the same on all %d rank(s)",
                 start.source, learner.updates, version + 1, start.digest[:12], rank.size)
    if lease:
        lease.keep(stop)
    if lead and not start.resumed:
        params.publish(version, policy.tensors(), {**version_meta(cfg, learner.updates, 0.0), "env": cfg.env.name})
    league = LeagueKeeper(store, cfg) if lead else None
    if lead and pops and pop and member:
        PbtWatch(pops, pop, member, cfg, League(store), stop, log).keep()
    meta = member.meta() if member else {}
    metrics.param_version(version)

    shape = Shape.of(spec, bptt=cfg.rollout.bptt, lstm=cfg.model.lstm)
    buffer = ExperienceBuffer(cfg.optimizer.buffer_samples, cfg.optimizer.max_staleness,
                              keep_reference=cfg.ppo.proximal == "first_use")
    o = cfg.optimizer
    decoders, most_decoders = decode_workers(cfg)
    loader = ExperienceLoader(store, shape, buffer, rank.rank, rank.size, read_layout(store) or 1, o.poll_s,
                              cfg.store.retention_s, on_bad=lambda key, why: metrics.bad_object(_reason(why)),
                              on_load=lambda n, nbytes, s: metrics.samples_downloaded(n, nbytes, s),
                              decode_workers=decoders, decode_most=most_decoders,
                              current_version=lambda: loop.version,  # set before the loader starts
                              poll_max_s=o.poll_max_s, lookback_s=o.list_lookback_s, sweep_s=o.sweep_s,
                              download_threads=o.download_threads, mark_s=o.mark_s)
    oplog = JsonlLog(f"{derived.run_dir}/logs/optimizer.jsonl") if lead else None
    if lead and not os.path.exists(f"{derived.run_dir}/config.toml"):
        # A cluster run has no launcher: keep the config beside the logs so `rapid eval --run-dir` works.
        with open(f"{derived.run_dir}/config.toml", "w") as f:
            f.write(to_toml(cfg))
    curves = (open_curves(derived.run_dir, "optimizer", cfg.run.name, cfg.metrics.tensorboard, cfg.metrics.wandb)
              if lead else None)
    report = OptimizerReport(metrics, oplog, buffer, loader, skipped=lambda: learner.skipped, curves=curves)
    writer = BackgroundWriter(on_done=report.writer_done)
    parts = Parts(learner, buffer, loader, writer, params, league, report, tensors=policy.tensors,
                  checkpoint=lambda v: _snapshot(learner, v, meta), store=store)
    timing = Timing(round_s=wait_round_s(ctx.timeout_s if ctx is not None else math.inf))
    loop = OptimizerLoop(cfg, parts, timing, stop, log, lead, grouped=ctx is not None, version=version,
                         rng=np.random.default_rng(cfg.run.seed + 7919 * rank.rank), gpu=device.type == "cuda",
                         sample_bytes=shape.sample_bytes)
    loader.start()
    lost: StoreError | None = None  # the store failed as the run stopped: what was still queued is not stored
    try:
        exit_code = drive(loop.run(), ctx, stop.wait)
    finally:
        loader.stop()
        # After an unexpected error the weights may be what broke: the last good checkpoint stays the newest.
        clean = sys.exc_info()[0] is None
        stop.set("error")  # set already unless the loop failed: the writer's store retries end at their next failure
        try:
            try:
                writer.close()  # drains: every queued version and checkpoint is stored, in order
            except StoreError as e:  # until_stored retried while the run went on; at the stop the store was down
                lost = e
            if league:
                league.close()
            if lease is not None and clean and lease.held and lost is None:  # rank 0 (the lead) holds the lease
                try:
                    _checkpoint(store, cfg, learner, loop.version, meta)
                except StoreError as e:
                    lost = e
        finally:
            report.close()
            metrics.close()
            _last_line(log, lead, clean, lease, lost, stop, loop, learner.updates)
            if lease:
                lease.release()
            if oplog:
                oplog.close()
    if lost is not None:
        return 1
    return EXPLOITED if stop.reason == EXPLOIT else exit_code


def _last_line(log, lead: bool, clean: bool, lease, lost: StoreError | None, stop, loop, updates: int) -> None:
    """Rank 0's one line on how the run ended and whether its final checkpoint is stored."""
    if not lead:
        return
    where = f"stopped ({stop.reason}) at version {loop.version} after {updates} updates"
    if lost is not None:
        log.error("%s; the store failed as the run stopped (%s), so the last version or checkpoint is not stored "
                  "and there is no final checkpoint: --resume continues from the newest one stored", where,
                  " ".join(str(lost).split()))
    elif clean and lease.held:
        log.info("%s; final checkpoint written; a version waited at most %.1f s for the background writer (past "
                 "a round, held while the ranks trained on)", where, loop.held_publish_s)
    else:
        log.warning("%s; no final checkpoint", where)


def _snapshot(learner: Learner, version: int, meta: dict) -> Checkpoint:
    """A checkpoint of the live weights and Adam state, copied to host memory (a GPU's moments are not
    duplicated on the GPU first): the writer encodes it while training goes on."""
    adam = learner.adam.state_dict()
    state = {k: {name: (v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v) for name, v in s.items()}
             for k, s in adam["state"].items()}
    return Checkpoint.from_torch(version, learner.updates, learner.policy.tensors(),
                                 {"state": state, "param_groups": copy.deepcopy(adam["param_groups"])}, meta)


def _write_layout(store, cfg: Config, world: int, resume: bool, log) -> None:
    """Fix the run's experience shard count before the first version (workers read it then). A run of an older
    rapid has none: its objects under experience/<worker>/ are left alone and not read."""
    try:
        legacy = resume and read_layout(store) is None and bool(store.list(EXPERIENCE_PREFIX))
        shards = write_layout(store, cfg.store.experience_shards or world)
        write_owner(store, Owner(cfg.run.name, cfg.env.name))
    except FormatError as e:
        raise UsageError(f"{e} in {store.describe()}: restore it or start a new run") from e
    log.info("experience in %d shard(s); %d per rank", shards, math.ceil(shards / world))
    if legacy:
        log.warning("this run began under an older rapid: experience objects in the old layout are ignored "
                    "(delete %s<worker>/ to reclaim them); restart rollout workers to write the new one",
                    EXPERIENCE_PREFIX)


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


def _checkpoint(store, cfg: Config, learner: Learner, version: int, meta: dict) -> None:
    ckpt = Checkpoint.from_torch(version, learner.updates, learner.policy.tensors(), learner.adam.state_dict(), meta)
    save_checkpoint(store, ckpt, cfg.optimizer.keep_checkpoints)

"""The config's value checks: every error in one pass, so `rapid` reports them together (``build_config``)."""

from __future__ import annotations

import importlib.util
import math
import re
from typing import TYPE_CHECKING

from rapid.opt.config import check_positive as _positive
from rapid.opt.config import check_unit as _unit
from rapid.run.pbt_config import pbt_errors

if TYPE_CHECKING:
    from rapid.run.config import Config

RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}", re.ASCII)
BOT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,59}", re.ASCII)  # as the league's bot:<name> ids


def validate(cfg: Config) -> list[str]:
    """Every value error in ``cfg``; an empty list means the config is usable."""
    e: list[str] = []
    _positive(e, "run.minutes", cfg.run.minutes, allow_zero=True)
    _positive(e, "run.updates", cfg.run.updates, allow_zero=True)
    _unit(e, "run.target_win_rate", cfg.run.target_win_rate)
    _positive(e, "run.num_workers", cfg.run.num_workers, allow_zero=True)
    _positive(e, "run.max_restarts", cfg.run.max_restarts, allow_zero=True)
    if not RUN_NAME.fullmatch(cfg.run.name):  # it names a folder under runs/ and labels metrics
        e.append(f"run.name must be 1-64 of A-Z a-z 0-9 . _ -, not starting with . or - (got {cfg.run.name!r})")
    if not 0 <= cfg.run.seed < 1 << 32:
        e.append(f"run.seed must be within [0, 2**32) (got {cfg.run.seed})")
    if not cfg.env.name:
        e.append("env.name must name a game")
    _positive(e, "env.num_games", cfg.env.num_games)
    for key in ("hidden", "encoder_layers", "lstm"):
        _positive(e, f"model.{key}", getattr(cfg.model, key))
    if not all(isinstance(n, int) and n > 0 for n in cfg.model.conv_channels):
        e.append(f"model.conv_channels must be positive integers (got {cfg.model.conv_channels})")
    e += cfg.ppo.errors()
    r = cfg.rollout
    _positive(e, "rollout.bptt", r.bptt)
    _positive(e, "rollout.samples_per_segment", r.samples_per_segment)
    _positive(e, "rollout.upload_interval_s", r.upload_interval_s)
    if r.warmup_upload_interval_s >= 0:
        _positive(e, "rollout.warmup_upload_interval_s", r.warmup_upload_interval_s)
    _positive(e, "rollout.param_poll_s", r.param_poll_s)
    _positive(e, "rollout.max_backlog", r.max_backlog)
    _positive(e, "rollout.max_backlog_mb", r.max_backlog_mb)
    _positive(e, "rollout.torch_threads", r.torch_threads)
    _positive(e, "rollout.linger_s", r.linger_s, allow_zero=True)
    if r.inference not in ("local", "node", "auto"):
        e.append(f"rollout.inference must be 'local', 'node' or 'auto' (got {r.inference!r})")
    _positive(e, "rollout.inference_lanes", r.inference_lanes)
    if r.inference != "local" and r.inference_lanes > 0 and cfg.env.num_games % r.inference_lanes:
        e.append(f"env.num_games ({cfg.env.num_games}) must split into rollout.inference_lanes "
                 f"({r.inference_lanes}) equal groups")
    _positive(e, "rollout.inference_max_batch", r.inference_max_batch)
    _positive(e, "rollout.inference_max_wait_ms", r.inference_max_wait_ms, allow_zero=True)
    _positive(e, "rollout.inference_idle_s", r.inference_idle_s, allow_zero=True)
    if r.inference_device not in ("auto", "cpu", "cuda"):
        e.append(f"rollout.inference_device must be 'auto', 'cpu' or 'cuda' (got {r.inference_device!r})")
    o = cfg.optimizer
    _positive(e, "optimizer.batch_samples", o.batch_samples)
    _positive(e, "optimizer.microbatch_samples", o.microbatch_samples, allow_zero=True)
    if o.microbatch_samples and o.batch_samples % o.microbatch_samples:
        e.append(f"optimizer.batch_samples ({o.batch_samples}) must be a multiple of "
                 f"optimizer.microbatch_samples ({o.microbatch_samples})")
    if o.buffer_samples < o.batch_samples:
        e.append(f"optimizer.buffer_samples ({o.buffer_samples}) must be ≥ batch_samples ({o.batch_samples})")
    _positive(e, "optimizer.max_buffer_mb", o.max_buffer_mb, allow_zero=True)
    _positive(e, "optimizer.max_staleness", o.max_staleness, allow_zero=True)
    _positive(e, "optimizer.max_reuse", o.max_reuse)
    _positive(e, "optimizer.publish_every", o.publish_every)
    _positive(e, "optimizer.target_reuse", o.target_reuse)
    if o.target_reuse > o.max_reuse:
        e.append(f"optimizer.target_reuse ({o.target_reuse}) must be ≤ max_reuse ({o.max_reuse})")
    _positive(e, "optimizer.max_batch_samples", o.max_batch_samples, allow_zero=True)
    if o.max_batch_samples and not o.batch_samples <= o.max_batch_samples <= o.buffer_samples:
        e.append(f"optimizer.max_batch_samples ({o.max_batch_samples}) must be within batch_samples … "
                 f"buffer_samples ({o.batch_samples} … {o.buffer_samples})")
    _positive(e, "optimizer.publish_interval_s", o.publish_interval_s, allow_zero=True)
    _positive(e, "optimizer.fold_interval_s", o.fold_interval_s, allow_zero=True)
    if o.decode_workers < -1:
        e.append(f"optimizer.decode_workers must be -1 (auto), 0 or more (got {o.decode_workers})")
    _positive(e, "optimizer.checkpoint_every", o.checkpoint_every)
    _positive(e, "optimizer.keep_checkpoints", o.keep_checkpoints)
    _positive(e, "optimizer.keep_versions", o.keep_versions, allow_zero=True)
    _positive(e, "optimizer.poll_s", o.poll_s)
    if o.poll_max_s < o.poll_s:
        e.append(f"optimizer.poll_max_s ({o.poll_max_s}) must be ≥ poll_s ({o.poll_s})")
    _positive(e, "optimizer.list_lookback_s", o.list_lookback_s)
    _positive(e, "optimizer.sweep_s", o.sweep_s)
    _positive(e, "optimizer.download_threads", o.download_threads)
    _positive(e, "optimizer.mark_s", o.mark_s, allow_zero=True)
    if not 0 <= cfg.store.experience_shards <= 65_536:
        e.append(f"store.experience_shards must be within [0, 65536] (got {cfg.store.experience_shards})")
    if o.device not in ("auto", "cpu", "cuda"):
        e.append(f"optimizer.device must be 'auto', 'cpu' or 'cuda' (got {o.device!r})")
    if o.precision not in ("fp32", "bf16", "auto"):
        e.append(f"optimizer.precision must be 'fp32', 'bf16' or 'auto' (got {o.precision!r})")
    _positive(e, "optimizer.torch_threads", o.torch_threads)
    _positive(e, "optimizer.collective_timeout_s", o.collective_timeout_s)
    lg = cfg.league
    _positive(e, "league.snapshot_every", lg.snapshot_every, allow_zero=True)
    _unit(e, "league.latest_prob", lg.latest_prob)
    _unit(e, "league.bot_prob", lg.bot_prob)
    if lg.bot_prob_final >= 0:
        _unit(e, "league.bot_prob_final", lg.bot_prob_final)
    _unit(e, "league.bot_begin", lg.bot_begin)
    _positive(e, "league.eta", lg.eta)
    if lg.scheme not in ("openai_five", "pfsp"):
        e.append(f"league.scheme must be 'openai_five' or 'pfsp' (got {lg.scheme!r})")
    _positive(e, "league.pfsp_power", lg.pfsp_power, allow_zero=True)
    _positive(e, "league.refresh_s", lg.refresh_s)
    _positive(e, "league.slate_size", lg.slate_size)
    _positive(e, "league.max_snapshots", lg.max_snapshots, allow_zero=True)
    if lg.keep_retired < -1:
        e.append(f"league.keep_retired must be -1 (keep all), 0 or more (got {lg.keep_retired})")
    for key, bots in (("league.bots", lg.bots), ("league.warmup_bots", lg.warmup_bots)):
        for bot in bots:
            if not BOT_NAME.fullmatch(bot.removeprefix("bot:")):
                e.append(f"{key}: {bot!r} is not a bot name (A-Z a-z 0-9 . _ -, e.g. 'random')")
    if lg.warmup_bots and not cfg.ppo.warmup_updates:
        e.append("league.warmup_bots are played through the warm-up only: set ppo.warmup_updates > 0")
    _positive(e, "eval.interval_s", cfg.eval.interval_s, allow_zero=True)
    _positive(e, "eval.games", cfg.eval.games)
    if cfg.eval.pool_games < -1:
        e.append(f"eval.pool_games must be -1 (half of eval.games), 0 or more (got {cfg.eval.pool_games})")
    _unit(e, "eval.core_share", cfg.eval.core_share)
    if cfg.eval.play not in ("sampled", "greedy", "both"):
        e.append(f"eval.play must be 'sampled', 'greedy' or 'both' (got {cfg.eval.play!r})")
    _positive(e, "eval.early_interval_s", cfg.eval.early_interval_s, allow_zero=True)
    _positive(e, "eval.early_s", cfg.eval.early_s, allow_zero=True)
    e += ladder_errors(cfg)
    e += pbt_errors(cfg.pbt, bool(cfg.eval.ladder), cfg.eval.interval_s > 0)
    _positive(e, "store.max_attempts", cfg.store.max_attempts)
    _positive(e, "store.retention_s", cfg.store.retention_s, allow_zero=True)
    if not 0 <= cfg.metrics.base_port < 65536:
        e.append(f"metrics.base_port must be within [0, 65535] (got {cfg.metrics.base_port})")
    if cfg.metrics.wandb not in ("", "offline", "online"):
        e.append(f"metrics.wandb must be '', 'offline' or 'online' (got {cfg.metrics.wandb!r})")
    elif cfg.metrics.wandb and importlib.util.find_spec("wandb") is None:
        e.append(f"metrics.wandb = {cfg.metrics.wandb!r} needs the wandb package: pip install 'rapid[wandb]'")
    return e


def ladder_errors(cfg: Config) -> list[str]:
    """The strength ladder's errors: ratings that are not finite numbers, malformed rungs, and any rung that
    training meets (a figure against an opponent the run trained on measures nothing)."""
    e: list[str] = []
    _positive(e, "eval.ladder_games", cfg.eval.ladder_games)
    _positive(e, "eval.ladder_interval_s", cfg.eval.ladder_interval_s)
    trained = {b.removeprefix("bot:") for b in (*cfg.league.bots, *cfg.league.warmup_bots)}
    for key, rating in cfg.eval.ladder.items():
        if not isinstance(rating, (int, float)) or isinstance(rating, bool) or not math.isfinite(rating):
            e.append(f"eval.ladder: the rating of {key!r} must be a finite number (got {rating!r})")
        if key.startswith("ref:"):
            if not key[4:]:
                e.append(f"eval.ladder: {key!r} names no reference file (ref:PATH)")
        elif not BOT_NAME.fullmatch(key.removeprefix("bot:")):
            e.append(f"eval.ladder: {key!r} is neither a bot name nor ref:PATH")
        elif key.removeprefix("bot:") in trained:
            e.append(f"eval.ladder: {key!r} is also a training opponent (league.bots or league.warmup_bots): "
                     "a ladder rung must be one that training never meets")
    return e

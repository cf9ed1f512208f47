"""What an optimizer rank derives from the config as the run goes: how far through its budget it is
(:func:`run_progress`, which the learner's schedules follow), what each published version says besides its weights
(:func:`version_meta`: the schedules the rollout workers play it with), and the balancer's bounds
(:func:`balance_settings`). Pure functions of the config, the clock and the update count."""

from __future__ import annotations

from rapid.opt.losses import linear_schedule
from rapid.optimizer.balance import PACE_EVERY_S, BalanceSettings
from rapid.run.config import Config


def run_progress(cfg: Config, elapsed_s: float, updates: int) -> float:
    """The share of the run's budget done: of run.minutes or run.updates, whichever is further along (0 without
    a budget). The learning-rate and entropy schedules follow it.

    >>> from rapid.run.config import RunConfig
    >>> run_progress(Config(run=RunConfig(minutes=5.0, updates=1000)), elapsed_s=60.0, updates=500)
    0.5
    """
    done = [elapsed_s / (60.0 * cfg.run.minutes)] if cfg.run.minutes else []
    done += [updates / cfg.run.updates] if cfg.run.updates else []
    return min(1.0, max(done, default=0.0))


def version_meta(cfg: Config, updates: int, elapsed_s: float) -> dict:
    """What a published version says besides its weights: its update count, and the team spirit and share of
    games against bots its games are to be played with (the ppo.team_spirit and league.bot_prob schedules at this
    point of the run's budget), and whether they are the warm-up's (ppo.warmup_updates: against
    league.warmup_bots only).

    >>> from rapid.run.config import LeagueConfig, RunConfig
    >>> from rapid.opt.config import PPOConfig
    >>> version_meta(Config(run=RunConfig(updates=100), ppo=PPOConfig(team_spirit=0.3, team_spirit_final=0.8),
    ...                     league=LeagueConfig(bot_prob=0.0, bot_prob_final=0.5, bot_begin=0.5)), 75, 9.0)
    {'updates': 75, 'team_spirit': 0.675, 'bot_prob': 0.25, 'warmup': False}
    """
    progress = run_progress(cfg, elapsed_s, updates)
    lg = cfg.league
    return {"updates": updates,
            "team_spirit": linear_schedule(cfg.ppo.team_spirit, cfg.ppo.team_spirit_final, progress),
            "bot_prob": linear_schedule(lg.bot_prob, lg.bot_prob_final, progress, lg.bot_begin),
            "warmup": cfg.ppo.in_warmup(updates)}


def balance_settings(cfg: Config, gpu: bool = False, sample_bytes: int = 0) -> BalanceSettings:
    """The balancer's bounds. On a GPU learner the batch may grow to half the buffer (a GPU amortizes its
    per-update launch cost over thousands of samples; growth trials still keep a size only if it pays), on a
    CPU to 4 × batch_samples, as optimizer.max_batch_samples = 0 says. With the rollouts paced, the buffer may
    grow to optimizer.max_buffer_mb of samples of ``sample_bytes`` (0: unknown, it keeps its size).

    >>> from rapid.run.config import OptimizerConfig
    >>> cfg = Config(optimizer=OptimizerConfig(batch_samples=128, buffer_samples=8192))
    >>> balance_settings(cfg).max_batch, balance_settings(cfg, gpu=True).max_batch
    (512, 4096)
    >>> balance_settings(cfg, sample_bytes=17_392).max_buffer     # moba 5v5's samples in 2 GiB
    123475
    """
    o = cfg.optimizer
    multiple = o.microbatch_samples or 1
    if not o.balance:
        return BalanceSettings(o.batch_samples, o.batch_samples, o.max_reuse, 0.0, multiple)
    room = o.buffer_samples // 2
    hi = o.max_batch_samples or max(o.batch_samples, room if gpu else min(4 * o.batch_samples, room))
    hi = max(o.batch_samples, hi - hi % multiple)
    interval = o.publish_interval_s or cfg.rollout.upload_interval_s
    r = cfg.rollout
    # A pace set now shows in what arrives after the next publish, the workers' poll and their next upload.
    shows_after_s = interval + r.param_poll_s + max(r.upload_interval_s, r.warmup_upload_interval_s)
    most = int(o.max_buffer_mb * 2**20 // sample_bytes) if sample_bytes and o.pace_rollouts else 0
    return BalanceSettings(o.batch_samples, hi, o.target_reuse, interval, multiple,
                           buffer=o.buffer_samples if o.pace_rollouts else 0,
                           pace_every_s=max(PACE_EVERY_S, shows_after_s), max_buffer=most,
                           fresh_s=(o.max_staleness + 1) * interval,
                           batch_follows_buffer=gpu and not o.max_batch_samples)

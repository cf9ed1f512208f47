"""The evaluator role: every ``eval.interval_s`` (``eval.early_interval_s`` in its first ``eval.early_s``) it
plays the newest version against the baseline, with sampled or greedy actions or both (``eval.play``), and
logs the win rates, so `rapid train` can show progress against a fixed yardstick (self-play win rates
hover near 50% by construction). Once the run's optimizer has stopped (:class:`rapid.run.run_watch.RunWatch`,
asked again over a few seconds: :func:`stays_gone`) and the newest version is rated, it stops too."""

from __future__ import annotations

import time
from itertools import islice

import torch

from rapid.envs.registry import make_env
from rapid.errors import FormatError
from rapid.infra.store import StoreError
from rapid.league import League, PoolConflict, rate_games, rating_of, version_id
from rapid.league.population import Fitness
from rapid.monitoring.metrics import EvaluatorMetrics
from rapid.roles.curves import open_curves
from rapid.roles.pbt_member import open_population
from rapid.roles.startup import JsonlLog, StopFlag, build_policy, open_run_store, setup_logging, start_metrics
from rapid.run.config import Config, EvalConfig
from rapid.run.ladder import Ladder
from rapid.run.matches import MatchScore, PolicyPlayer, batch_size, load_policy, play_match
from rapid.run.param_store import ParameterStore
from rapid.run.population import PopulationStore
from rapid.run.run_watch import RunWatch, quiet_s


def run_evaluator(cfg: Config, stop: StopFlag | None = None) -> int:
    log = setup_logging("evaluator")
    stop = StopFlag() if stop is None else stop  # an unset flag is falsy
    torch.set_num_threads(1)
    metrics = start_metrics(EvaluatorMetrics, cfg)
    store = open_run_store(cfg, metrics)
    params = ParameterStore(store)
    league = League(store)
    games = cfg.eval.games
    env = make_env(cfg.env.name, num_games=batch_size(games), seed=cfg.run.seed + 99991, options=cfg.env.options)
    # A match steps every game of its env until each has played its share: the pool's fewer games get their own.
    pool_games = cfg.eval.pool_match_games
    pool_env = make_env(cfg.env.name, num_games=batch_size(pool_games), seed=cfg.run.seed + 99992,
                        options=cfg.env.options) if pool_games else None
    ladder = open_ladder(cfg)
    population = open_population(cfg, log) if cfg.pbt.member >= 0 else None  # a member's rating is its fitness
    out = JsonlLog(f"{cfg.derive().run_dir}/logs/eval.jsonl")
    curves = open_curves(cfg.derive().run_dir, "evaluator", cfg.run.name, cfg.metrics.tensorboard, cfg.metrics.wandb)
    last, rounds, evaluator_started = -1, 0, time.time()
    laddered_at = evaluator_started  # the first rating after ladder_interval_s: the first seconds are the learner's
    watch, version_at, asked = RunWatch(store, quiet_s(cfg)), time.time(), False
    while not stop:
        round_s = 0.0
        try:
            version = params.latest_version()
        except (StoreError, FormatError) as e:
            log.warning("cannot read the latest version: %s", e)
            version = None
        if version is not None and version > last:
            started = time.time()
            policy = load_policy(cfg, env.spec, params, version)
            scores, rating = _play_baseline(cfg, env, policy, version, rounds, league, metrics, out, log)
            pool_result = None if pool_env is None else _play_pool(cfg, pool_env, league, policy, version,
                                                                   pool_games, rounds, log)
            if pool_result:
                member, res = pool_result
                rating = _rate(league, version, member, res, log)
                metrics.win_rate("pool", res.win_rate)
                out.write({"version": version, "opponent": member, "games": res.games, "wins": res.wins,
                           "losses": res.losses, "draws": res.draws, "win_rate": res.win_rate, **rating})
            if ladder is not None and time.time() - laddered_at >= cfg.eval.ladder_interval_s:
                laddered_at = time.time()
                rating.update(_play_ladder(cfg, ladder, policy, version, rounds, metrics, out, log))
                if population is not None:
                    _report_fitness(population, cfg.pbt.member, version, rating, log)
            if rating.get("rating") is not None:
                metrics.rating(version_id(version), rating["rating"], rating["rating_sigma"])
            if curves is not None:
                curves.scalars({**{curve_tag(cfg.eval.opponent, mode): s.win_rate for mode, s in scores.items()},
                                "eval/mean_length": scores[cfg.eval.modes[0]].mean_length,
                                **({"eval/win_rate_vs_pool": pool_result[1].win_rate} if pool_result else {}),
                                **{f"eval/{k}": v for k, v in rating.items()}}, step=version)
            last, rounds, version_at = version, rounds + 1, time.time()
            round_s = version_at - started
        gone = watch.optimizer_gone(version_at, time.time(), force=not asked)  # at start, then when quiet
        asked = True
        if gone and version is not None and version <= last and stays_gone(watch, stop):
            log.info("the run's optimizer %s and its newest version v%d is rated: the evaluator stops", gone, last)
            break
        interval_s = eval_interval_s(cfg.eval, time.time() - evaluator_started)
        stop.wait(eval_wait_s(interval_s, round_s, cfg.eval.core_share))
    env.close()
    if ladder is not None:
        ladder.env.close()
    if pool_env is not None:
        pool_env.close()
    out.close()
    if curves is not None:
        curves.close()
    metrics.close()
    return 0


def _play_baseline(cfg: Config, env, policy, version: int, rounds: int, league: League, metrics: EvaluatorMetrics,
                   out: JsonlLog, log) -> tuple[dict[str, MatchScore], dict]:
    """The round's matches against the baseline, one per mode of ``eval.play`` on the same games (the same seeds,
    a fresh bot each), each logged with ``greedy``; the first is rated and sets the win-rate gauge. Returns the
    scores by mode and the rating."""
    scores: dict[str, MatchScore] = {}
    rating: dict = {}
    for mode in cfg.eval.modes:
        started = time.time()
        player = PolicyPlayer(policy, env.spec, f"v{version}", greedy=mode == "greedy")
        result = scores[mode] = play_match(env, player, env.make_bot(cfg.eval.opponent, seed=rounds), cfg.eval.games,
                                           seed=cfg.run.seed + rounds)
        rated = mode == cfg.eval.modes[0]
        if rated:
            rating = _rate(league, version, f"bot:{cfg.eval.opponent}", result, log)
            metrics.win_rate(cfg.eval.opponent, result.win_rate)
        metrics.games(result.games)
        lo, hi = result.interval()
        out.write({"version": version, "opponent": cfg.eval.opponent, "greedy": mode == "greedy",
                   "games": result.games, "wins": result.wins, "losses": result.losses, "draws": result.draws,
                   "win_rate": result.win_rate, "ci_low": lo, "ci_high": hi, "mean_length": result.mean_length,
                   "at_limit": result.at_limit, "wins_before_limit": result.wins_before_limit,
                   "eval_s": time.time() - started, **(rating if rated else {})})
        log.info(result.line(f"v{version}{' greedy' if mode == 'greedy' else ''}", cfg.eval.opponent))
    return scores, rating


def open_ladder(cfg: Config) -> Ladder | None:
    """The strength ladder on an env of its own (``eval.ladder``; None without one)."""
    if not cfg.eval.ladder:
        return None
    env = make_env(cfg.env.name, num_games=batch_size(cfg.eval.ladder_games), seed=cfg.run.seed + 99993,
                   options=cfg.env.options)
    return Ladder.build(cfg.eval.ladder, cfg, env)


def _play_ladder(cfg: Config, ladder: Ladder, policy, version: int, rounds: int, metrics: EvaluatorMetrics,
                 out: JsonlLog, log) -> dict:
    """The version against every rung of the ladder, in the rated mode of ``eval.play``: logged, exported, and
    returned as curves (``ladder_rating``, ``ladder_sigma``)."""
    greedy = cfg.eval.modes[0] == "greedy"
    result = ladder.play(PolicyPlayer(policy, ladder.env.spec, f"v{version}", greedy=greedy),
                         cfg.eval.ladder_games, seed=cfg.run.seed + 7 * rounds)
    out.write(result.record(version, greedy))
    metrics.ladder(result.estimate.rating, result.estimate.sigma, {k: s.win_rate for k, s in result.scores.items()})
    metrics.games(sum(s.games for s in result.scores.values()))
    for line in result.lines(f"v{version}"):
        log.info(line)
    return {"ladder_rating": result.estimate.rating, "ladder_sigma": result.estimate.sigma,
            **{f"ladder_win_rate/{k}": s.win_rate for k, s in result.scores.items()}}


def _report_fitness(population: PopulationStore, member: int, version: int, rating: dict, log) -> None:
    """The member's newest ladder rating, for the population's next round (a store error: the next rating)."""
    try:
        population.write_fitness(member, Fitness(version, rating["ladder_rating"], rating["ladder_sigma"], time.time()))
    except StoreError as e:
        log.warning("pbt: the fitness of v%d is not stored: %s", version, e)


def curve_tag(opponent: str, mode: str) -> str:
    """The TensorBoard / W&B tag of the win rate against the baseline in one mode of ``eval.play``.

    >>> curve_tag("random", "sampled"), curve_tag("random", "greedy")
    ('eval/win_rate_vs_random', 'eval/win_rate_vs_random_greedy')
    """
    return f"eval/win_rate_vs_{opponent}" + ("_greedy" if mode == "greedy" else "")


RECHECKS = 3  # 1 s, 2 s and 4 s later (RunWatch.recheck_waits)


def stays_gone(watch: RunWatch, stop: StopFlag) -> bool:
    """Whether the run is still without an optimizer when asked again ``RECHECKS`` times: a --resume starts the
    evaluator beside its optimizer, which may take the run only after the evaluator read the last run's lease."""
    for wait_s in islice(watch.recheck_waits(), RECHECKS):
        if stop.wait(wait_s):
            return True
        if not watch.optimizer_gone(0.0, time.time(), force=True):
            return False
    return True


def eval_interval_s(settings: EvalConfig, since_start_s: float) -> float:
    """The interval between rounds ``since_start_s`` seconds after the evaluator started: ``early_interval_s``
    during the first ``early_s`` seconds when it is set, else ``interval_s``.

    >>> eval_interval_s(EvalConfig(interval_s=20.0, early_interval_s=2.0, early_s=60.0), 59.0)
    2.0
    >>> eval_interval_s(EvalConfig(interval_s=20.0, early_interval_s=2.0, early_s=60.0), 60.0)
    20.0
    """
    if settings.early_interval_s > 0 and since_start_s < settings.early_s:
        return settings.early_interval_s
    return settings.interval_s


def eval_wait_s(interval_s: float, round_s: float, core_share: float) -> float:
    """Seconds to wait after an evaluation round of ``round_s`` seconds (0 when none was played): at least
    ``interval_s``, and long enough that rounds take at most ``core_share`` of a core (0: no limit).

    >>> eval_wait_s(60.0, 35.0, 0.0), eval_wait_s(60.0, 35.0, 0.25), eval_wait_s(60.0, 10.0, 0.25)
    (60.0, 105.0, 60.0)
    """
    if core_share <= 0 or round_s <= 0:
        return interval_s
    return max(interval_s, round_s * (1.0 / core_share - 1.0))


def _rate(league: League, version: int, opponent: str, result: MatchScore, log) -> dict:
    """TrueSkill update for the version and its opponent; {} if the pool could not be written."""
    me = version_id(version)
    try:
        state = league.update(lambda s: rate_games(s, me, opponent, result.wins, result.losses, result.draws,
                                                   time.time()))
    except (StoreError, PoolConflict, FormatError) as e:
        log.warning("rating not stored: %s", e)
        return {}
    r = rating_of(state, me)
    return {"rating": r.mu, "rating_sigma": r.sigma}


def _play_pool(cfg: Config, env, league: League, policy, version: int, games: int, rounds: int, log):
    """A match against a past snapshot, taken in turn, so versions are rated against each other too."""
    try:
        snapshots = [m for m in league.read_or_empty().snapshots() if m.version != version]
    except (StoreError, FormatError) as e:
        log.warning("cannot read the pool: %s", e)
        return None
    if not snapshots:
        return None
    member = snapshots[rounds % len(snapshots)]
    past = build_policy(cfg, env.spec, league.load_snapshot(member.id).tensors)
    result = play_match(env, PolicyPlayer(policy, env.spec, f"v{version}"), PolicyPlayer(past, env.spec, member.id),
                        games, seed=cfg.run.seed + 7 * rounds)
    log.info(result.line(f"v{version}", member.id))
    return member.id, result

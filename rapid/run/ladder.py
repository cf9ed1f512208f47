"""The strength ladder: a policy's rating against opponents that training never meets (``eval.ladder``).

A rung is a scripted bot of the env (``lookahead``, ``lane``…) or a frozen reference policy, ``ref:PATH``: a file
written by ``rapid export --format reference`` (a params object whose meta names the game and the model, so no
run directory is needed to play it). Each rung has a fixed rating on one Elo scale, random at 0
(:mod:`rapid.league.ladder`); ``rapid eval --ladder --calibrate`` measures them with a round robin and prints the
table for a config's ``[eval.ladder]``. The evaluator plays the newest version against every rung each
``eval.ladder_interval_s`` and logs one rating per version; ``rapid eval --ladder`` does the same for any version.

Usage::

    >>> from rapid.envs.registry import make_env
    >>> from rapid.run.config import ModelConfig
    >>> cfg = Config(model=ModelConfig(hidden=16, lstm=16))
    >>> env = make_env(cfg.env.name, num_games=4)
    >>> ladder = Ladder.build({"random": 0.0, "lookahead": 560.0}, cfg, env)
    >>> result = ladder.play(PolicyPlayer(build_policy(cfg, env.spec), env.spec, "v0"), games=4, seed=0)
    >>> sorted(result.scores), result.estimate.sigma > 0
    (['lookahead', 'random'], True)
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import combinations

from rapid.envs.base import VecMultiAgentEnv
from rapid.errors import UsageError
from rapid.league.ladder import Estimate, Pairing, Score, calibrate, rate
from rapid.roles.startup import build_policy
from rapid.run.config import Config
from rapid.run.ladder_rungs import ANCHOR, REF, read_reference, rung_name
from rapid.run.matches import MatchScore, Player, PolicyPlayer, play_match


def load_reference(path: str, cfg: Config, env: VecMultiAgentEnv):
    """The policy of a reference file, in eval mode, for ``env``'s game; UsageError for one that does not fit."""
    obj, ref_cfg = read_reference(path, cfg)
    try:
        return build_policy(ref_cfg, env.spec, obj.tensors)
    except (ValueError, RuntimeError) as e:
        raise UsageError(f"ladder reference {path} does not fit this game's observations or actions ({e})") from None


def _reference_player(policy, spec, name: str, seed: int) -> Player:
    return PolicyPlayer(policy, spec, name)  # it samples from its own generator (torch's): the seed is the bots'


def _bot_player(env: VecMultiAgentEnv, name: str, seed: int) -> Player:
    return env.make_bot(name, seed)


@dataclass
class LadderResult:
    scores: dict[str, MatchScore]
    """By rung name."""
    estimate: Estimate
    seconds: float

    def record(self, version: int, greedy: bool) -> dict:
        """The evaluator's log line (``logs/eval.jsonl``) for this result."""
        return {"version": version, "greedy": greedy, "ladder_rating": self.estimate.rating,
                "ladder_sigma": self.estimate.sigma, "eval_s": self.seconds,
                "ladder": {k: {"wins": s.wins, "losses": s.losses, "draws": s.draws, "win_rate": s.win_rate}
                           for k, s in self.scores.items()}}

    def lines(self, who: str) -> list[str]:
        out = [s.line(who, name) for name, s in self.scores.items()]
        return out + [f"{who}: ladder rating {self.estimate.rating:.0f} ± {self.estimate.sigma:.0f}"]


@dataclass
class Ladder:
    """The rungs of ``eval.ladder``, ready to play on one env: each a factory of a fresh player, and its rating."""

    env: VecMultiAgentEnv
    players: dict[str, Callable[[int], Player]]
    ratings: dict[str, float]

    @classmethod
    def build(cls, ladder: Mapping[str, float], cfg: Config, env: VecMultiAgentEnv) -> Ladder:
        """UsageError, naming every rung at fault, for a bot the env lacks or a reference that cannot be played."""
        players: dict[str, Callable[[int], Player]] = {}
        ratings: dict[str, float] = {}
        errors = []
        for key, rating in ladder.items():
            name = rung_name(key)
            if key.startswith(REF):
                try:
                    policy = load_reference(key[len(REF):], cfg, env)
                except UsageError as e:
                    errors.append(str(e))
                    continue
                players[name] = functools.partial(_reference_player, policy, env.spec, name)
            elif name in env.bot_names():
                players[name] = functools.partial(_bot_player, env, name)
            else:
                errors.append(f"eval.ladder: {name!r} is not a bot of {cfg.env.name} ({', '.join(env.bot_names())})")
            ratings[name] = rating
        if errors:
            raise UsageError("; ".join(errors))
        return cls(env, players, ratings)

    def play(self, player: Player, games: int, seed: int) -> LadderResult:
        """``games`` games of ``player`` against every rung, and the rating that explains them."""
        started = time.time()
        scores = {name: play_match(self.env, player, make(seed), games, seed=seed)
                  for name, make in self.players.items()}
        estimate = rate({k: Score.of(s.wins, s.losses, s.draws) for k, s in scores.items()}, self.ratings)
        return LadderResult(scores, estimate, time.time() - started)

    def round_robin(self, games: int, seed: int, log: Callable[[str], None] = print) -> dict[str, float]:
        """Every pair of rungs ``games`` games each; the rungs' ratings that explain them, random at 0."""
        names = list(self.players)
        if ANCHOR not in names:
            raise UsageError(f"calibrating a ladder needs the {ANCHOR!r} bot among its rungs: it anchors the scale")
        pairs: list[Pairing] = []
        for a, b in combinations(names, 2):
            s = play_match(self.env, self.players[a](seed), self.players[b](seed + 1), games, seed=seed)
            log(s.line(a, b))
            pairs.append((a, b, Score.of(s.wins, s.losses, s.draws)))
        return calibrate(names, pairs, anchor=ANCHOR)


def ladder_toml(ladder: Mapping[str, float], ratings: Mapping[str, float]) -> str:
    """The ``[eval.ladder]`` table for a config, keyed as ``ladder`` is, with ``ratings`` by rung name."""
    rows = ["[eval.ladder]"]
    for key in ladder:
        value = ratings[rung_name(key)]
        rows.append(f'"{key}" = {value:.0f}.0' if math.isfinite(value) else f'"{key}" = nan')
    return "\n".join(rows) + "\n"


def eval_ladder(args) -> int:
    """`rapid eval --ladder [CONFIG]`: a version's games against every rung and its rating; with ``--calibrate``,
    the rungs' own ratings from a round robin, as a config's ``[eval.ladder]`` table."""
    from rapid.api import run_dir_config
    from rapid.envs.registry import make_env
    from rapid.roles.startup import open_run_store
    from rapid.run.config_files import load_config
    from rapid.run.matches import batch_size, load_policy, resolve_version
    from rapid.run.param_store import ParameterStore

    if args.calibrate and not args.ladder:
        raise UsageError("--calibrate needs --ladder CONFIG: the config whose ladder to calibrate")
    if not args.calibrate and not args.run_dir:
        raise UsageError("--run-dir is required (the run whose version to rate)")
    cfg = load_config(args.ladder, args.set) if args.calibrate else run_dir_config(args.run_dir, args.set)
    ladder_cfg = load_config(args.ladder) if args.ladder else cfg
    if ladder_cfg.env.name != cfg.env.name:
        raise UsageError(f"{args.ladder} plays {ladder_cfg.env.name}; this run plays {cfg.env.name}")
    if not ladder_cfg.eval.ladder:
        raise UsageError(f"{args.ladder or args.run_dir}: its config has no [eval.ladder]")
    env = make_env(cfg.env.name, num_games=batch_size(args.games), seed=args.seed, options=cfg.env.options)
    ladder = Ladder.build(ladder_cfg.eval.ladder, cfg, env)
    if args.calibrate:
        ratings = ladder.round_robin(args.games, args.seed)
        print(ladder_toml(ladder_cfg.eval.ladder, ratings), end="")
        return 0
    params = ParameterStore(open_run_store(cfg))
    version = resolve_version(params, args.version)
    policy = load_policy(cfg, env.spec, params, version)
    result = ladder.play(PolicyPlayer(policy, env.spec, f"v{version}", greedy=args.greedy), args.games, args.seed)
    for line in result.lines(f"v{version}" + (" greedy" if args.greedy else "")):
        print(line)
    return 0

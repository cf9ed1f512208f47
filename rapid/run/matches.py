"""Evaluation: play a policy against a baseline for N games and report the win rate with a 95% interval.

Usage::

    >>> import tempfile
    >>> from rapid.envs.registry import make_env
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.run.config import ModelConfig
    >>> cfg = Config(model=ModelConfig(hidden=16, lstm=16))   # env: connect four; a small model, for speed
    >>> env = make_env(cfg.env.name, num_games=batch_size(4))
    >>> params = ParameterStore(LocalStore(tempfile.mkdtemp()))
    >>> params.publish(1, build_policy(cfg, env.spec).tensors())   # what an optimizer publishes
    >>> players = make_player("latest", cfg, env, params), make_player("random", cfg, env, params, seed=1)
    >>> [p.name for p in players]
    ['v1', 'random']
    >>> result = play_match(env, *players, games=4, seed=0)
    >>> result.games, 0.0 <= result.win_rate <= 1.0, len(result.interval())
    (4, True, 2)
    >>> print(result.line("v1", "random"))
    v1 vs random: won ..., lost ..., drew ... of 4 games; win rate ... (95% CI ...), mean length ...

Player A plays side 0 in half the games and side 1 in the other half, so first-move advantage cancels.
Every slot of the vector env plays the same number of games, so short games are not over-counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import torch

from rapid.envs.base import EnvSpec, EpisodeStats, StepResult, VecMultiAgentEnv
from rapid.errors import UsageError
from rapid.infra.store import KeyNotFound
from rapid.opt.model import Policy
from rapid.roles.startup import build_policy
from rapid.run.config import Config
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import parse_version_text


class Player(Protocol):
    name: str

    def act(self, step: StepResult) -> np.ndarray:
        """Actions for every agent of every game; the match keeps this player's side."""


class PolicyPlayer:
    """A policy acting for all agents, with its LSTM state reset whenever a game starts. It steps the agents the
    rollout worker steps (``EnvSpec.moving``: in a turn-based game only the player to move), so its memory
    holds what it held in training."""

    def __init__(self, policy: Policy, spec: EnvSpec, name: str, greedy: bool = False):
        self.policy, self.spec, self.name, self.greedy = policy, spec, name, greedy
        self.state: tuple[torch.Tensor, torch.Tensor] | None = None

    def act(self, step: StepResult) -> np.ndarray:
        B, A = step.obs.shape[:2]
        if self.state is None:
            self.state = self.policy.initial_state(B * A)
        h, c = self.state
        starts = torch.from_numpy(np.repeat(step.done, A))
        h[starts] = 0.0
        c[starts] = 0.0
        rows = torch.from_numpy(np.flatnonzero(self.spec.moving(step.active).reshape(B * A)))
        actions = torch.zeros((B * A, len(self.spec.action_heads)), dtype=torch.int64)
        if len(rows):
            out = self.policy.act(torch.from_numpy(step.obs.reshape(B * A, -1))[rows],
                                  torch.from_numpy(step.action_mask.reshape(B * A, -1))[rows], (h[rows], c[rows]),
                                  greedy=self.greedy)
            actions[rows] = out.actions
            h[rows], c[rows] = out.state
        return actions.numpy().reshape(B, A, -1)


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class MatchScore:
    """A match of many games from player A's side (one game's record in the league is a MatchResult)."""

    wins: int
    losses: int
    draws: int
    mean_length: float
    at_limit: int = 0
    """Games cut at the env's time limit (decided there by the game's tie-break, e.g. moba's structure HP)."""
    wins_before_limit: int = 0
    """Wins that ended the game before the time limit (in moba: the enemy ancient destroyed)."""

    @property
    def games(self) -> int:
        return self.wins + self.losses + self.draws

    @property
    def win_rate(self) -> float:
        return self.wins / self.games if self.games else 0.0

    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.wins, self.games)

    def line(self, a: str, b: str) -> str:
        lo, hi = self.interval()
        return (f"{a} vs {b}: won {self.wins}, lost {self.losses}, drew {self.draws} of {self.games} games; "
                f"win rate {self.win_rate:.3f} (95% CI {lo:.3f}–{hi:.3f}), mean length {self.mean_length:.1f}"
                + (f"; {self.at_limit} reached the time limit, {self.wins_before_limit} of the wins came before it"
                   if self.at_limit else ""))


def batch_size(games: int, max_batch: int = 256) -> int:
    """How many games to step at once for a match of ``games`` games."""
    return max(1, min(games, max_batch))


Watch = Callable[[StepResult, np.ndarray, np.ndarray], None]
"""``watch(step, rows, actions)`` before each step: the (game, agent) pairs where A moves in a game that
counts (``rows``, boolean) and A's actions, e.g. to judge A's moves as a benchmark does."""

OnEpisode = Callable[[EpisodeStats, int], None]
"""``on_episode(episode, side_a)`` for every game that counts, once it ends, with the side A played in it: e.g.
to read the env's per-side game stats (``episode.info``) as A's and B's."""


def play_match(env: VecMultiAgentEnv, player_a: Player, player_b: Player, games: int, seed: int = 0,
               watch: Watch | None = None, on_episode: OnEpisode | None = None) -> MatchScore:
    """``games`` games of A against B on ``env`` (best built with ``batch_size(games)`` games)."""
    B = env.num_games
    quota = np.full(B, games // B)
    quota[: games % B] += 1
    sides = np.asarray(env.spec.side_of_agent)
    played = np.zeros(B, dtype=np.int64)
    side_a = np.arange(B) % 2
    wins = losses = draws = at_limit = wins_before_limit = 0
    lengths = []
    step = env.reset(seed=seed)
    while (played < quota).any():
        a_rows = sides[None, :] == side_a[:, None]
        # Each player sees only its own agents as active, so a bot that searches (lookahead) does it for
        # the moves it makes, not for the other side's too.
        acts_a = player_a.act(replace(step, active=step.active & a_rows))
        acts_b = player_b.act(replace(step, active=step.active & ~a_rows))
        if watch is not None:
            watch(step, step.active & a_rows & (played < quota)[:, None], acts_a)
        step = env.step(np.where(a_rows[..., None], acts_a, acts_b))
        for ep in step.episodes:
            b = ep.game
            if played[b] < quota[b]:
                if ep.winner < 0:
                    draws += 1
                elif ep.winner == side_a[b]:
                    wins += 1
                    wins_before_limit += not ep.truncated
                else:
                    losses += 1
                lengths.append(ep.length)
                at_limit += ep.truncated
                if on_episode is not None:
                    on_episode(ep, int(side_a[b]))
            played[b] += 1
            side_a[b] = 1 - side_a[b]
    return MatchScore(wins, losses, draws, float(np.mean(lengths)) if lengths else 0.0, at_limit, wins_before_limit)


def load_policy(cfg: Config, spec: EnvSpec, params: ParameterStore, version: int) -> Policy:
    policy = build_policy(cfg, spec)
    try:
        tensors = params.fetch(version).tensors  # a corrupt object is a FormatError of its own, not a misfit
    except KeyNotFound:
        raise UsageError(f"parameter version {version} is not in the store") from None
    try:
        policy.load_tensors(tensors)
    except ValueError as e:
        raise UsageError(f"parameter version {version} does not fit this config's model ({e}): was it trained "
                         "with other model settings?") from None
    policy.eval()
    return policy


def resolve_version(params: ParameterStore, text: str) -> int:
    """'latest', '12' or 'v12' → a published version number."""
    if text == "latest":
        version = params.latest_version()
        if version is None:
            raise UsageError("no parameter version has been published yet")
        return version
    version = parse_version_text(text)
    if version is None:
        raise UsageError(f"{text!r} is not a version (use latest, 12 or v12) or a bot name")
    return version


def make_player(text: str, cfg: Config, env: VecMultiAgentEnv, params: ParameterStore, seed: int = 0,
                greedy: bool = False) -> Player:
    """A bot of the env by name (``random``, ``lookahead``, ``lane``…) or a published policy version, which
    samples its actions or, with ``greedy``, plays the most likely one."""
    name = text.removeprefix("bot:")
    if name in env.bot_names():
        return env.make_bot(name, seed)
    version = resolve_version(params, text)
    return PolicyPlayer(load_policy(cfg, env.spec, params, version), env.spec, f"v{version}", greedy=greedy)

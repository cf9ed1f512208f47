"""Opponent sampling: OpenAI Five quality scores and PFSP. Pure functions plus a worker cache.

The opponent of a game is, with probability ``bot_prob``, a scripted bot (uniform over active bots);
otherwise the latest policy with probability ``latest_prob``, or else a past snapshot:

- ``openai_five``: p_i ∝ exp(q_i). A snapshot joins with q = max of the pool; when the learner beats
  snapshot i, q_i ← q_i − η/(N·p_i) (N active snapshots), so beaten snapshots are sampled less.
- ``pfsp`` (AlphaStar): p_i ∝ f(x_i), x_i the learner's win rate against i, f(x) = (1 − x)^power
  ("hard" weighting: focus on the opponents the learner still loses to).

Missing categories (no bots, no snapshots) give their share to the latest policy. Through the run's warm-up
(``ppo.warmup_updates``) every game is against a bot of ``warmup_bots`` instead.
Usage in a rollout worker::

    >>> import tempfile
    >>> from rapid.run.config import LeagueConfig
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.run.param_store import ParameterStore
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> ParameterStore(store).publish(42, {"w": np.zeros(2, np.float32)})
    >>> league = League(store)
    >>> league.add_snapshot_from_params(42).id
    'v000000000042'
    >>> sampler = OpponentSampler(league, LeagueConfig(latest_prob=0.5))   # the config's league section
    >>> sampler.distribution()
    {'latest': 0.5, 'v000000000042': 0.5}
    >>> choice = sampler.choose(np.random.default_rng(1))   # at every game start; fixed for the whole game
    >>> choice
    OpponentChoice(id='v000000000042', kind='snapshot', version=42)
    >>> if choice.kind == "snapshot":
    ...     params = sampler.load_params(choice.id)         # LRU-cached, not re-downloaded per game
    >>> params.version
    42
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rapid.errors import FormatError
from rapid.formats.params import ParamsObject
from rapid.infra.store import StoreError
from rapid.league.pool import League
from rapid.league.state import Member, PoolState, bot_ids
from rapid.run.config import LeagueConfig

LATEST = "latest"


@dataclass(frozen=True)
class OpponentChoice:
    id: str  # "latest", a snapshot id or a bot id
    kind: str  # "latest" | "snapshot" | "bot"
    version: int | None  # the snapshot's learner version; None for the latest policy and bots


def quality_probabilities(snapshots: list[Member]) -> dict[str, float]:
    """OpenAI Five: p_i = exp(q_i) / Σ_j exp(q_j) over the given snapshots."""
    if not snapshots:
        return {}
    top = max(m.quality for m in snapshots)  # shift by the max: exp never overflows
    weights = {m.id: math.exp(m.quality - top) for m in snapshots}
    total = sum(weights.values())
    return {k: w / total for k, w in weights.items()}


def pfsp_weight(win_rate: float, power: float) -> float:
    """f(x) = (1 − x)^power, the "hard" weighting; x is the learner's win rate against the opponent."""
    return (1.0 - win_rate) ** power


def pfsp_probabilities(snapshots: list[Member], power: float) -> dict[str, float]:
    """PFSP: p_i ∝ f(x_i); an opponent never played counts as x = 0.5; uniform if every weight is 0."""
    if not snapshots:
        return {}
    weights = {}
    for m in snapshots:
        x = m.learner_win_rate()
        weights[m.id] = pfsp_weight(0.5 if x is None else x, power)
    total = sum(weights.values())
    if total <= 0:
        return {k: 1.0 / len(weights) for k in weights}
    return {k: w / total for k, w in weights.items()}


def past_probabilities(state: PoolState, config: LeagueConfig) -> dict[str, float]:
    """The distribution over active snapshots, given that a past opponent is played."""
    if config.scheme == "pfsp":
        return pfsp_probabilities(state.snapshots(), config.pfsp_power)
    return quality_probabilities(state.snapshots())


MIN_UPDATE_PROBABILITY = 0.01
"""Floor on p in the quality update. Workers sample from a pool copy up to ``refresh_s`` old, so a snapshot
can still be played (and beaten) after its p fell near zero; without a floor one such win subtracts
η/(N·p) ≈ ∞ and the pool breaks. With it, one win moves q by at most η/(N·0.01) = 1/N for η = 0.01."""


def quality_update(quality: float, probability: float, n_snapshots: int, eta: float) -> float:
    """OpenAI Five, after the learner beats a snapshot: q ← q − η / (N·p), p floored (see above)."""
    return quality - eta / (n_snapshots * max(probability, MIN_UPDATE_PROBABILITY))


def opponent_distribution(state: PoolState, config: LeagueConfig, bot_prob: float | None = None,
                          warmup: bool = False) -> dict[str, float]:
    """Every possible opponent of the next game (``LATEST``, snapshot ids, bot ids) with its probability;
    ``bot_prob`` (the schedule's value now) replaces ``config.bot_prob``. In the warm-up (``ppo.warmup_updates``)
    every game is against ``config.warmup_bots``; outside it those are not drawn unless ``config.bots`` names
    them too."""
    warmup_bots = set(bot_ids(config.warmup_bots))
    warmup_only = warmup_bots - set(bot_ids(config.bots))
    if warmup:
        warm = [m for m in state.bots() if m.id in warmup_bots]
        if warm:
            return {LATEST: 0.0, **{m.id: 1.0 / len(warm) for m in warm}}
    bots = [m for m in state.bots() if m.id not in warmup_only]
    past = past_probabilities(state, config)
    bot_share = (config.bot_prob if bot_prob is None else bot_prob) if bots else 0.0
    past_share = (1.0 - bot_share) * (1.0 - config.latest_prob) if past else 0.0
    dist = {LATEST: 1.0 - bot_share - past_share}
    dist.update({k: past_share * p for k, p in past.items()})
    dist.update({m.id: bot_share / len(bots) for m in bots})
    return dist


def choice_for(state: PoolState, opponent_id: str) -> OpponentChoice:
    if opponent_id == LATEST:
        return OpponentChoice(LATEST, "latest", None)
    m = state.members[opponent_id]
    return OpponentChoice(m.id, m.kind, m.version)


class OpponentSampler:
    """A rollout worker's view of the pool: a periodically refreshed distribution and a params cache.

    A failed refresh (store unreachable, damaged pool) keeps the previous pool: workers never stop
    playing because the league is briefly unavailable; ``refresh_errors`` counts such failures.
    """

    def __init__(self, league: League, config: LeagueConfig, cache_size: int = 4,
                 clock: Callable[[], float] = time.monotonic):
        self.league = league
        self.config = config
        self.refresh_s = config.refresh_s
        self.cache_size = cache_size
        self.clock = clock
        self.state = PoolState()
        self.refresh_errors = 0
        self.bot_prob = config.bot_prob
        """The share of games against bots now: ``config.bot_prob`` until :meth:`set_schedule` moves it."""
        self.warmup = False
        """Whether the games now are the warm-up's (against ``config.warmup_bots`` only)."""
        self._refreshed_at: float | None = None
        self._ids: list[str] = [LATEST]
        self._cumulative = np.ones(1)
        self._cache: OrderedDict[str, ParamsObject] = OrderedDict()

    def refresh(self, force: bool = False) -> None:
        now = self.clock()
        if not force and self._refreshed_at is not None and now - self._refreshed_at < self.refresh_s:
            return
        self._refreshed_at = now
        try:
            state = self.league.read_or_empty()
        except (StoreError, FormatError):
            self.refresh_errors += 1
            return
        self.state = state
        self._draw_from(self.distribution_now())

    def set_schedule(self, bot_prob: float, warmup: bool = False) -> None:
        """Draw the next games' opponents with this share against bots (the league.bot_prob schedule's value),
        or against the warm-up bots alone while ``warmup``."""
        if (bot_prob, warmup) != (self.bot_prob, self.warmup):
            self.bot_prob, self.warmup = bot_prob, warmup
            self._draw_from(self.distribution_now())

    def distribution_now(self) -> dict[str, float]:
        """The distribution of the pool as last read, at the schedule's values now."""
        return opponent_distribution(self.state, self.config, self.bot_prob, self.warmup)

    def _draw_from(self, dist: dict[str, float]) -> None:
        self._ids = list(dist)
        self._cumulative = np.cumsum(list(dist.values()))

    def distribution(self) -> dict[str, float]:
        self.refresh()
        return self.distribution_now()

    def choose(self, rng: np.random.Generator) -> OpponentChoice:
        """The opponent of the next game (call once per game start)."""
        self.refresh()
        u = rng.random() * self._cumulative[-1]  # scaled: float rounding never falls off the end
        i = min(int(np.searchsorted(self._cumulative, u, side="right")), len(self._ids) - 1)
        return choice_for(self.state, self._ids[i])

    def choose_past(self, rng: np.random.Generator) -> OpponentChoice | None:
        """A past snapshot drawn from the pool's distribution over snapshots alone; None when it holds none."""
        self.refresh()
        past = past_probabilities(self.state, self.config)
        if not past:
            return None
        cumulative = np.cumsum(list(past.values()))
        i = min(int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")), len(past) - 1)
        return choice_for(self.state, list(past)[i])

    def load_params(self, member_id: str) -> ParamsObject:
        """A snapshot's weights, from a small LRU cache (snapshots are immutable: never stale)."""
        if member_id in self._cache:
            self._cache.move_to_end(member_id)
            return self._cache[member_id]
        obj = self.league.load_snapshot(member_id)
        self._cache[member_id] = obj
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return obj

"""Rollout-side league wiring: turns the league's opponent choices into playable opponents. (The worker's
finished games need no wiring: they travel inside its experience objects, and the optimizer tallies them.)

Usage (inside a rollout worker)::

    >>> import tempfile
    >>> from rapid.config import LeagueConfig, ModelConfig, RolloutConfig
    >>> from rapid.envs.registry import make_env
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.league.state import ensure_bots
    >>> from rapid.param_store import ParameterStore
    >>> from rapid.roles.startup import build_policy
    >>> from rapid.rollout_worker import RolloutSettings, RolloutWorker
    >>> cfg = Config(model=ModelConfig(hidden=16, lstm=16), rollout=RolloutConfig(bptt=4, samples_per_segment=2),
    ...              league=LeagueConfig(latest_prob=0.5, bot_prob=0.5, bots=["random"]))
    >>> env = make_env(cfg.env.name, num_games=2)
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> policy = build_policy(cfg, env.spec)
    >>> ParameterStore(store).publish(2, policy.tensors())
    >>> league = League(store)
    >>> state = league.update(lambda s: ensure_bots(s, ["bot:random"], 0.0))
    >>> snapshot = league.add_snapshot_from_params(2)                # the pool: a bot and one snapshot
    >>> source = LeagueOpponents(league, cfg, env, lambda: build_policy(cfg, env.spec))
    >>> rng = np.random.default_rng(0)
    >>> sorted({source.choose(rng).id for _ in range(20)})           # the opponent of one new game each
    ['bot:random', 'latest', 'v000000000002']
    >>> worker = RolloutWorker(env, policy, RolloutSettings.of(cfg, env.spec), opponents=source, seed=0)
    >>> worker.set_params(3, policy.tensors())
    >>> episodes = []
    >>> while not episodes:
    ...     episodes = worker.collect().episodes                     # the segment's finished games
    >>> sorted(episodes[0])                                          # uploaded with the segment's samples
    ['learner_return', 'learner_side', 'learner_version', 'length', 'opponent', 'winner']
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from rapid.config import Config
from rapid.envs.base import VecMultiAgentEnv
from rapid.errors import FormatError
from rapid.infra.store import KeyNotFound, StoreError
from rapid.league import LATEST, League, OpponentSampler
from rapid.opt.model import Policy
from rapid.rollout_worker import Opponent

log = logging.getLogger(__name__)


class LeagueOpponents:
    """An OpponentSource backed by the league pool; a snapshot's policy is built once and cached."""

    def __init__(self, league: League, cfg: Config, env: VecMultiAgentEnv, make_policy: Callable[[], Policy],
                 cache_size: int = 4):
        self.sampler = OpponentSampler(league, cfg.league, cache_size=cache_size)
        self.env, self.make_policy, self.cache_size = env, make_policy, cache_size
        self._latest = Opponent(LATEST)
        self._cache: OrderedDict[str, Opponent] = OrderedDict()
        self.load_failures = 0

    def choose(self, rng: np.random.Generator) -> Opponent:
        choice = self.sampler.choose(rng)
        if choice.kind == "latest":
            return self._latest
        if choice.id in self._cache:
            self._cache.move_to_end(choice.id)
            return self._cache[choice.id]
        try:
            opponent = self._build(choice.id, choice.kind)
        except (StoreError, KeyNotFound, FormatError, ValueError, KeyError) as e:
            # A snapshot that cannot be loaded must not stop the worker: play the latest policy instead.
            self.load_failures += 1
            log.warning("cannot load opponent %s (%s); playing the latest policy", choice.id, e)
            return self._latest
        self._cache[choice.id] = opponent
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return opponent

    def _build(self, member_id: str, kind: str) -> Opponent:
        if kind == "bot":
            return Opponent(member_id, bot=self.env.make_bot(member_id.removeprefix("bot:"), seed=len(self._cache)))
        policy = self.make_policy()
        policy.load_tensors(self.sampler.load_params(member_id).tensors)
        policy.eval()
        return Opponent(member_id, policy=policy)

"""Rollout-side league wiring: turns the league's opponent choices into playable opponents. (The worker's
finished games need no wiring: they travel inside its experience objects, and the optimizer tallies them.)

Usage (inside a rollout worker)::

    >>> import tempfile
    >>> from rapid.run.config import LeagueConfig, ModelConfig, RolloutConfig
    >>> from rapid.envs.registry import make_env
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.league.state import ensure_bots
    >>> from rapid.run.param_store import ParameterStore
    >>> from rapid.roles.startup import build_policy
    >>> from rapid.rollout.worker import RolloutSettings, RolloutWorker
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

import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping

import numpy as np

from rapid.envs.base import VecMultiAgentEnv
from rapid.errors import FormatError
from rapid.infra.store import KeyNotFound, StoreError
from rapid.league import LATEST, League, OpponentSampler
from rapid.opt.model import Policy
from rapid.rollout.worker import Opponent, stamped_share
from rapid.run.config import Config

log = logging.getLogger(__name__)


class LeagueOpponents:
    """An OpponentSource backed by the league pool.

    Every distinct past policy a worker's games play against costs one more forward pass a step, so past snapshots
    are played from a slate: ``league.slate_size`` draws from the pool's distribution over snapshots, redrawn every
    ``league.refresh_s``; a game against the past takes one entry of the slate at random. Each game's opponent is
    still distributed as the pool says, but a worker's games hold about two slates of past policies at most (the
    current one, and the one before in the games still running) where a draw per game meant up to one per game
    (``benchmarks/bench_opponents.py``). Policies are built once per slate and kept while drawn again.

    ``shared``: a name every worker of a node passes under node inference (the node's folder). The slate is then
    drawn at each ``league.refresh_s`` boundary of the clock (``time.monotonic``: one clock for a machine's
    processes) from a seed of that name and the boundary's number, so every lane and worker of the node plays the
    same past policies and the server's batches hold the latest and one slate: each distinct policy in a batch is
    one more forward pass there. The pool's distribution over snapshots holds as before, per slate.
    """

    def __init__(self, league: League, cfg: Config, env: VecMultiAgentEnv,
                 make_policy: Callable[[], Policy] | None = None, clock: Callable[[], float] = time.monotonic,
                 remote: Callable[[str], None] | None = None, shared: str | None = None):
        """``make_policy`` builds a past policy to play on this core; ``remote`` instead has the node's inference
        server load it by id (``NodeClient.load_opponent``), which raises what a failed load raises."""
        self.slate_size = cfg.league.slate_size
        self.sampler = OpponentSampler(league, cfg.league, cache_size=self.slate_size)
        self.env, self.make_policy, self.clock, self.remote = env, make_policy, clock, remote
        self._latest = Opponent(LATEST)
        self._bots: dict[str, Opponent] = {}
        self._slate: list[Opponent] = []
        self._drawn_at = -math.inf
        self._seed = None if shared is None else int.from_bytes(hashlib.sha256(shared.encode()).digest()[:8], "little")
        self.load_failures = 0

    def follow(self, meta: Mapping | None) -> None:
        """New games take the share against bots that the version now played is stamped with (the optimizer's
        league.bot_prob schedule), or keep the config's, and are the warm-up's while it is stamped so."""
        self.sampler.set_schedule(stamped_share(meta, "bot_prob", self.sampler.config.bot_prob),
                                  warmup=(meta or {}).get("warmup") is True)

    def choose(self, rng: np.random.Generator) -> Opponent:
        choice = self.sampler.choose(rng)
        if choice.kind == "latest":
            return self._latest
        if choice.kind == "bot":
            if choice.id not in self._bots:
                self._bots[choice.id] = self._load(choice.id, "bot")
            return self._bots[choice.id]
        slate = self.slate(rng)
        return slate[int(rng.integers(len(slate)))] if slate else self._latest

    def slate(self, rng: np.random.Generator) -> list[Opponent]:
        """The past opponents new games are drawn from now (redrawn every ``league.refresh_s``)."""
        now, refresh = self.clock(), self.sampler.refresh_s
        if self._seed is not None:  # the node's slate: the same draw in every worker for this stretch of the clock
            epoch = math.floor(now / refresh)
            if self._slate and epoch * refresh == self._drawn_at:
                return self._slate
            self._drawn_at, rng = epoch * refresh, np.random.default_rng([self._seed, epoch])
        elif self._slate and now - self._drawn_at < refresh:
            return self._slate
        else:
            self._drawn_at = now
        built = {o.id: o for o in self._slate}
        slate = []
        for _ in range(self.slate_size):
            pick = self.sampler.choose_past(rng)
            if pick is None:
                break
            if pick.id not in built:
                built[pick.id] = self._load(pick.id, "snapshot")
            slate.append(built[pick.id])
        self._slate = slate
        return slate

    def _load(self, member_id: str, kind: str) -> Opponent:
        try:
            return self._build(member_id, kind)
        except (StoreError, KeyNotFound, FormatError, ValueError, KeyError) as e:
            # A snapshot that cannot be loaded must not stop the worker: play the latest policy instead.
            self.load_failures += 1
            log.warning("cannot load opponent %s (%s); playing the latest policy", member_id, e)
            return self._latest

    def _build(self, member_id: str, kind: str) -> Opponent:
        if kind == "bot":
            return Opponent(member_id, bot=self.env.make_bot(member_id.removeprefix("bot:"), seed=len(self._bots)))
        if self.remote is not None:
            self.remote(member_id)
            return Opponent(member_id)
        if self.make_policy is None:
            raise ValueError("no way to play a past policy: neither make_policy nor remote given")
        policy = self.make_policy()
        policy.load_tensors(self.sampler.load_params(member_id).tensors)
        policy.eval()
        return Opponent(member_id, policy=policy)

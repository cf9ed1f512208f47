"""A rollout worker's past opponents come from a slate: the pool's distribution per game, few policies at once."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from rapid.envs.registry import make_env
from rapid.infra.store import LocalStore
from rapid.league import League
from rapid.league.sampling import past_probabilities
from rapid.league.state import version_id
from rapid.roles.startup import build_policy
from rapid.rollout.opponents import LeagueOpponents
from rapid.run.config import Config, LeagueConfig, ModelConfig
from rapid.run.param_store import ParameterStore

QUALITY = {1: 0.0, 2: 1.0, 3: 2.0, 4: 0.5, 5: -1.0, 6: 1.5}  # p ∝ exp(q): from 1% to 45% of the past games


@pytest.fixture()
def setup(tmp_path):
    league_cfg = LeagueConfig(latest_prob=0.25, refresh_s=30.0, slate_size=3)
    cfg = Config(model=ModelConfig(hidden=8, lstm=8), league=league_cfg)
    env = make_env(cfg.env.name, num_games=2)
    store = LocalStore(tmp_path)
    league = League(store)
    for version in QUALITY:
        ParameterStore(store).publish(version, build_policy(cfg, env.spec).tensors())
        league.add_snapshot_from_params(version)

    def set_quality(state):
        for version, q in QUALITY.items():
            state.members[version_id(version)].quality = q
        return state

    state = league.update(set_quality)
    clock = [0.0]
    builds = []

    def make_policy():
        builds.append(1)
        return build_policy(cfg, env.spec)

    source = LeagueOpponents(league, cfg, env, make_policy, clock=lambda: clock[0])
    return source, past_probabilities(state, cfg.league), clock, builds


def test_between_redraws_games_play_at_most_a_slate_of_past_policies(setup):
    source, _, clock, builds = setup
    rng = np.random.default_rng(0)
    games = [source.choose(rng) for _ in range(300)]
    past = [o for o in games if o.id != "latest"]
    assert 200 <= len(past) <= 250  # 75% of the games
    assert len({id(o) for o in past}) <= 3 and len(builds) <= 3  # built once each, whatever the game count
    clock[0] = 31.0  # refresh_s later: a new slate, keeping the policies drawn again
    later = {o.id: o for o in (source.choose(rng) for _ in range(300)) if o.id != "latest"}
    assert len(later) <= 3 and len(builds) <= 3 + len(set(later) - {o.id for o in past})
    assert all(o is {p.id: p for p in past}[i] for i, o in later.items() if i in {p.id for p in past})


def test_over_many_slates_each_game_meets_the_pools_distribution(setup):
    source, probabilities, clock, _ = setup
    rng = np.random.default_rng(1)
    counts: Counter[str] = Counter()
    for slate in range(600):
        clock[0] = 31.0 * slate
        counts.update(o.id for o in (source.choose(rng) for _ in range(20)) if o.id != "latest")
    total = sum(counts.values())
    for member, p in probabilities.items():
        spread = 4 * math.sqrt(p * (1 - p) / (3 * 600))  # a slate's games share its 3 draws: count the draws
        assert abs(counts[member] / total - p) <= spread + 0.005, (member, counts[member] / total, p)


def test_the_workers_of_a_node_play_one_slate_and_the_pool_distribution_holds(setup):
    """Node inference: every worker of a node draws the same slate for each stretch of refresh_s (the server's batch
    then holds the latest and one slate), whatever each worker's own draws; other nodes draw their own."""
    source, probabilities, clock, _ = setup
    cfg = Config(model=ModelConfig(hidden=8, lstm=8), league=source.sampler.config)

    def node_worker(name: str) -> LeagueOpponents:
        return LeagueOpponents(source.sampler.league, cfg, source.env, lambda: build_policy(cfg, source.env.spec),
                               clock=lambda: clock[0], shared=name)

    a, b, other = node_worker("node-a"), node_worker("node-a"), node_worker("node-b")
    rngs = [np.random.default_rng(i) for i in range(3)]
    counts: Counter[str] = Counter()
    differs = 0
    for stretch in range(400):
        clock[0] = 30.0 * stretch + 3.0 * (stretch % 4)  # anywhere within its first 10 s
        slate_a = [o.id for o in a.slate(rngs[0])]
        assert slate_a == [o.id for o in b.slate(rngs[1])], "one slate per node"
        clock[0] += 20.0  # later in the same stretch: the same slate, not redrawn
        assert [o.id for o in a.slate(rngs[0])] == slate_a
        differs += slate_a != [o.id for o in other.slate(rngs[2])]
        counts.update(slate_a)
    assert differs > 200, "another node draws its own slates"
    total = sum(counts.values())
    for member, p in probabilities.items():
        spread = 4 * math.sqrt(p * (1 - p) / total)
        assert abs(counts[member] / total - p) <= spread + 0.005, (member, counts[member] / total, p)

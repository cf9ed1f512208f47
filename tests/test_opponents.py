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

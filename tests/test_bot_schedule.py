"""league.bot_prob on a schedule: the optimizer stamps each version with the share of games against bots, and the
rollout worker draws its new games' opponents with the share of the version it plays."""

from __future__ import annotations

import numpy as np
import pytest

from rapid.envs.registry import make_env
from rapid.errors import UsageError
from rapid.infra.store import LocalStore
from rapid.league import League
from rapid.league.state import ensure_bots
from rapid.roles.optimizer_settings import version_meta
from rapid.roles.startup import build_policy
from rapid.rollout.opponents import LeagueOpponents
from rapid.rollout.worker import RolloutSettings, RolloutWorker
from rapid.run.config import Config, EnvConfig, LeagueConfig, ModelConfig, RolloutConfig, RunConfig
from rapid.run.config_files import load_config

C4 = "pettingzoo.classic.connect_four_v3"


def test_each_version_is_stamped_with_the_bot_share_of_its_point_in_the_budget():
    league = LeagueConfig(bots=["random"], bot_prob=0.0, bot_prob_final=0.5, bot_begin=0.2)
    cfg = Config(run=RunConfig(minutes=5.0), league=league)
    shares = [version_meta(cfg, 0, t)["bot_prob"] for t in (0.0, 60.0, 180.0, 300.0, 400.0)]
    assert shares == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.5])  # held through the first fifth, then linear
    held = Config(run=RunConfig(minutes=5.0), league=LeagueConfig(bots=["random"], bot_prob=0.25))
    assert [version_meta(held, 0, t)["bot_prob"] for t in (0.0, 300.0)] == [0.25, 0.25]


@pytest.fixture()
def source(tmp_path):
    cfg = Config(env=EnvConfig(name=C4), model=ModelConfig(hidden=8, lstm=8),
                 rollout=RolloutConfig(bptt=4, samples_per_segment=1),
                 league=LeagueConfig(bots=["random"], bot_prob=0.25, latest_prob=1.0))
    env = make_env(C4, num_games=16, seed=0)
    league = League(LocalStore(tmp_path))
    league.update(lambda s: ensure_bots(s, ["bot:random"], 0.0))
    return cfg, env, LeagueOpponents(league, cfg, env, lambda: build_policy(cfg, env.spec))


def bot_share(source: LeagueOpponents, rng: np.random.Generator, games: int = 400) -> float:
    return sum(source.choose(rng).id == "bot:random" for _ in range(games)) / games


def test_new_games_take_the_stamped_share_and_an_untrustworthy_one_keeps_the_configs(source):
    _, _, opponents = source
    rng = np.random.default_rng(0)
    assert 0.19 <= bot_share(opponents, rng) <= 0.31  # the config's 0.25 before any version
    for meta, low, high in (({"bot_prob": 1.0}, 1.0, 1.0), ({"bot_prob": 0.0}, 0.0, 0.0),
                            ({"bot_prob": 0.5}, 0.43, 0.57), ({"updates": 3}, 0.19, 0.31),
                            ({"bot_prob": "1"}, 0.19, 0.31), ({"bot_prob": 7.0}, 0.19, 0.31),
                            ({"bot_prob": True}, 0.19, 0.31), (None, 0.19, 0.31)):
        opponents.follow(meta)
        assert low <= bot_share(opponents, rng) <= high, meta


def test_a_worker_starts_its_games_against_bots_at_the_share_of_the_version_it_plays(source):
    cfg, env, opponents = source
    policy = build_policy(cfg, env.spec)
    worker = RolloutWorker(env, policy, RolloutSettings.of(cfg, env.spec), opponents=opponents, seed=0)
    worker.set_params(1, policy.tensors(), {"bot_prob": 1.0})
    for _ in range(30):  # a connect four game lasts at most 42 moves: every game has restarted by now
        worker.collect()
    assert all(o.id == "bot:random" for o in worker.game_opponent)
    worker.set_params(2, policy.tensors(), {"bot_prob": 0.0})
    for _ in range(30):
        worker.collect()
    assert all(o.id == "latest" for o in worker.game_opponent)


@pytest.mark.parametrize(("override", "field"), [
    ("league.bot_prob_final=1.5", "league.bot_prob_final"),
    ("league.bot_begin=-0.1", "league.bot_begin"),
    ("league.bot_begin=2", "league.bot_begin"),
])
def test_a_bot_schedule_out_of_range_is_refused_at_start_up(override, field):
    with pytest.raises(UsageError, match=field):
        load_config(None, [override])
    load_config(None, ["league.bot_prob_final=-1", "league.bot_begin=0.5"])  # -1: held at bot_prob

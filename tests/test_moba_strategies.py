"""The moba team strategies (``focus``, ``push``): legal actions for every match shape, determinism, and the
ladder above ``lane`` in the 5v5 game of configs/moba-5v5.toml."""

from __future__ import annotations

import numpy as np
import pytest

from rapid.envs.moba import MobaVecEnv
from rapid.envs.moba.config import ATTACK, MOVE, NUM_DIRS, NUM_TYPES
from rapid.run.config_files import load_config
from rapid.run.matches import play_match

STRATEGIES = ("focus", "push")
SHAPES = [(1, 1), (3, 3), (5, 3), (2, 2)]


def test_registered() -> None:
    env = MobaVecEnv(num_games=1)
    for name in STRATEGIES:
        assert name in env.bot_names()
        assert env.make_bot(name).name == name


@pytest.mark.parametrize("heroes,lanes", SHAPES)
@pytest.mark.parametrize("name", STRATEGIES)
def test_actions_are_legal(name: str, heroes: int, lanes: int) -> None:
    """Against ``lane`` (on both sides, by turns), every action has the right shape and the masks allow it."""
    env = MobaVecEnv(num_games=4, seed=3, heroes_per_side=heroes, lanes=lanes, spawn_in_lanes=heroes > 1,
                     max_seconds=60.0)
    bot, other = env.make_bot(name, 0), env.make_bot("lane")
    ob = env.observer
    step = env.reset()
    mine = (np.arange(env.num_games)[:, None] % 2) == np.asarray(env.spec.side_of_agent)[None, :]
    acted = np.zeros(NUM_TYPES, bool)
    for _ in range(180):  # past a reset (120 steps a game)
        actions = bot.act(step)
        assert actions.shape == (env.num_games, 2 * heroes, 3) and actions.dtype == np.int64
        atype, direction, slot = actions[..., 0], actions[..., 1], actions[..., 2]
        assert ((atype >= 0) & (atype < NUM_TYPES)).all() and ((direction >= 0) & (direction < NUM_DIRS)).all()
        assert np.take_along_axis(ob.type_mask, atype[..., None], axis=2).all()
        targeted = atype > MOVE
        valid = np.take_along_axis(ob.target_valid[atype, np.arange(env.num_games)[:, None],
                                                   np.arange(2 * heroes)[None, :]], slot[..., None], axis=2)[..., 0]
        assert valid[targeted].all()
        acted[np.unique(atype[step.active & mine])] = True
        step = env.step(np.where(mine[..., None], actions, other.act(step)))
    assert acted[MOVE] and acted[ATTACK]  # it walks and it attacks


@pytest.mark.parametrize("name", STRATEGIES)
def test_deterministic(name: str) -> None:
    """The same seed gives the same games; the bot's own seed changes nothing (it draws nothing)."""
    runs = []
    for bot_seed in (0, 5):
        env = MobaVecEnv(num_games=3, seed=11, heroes_per_side=3, lanes=3)
        bot, other = env.make_bot(name, bot_seed), env.make_bot("random", 1)
        side0 = (np.asarray(env.spec.side_of_agent) == 0)[None, :, None]
        step, trace = env.reset(), []
        for _ in range(150):
            actions = bot.act(step)
            trace.append(actions.copy())
            step = env.step(np.where(side0, actions, other.act(step)))
        runs.append(np.stack(trace))
    np.testing.assert_array_equal(runs[0], runs[1])


def match(a: str, b: str, games: int, seed: int) -> float:
    options = load_config("configs/moba-5v5.toml", []).env.options
    env = MobaVecEnv(num_games=games, seed=seed, **options)
    score = play_match(env, env.make_bot(a, seed), env.make_bot(b, seed + 1), games=games, seed=seed)
    return score.win_rate


def test_ladder_in_5v5() -> None:
    """In the shipped 5v5 game ``focus`` beats ``lane`` (82% of 80 games measured) and ``push`` beats both
    (100% of 200 each), destroying the ancient long before the time limit."""
    assert match("focus", "lane", 8, seed=2) >= 0.6
    assert match("push", "lane", 4, seed=1) == 1.0
    assert match("push", "focus", 4, seed=1) == 1.0

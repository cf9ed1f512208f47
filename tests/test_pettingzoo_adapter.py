"""The PettingZoo adapter: AEC board games and parallel games behind the vectorized interface."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from rapid.envs.base import RandomBot
from rapid.envs.pettingzoo_adapter import PettingZooVecEnv, grid_of, split_sides

TINY = "tests.pz_tiny_parallel"

# (module, moves in the shortest and longest game, cells)
AEC_GAMES = {"pettingzoo.classic.connect_four_v3": (7, 42), "pettingzoo.classic.tictactoe_v3": (5, 9)}


@pytest.mark.parametrize("path", sorted(AEC_GAMES))
def test_aec_games_with_random_bot(path):
    B = 4
    env = PettingZooVecEnv(path, num_games=B, seed=3)
    spec = env.spec
    assert spec.num_agents == 2 and spec.side_of_agent == (0, 1)
    assert len(spec.agent_names) == 2 and spec.agent_names[0] == env.games[0].possible_agents[0]
    bot = RandomBot(spec, seed=1)
    step = env.reset()
    lo, hi = AEC_GAMES[path]
    episodes = []
    first_mover_after_reset = 0
    for t in range(300):
        assert step.obs.shape == (B, 2, spec.obs_dim) and step.obs.dtype == np.float32
        assert step.action_mask.shape == (B, 2, spec.mask_dim) and step.action_mask.dtype == bool
        assert step.rewards.shape == (B, 2) and step.terminated.shape == (B,) == step.truncated.shape
        assert step.action_mask.any(-1).all(), "every head has an allowed action"
        assert (step.active.sum(1) == 1).all(), "exactly one player moves per game per step"
        for b, game in enumerate(env.games):
            agent = game.agent_selection
            i = env.index[agent]
            assert step.active[b, i]
            legal = np.asarray(game.observe(agent)["action_mask"], dtype=bool)
            np.testing.assert_array_equal(step.action_mask[b, i], legal)
        actions = bot.act(step)
        step = env.step(actions)
        for ep in step.episodes:
            episodes.append(ep)
            b = ep.game
            assert step.terminated[b] and not step.truncated[b]
            # auto-reset: the new game shows an empty board and player_0 to move
            assert not step.obs[b].any()
            assert step.active[b, 0] and not step.active[b, 1]
            first_mover_after_reset += 1
        assert len(step.episodes) == int(step.done.sum())
    assert len(episodes) >= 10
    for ep in episodes:
        assert ep.winner in (-1, 0, 1)
        assert lo <= ep.length <= hi
        # a real win is +1/-1, a draw 0/0 (not the illegal-move penalty)
        assert ep.side_returns in ((1.0, -1.0), (-1.0, 1.0), (0.0, 0.0))
        if ep.winner == 0:
            assert ep.length % 2 == 1 and ep.side_returns == (1.0, -1.0)   # player_0 moves on odd turns
        elif ep.winner == 1:
            assert ep.length % 2 == 0
        else:
            assert ep.length == hi                                          # a draw fills the board
    env.close()


@pytest.mark.parametrize("path", sorted(AEC_GAMES))
def test_illegal_actions_are_replaced(path):
    env = PettingZooVecEnv(path, num_games=2, seed=0)
    step = env.reset()
    H = len(env.spec.action_heads)
    episodes = []
    for t, bad in zip(range(120), [0, 99, -5, 0, 1] * 40):
        # always the same (soon illegal) cell, or out of range
        step = env.step(np.full((2, 2, H), bad, dtype=np.int64))
        episodes += step.episodes
        assert step.action_mask.any(-1).all()
    assert episodes
    for ep in episodes:
        assert ep.side_returns in ((1.0, -1.0), (-1.0, 1.0), (0.0, 0.0)), "a game ended by an illegal move"


def test_rps_parallel_env():
    env = PettingZooVecEnv("pettingzoo.classic.rps_v2", num_games=3, seed=0, options={"max_cycles": 6})
    assert env.parallel and env.spec.num_agents == 2 and env.spec.action_heads == (3,)
    step = env.reset()
    bot = RandomBot(env.spec, seed=0)
    episodes = []
    for _ in range(30):
        assert step.active.all(), "parallel games: every live agent acts"
        assert step.action_mask.all()
        step = env.step(bot.act(step))
        # rock-paper-scissors is zero-sum step by step
        np.testing.assert_allclose(step.rewards.sum(1), 0.0)
        episodes += step.episodes
    assert len(episodes) == 3 * 5
    for ep in episodes:
        assert ep.length == 6 and ep.truncated and ep.winner in (-1, 0, 1)
        assert ep.side_returns[0] == -ep.side_returns[1]
        assert ep.winner == (-1 if ep.side_returns[0] == 0 else (0 if ep.side_returns[0] > 0 else 1))


def test_tiny_parallel_env_sides_masks_heads_and_deaths():
    env = PettingZooVecEnv(TINY, num_games=2, seed=0, options={"max_steps": 5, "die_at": 2})
    spec = env.spec
    assert spec.agent_names == ("red_0", "red_1", "blue_0", "blue_1")
    assert spec.side_of_agent == (0, 0, 1, 1)          # split by name prefix
    assert spec.action_heads == (3, 2) and spec.mask_dim == 5
    assert spec.obs_dim == 3                           # padded to the largest observation
    step = env.reset()
    assert step.obs[0, 0].tolist() == [1, 1, 1] and step.obs[0, 2].tolist() == [1, 1, 0]  # zero-padded
    assert not step.action_mask[..., 0].any() and step.action_mask[..., 1:].all()       # mask from info
    bot = RandomBot(spec, seed=0)
    eps = []
    for t in range(1, 11):
        actions = bot.act(step)
        actions[:, :2, 0] = 2   # red scores
        actions[:, 2:, 0] = 0   # blue asks for a forbidden action: replaced by the first allowed (1) → scores
        step = env.step(actions)
        eps += step.episodes
        game_t = (t - 1) % 5 + 1
        if game_t < 5:
            assert step.active[:, :3].all()
            assert step.active[:, 3].tolist() == [game_t < 2] * 2, "a dead agent is inactive"
            assert step.obs[:, 3].any(-1).tolist() == [game_t < 2] * 2, "a dead agent's row shows zeros"
            np.testing.assert_allclose(step.obs[:, 0], game_t + 1)
    assert len(eps) == 4
    for ep in eps:
        assert ep.truncated and ep.length == 5
        assert ep.side_returns == (10.0, 5.0 + 2.0)    # blue_1 scored only before it died
        assert ep.winner == 0


def test_split_sides():
    assert split_sides(["a", "b"]) == (0, 1)
    assert split_sides(["adversary_0", "agent_0", "agent_1"]) == (0, 1, 1)
    assert split_sides(["x_0", "y_0", "x_1", "y_1"]) == (0, 1, 0, 1)
    assert split_sides(["p_0", "p_1", "p_2", "p_3"]) == (0, 0, 1, 1)
    assert split_sides(["a_0", "b_0", "c_0"]) == (0, 1, 1)


def test_bad_import_paths():
    with pytest.raises(ValueError, match="cannot import env 'pettingzoo.classic.nosuch_v0'"):
        PettingZooVecEnv("pettingzoo.classic.nosuch_v0", num_games=1)
    with pytest.raises(ValueError, match="cannot import env"):
        PettingZooVecEnv("no_such_package.game", num_games=1)
    with pytest.raises(ValueError, match="not a PettingZoo env module"):
        PettingZooVecEnv("json", num_games=1)
    with pytest.raises(ValueError, match="rejected options"):
        PettingZooVecEnv("pettingzoo.classic.tictactoe_v3", num_games=1, options={"bogus_option": 1})


def test_deterministic_under_seed():
    def run(seed):
        env = PettingZooVecEnv("pettingzoo.classic.connect_four_v3", num_games=2, seed=seed)
        bot = RandomBot(env.spec, seed=5)
        step = env.reset()
        obs = []
        for _ in range(30):
            step = env.step(bot.act(step))
            obs.append(step.obs)
        return np.stack(obs)

    np.testing.assert_array_equal(run(1), run(1))


TINY_AEC = "tests.pz_tiny_aec"


def test_turn_based_eliminated_player_is_inactive():
    """Three players take turns; player_1 is knocked out on its first move. From then on only the live player
    to move is active, the dead step PettingZoo asks for is taken inside the adapter, and the eliminated
    player's row shows no stale observation."""
    env = PettingZooVecEnv(TINY_AEC, num_games=2, seed=0, options={"length": 7})
    assert env.spec.side_of_agent == (0, 1, 1)
    step = env.reset()
    bot = RandomBot(env.spec, seed=0)
    movers, eps, p1_rewards = [], [], 0.0
    for _ in range(20):
        assert (step.active.sum(1) == 1).all(), f"exactly one player moves per game per step: {step.active}"
        for b, game in enumerate(env.games):
            agent = game.agent_selection
            assert not game.terminations[agent], "a dead player is never asked to move"
            assert step.active[b, env.index[agent]]
        movers.append(int(np.flatnonzero(step.active[0])[0]))
        step = env.step(bot.act(step))
        if not eps:
            p1_rewards += float(step.rewards[0, 1])
            if 1 in movers and not step.done[0]:
                assert not step.obs[0, 1].any(), "the eliminated player's row is cleared"
        eps += [e for e in step.episodes if e.game == 0]
    assert movers[:9] == [0, 1, 2, 0, 2, 0, 2, 0, 1], "player_1 moves once a game, then only 0 and 2 take turns"
    assert eps[0].length == 7 and eps[0].side_returns == (1.0, -1.0) and eps[0].winner == 0
    assert p1_rewards == -1.0


def test_a_cut_game_hands_over_each_agents_view_at_the_cut():
    """At a time limit the adapter keeps what every agent still in the game saw before the reset
    (``final_obs``), so learning can bootstrap from it; games that end by their rules give none."""
    aec = PettingZooVecEnv(TINY_AEC, num_games=2, seed=0, options={"length": 7, "cut": True})
    par = PettingZooVecEnv(TINY, num_games=2, seed=0, options={"max_steps": 5, "die_at": 2})
    expected = {aec: (7, [[7, 0], [0, 0], [7, 2]]),                 # (moves, own index); player_1 knocked out
                par: (5, [[6, 6, 6], [6, 6, 6], [6, 6, 0], [0, 0, 0]])}  # step 5 + 1, zero-padded; blue_1 died
    for env, (length, views) in expected.items():
        assert not env.spec.clock_in_obs
        step, bot, cuts = env.reset(), RandomBot(env.spec, seed=0), 0
        for _ in range(2 * length):
            step = env.step(bot.act(step))
            assert (step.final_obs is None) == (not step.truncated.any())
            if step.truncated.any():
                cuts += 1
                assert step.truncated.all() and step.final_obs.shape == step.obs.shape
                np.testing.assert_array_equal(step.final_obs, np.array([views] * 2, np.float32))
                assert not np.array_equal(step.final_obs, step.obs), "the next game's first view is apart"
        assert cuts == 2
    ended = PettingZooVecEnv(TINY_AEC, num_games=2, seed=0, options={"length": 7})
    step, bot = ended.reset(), RandomBot(ended.spec, seed=0)
    for _ in range(12):
        step = ended.step(bot.act(step))
        assert step.final_obs is None and not step.truncated.any()


def test_turn_based_discount_is_per_round():
    """One step of a turn-based game is one player's move: a round of moves is one second of game time, so
    gamma from the horizon discounts once per round of turns, not once per move."""
    env = PettingZooVecEnv("pettingzoo.classic.connect_four_v3", num_games=1)
    assert env.spec.seconds_per_step == 0.5
    assert PettingZooVecEnv(TINY_AEC, num_games=1).spec.seconds_per_step == 1 / 3
    assert PettingZooVecEnv(TINY, num_games=1).spec.seconds_per_step == 1.0


def test_a_board_observation_is_a_grid_for_the_convolutions():
    board = PettingZooVecEnv("pettingzoo.classic.connect_four_v3", num_games=1)
    assert board.spec.grid == (6, 7, 2) and board.spec.obs_dim == 84
    box = lambda *shape: spaces.Box(0, 1, shape)  # noqa: E731
    assert grid_of([box(8, 8, 3), box(8, 8, 3)]) == (8, 8, 3)
    assert grid_of([box(24)]) is None                       # features, not a grid
    assert grid_of([box(4, 52)]) is None                    # a 2-D table (gin rummy's hands)
    assert grid_of([box(2, 9, 3)]) is None                  # too narrow to convolve
    assert grid_of([box(8, 8, 3), box(8, 8, 4)]) is None    # agents see different shapes

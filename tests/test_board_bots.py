"""The one-step-lookahead bot for PettingZoo board games: it wins when it can, blocks, and beats random."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.classic import connect_four_v3

from rapid.envs.board_bots import (
    LookaheadBot,
    blocking_moves,
    clone_game,
    connect_four_safe,
    connect_four_wins,
    lookahead_move,
    safe_moves,
    winning_moves,
)
from rapid.envs.registry import make_env
from rapid.opt.model import Policy
from rapid.run.config import Config
from rapid.run.matches import PolicyPlayer, make_player, play_match

C4 = "pettingzoo.classic.connect_four_v3"


def position(moves: list[int]):
    game = connect_four_v3.env()
    game.reset(seed=0)
    for m in moves:
        game.step(m)
    return game.unwrapped


def test_wins_when_it_can_else_blocks():
    rng = np.random.default_rng(0)
    legal = np.arange(7)
    # player_0 has three in column 0 and is to move: it takes the win, every time.
    game = position([0, 1, 0, 1, 0, 2])
    assert {lookahead_move(game, "player_0", legal, rng) for _ in range(20)} == {0}
    # player_1 has three in column 1; player_0 (to move) has no win of its own: it blocks column 1.
    game = position([0, 1, 2, 1, 4, 1])
    assert game.agent_selection == "player_0"
    assert {lookahead_move(game, "player_0", legal, rng) for _ in range(20)} == {1}
    # nothing to win or block: a random legal move.
    assert len({lookahead_move(position([]), "player_0", legal, rng) for _ in range(40)}) > 3


def test_two_steps_ahead_it_does_not_play_under_the_opponents_win():
    """player_0 (1) holds row 4 at columns 0, 2 and 3 and needs column 1 of that row, whose bottom cell is empty:
    player_1 (2, to move, with nothing to win or block) playing column 1 would hand it the win.

        . . . . . . .   row 0 (top)
        2 . . . . . .   row 3
        1 . 1 1 . . .   row 4
        2 . 2 1 . . .   row 5
    """
    rng, legal = np.random.default_rng(0), np.arange(7)
    game = position([3, 0, 0, 2, 3, 0, 2])
    assert game.agent_selection == "player_1"
    assert safe_moves(game, "player_1", legal) == [0, 2, 3, 4, 5, 6]
    assert 1 not in {lookahead_move(game, "player_1", legal, rng, depth=2) for _ in range(60)}
    assert 1 in {lookahead_move(game, "player_1", legal, rng, depth=1) for _ in range(60)}
    safe = connect_four_safe(np.array([game.board]), np.array([2]))[0]
    assert np.flatnonzero(safe).tolist() == [0, 2, 3, 4, 5, 6]


def test_clone_leaves_the_game_untouched():
    game = position([3, 3])
    board = list(game.board)
    twin = clone_game(game)
    twin.step(4)
    assert list(game.board) == board and game.agent_selection == "player_0"
    assert list(twin.board) != board
    # A win in the copy leaves the original's flags and rewards as they were.
    game = position([0, 1, 0, 1, 0, 2])
    twin = clone_game(game)
    twin.step(0)
    assert twin.terminations["player_0"] and twin.rewards["player_0"] == 1
    assert not any(game.terminations.values()) and game.rewards == {"player_0": 0, "player_1": 0}
    assert game.agent_selection == "player_0" and twin._agent_selector is not game._agent_selector


def test_clone_keeps_shared_state_shared():
    """Two attributes holding one object hold one copy of it, as a deep copy would keep them."""
    game = position([3])
    game.spare = game.board
    game.nested = {"cells": [[0], [1]]}
    twin = clone_game(game)
    assert twin.spare is twin.board and twin.board is not game.board
    twin.nested["cells"][0].append(5)
    assert game.nested == {"cells": [[0], [1]]}


def test_connect_four_rules_in_numpy_find_what_the_copies_find():
    """The vectorized connect four path against the generic one (a copy of the game per move), on every position
    of 60 random games: the same winning, blocking and safe moves."""
    rng, positions, threats = np.random.default_rng(0), 0, 0
    for seed in range(60):
        game = connect_four_v3.env()
        game.reset(seed=seed)
        raw = game.unwrapped
        while not any(raw.terminations.values()):
            agent, legal = raw.agent_selection, np.flatnonzero(np.asarray(raw.board[:7]) == 0)
            own = np.array([raw.agents.index(agent) + 1])
            wins = np.flatnonzero(connect_four_wins(np.array([raw.board]), own)[0]).tolist()
            blocks = np.flatnonzero(connect_four_wins(np.array([raw.board]), 3 - own)[0]).tolist()
            assert wins == winning_moves(raw, agent, legal), raw.board
            assert blocks == blocking_moves(raw, agent, legal), raw.board
            safe = np.flatnonzero(connect_four_safe(np.array([raw.board]), own)[0]).tolist()
            assert safe == safe_moves(raw, agent, legal), raw.board
            positions, threats = positions + 1, threats + bool(wins or blocks)
            game.step(int(rng.choice(legal)))
    assert positions > 1000 and threats > 300, (positions, threats)


@pytest.mark.parametrize("name", ["lookahead", "lookahead2"])
def test_the_bots_vector_play_draws_uniformly_from_the_first_tier_the_copies_find(name):
    """``LookaheadBot`` on a vector env of connect four (every board at once) against the generic rules on each
    game (a copy per move): over 150 draws on the same positions, each game's moves are exactly its first
    non-empty tier among winning, blocking, (safe, at depth 2) and legal moves, every one of them drawn."""
    env = make_env(C4, num_games=48, seed=0)
    mover, bot = env.make_bot("random", seed=1), env.make_bot(name, seed=2)
    step = env.reset(seed=0)
    for _ in range(9):  # mid-game positions, threats among them
        step = env.step(mover.act(step))
    drawn: dict[tuple[int, int], set[int]] = {}
    for _ in range(150):
        actions = bot.act(step)
        for b, i in np.argwhere(step.active):
            drawn.setdefault((int(b), int(i)), set()).add(int(actions[b, i, 0]))
    tiers_seen = set()
    for (b, i), moves in drawn.items():
        game, agent = env.games[b].unwrapped, env.spec.agent_names[i]
        legal = np.flatnonzero(step.action_mask[b, i])
        tiers = [winning_moves(game, agent, legal), blocking_moves(game, agent, legal)]
        tiers += [safe_moves(game, agent, legal)] if name == "lookahead2" else []
        first = next((k for k, tier in enumerate(tiers) if tier), len(tiers))
        assert moves == set(tiers[first] if first < len(tiers) else legal.tolist()), (b, game.board, first)
        tiers_seen.add(first)
    assert len(drawn) == 48 and {0, 1} <= tiers_seen, tiers_seen


def test_registered_for_board_games_and_beats_random():
    env = make_env(C4, num_games=100, seed=0)
    # the search bots: tests/test_c4_search.py
    assert env.bot_names() == ("random", "lookahead", "lookahead2", "search1", "search2", "search4")
    bot = make_player("bot:lookahead", Config(), env, params=None, seed=1)
    assert isinstance(bot, LookaheadBot) and bot.connect_four
    result = play_match(env, bot, env.make_bot("random", seed=2), games=200, seed=0)
    assert result.win_rate >= 0.9, result.line("lookahead", "random")
    assert "lookahead" not in make_env("tests.pz_tiny_parallel", num_games=1).bot_names()
    # Looking at the reply too beats looking one move ahead (57% won, 36% lost over 4,000 games: BENCHMARKS.md).
    two = env.make_bot("lookahead2", seed=3)
    assert two.name == "lookahead2" and two.depth == 2
    result = play_match(env, two, env.make_bot("lookahead", seed=4), games=400, seed=0)
    assert result.win_rate > 0.53, result.line("lookahead2", "lookahead")


def test_a_match_shows_its_watch_only_player_a_moves_in_games_that_count():
    env = make_env(C4, num_games=4)
    seen = []

    def watch(step, rows, acts):
        assert not (rows & ~step.active).any()
        seen.append(int(rows.sum()))

    # 6 games on 4 slots: quotas 2, 2, 1, 1, so two slots go on playing games that do not count.
    result = play_match(env, env.make_bot("random", seed=1), env.make_bot("random", seed=2), games=6, seed=0,
                        watch=watch)
    moves = result.mean_length * 6
    assert abs(sum(seen) - moves / 2) <= 3, (sum(seen), moves)  # A makes half the moves, give or take a first


def test_a_policy_player_steps_only_the_player_to_move_in_a_turn_based_game():
    """As in training (rapid.rollout.decisions): the waiting player's LSTM state does not move on the opponent's
    turn."""
    env = make_env(C4, num_games=3)
    player = PolicyPlayer(Policy(env.spec.obs_dim, env.spec.action_heads, hidden=8, lstm=8), env.spec, "p")
    step = env.reset(seed=0)
    actions = player.act(step)
    h = player.state[0].reshape(3, 2, -1)
    assert (h[:, 0].abs().sum(-1) > 0).all() and (h[:, 1] == 0).all()   # player_0 moves first
    step = env.step(actions)
    before = h[:, 0].clone()
    player.act(step)
    assert (player.state[0].reshape(3, 2, -1)[:, 0] == before).all() and (h[:, 1].abs().sum(-1) > 0).all()

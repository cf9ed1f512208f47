"""The connect four search bots (``search2``, ``search4``): the bitboard rules against the 42-cell ones, the vector
negamax against a plain recursive one, the tactics (win, block, do not play under a win, a forced win two moves
deep), legal moves only, the same moves for a seed, and a clear win over ``lookahead2``."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.classic import connect_four_v3

from rapid.envs.board_bots import C4_LINES, clone_game
from rapid.envs.c4_search import (
    WIN,
    SearchBot,
    leaf_score,
    move_scores,
    open_lines,
    to_bitboards,
    winning_cells,
)
from rapid.envs.registry import make_env
from rapid.run.matches import play_match

C4 = "pettingzoo.classic.connect_four_v3"


def random_positions(count: int, seed: int = 0):
    """Raw connect four games after a random number of random moves, no game over."""
    rng, games = np.random.default_rng(seed), []
    while len(games) < count:
        game = connect_four_v3.env()
        game.reset(seed=0)
        for _ in range(int(rng.integers(0, 30))):
            game.step(int(rng.choice(np.flatnonzero(np.asarray(game.unwrapped.board[:7]) == 0))))
            if any(game.unwrapped.terminations.values()):
                break
        if not any(game.unwrapped.terminations.values()):
            games.append(game.unwrapped)
    return games


def cells_of(bitboard) -> set[int]:
    """PettingZoo cell indices (row 0 on top) of a bitboard's cells."""
    bits = int(bitboard)
    return {r * 7 + c for r in range(6) for c in range(7) if bits >> (c * 7 + 5 - r) & 1}


def test_bitboard_lines_count_what_the_lines_of_four_count():
    for game in random_positions(80):
        board = np.array(game.board)
        for piece in (1, 2):
            mine, theirs = to_bitboards(board[None], np.array([piece]))
            assert cells_of(mine[0]) == set(np.flatnonzero(board == piece).tolist())
            lines = board[C4_LINES]  # [lines, 4]
            own, other = (lines == piece).sum(1), (lines == 3 - piece).sum(1)
            threes, twos = open_lines(mine, theirs)
            assert int(threes[0]) == int(((own == 3) & (other == 0)).sum())
            assert int(twos[0]) == int(((own == 2) & (other == 0)).sum())
            completing = {int(line[lines[k] == 0][0]) for k, line in enumerate(C4_LINES) if own[k] == 3
                          and other[k] == 0}
            assert cells_of(winning_cells(mine, mine | theirs)[0]) == completing


def reference_scores(game, depth: int) -> list[int]:
    """Plain recursive negamax on copies of the PettingZoo game (its own rules), the same scores and leaf."""
    agent = game.agent_selection
    scores = []
    for move in range(7):
        if game.board[move] != 0:
            scores.append(-2 * WIN)
            continue
        twin = clone_game(game)
        twin.step(move)
        if twin.terminations[agent] and twin.rewards[agent] > 0:
            scores.append(WIN + depth)
        elif all(twin.board):
            scores.append(0)
        elif depth == 1:
            piece = np.array([twin.agents.index(twin.agent_selection) + 1])
            scores.append(-int(leaf_score(*to_bitboards(np.array([twin.board]), piece))[0]))
        else:
            scores.append(-max(reference_scores(twin, depth - 1)))
    return scores


@pytest.mark.parametrize("depth", [1, 2])
def test_the_vector_negamax_scores_what_a_recursive_one_scores(depth):
    games = random_positions(30, seed=depth)
    boards = np.array([g.board for g in games])
    pieces = np.array([g.agents.index(g.agent_selection) + 1 for g in games])
    scores = move_scores(*to_bitboards(boards, pieces), depth)
    for k, game in enumerate(games):
        assert scores[k].tolist() == reference_scores(game, depth), game.board


def after(moves: list[int], name: str = "search4", games: int = 1, seed: int = 0):
    env = make_env(C4, num_games=games, seed=0)
    step = env.reset(seed=0)
    for column in moves:
        step = env.step(np.full((games, 2, 1), column))
    return env, step, int(np.flatnonzero(step.active[0])[0])


def drawn(env, step, mover: int, name: str, tries: int = 40) -> set[int]:
    bot = env.make_bot(name, seed=1)
    return {int(bot.act(step)[0, mover, 0]) for _ in range(tries)}


def test_it_wins_blocks_and_does_not_play_under_the_opponents_win():
    env, step, mover = after([0, 1, 0, 1, 0, 2])  # player_0 has three in column 0
    assert mover == 0 and drawn(env, step, mover, "search4") == {0}
    env, step, mover = after([0, 1, 2, 1, 4, 1])  # player_1 has three in column 1: player_0 blocks
    assert mover == 0 and drawn(env, step, mover, "search4") == {1}
    # player_1 to move: column 1 would let player_0 complete row 4 (test_board_bots has the picture)
    env, step, mover = after([3, 0, 0, 2, 3, 0, 2])
    assert mover == 1 and 1 not in drawn(env, step, mover, "search4") | drawn(env, step, mover, "search2")


def test_it_finds_a_forced_win_two_moves_deep_that_lookahead2_does_not():
    """player_0 holds columns 3 and 4 of the bottom row: 2 or 5 makes an open three, two cells to win at and one
    block. ``lookahead2`` has nothing to win, block or avoid, so plays anything."""
    env, step, mover = after([3, 0, 4, 0])
    assert drawn(env, step, mover, "search4") == {2, 5}
    assert drawn(env, step, mover, "search2") == {2, 5}
    assert len(drawn(env, step, mover, "lookahead2", tries=80)) > 4
    board = np.array([env.games[0].unwrapped.board])
    assert move_scores(*to_bitboards(board, np.array([1])), 4)[0, [2, 5]].tolist() == [WIN + 2] * 2


def test_registered_for_connect_four_only_and_plays_legal_moves_the_same_for_a_seed():
    env = make_env(C4, num_games=32, seed=0)
    assert {"search2", "search4"} <= set(env.bot_names())
    assert isinstance(env.make_bot("search4"), SearchBot) and env.make_bot("search2").depth == 2
    for other in ("pettingzoo.classic.tictactoe_v3", "tests.pz_tiny_aec", "tests.pz_tiny_parallel"):
        assert not {"search2", "search4"} & set(make_env(other, num_games=1).bot_names()), other
        with pytest.raises(KeyError):
            make_env(other, num_games=1).make_bot("search4")
    # search4 against random to the end of 32 games (full columns among them): legal moves, and the same ones
    # from a second bot with the same seed.
    bot, twin, mover = env.make_bot("search4", seed=5), env.make_bot("search4", seed=5), env.make_bot("random", 6)
    step, seen, ended = env.reset(seed=0), 0, 0
    while ended < 32:
        ours = bot.act(step)
        assert (twin.act(step) == ours).all()
        rows = np.argwhere(step.active)
        assert step.action_mask[rows[:, 0], rows[:, 1], ours[rows[:, 0], rows[:, 1], 0]].all()
        actions = np.where((np.arange(2) == 0)[None, :, None], ours, mover.act(step))
        seen += int(step.active[:, 0].sum())
        step = env.step(actions)
        ended += len(step.episodes)
    assert seen > 32 * 5


def test_it_beats_lookahead2_clearly():
    # 199 won, 1 drawn of 200 (seed 9001; tests bench 1000 games); well under that here.
    env = make_env(C4, num_games=60, seed=0)
    result = play_match(env, env.make_bot("search4", seed=1), env.make_bot("lookahead2", seed=2), games=60, seed=0)
    assert result.win_rate >= 0.85, result.line("search4", "lookahead2")

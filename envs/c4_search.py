"""A depth-limited negamax bot for connect four, every active game's tree at once in numpy (``search4``).

The ladder needs an opponent clearly stronger than ``lookahead2`` that training never meets. ``search4`` (and the
cheaper ``search2`` and ``search1``, rungs between ``lookahead2`` and it) searches every move sequence ``depth``
plies deep (7^depth leaves a board, no pruning: the whole tree of every game is a few numpy arrays, one level at a
time). A move that completes a line of four scores ``WIN`` plus the plies left (a sooner win scores more); a full
board is a draw (0). A leaf scores, for the player to move there: a win when it has a playable winning cell (one
more ply, free), a loss when the opponent has two (or one with another of its winning cells right above it), else a
weighted count of open lines (the lines of four with no opposing piece) holding three and two of each player's
pieces, of its winning cells, and of its pieces in the centre column. The bot plays a best-scoring move at the root,
ties broken by its seeded generator.

Boards are bitboards (uint64): column ``c`` holds bits ``7c`` (bottom row) to ``7c + 5`` (top), bit ``7c + 6`` is
always empty, so a shift by 1, 7, 6 or 8 steps along a column, a row or a diagonal and never wraps onto the board.

    >>> from rapid.envs.registry import make_env
    >>> env = make_env("pettingzoo.classic.connect_four_v3", num_games=1)
    >>> bot = env.make_bot("search4", seed=0)
    >>> step = env.reset(seed=0)
    >>> for column in [3, 0, 4, 0]:       # player_0 holds columns 3 and 4 of the bottom row, both ends open
    ...     step = env.step(np.full((1, 2, 1), column))
    >>> int(bot.act(step)[0, 0, 0]) in (2, 5)   # an open three: two cells to win at, one block
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rapid.envs.base import EnvSpec, RandomBot, ScriptedBot, StepResult

SEARCH_DEPTHS = {"search1": 1, "search2": 2, "search4": 4}
"""The search bots by name, and how many plies each searches."""

ROWS, COLS, H = 6, 7, 7  # H: bits a column (its rows and an empty one above)
WIN = 1_000_000
"""A won position's score (plus the plies left when it is won inside the tree)."""
W_THREE, W_TWO, W_THREAT, W_CENTRE = 10, 3, 20, 4
"""The leaf's weights: open lines holding three and two pieces, winning cells, pieces in the centre column."""
CHUNK = 128
"""Boards searched at once (7^4 leaves each): bounds the memory of one step of many games."""

_U = np.uint64
_ONE = _U(1)
BOTTOM = _U(sum(1 << (c * H) for c in range(COLS)))
BOARD = _U(sum(((1 << ROWS) - 1) << (c * H) for c in range(COLS)))
CENTRE = _U(((1 << ROWS) - 1) << (3 * H))
COL_BOTTOM = np.array([1 << (c * H) for c in range(COLS)], dtype=_U)
COL_TOP = np.array([1 << (c * H + ROWS - 1) for c in range(COLS)], dtype=_U)
COL_MASK = np.array([((1 << ROWS) - 1) << (c * H) for c in range(COLS)], dtype=_U)
SHIFTS = tuple(_U(s) for s in (1, H, H - 1, H + 1))  # vertical, horizontal, the two diagonals


def _window_starts(s: np.uint64) -> np.uint64:
    return BOARD & (BOARD >> s) & (BOARD >> _U(2 * int(s))) & (BOARD >> _U(3 * int(s)))


STARTS = tuple(_window_starts(s) for s in SHIFTS)
"""The cells where a line of four begins, each direction: the line's four cells on the board."""
# PettingZoo's board is row-major with row 0 on top: cell r * 7 + c is bit 7c + (5 - r).
CELL_BITS = np.array([1 << (c * H + ROWS - 1 - r) for r in range(ROWS) for c in range(COLS)], dtype=_U)


def to_bitboards(boards: np.ndarray, piece: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bitboards (of ``piece``, of the other player) of PettingZoo boards int [n, 42] (0 empty, 1 and 2 the
    players' pieces), ``piece`` int [n]: uint64 [n] each."""
    bits = np.where(boards != 0, CELL_BITS[None, :], _U(0))
    mine = np.bitwise_or.reduce(np.where(boards == piece[:, None], bits, _U(0)), axis=1)
    return mine, np.bitwise_or.reduce(bits, axis=1) ^ mine


def fours(x: np.ndarray) -> np.ndarray:
    """Whether bitboards ``x`` hold a line of four: bool, ``x``'s shape."""
    found = np.zeros(x.shape, dtype=bool)
    for s in SHIFTS:
        pairs = x & (x >> s)
        found |= (pairs & (pairs >> (s + s))) != 0
    return found


def winning_cells(x: np.ndarray, filled: np.ndarray) -> np.ndarray:
    """The empty cells where a piece would complete a line of four for pieces ``x`` (``filled``: every piece)."""
    s1, s2, s3 = _ONE, _U(2), _U(3)
    cells = (x << s1) & (x << s2) & (x << s3)  # vertical: only on top of three
    for s in SHIFTS[1:]:
        pairs = (x << s) & (x << (s + s))
        cells |= pairs & (x << (s + s + s))
        cells |= pairs & (x >> s)
        pairs = (x >> s) & (x >> (s + s))
        cells |= pairs & (x << s)
        cells |= pairs & (x >> (s + s + s))
    return cells & (BOARD ^ filled)


def _count(x: np.ndarray) -> np.ndarray:
    return np.bitwise_count(x).astype(np.int64)


def open_lines(x: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How many lines of four without a piece of ``other`` hold three and two pieces of ``x``: int64 each."""
    threes = twos = np.zeros(x.shape, dtype=np.int64)
    for s, starts in zip(SHIFTS, STARTS):
        s2, s3 = s + s, s + s + s
        free = starts & ~(other | (other >> s) | (other >> s2) | (other >> s3))
        a, b, c, d = x, x >> s, x >> s2, x >> s3
        low_ab, high_ab, low_cd, high_cd = a ^ b, a & b, c ^ d, c & d  # two 2-bit sums, added bit by bit
        low, carry = low_ab ^ low_cd, low_ab & low_cd
        mid, high = high_ab ^ high_cd ^ carry, (high_ab & high_cd) | (carry & (high_ab ^ high_cd))
        two_or_three = free & mid & ~high
        threes = threes + _count(two_or_three & low)
        twos = twos + _count(two_or_three & ~low)
    return threes, twos


def leaf_score(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """The leaf's score for the player to move (pieces ``mine``) against ``theirs``: int64 (module docstring)."""
    filled = mine | theirs
    playable = (filled + BOTTOM) & BOARD
    my_cells, their_cells = winning_cells(mine, filled), winning_cells(theirs, filled)
    my3, my2 = open_lines(mine, theirs)
    their3, their2 = open_lines(theirs, mine)
    score = (W_THREE * (my3 - their3) + W_TWO * (my2 - their2)
             + W_THREAT * (_count(my_cells) - _count(their_cells))
             + W_CENTRE * (_count(mine & CENTRE) - _count(theirs & CENTRE)))
    forced = their_cells & playable
    lost = (_count(forced) >= 2) | ((forced & (their_cells >> _ONE)) != 0)
    score = np.where(lost, -WIN, score)
    score = np.where((my_cells & playable) != 0, WIN, score)
    return np.where(filled == BOARD, 0, score)  # a full board: a draw


def move_scores(mine: np.ndarray, theirs: np.ndarray, depth: int) -> np.ndarray:
    """Negamax scores of the 7 moves of the player to move (pieces ``mine``): int64 [n, 7], an illegal move
    ``-2 * WIN``."""
    filled = mine | theirs
    dropped = (filled[:, None] + COL_BOTTOM) & COL_MASK  # [n, 7]: the cell each move fills
    legal = (filled[:, None] & COL_TOP) == 0
    after = mine[:, None] | dropped
    won = fours(after) & legal
    scores = np.where(won, WIN + depth, -2 * WIN).astype(np.int64)
    go_on = np.flatnonzero(legal & ~won)
    if depth > 1 and len(go_on):
        replies = move_scores(np.broadcast_to(theirs[:, None], after.shape).ravel()[go_on], after.ravel()[go_on],
                              depth - 1)
        best = replies.max(1)
        best[best == -2 * WIN] = 0  # the board is full: a draw
        scores.ravel()[go_on] = -best
    elif len(go_on):
        scores.ravel()[go_on] = -leaf_score(np.broadcast_to(theirs[:, None], after.shape).ravel()[go_on],
                                            after.ravel()[go_on])
    return scores


class SearchBot(ScriptedBot):
    """Negamax to a fixed depth on every connect four game of a PettingZoo vector env (the module docstring)."""

    def __init__(self, games: Sequence[Any], spec: EnvSpec, seed: int = 0, name: str = "search4"):
        self.name, self.depth = name, SEARCH_DEPTHS[name]
        self.games, self.spec = games, spec
        self.rng = np.random.default_rng(seed)
        self.fallback = RandomBot(spec, seed + 1)

    def act(self, step: StepResult) -> np.ndarray:
        out = self.fallback.act(step)
        rows = np.argwhere(step.active & step.action_mask[:, :, :COLS].any(-1))
        if not len(rows):
            return out
        names = self.spec.agent_names
        boards = np.array([self.games[b].unwrapped.board for b, _ in rows])
        own = np.array([self.games[b].unwrapped.agents.index(names[i]) + 1 for b, i in rows])
        mine, theirs = to_bitboards(boards, own)
        scores = np.concatenate([move_scores(mine[k:k + CHUNK], theirs[k:k + CHUNK], self.depth)
                                 for k in range(0, len(rows), CHUNK)])
        legal = step.action_mask[rows[:, 0], rows[:, 1], :COLS].astype(bool)
        scores = np.where(legal, scores, -3 * WIN)
        best = scores == scores.max(1, keepdims=True)
        keys = np.where(best, self.rng.random(best.shape), -1.0)
        out[rows[:, 0], rows[:, 1], 0] = keys.argmax(1)
        return out

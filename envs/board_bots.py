"""Scripted players for turn-based PettingZoo board games (any AEC game with one discrete action and masks).

``lookahead`` looks one move ahead: it plays a move that wins at once when it has one, else a move that
blocks an opponent's immediate win (a move with which that opponent would win, were it to move now), else a
uniformly random legal move. ``lookahead2`` also looks at the reply: with nothing to win or block it avoids the
moves after which the opponent could win at once (playing under the cell it needs, at connect four), if it has
any other. They find them by playing each legal move on a copy of the game's state, so they
need nothing game-specific; connect four, where ``lookahead`` is also a training opponent (``league.bots``), has
the same rules on every game's board at once in numpy (a step of 32 games, the env's own included, about 13 times
faster; BENCHMARKS.md). ``lookahead`` beats a random player in about 19 games of 20 at connect four.

Connect four also has ``search1``, ``search2`` and ``search4`` (``rapid.envs.c4_search``, ladder opponents training
never meets): a negamax search 1, 2 or 4 plies deep with a heuristic leaf (open lines of two and three, winning
cells, the centre column), every game's tree at once on bitboards. ``search4`` won 981, lost 12 and drew 7 of 1,000
games against ``lookahead2`` and 483 against 124 losses (393 draws) against ``search2``; ``search2`` won 984 of
1,000 against ``lookahead2``; ``search1`` won 374 of 400 against ``lookahead2`` and 56 of 400 against ``search2``.

Usage::

    >>> from rapid.envs.registry import make_env
    >>> env = make_env("pettingzoo.classic.connect_four_v3", num_games=1)
    >>> bot = env.make_bot("lookahead", seed=0)      # also: rapid eval --against bot:lookahead
    >>> step = env.reset(seed=0)
    >>> for column in [0, 1, 0, 1, 0]:               # player_0 has three in column 0; player_1 moves
    ...     step = env.step(np.full((1, 2, 1), column))
    >>> actions = bot.act(step)                      # [B, A, 1]; the caller keeps the rows of the bot's side
    >>> actions.shape, step.active[0].tolist(), int(actions[0, 1, 0])   # player_1 blocks column 0
    ((1, 2, 1), [False, True], 0)
    >>> step = env.step(np.full((1, 2, 1), 1))       # player_1 did not block: player_0 wins at once
    >>> int(bot.act(step)[0, 0, 0])
    0
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from rapid.envs.base import EnvSpec, RandomBot, ScriptedBot, StepResult

_ATOMS = (type(None), bool, int, float, complex, str, bytes)


def _is_static(value: Any) -> bool:
    """Spaces never change during a game: copies share them (they are most of a deep copy's cost)."""
    if isinstance(value, spaces.Space):
        return True
    return isinstance(value, dict) and bool(value) and all(isinstance(v, spaces.Space) for v in value.values())


def _copy(value: Any, memo: dict[int, Any]) -> Any:
    """A copy of one attribute of a game's state. The common containers of plain values (a board as a list or
    an array, rewards and flags by agent) are copied flat, several times faster than ``copy.deepcopy`` (which
    takes the rest); ``memo`` keeps attributes that share one object sharing its copy."""
    if isinstance(value, _ATOMS) or _is_static(value):
        return value
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, list) and all(isinstance(v, _ATOMS) for v in value):
        twin: Any = list(value)
    elif isinstance(value, dict) and all(isinstance(v, _ATOMS) for v in value.values()):
        twin = dict(value)
    elif isinstance(value, np.ndarray) and value.dtype != object:
        twin = value.copy()
    else:
        return copy.deepcopy(value, memo)
    memo[id(value)] = twin
    return twin


def clone_game(game: Any) -> Any:
    """A copy of a raw PettingZoo AEC env's state that can be stepped without touching the original.

    ``copy.deepcopy`` is not enough: PettingZoo's envs pickle (and so deep-copy) as their constructor's
    arguments, which gives a fresh game instead of the position.
    """
    raw = game.unwrapped
    twin = object.__new__(type(raw))
    memo: dict[int, Any] = {}
    twin.__dict__.update({k: _copy(v, memo) for k, v in raw.__dict__.items()})
    return twin


def _select(twin: Any, agent: str) -> None:
    """Make it ``agent``'s turn in a copy, PettingZoo's turn order (``AgentSelector``) included: games ask it
    who moves next, to give that player the loser's reward."""
    twin.agent_selection = agent
    order = getattr(getattr(twin, "_agent_selector", None), "agent_order", None)
    if order and agent in order:
        twin._agent_selector._current_agent = (order.index(agent) + 1) % len(order)
        twin._agent_selector.selected_agent = agent


def _legal(game: Any, agent: str) -> np.ndarray | None:
    obs = game.observe(agent)
    if isinstance(obs, dict) and obs.get("action_mask") is not None:
        return np.flatnonzero(np.asarray(obs["action_mask"], dtype=bool))
    return None


def wins_at_once(game: Any, agent: str, move: int) -> bool:
    """Whether ``agent`` playing ``move`` now (its turn or not) ends the game with a positive reward for it."""
    twin = clone_game(game)
    _select(twin, agent)
    twin.step(int(move))
    return bool(twin.terminations.get(agent)) and twin.rewards.get(agent, 0) > 0


def winning_moves(game: Any, agent: str, legal: np.ndarray) -> list[int]:
    """The moves among ``legal`` with which ``agent`` wins at once in ``game`` (a raw AEC env)."""
    return [int(m) for m in legal if wins_at_once(game, agent, m)]


def blocking_moves(game: Any, agent: str, legal: np.ndarray) -> list[int]:
    """The moves among ``agent``'s ``legal`` ones with which another player in the game would win at once, were
    it to move now: the cells ``agent`` must take to block."""
    blocks: set[int] = set()
    own = set(int(m) for m in legal)
    for other in game.agents:
        if other == agent or game.terminations.get(other) or game.truncations.get(other):
            continue
        candidates = [m for m in _legal_of(game, other, legal) if int(m) in own]
        blocks.update(int(m) for m in candidates if wins_at_once(game, other, m))
    return sorted(blocks)


def safe_moves(game: Any, agent: str, legal: np.ndarray) -> list[int]:
    """The moves among ``legal`` after which no other player of ``game`` (a raw AEC env) can win at once."""
    safe = []
    for move in legal:
        twin = clone_game(game)
        _select(twin, agent)
        twin.step(int(move))
        over = any(twin.terminations.values()) or any(twin.truncations.values())
        if over or not any(winning_moves(twin, other, _legal_of(twin, other, legal))
                           for other in twin.agents if other != agent):
            safe.append(int(move))
    return safe


def _legal_of(game: Any, agent: str, fallback: np.ndarray) -> np.ndarray:
    """``agent``'s legal moves in ``game`` as were it its turn (its action mask), else ``fallback``."""
    view = clone_game(game)
    _select(view, agent)
    theirs = _legal(view, agent)
    return fallback if theirs is None else theirs


def lookahead_move(game: Any, agent: str, legal: np.ndarray, rng: np.random.Generator, depth: int = 1) -> int:
    """The choice of ``agent`` among its ``legal`` moves in ``game`` (a raw AEC env) looking ``depth`` moves ahead
    (1 or 2; the module docstring)."""
    tiers = [lambda: winning_moves(game, agent, legal), lambda: blocking_moves(game, agent, legal)]
    if depth >= 2:
        tiers.append(lambda: safe_moves(game, agent, legal))
    for tier in tiers:
        moves = tier()
        if moves:
            return int(rng.choice(moves))
    return int(rng.choice(legal))


def _lines_of_four(rows: int, cols: int) -> np.ndarray:
    """The flat cell indices of every line of four on a ``rows × cols`` board: [lines, 4]."""
    cells, steps, lines = np.arange(rows * cols).reshape(rows, cols), np.arange(4), []
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        for r in range(rows):
            for c in range(cols):
                rr, cc = r + dr * steps, c + dc * steps
                if rr.min() >= 0 and rr.max() < rows and cc.min() >= 0 and cc.max() < cols:
                    lines.append(cells[rr, cc])
    return np.array(lines)


LOOKAHEAD_DEPTHS = {"lookahead": 1, "lookahead2": 2}
"""The lookahead bots by name, and how many moves each looks ahead."""

C4_ROWS, C4_COLS = 6, 7
C4_LINES = _lines_of_four(C4_ROWS, C4_COLS)


def connect_four_drops(boards: np.ndarray, piece: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The boards after dropping ``piece`` in each column, int [n, 7, 42], and which columns had room, bool [n, 7],
    for ``boards`` int [n, 42] (PettingZoo's connect four: row 0 on top, 0 empty, 1 and 2 the players' pieces) and
    ``piece`` int [n]. A full column leaves its board as it was."""
    n = len(boards)
    landing = (boards.reshape(n, C4_ROWS, C4_COLS) == 0).sum(1) - 1  # [n, 7]: the lowest empty row, -1 if full
    dropped = np.repeat(boards[:, None, :], C4_COLS, axis=1)
    games, open_cols = np.nonzero(landing >= 0)
    dropped[games, open_cols, landing[games, open_cols] * C4_COLS + open_cols] = piece[games]
    return dropped, landing >= 0


def _completes_line(dropped: np.ndarray, room: np.ndarray, piece: np.ndarray) -> np.ndarray:
    lines = dropped[:, :, C4_LINES] == piece[:, None, None, None]  # [n, 7, lines, 4]
    return lines.all(-1).any(-1) & room


def connect_four_wins(boards: np.ndarray, piece: np.ndarray) -> np.ndarray:
    """Whether dropping ``piece`` in each column completes a line of four: bool [n, 7] (``connect_four_drops``'s
    arguments). A full column never wins."""
    return _completes_line(*connect_four_drops(boards, piece), piece)


def connect_four_safe(boards: np.ndarray, piece: np.ndarray) -> np.ndarray:
    """Whether dropping ``piece`` in each column leaves the other player no win at once (a move that wins ends
    the game, so it is safe): bool [n, 7]."""
    n = len(boards)
    dropped, room = connect_four_drops(boards, piece)
    replies = connect_four_wins(dropped.reshape(n * C4_COLS, -1), np.repeat(3 - piece, C4_COLS))
    return (~replies.reshape(n, C4_COLS, C4_COLS).any(-1) | _completes_line(dropped, room, piece)) & room


def is_connect_four(game: Any) -> bool:
    return type(game.unwrapped).__module__.endswith("connect_four.connect_four")


class LookaheadBot(ScriptedBot):
    """One- or two-step lookahead on the games of a PettingZoo vector env (see the module docstring)."""

    def __init__(self, games: Sequence[Any], spec: EnvSpec, seed: int = 0, name: str = "lookahead"):
        if len(spec.action_heads) != 1:
            raise ValueError("the lookahead bot plays games with one discrete action")
        self.name, self.depth = name, LOOKAHEAD_DEPTHS[name]
        self.games, self.spec = games, spec
        self.rng = np.random.default_rng(seed)
        self.fallback = RandomBot(spec, seed + 1)
        self.connect_four = bool(games) and all(is_connect_four(g) for g in games)

    def act(self, step: StepResult) -> np.ndarray:
        out = self.fallback.act(step)
        if self.connect_four:
            return self._act_connect_four(step, out)
        names = self.spec.agent_names
        for b, game in enumerate(self.games):
            for i in np.flatnonzero(step.active[b]):
                legal = np.flatnonzero(step.action_mask[b, i])
                out[b, i, 0] = lookahead_move(game.unwrapped, names[i], legal, self.rng, self.depth)
        return out

    def _act_connect_four(self, step: StepResult, out: np.ndarray) -> np.ndarray:
        """The rules above, every active game's board at once: each game's move is drawn uniformly from its first
        tier with a legal move (random keys, the largest of the tier's kept), with no Python loop over games."""
        rows = np.argwhere(step.active)
        if not len(rows):
            return out
        names = self.spec.agent_names
        boards = np.array([self.games[b].unwrapped.board for b, _ in rows])
        own = np.array([self.games[b].unwrapped.agents.index(names[i]) + 1 for b, i in rows])
        tiers = [connect_four_wins(boards, own), connect_four_wins(boards, 3 - own)]
        if self.depth >= 2:
            tiers.append(connect_four_safe(boards, own))
        legal = step.action_mask[rows[:, 0], rows[:, 1], :C4_COLS].astype(bool)
        moves, open_games = legal.copy(), np.ones(len(rows), dtype=bool)
        for tier in tiers:
            tier_moves = tier & legal
            found = tier_moves.any(1) & open_games
            moves[found], open_games[found] = tier_moves[found], False
        keys = np.where(moves, self.rng.random(moves.shape), -1.0)
        playable = legal.any(1)
        out[rows[playable, 0], rows[playable, 1], 0] = keys[playable].argmax(1)
        return out

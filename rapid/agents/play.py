"""`rapid play`: a person plays a turn-based board game against a run's policy in the terminal.

The game is the run's own PettingZoo AEC env (connect four, tictactoe, any board game whose moves are columns
or cells of its grid); the policy plays its seat through :class:`rapid.agents.pz_agent.PettingZooAgent`, so it sees
the board as it did in training. The board is drawn from the person's view (you X, the agent O), with the
legal moves, and each agent move comes with its value estimate (its expected return: +1 a sure win, -1 a
sure loss in these games).

>>> import io, tempfile
>>> from rapid.api import load_policy, publish_untrained
>>> from rapid.run.config_files import load_config
>>> policy = load_policy(publish_untrained(load_config(None, ["env.name=pettingzoo.classic.tictactoe_v3",
...     "model.hidden=16", "model.lstm=16"]), tempfile.mkdtemp()))
>>> moves = iter(["9", "0", "1", "2", "3", "4", "5", "6", "7", "8"])
>>> out = io.StringIO()
>>> result = play_game(policy, read=lambda prompt: next(moves), write=lambda line: print(line, file=out))
>>> result in ("you won", "the agent won", "a draw")
True
>>> print(out.getvalue())
tictactoe: you are X and move first; the agent (v1) is O.
<BLANKLINE>
 0 1 2
 3 4 5
 6 7 8
legal moves: 0 1 2 3 4 5 6 7 8
9 is not a legal move; legal: 0 1 2 3 4 5 6 7 8
the agent plays ...
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from rapid.api import TrainedPolicy
from rapid.errors import UsageError


class Board:
    """How a grid game's moves map to its board: one move per column (connect four) or per cell (tictactoe)."""

    def __init__(self, policy: TrainedPolicy):
        spec = policy.spec
        if not (spec.turn_based and spec.grid and len(spec.action_heads) == 1 and spec.num_agents == 2):
            raise UsageError(f"rapid play is for two-player turn-based board games (connect four, tictactoe); this "
                             f"run plays {policy.env_name}" + (": watch it with rapid watch" if
                                                                policy.env_name == "moba" else ""))
        self.height, self.width, _ = spec.grid
        self.moves = spec.action_heads[0]
        if self.moves not in (self.width, self.height * self.width):
            raise UsageError(f"{policy.env_name}: its {self.moves} moves are neither the columns nor the cells of "
                             f"its {self.height}×{self.width} board")
        self.columns = self.moves == self.width

    def lines(self, planes: np.ndarray, legal: np.ndarray | None = None) -> list[str]:
        """The board from the person's view (plane 0 theirs: X, plane 1 the agent's: O); empty cells show their
        move number in a game of cells, and the column numbers stand below a game of columns."""
        mine, theirs = planes[..., 0] > 0, planes[..., 1] > 0
        rows = []
        for r in range(self.height):
            cells = []
            for c in range(self.width):
                i = r * self.width + c
                empty = str(i) if not self.columns and (legal is None or legal[i]) else "."
                cells.append("X" if mine[r, c] else "O" if theirs[r, c] else empty)
            rows.append(" " + " ".join(f"{x:>{len(str(self.moves - 1))}}" for x in cells))
        if self.columns:
            rows.append(" " + " ".join(str(c) for c in range(self.width)))
        return rows


def _planes(obs: dict, own_view: bool) -> np.ndarray:
    """The board's two piece planes from the person's view (PettingZoo's observation is the mover's view)."""
    planes = np.asarray(obs["observation"])
    return planes if own_view else planes[..., ::-1]


def play_game(policy: TrainedPolicy, agent_first: bool = False, greedy: bool = True, seed: int = 0,
              read: Callable[[str], str] = input, write: Callable[[str], None] = print) -> str:
    """One game, the person's moves read with ``read``; returns how it ended ("you won", "the agent won", "a
    draw"), or "abandoned" when the person typed q or the input ended."""
    from rapid.agents.pz_agent import PettingZooAgent
    from rapid.envs.pettingzoo_adapter import load_pettingzoo_module

    board = Board(policy)
    module = load_pettingzoo_module(policy.env_name)
    if not hasattr(module, "env"):
        raise UsageError(f"{policy.env_name} is not a turn-based (AEC) PettingZoo game")
    env = module.env(**policy.config.env.options)
    env.reset(seed=seed)
    agent_name, person = (env.possible_agents if agent_first else env.possible_agents[::-1])
    agent = PettingZooAgent(policy, env, agents=[agent_name], greedy=greedy)
    game = re.sub(r"_v[0-9]+$", "", policy.env_name.rsplit(".", 1)[-1]).replace("_", " ")  # connect_four_v3
    write(f"{game}: you are X and move {'second' if agent_first else 'first'}; the agent (v{policy.version}) is O.")
    final: dict[str, float] = {}
    last_view = None
    for name in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        last_view = _planes(obs, name == person)
        if terminated or truncated:
            final[name] = reward
            env.step(None)
            continue
        legal = np.flatnonzero(np.asarray(obs["action_mask"]))
        if name == agent_name:
            move = agent.act(name, obs, info)
            write(f"the agent plays {move} (its value estimate {agent.last_value[name]:+.2f})")
        else:
            write("")
            write("\n".join(board.lines(last_view, np.asarray(obs["action_mask"]))))
            write("legal moves: " + " ".join(map(str, legal)))
            move = _ask(read, write, legal)
            if move is None:
                write("game abandoned")
                env.close()
                return "abandoned"
        env.step(move)
    write("")
    if last_view is not None:  # None only for a game that ended before its first turn
        write("\n".join(board.lines(last_view)))
    result = ("you won" if final.get(person, 0) > final.get(agent_name, 0) else
              "the agent won" if final.get(agent_name, 0) > final.get(person, 0) else "a draw")
    write(f"game over: {result}")
    env.close()
    return result


def _ask(read: Callable[[str], str], write: Callable[[str], None], legal: np.ndarray) -> int | None:
    while True:
        try:
            text = read("your move> ").strip()
        except EOFError:
            return None
        if text.lower() in ("q", "quit"):
            return None
        if text.isascii() and text.isdigit() and int(text) in legal:
            return int(text)
        write(f"{text} is not a legal move; legal: {' '.join(map(str, legal))}")

"""A tiny turn-based (AEC) PettingZoo game for the adapter tests: three players take turns, one is eliminated.

``player_0``, ``player_1`` and ``player_2`` move in turn (Discrete(2), any action). ``eliminate`` is knocked out
on its first move (reward -1) and takes PettingZoo's dead step (action ``None``) when its turn comes round; the
other two play on. After ``length`` live moves the game ends and ``player_0`` scores +1 (with ``cut``, the game is
truncated there instead: a time limit). Each observation is (moves so far, own index).
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv

AGENTS = ["player_0", "player_1", "player_2"]


class TinyTurns(AECEnv):
    metadata = {"name": "tiny_turns_v0", "render_modes": [], "is_parallelizable": False}

    def __init__(self, length: int = 7, eliminate: str = "player_1", cut: bool = False):
        super().__init__()
        self.possible_agents = list(AGENTS)
        self.length, self.eliminate, self.cut = length, eliminate, cut
        self.agents = []

    def observation_space(self, agent):
        return spaces.Dict({"observation": spaces.Box(0, 100, shape=(2,), dtype=np.float32),
                            "action_mask": spaces.Box(0, 1, shape=(2,), dtype=np.int8)})

    def action_space(self, agent):
        return spaces.Discrete(2)

    def observe(self, agent):
        return {"observation": np.array([self.moves, AGENTS.index(agent)], dtype=np.float32),
                "action_mask": np.ones(2, dtype=np.int8)}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.moves = 0
        self._skip_agent_selection = None
        self.agent_selection = AGENTS[0]

    def _next_live(self, after: str) -> str:
        i = AGENTS.index(after)
        for k in range(1, len(AGENTS) + 1):
            a = AGENTS[(i + k) % len(AGENTS)]
            if a in self.agents and not self.terminations[a]:
                return a
        return after

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        assert action in (0, 1), f"illegal action {action!r} reached the game"
        self._clear_rewards()
        self.moves += 1
        if agent == self.eliminate:
            self.terminations[agent] = True
            self.rewards[agent] = -1.0
        if self.moves >= self.length and self.cut:
            self.truncations = dict.fromkeys(self.agents, True)
        elif self.moves >= self.length:
            self.terminations = dict.fromkeys(self.agents, True)
            self.rewards["player_0"] += 1.0
        self._accumulate_rewards()
        self.agent_selection = self._next_live(agent)
        self._deads_step_first()


def env(**kwargs):
    return TinyTurns(**kwargs)

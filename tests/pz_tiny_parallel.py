"""A tiny PettingZoo ParallelEnv for the adapter tests: 2 v 2 (``red_*`` vs ``blue_*``), MultiDiscrete actions,
action masks in ``info``, an agent that dies mid-game, and a fixed game length.

Each step every live red agent scores 1 if its first action component is 2, every blue agent if it is 1.
``blue_1`` leaves the game after ``die_at`` steps; the game is truncated after ``max_steps``.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

MASK = np.array([False, True, True, True, True])  # head 0 (3): action 0 forbidden; head 1 (2): both allowed


class TinyParallel(ParallelEnv):
    metadata = {"name": "tiny_parallel_v0", "render_modes": []}

    def __init__(self, max_steps: int = 5, die_at: int = 2):
        self.possible_agents = ["red_0", "red_1", "blue_0", "blue_1"]
        self.max_steps, self.die_at = max_steps, die_at
        self.agents = []
        self.t = 0

    def observation_space(self, agent):
        return spaces.Box(-10, 10, shape=(3,) if agent.startswith("red") else (2,), dtype=np.float32)

    def action_space(self, agent):
        return spaces.MultiDiscrete([3, 2])

    def _obs(self, agent):
        size = 3 if agent.startswith("red") else 2
        return np.full(size, self.t + 1, dtype=np.float32)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.t = 0
        return {a: self._obs(a) for a in self.agents}, {a: {"action_mask": MASK.copy()} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {}
        for a in self.agents:
            act = np.asarray(actions[a])
            assert MASK[int(act[0])] and 0 <= act[1] < 2, f"illegal action {act} reached the game"
            want = 2 if a.startswith("red") else 1
            rewards[a] = 1.0 if int(act[0]) == want else 0.0
        trunc = self.t >= self.max_steps
        terms = {a: (a == "blue_1" and self.t >= self.die_at) for a in self.agents}
        truncs = {a: trunc for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        infos = {a: {"action_mask": MASK.copy()} for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos


def parallel_env(**kwargs):
    return TinyParallel(**kwargs)

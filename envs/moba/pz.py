"""PettingZoo ``ParallelEnv`` view of one moba game, for tools and tests that speak PettingZoo.

Each agent's observation is ``{"observation": float32 [obs_dim], "action_mask": (int8 [n_head] per head)}``
and its action a ``MultiDiscrete(action_heads)`` vector ``[type, direction, target slot]``; the mask is a
tuple with one array per head because that is what ``MultiDiscrete.sample(mask=…)`` takes. When the game ends
every agent is terminated (ancient fell) or truncated (time limit) and ``agents`` becomes empty; call
``reset`` for the next game.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from rapid.envs.base import StepResult, head_offsets
from rapid.envs.moba.env import MobaVecEnv

OBS_BOUND = 2.0
"""Every observation feature lies within ±1.5 by construction; the space says ±2."""


class MobaParallelEnv(ParallelEnv):
    """One game of :class:`MobaVecEnv` (same options) behind PettingZoo's parallel API."""

    metadata = {"name": "rapid_moba_v0", "render_modes": ["rgb_array"], "is_parallelizable": True}

    def __init__(self, render_mode: str | None = None, **options: Any):
        self.env = MobaVecEnv(num_games=1, seed=0, **options)
        self.render_mode = render_mode
        spec = self.env.spec
        self.possible_agents = list(spec.agent_names)
        self.agents: list[str] = []
        self._obs_space = spaces.Dict({
            "observation": spaces.Box(-OBS_BOUND, OBS_BOUND, (spec.obs_dim,), np.float32),
            "action_mask": spaces.Tuple([spaces.Box(0, 1, (n,), np.int8) for n in spec.action_heads]),
        })
        self._act_space = spaces.MultiDiscrete(np.array(spec.action_heads, dtype=np.int64))
        self.observation_spaces = {a: self._obs_space for a in self.possible_agents}
        self.action_spaces = {a: self._act_space for a in self.possible_agents}
        self._offsets = head_offsets(spec.action_heads)

    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.action_spaces[agent]

    def _observations(self, step: StepResult) -> dict[str, dict[str, np.ndarray | tuple[np.ndarray, ...]]]:
        masks = step.action_mask[0].astype(np.int8)
        heads = list(zip(self._offsets, self.env.spec.action_heads))
        return {a: {"observation": step.obs[0, i].copy(),
                    "action_mask": tuple(masks[i, o:o + n].copy() for o, n in heads)}
                for i, a in enumerate(self.possible_agents)}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        step = self.env.reset(seed=seed)
        self.agents = list(self.possible_agents)
        return self._observations(step), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Agents missing from ``actions`` do nothing this step. On the last step of a game the returned
        observations already show the next game's start (the vector env resets itself)."""
        act = np.zeros((1, len(self.possible_agents), len(self.env.spec.action_heads)), np.int64)
        for i, a in enumerate(self.possible_agents):
            if a in actions:
                act[0, i] = np.asarray(actions[a], dtype=np.int64)
        step = self.env.step(act)
        ended = bool(step.done[0])
        agents = list(self.agents)
        obs = self._observations(step)
        rewards = {a: float(step.rewards[0, i]) for i, a in enumerate(self.possible_agents) if a in agents}
        terminations = {a: bool(step.terminated[0]) for a in agents}
        truncations = {a: bool(step.truncated[0]) for a in agents}
        infos: dict[str, dict] = {a: {} for a in agents}
        if ended:
            ep = step.episodes[0]
            for a in agents:
                infos[a] = {"winner": ep.winner, "length": ep.length, **ep.info}
            self.agents = []
        return {a: obs[a] for a in agents}, rewards, terminations, truncations, infos

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        from rapid.envs.moba.render import render_frame

        return render_frame(self.env, 0)

    def close(self) -> None:
        self.env.close()

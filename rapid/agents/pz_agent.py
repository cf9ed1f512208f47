"""A trained policy as a player in any PettingZoo env loop, turn-based (AEC) or parallel.

It takes PettingZoo's observations as they come (a plain array, or a dict with ``observation`` and
``action_mask``, or the mask in ``info["action_mask"]``), keeps one LSTM state per agent it plays, and
answers with the action the env takes (an int for ``Discrete``, an array for ``MultiDiscrete``). An env
whose agents, observations or actions differ from the policy's game is refused in one line.

Usage (connect four: the policy plays ``player_0``; a fixed column for ``player_1`` stands for your code)::

    >>> import tempfile
    >>> from pettingzoo.classic import connect_four_v3
    >>> from rapid.api import load_policy, publish_untrained
    >>> from rapid.run.config_files import load_config
    >>> run = publish_untrained(load_config(None, ["model.hidden=16", "model.lstm=16"]), tempfile.mkdtemp())
    >>> env = connect_four_v3.env()
    >>> env.reset(seed=0)
    >>> agent = PettingZooAgent(load_policy(run), env, agents=["player_0"], greedy=True)
    >>> final = {}
    >>> for name in env.agent_iter():
    ...     obs, reward, terminated, truncated, info = env.last()
    ...     if terminated or truncated:
    ...         action, final[name] = None, reward
    ...     elif name == "player_0":
    ...         action = agent.act(name, obs, info)             # a column, 0-6
    ...     else:
    ...         action = int(obs["action_mask"].argmax())      # the first open column
    ...     env.step(action)
    >>> sorted(final.values()) in ([-1, 1], [0, 0])        # a win and a loss, or a draw
    True
    >>> -10 < agent.last_value["player_0"] < 10         # its value estimate when it last moved
    True

In a parallel env, ``agent.act_parallel(observations, infos)`` answers for every agent it plays at once. Call
``agent.reset()`` when a new game starts: its agents' memory starts afresh, as in training.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from gymnasium import spaces

from rapid.api import TrainedPolicy
from rapid.envs.base import head_offsets
from rapid.envs.pettingzoo_adapter import observation_and_mask
from rapid.errors import UsageError


def _flat_size(space: spaces.Space) -> int:
    if isinstance(space, spaces.Dict) and "observation" in space.spaces:
        space = space["observation"]
    if space.shape is None:
        raise UsageError(f"observation space {space} has no shape (a Box, or a Dict with an 'observation' Box, "
                         "is needed)")
    return int(np.prod(space.shape))


def _heads(space: spaces.Space) -> tuple[int, ...]:
    if isinstance(space, spaces.Discrete):
        return (int(space.n),)
    if isinstance(space, spaces.MultiDiscrete):
        return tuple(int(n) for n in np.asarray(space.nvec).ravel())
    return ()


class PettingZooAgent:
    """Plays ``policy`` for ``agents`` (default: every agent) of the PettingZoo ``env`` (AEC or parallel)."""

    def __init__(self, policy: TrainedPolicy, env: Any, agents: Iterable[str] | None = None, greedy: bool = False):
        self.policy, self.greedy = policy, greedy
        spec = policy.spec
        names = list(env.possible_agents)
        if tuple(names) != tuple(spec.agent_names):
            raise UsageError(f"this env's agents {names} are not those of the policy's game {policy.env_name} "
                             f"({list(spec.agent_names)})")
        self.index = {a: i for i, a in enumerate(names)}
        self.agents = list(names if agents is None else agents)
        unknown = [a for a in self.agents if a not in self.index]
        if unknown:
            raise UsageError(f"agents {unknown} are not in this env ({names})")
        offsets = head_offsets(spec.action_heads)
        self._slots, self._discrete = {}, {}
        for a in self.agents:
            size, heads = _flat_size(env.observation_space(a)), _heads(env.action_space(a))
            if size > spec.obs_dim or len(heads) != len(spec.action_heads) or any(
                    n > m for n, m in zip(heads, spec.action_heads)):
                raise UsageError(f"agent {a} observes {size} values and acts with heads {heads}; the policy "
                                 f"({policy.env_name} v{policy.version}) takes ≤ {spec.obs_dim} values and heads "
                                 f"{spec.action_heads}")
            self._discrete[a] = isinstance(env.action_space(a), spaces.Discrete)
            self._slots[a] = np.concatenate([offsets[h] + np.arange(n) for h, n in enumerate(heads)])
        self.reset()

    def reset(self) -> None:
        """Every agent's memory starts afresh: call it when a game starts."""
        self.state = self.policy.initial_state(len(self.index))
        self.last_value: dict[str, float] = {}
        """Each agent's value estimate when it last acted (the return it expects from there)."""

    def _view(self, agent: str, observation: Any, info: dict | None) -> tuple[np.ndarray, np.ndarray]:
        """The agent's observation and action mask as rows of the policy's vectors, laid out as the vector
        env that trained it lays them out (zero-padded; the agent's own heads' slots of the mask)."""
        observation, mask = observation_and_mask(observation, info)
        obs = np.zeros(self.policy.spec.obs_dim, np.float32)
        flat = np.asarray(observation, dtype=np.float32).ravel()
        obs[:flat.size] = flat
        row = np.zeros(self.policy.spec.mask_dim, bool)
        slots = self._slots[agent]
        row[slots] = True
        if mask is not None:  # a tuple of per-head masks (MultiDiscrete) or one array
            given = np.concatenate([np.asarray(m).ravel() for m in mask]) if isinstance(mask, tuple | list) \
                else np.asarray(mask).ravel()
            if given.size == slots.size and given.any():
                row[slots] = given.astype(bool)
        return obs, row

    def _actions(self, agents: list[str], observations: list, infos: list) -> list:
        others = [a for a in agents if a not in self._slots]
        if others:
            raise UsageError(f"this PettingZooAgent plays {self.agents}, not {others}")
        views = [self._view(a, o, i) for a, o, i in zip(agents, observations, infos)]
        rows = [self.index[a] for a in agents]
        h, c = self.state
        out = self.policy.act(np.stack([v[0] for v in views]), np.stack([v[1] for v in views]),
                              (h[rows], c[rows]), greedy=self.greedy)
        h[rows], c[rows] = out.state
        self.last_value.update(zip(agents, out.value.tolist()))
        return [int(act[0]) if self._discrete[a] else act.copy() for a, act in zip(agents, out.actions)]

    def act(self, agent: str, observation: Any, info: dict | None = None) -> Any:
        """The action of ``agent`` on its turn (AEC: what ``env.last()`` gave for it)."""
        return self._actions([agent], [observation], [info])[0]

    def act_parallel(self, observations: dict[str, Any], infos: dict[str, dict] | None = None) -> dict[str, Any]:
        """Actions of every agent this plays that is in ``observations`` (a parallel env's step)."""
        mine = [a for a in observations if a in self._slots]
        if not mine:
            return {}
        infos = infos or {}
        return dict(zip(mine, self._actions(mine, [observations[a] for a in mine], [infos.get(a) for a in mine])))

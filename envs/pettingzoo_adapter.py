"""Any PettingZoo env, named by import path, in the vectorized multi-agent interface.

Turn-based (AEC) games step one turn per vector step: the live agent whose turn it is is ``active`` and
observes; the other agents' actions are ignored that step, and their rows keep what they saw on their last
turn. PettingZoo's dead steps (an eliminated agent's turn, action ``None``) are taken inside the adapter, so
every vector step is a live player's move. A round of turns (one step per player) is one second of game time,
so the discount horizon counts rounds, not single moves.
Parallel games step all live agents. An agent that has left the game (eliminated, or dead in a parallel game
that goes on) is inactive and its row shows zeros: a state of its own, not a stale view of its last turn.
Observations of different sizes are zero-padded to the largest; ``Dict`` observations with an
``action_mask`` entry (PettingZoo's classic games) give their mask, otherwise a mask from
``info['action_mask']`` or all-allowed.

Agents are split into two sides: with two agents, one each; otherwise by name prefix when there are
exactly two prefixes (``adversary_0``, ``agent_1`` …), else first half / second half.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.wrappers import AssertOutOfBoundsWrapper, OrderEnforcingWrapper, TerminateIllegalWrapper

from rapid.envs.base import (
    EnvSpec,
    EpisodeStats,
    ScriptedBot,
    StepResult,
    VecMultiAgentEnv,
    generic_bot,
    head_offsets,
    winner_from_returns,
)
from rapid.envs.board_bots import LOOKAHEAD_DEPTHS, LookaheadBot, is_connect_four
from rapid.envs.c4_search import SEARCH_DEPTHS, SearchBot


def load_pettingzoo_module(path: str):
    try:
        module = importlib.import_module(path)
    except ImportError as e:
        raise ValueError(f"cannot import env {path!r}: {e}") from None
    if not (hasattr(module, "parallel_env") or hasattr(module, "env")):
        raise ValueError(f"{path!r} is not a PettingZoo env module (no env() or parallel_env())")
    return module


CHECKS = (OrderEnforcingWrapper, AssertOutOfBoundsWrapper, TerminateIllegalWrapper)


def checks_removed(game: Any) -> Any:
    """A turn-based game under PettingZoo's checking wrappers (call order, action bounds, illegal moves):
    the adapter only sends allowed actions, and each attribute read through the wrappers costs a chain of
    ``__getattr__`` calls, a quarter of the stepping time in connect four. Other wrappers are kept."""
    while isinstance(game, CHECKS):
        game = game.env
    return game


def _obs_space(space: spaces.Space) -> spaces.Space:
    if isinstance(space, spaces.Dict) and "observation" in space.spaces:
        return space["observation"]
    return space


def _flat_size(space: spaces.Space, agent: str) -> int:
    if space.shape is None:
        raise ValueError(f"agent {agent}: observation space {space} has no shape (a Box, or a Dict with an "
                         "'observation' Box, is needed)")
    return int(np.prod(space.shape))


def _heads(space: spaces.Space, agent: str) -> tuple[int, ...]:
    if isinstance(space, spaces.Discrete):
        return (int(space.n),)
    if isinstance(space, spaces.MultiDiscrete):
        return tuple(int(n) for n in np.asarray(space.nvec).ravel())
    raise ValueError(f"agent {agent}: action space {space} is not Discrete or MultiDiscrete")


def grid_of(obs_spaces: list[spaces.Space]) -> tuple[int, int, int] | None:
    """(height, width, channels) when every agent observes one channels-last grid of at least 3 × 3 cells
    (PettingZoo's board games and images are laid out so), else None."""
    shapes = {tuple(getattr(s, "shape", None) or ()) for s in obs_spaces}
    if len(shapes) != 1:
        return None
    shape = shapes.pop()
    if len(shape) != 3 or min(shape[:2]) < 3:
        return None
    height, width, channels = (int(n) for n in shape)
    return height, width, channels


def split_sides(agents: list[str]) -> tuple[int, ...]:
    if len(agents) == 2:
        return (0, 1)
    prefixes = [a.rsplit("_", 1)[0] for a in agents]
    distinct = list(dict.fromkeys(prefixes))
    if len(distinct) == 2:
        return tuple(distinct.index(p) for p in prefixes)
    half = len(agents) // 2
    return tuple(0 if i < half else 1 for i in range(len(agents)))



def observation_and_mask(obs: Any, info: dict | None) -> tuple[Any, Any]:
    """A PettingZoo agent's observation and its action mask (None if it has none): the mask rides in a dict
    observation (``action_mask``), else in the agent's info."""
    mask = None
    if isinstance(obs, dict):
        mask = obs.get("action_mask")
        obs = obs["observation"]
    if mask is None and info:
        mask = info.get("action_mask")
    return obs, mask

class PettingZooVecEnv(VecMultiAgentEnv):
    """B independent PettingZoo games behind the vectorized interface."""

    def __init__(self, path: str, num_games: int, seed: int = 0, options: dict[str, Any] | None = None):
        module = load_pettingzoo_module(path)
        options = dict(options or {})
        self.parallel = hasattr(module, "parallel_env")
        factory = module.parallel_env if self.parallel else module.env
        try:
            self.games = [factory(**options) for _ in range(num_games)]
        except TypeError as e:
            raise ValueError(f"env {path!r} rejected options {options}: {e}") from None
        self.num_games = num_games
        self.seed = seed
        self.cores = self.games if self.parallel else [checks_removed(g) for g in self.games]
        first = self.games[0]
        agents = list(first.possible_agents)
        self.index = {a: i for i, a in enumerate(agents)}
        obs_spaces = [_obs_space(first.observation_space(a)) for a in agents]
        self.obs_sizes = [_flat_size(s, a) for s, a in zip(obs_spaces, agents)]
        head_sets = [_heads(first.action_space(a), a) for a in agents]
        if len({len(h) for h in head_sets}) != 1:
            raise ValueError(f"env {path!r}: agents have different numbers of action heads")
        heads = tuple(int(max(n)) for n in zip(*head_sets))
        self.own_heads = head_sets
        self.spec = EnvSpec(
            name=path, num_agents=len(agents), obs_dim=max(self.obs_sizes), action_heads=heads,
            side_of_agent=split_sides(agents), agent_names=tuple(agents),
            seconds_per_step=1.0 if self.parallel else 1.0 / len(agents), grid=grid_of(obs_spaces),
            turn_based=not self.parallel,
        )
        self.offsets = head_offsets(heads)
        # Where each agent's own choices sit in the mask row (its heads may be smaller than the widest).
        self._own_slots = [np.concatenate([self.offsets[h] + np.arange(n) for h, n in enumerate(own)])
                           for own in head_sets]
        self._own_mask = np.zeros((len(agents), self.spec.mask_dim), dtype=bool)
        for i, slots in enumerate(self._own_slots):
            self._own_mask[i, slots] = True
        self._episode = np.zeros(num_games, dtype=np.int64)
        self._length = np.zeros(num_games, dtype=np.int64)
        self._returns = np.zeros((num_games, len(agents)), dtype=np.float64)
        self._obs = np.zeros((num_games, len(agents), self.spec.obs_dim), dtype=np.float32)
        self._mask = np.ones((num_games, len(agents), self.spec.mask_dim), dtype=bool)
        self._active = np.zeros((num_games, len(agents)), dtype=bool)
        self._final = np.zeros_like(self._obs)

    # --- per-game helpers -------------------------------------------------------------------------

    def _game_seed(self, b: int) -> int:
        return int(self.seed * 1_000_003 + b * 10_007 + self._episode[b])

    def _write_agent(self, b: int, agent: str, obs: Any, info: dict | None, active: bool) -> None:
        i = self.index[agent]
        obs, mask = observation_and_mask(obs, info)
        flat = np.asarray(obs).reshape(-1)
        row = self._obs[b, i]
        row[:flat.size] = flat
        row[flat.size:] = 0.0
        self._mask[b, i] = self._own_mask[i]
        if mask is not None and active:
            mask = np.asarray(mask, dtype=bool).reshape(-1)
            if mask.size == self._own_slots[i].size and mask.any():
                self._mask[b, i, self._own_slots[i]] = mask
        self._active[b, i] = active

    def _reset_game(self, b: int) -> None:
        game = self.games[b]
        self._obs[b] = 0.0
        self._mask[b] = True
        self._active[b] = False
        self._length[b] = 0
        self._returns[b] = 0.0
        if self.parallel:
            obs, infos = game.reset(seed=self._game_seed(b))
            for agent in game.agents:
                self._write_agent(b, agent, obs[agent], infos.get(agent), True)
        else:
            game.reset(seed=self._game_seed(b))
            self._observe_aec(b, self._live(self.cores[b]))

    def _clear_departed(self, b: int, present: list[str]) -> None:
        """Agents no longer in the game: zero observation, every action allowed, inactive."""
        if len(present) == self.spec.num_agents:
            return
        for agent in self.spec.agent_names:
            if agent not in present:
                i = self.index[agent]
                self._obs[b, i] = 0.0
                self._mask[b, i] = True
                self._active[b, i] = False

    def _live(self, game: Any) -> list[str]:
        return [a for a in game.agents if not (game.terminations[a] or game.truncations[a])]

    def _observe_aec(self, b: int, live: list[str]) -> None:
        """The player to move observes; the others keep what they saw on their last turn (a policy steps a
        turn-based agent only on its turns: ``EnvSpec.moving``), which halves the observing."""
        game = self.cores[b]
        self._active[b] = False
        mover = game.agent_selection
        if mover in live:
            self._write_agent(b, mover, game.observe(mover), game.infos.get(mover), True)
        self._clear_departed(b, live)

    def _action_for(self, b: int, agent: str, actions: np.ndarray) -> Any:
        """The agent's action, with forbidden choices replaced by its first allowed one."""
        i = self.index[agent]
        chosen = []
        for h, n in enumerate(self.own_heads[i]):
            allowed = self._mask[b, i, self.offsets[h]:self.offsets[h] + n]
            a = int(actions[b, i, h])
            if not (0 <= a < n and allowed[a]):
                a = int(np.argmax(allowed))
            chosen.append(a)
        return chosen[0] if len(chosen) == 1 else np.asarray(chosen, dtype=np.int64)

    def _finish(self, b: int, truncated: bool, episodes: list[EpisodeStats]) -> None:
        sides = np.asarray(self.spec.side_of_agent)
        side_returns = (float(self._returns[b, sides == 0].sum()), float(self._returns[b, sides == 1].sum()))
        episodes.append(EpisodeStats(game=b, winner=winner_from_returns(side_returns), length=int(self._length[b]),
                                     side_returns=side_returns, truncated=truncated))
        self._episode[b] += 1
        self._reset_game(b)

    # --- interface --------------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> StepResult:
        if seed is not None:
            self.seed = seed
        self._episode[:] = 0
        for b in range(self.num_games):
            self._reset_game(b)
        return self._result(np.zeros((self.num_games, self.spec.num_agents), np.float32),
                            np.zeros(self.num_games, bool), np.zeros(self.num_games, bool), [])

    def step(self, actions: np.ndarray) -> StepResult:
        B, A = self.num_games, self.spec.num_agents
        rewards = np.zeros((B, A), dtype=np.float32)
        terminated = np.zeros(B, dtype=bool)
        truncated = np.zeros(B, dtype=bool)
        episodes: list[EpisodeStats] = []
        ended = []
        for b, game in enumerate(self.cores):
            if self.parallel:
                done, cut = self._step_parallel(b, game, actions, rewards)
            else:
                done, cut = self._step_aec(b, game, actions, rewards)
            if done:
                terminated[b], truncated[b] = not cut, cut
                ended.append(b)
        self._length += 1
        self._returns += rewards
        for b in ended:
            self._finish(b, bool(truncated[b]), episodes)
        final = np.where(truncated[:, None, None], self._final, 0.0).astype(np.float32) if truncated.any() else None
        return self._result(rewards, terminated, truncated, episodes, final)

    def _keep_final_views(self, b: int, views: dict[str, Any]) -> None:
        """Each agent's view at a time-limit cut, before the reset (``StepResult.final_obs``)."""
        self._obs[b] = 0.0
        for agent, view in views.items():
            self._write_agent(b, agent, view, None, False)
        self._final[b] = self._obs[b]

    def _step_parallel(self, b, game, actions, rewards) -> tuple[bool, bool]:
        live = list(game.agents)
        obs, rew, terms, truncs, infos = game.step({a: self._action_for(b, a, actions) for a in live})
        for agent, r in rew.items():
            rewards[b, self.index[agent]] = r
        for agent in game.agents:
            self._write_agent(b, agent, obs[agent], infos.get(agent), True)
        self._clear_departed(b, list(game.agents))
        if game.agents and not all(terms.get(a, False) or truncs.get(a, False) for a in game.agents):
            return False, False
        cut = any(truncs.values()) and not any(terms.values())
        if cut:
            self._keep_final_views(b, {a: o for a, o in obs.items() if truncs.get(a, False)})
        return True, cut

    def _step_aec(self, b, game, actions, rewards) -> tuple[bool, bool]:
        game.step(self._action_for(b, game.agent_selection, actions))
        while True:
            for other, r in game.rewards.items():
                rewards[b, self.index[other]] += r
            alive = self._live(game)
            dead_turn = game.terminations[game.agent_selection] or game.truncations[game.agent_selection]
            if not (alive and dead_turn):
                break
            game.step(None)  # an eliminated player's dead step: nobody moves
        if alive:
            self._observe_aec(b, alive)
            return False, False
        cut = any(game.truncations.values()) and not any(game.terminations.values())
        if cut:
            self._keep_final_views(b, {a: game.observe(a) for a in game.agents if game.truncations[a]})
        return True, cut

    def _result(self, rewards, terminated, truncated, episodes, final_obs=None) -> StepResult:
        return StepResult(obs=self._obs.copy(), action_mask=self._mask.copy(), rewards=rewards,
                          terminated=terminated, truncated=truncated, active=self._active.copy(),
                          episodes=episodes, final_obs=final_obs)

    def bot_names(self) -> tuple[str, ...]:
        """``random`` for every game; ``lookahead`` and ``lookahead2`` too for turn-based games with one discrete
        action; ``search1``, ``search2`` and ``search4`` too for connect four (``rapid.envs.c4_search``)."""
        board = not self.parallel and len(self.spec.action_heads) == 1
        if not board:
            return ("random",)
        c4 = bool(self.games) and all(is_connect_four(g) for g in self.games)
        return ("random", *LOOKAHEAD_DEPTHS, *(SEARCH_DEPTHS if c4 else ()))

    def make_bot(self, name: str, seed: int = 0) -> ScriptedBot:
        if name in LOOKAHEAD_DEPTHS and name in self.bot_names():
            return LookaheadBot(self.games, self.spec, seed, name)
        if name in SEARCH_DEPTHS and name in self.bot_names():
            return SearchBot(self.games, self.spec, seed, name)
        return generic_bot(name, self.spec, seed)

    def close(self) -> None:
        for game in self.games:
            game.close()

"""The vectorized multi-agent environment interface: the first stop of the data path (docs/architecture.md).

One object steps ``B`` games at once. Every game has the same ``A`` agents, split into two sides
(``spec.side_of_agent``). Actions are factorized into heads (``spec.action_heads`` gives each head's size);
action masks concatenate the heads' masks along the last axis.

Usage (a rollout worker's loop, with a random player choosing the actions)::

    >>> from rapid.envs.registry import make_env
    >>> env = make_env("moba", num_games=4, seed=0)
    >>> step = env.reset()
    >>> step.obs.shape, step.action_mask.shape, env.spec.action_heads   # [B, A, obs_dim], [B, A, sum(heads)]
    ((4, 2, 101), (4, 2, 27), (6, 8, 13))
    >>> player = env.make_bot("random", seed=1)
    >>> for t in range(600):
    ...     actions = player.act(step)                 # int64 [B, A, heads]
    ...     step = env.step(actions)                   # step.rewards [B, A], step.done [B]
    ...     if step.episodes:                          # games that ended on this step
    ...         break
    >>> ep = step.episodes[0]
    >>> ep.winner in (-1, 0, 1), bool(step.done[ep.game]), ep.length == t + 1
    (True, True, True)

A game that ends is reset on the same step: ``step.obs`` then already shows the new game's first
observation, and ``step.first[b]`` is True on the step after, when its agents act for the first time.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class EnvSpec:
    """Static shape of an environment, the same for every game of it."""

    name: str
    num_agents: int
    """Agents per game, both sides together."""
    obs_dim: int
    action_heads: tuple[int, ...]
    """Size of each factorized action head; the mask of head k is ``mask[..., offset_k:offset_k + n_k]``."""
    side_of_agent: tuple[int, ...]
    """0 or 1 for each agent index."""
    agent_names: tuple[str, ...] = ()
    seconds_per_step: float = 1.0
    """Game time one step covers; turns the discount horizon in seconds into gamma."""
    grid: tuple[int, int, int] | None = None
    """(height, width, channels) when every agent's observation is one channels-last grid (a board, an image),
    flattened: the policy may encode it with convolutions."""
    turn_based: bool = False
    """Players take turns (PettingZoo's AEC games): a policy steps an agent only on its own turns, so the
    agent's memory and samples hold its decisions, not its waits. Otherwise every agent steps every step."""
    clock_in_obs: bool = False
    """The observation shows the game's clock, so a game cut at its time limit ends for the agents as one
    ended by its rules (the moba game: the limit decides the winner). Otherwise a cut is not the agent's
    doing and nothing it could see coming: learning bootstraps from the value of its view at the cut
    (``StepResult.final_obs``)."""

    @property
    def mask_dim(self) -> int:
        return int(sum(self.action_heads))

    def moving(self, active: np.ndarray) -> np.ndarray:
        """bool [B, A] from ``StepResult.active``: the agents a policy steps now (its memory and its samples).
        In a turn-based game the player to move; otherwise all of them, inactive ones too (a dead or stunned
        hero still sees the game go on)."""
        return active if self.turn_based else np.ones_like(active)


@dataclass
class EpisodeStats:
    """Outcome of one finished game."""

    game: int
    """Index of the game slot (0..B-1) in the vector env."""
    winner: int
    """0 or 1 for the winning side, -1 for a draw."""
    length: int
    side_returns: tuple[float, float]
    """Sum of raw rewards of each side's agents over the game."""
    truncated: bool = False
    info: dict = field(default_factory=dict)
    """Game-specific numbers (scores, kills, last hits…), all plain floats."""


@dataclass
class StepResult:
    obs: np.ndarray
    """float32 [B, A, obs_dim], each agent's own (mirrored) view."""
    action_mask: np.ndarray
    """bool [B, A, sum(action_heads)]; every head has at least one allowed action."""
    rewards: np.ndarray
    """float32 [B, A], raw rewards earned by the previous step's actions."""
    terminated: np.ndarray
    """bool [B]: the game ended by its rules on the previous step (and has been reset)."""
    truncated: np.ndarray
    """bool [B]: the game was cut at a time limit on the previous step (and has been reset)."""
    active: np.ndarray
    """bool [B, A]: the agent's action on the next step matters (False for a player waiting for its
    turn, or a dead agent). Learning ignores inactive steps' actions."""
    episodes: list[EpisodeStats] = field(default_factory=list)
    final_obs: np.ndarray | None = None
    """float32 [B, A, obs_dim]: in the games cut at a time limit on the previous step (``truncated``), each
    agent's view at the cut, before the reset (zeros for agents that had left, and in other games); None when
    no game was cut, or the env keeps no such view."""

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated


class VecMultiAgentEnv(abc.ABC):
    """B games of one multi-agent game, stepped together; games reset themselves when they end."""

    spec: EnvSpec
    num_games: int

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> StepResult:
        """Start every game afresh; rewards are zero and no game is done."""

    @abc.abstractmethod
    def step(self, actions: np.ndarray) -> StepResult:
        """Apply int actions [B, A, heads]; actions that the mask forbids are treated as no-ops."""

    def close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Release resources (windows, subprocesses). Default: nothing."""

    def bot_names(self) -> tuple[str, ...]:
        """Scripted players this env offers, weakest first."""
        return ("random",)

    def make_bot(self, name: str, seed: int = 0) -> ScriptedBot:
        """A scripted player by name; KeyError for a name not in ``bot_names()``."""
        return generic_bot(name, self.spec, seed)


def head_offsets(action_heads: tuple[int, ...]) -> np.ndarray:
    """Start of each head's slice in a concatenated mask."""
    return np.concatenate([[0], np.cumsum(action_heads)[:-1]]).astype(np.int64)


def winner_from_returns(side_returns: tuple[float, float]) -> int:
    """The side with the higher return wins; equal returns are a draw."""
    if side_returns[0] > side_returns[1]:
        return 0
    if side_returns[1] > side_returns[0]:
        return 1
    return -1


class ScriptedBot(abc.ABC):
    """A hand-written player. It sees the env (game state included), not only observations.

    >>> from rapid.envs.moba import MobaVecEnv
    >>> env = MobaVecEnv(num_games=2, seed=0)
    >>> bot = env.make_bot("lane", seed=1)
    >>> bot.act(env.reset()).shape       # [B, A, heads]; the caller keeps the rows of the bot's side
    (2, 2, 3)
    """

    name: str

    @abc.abstractmethod
    def act(self, step: StepResult) -> np.ndarray:
        """Actions for every agent of every game (int64 [B, A, heads])."""


class RandomBot(ScriptedBot):
    """Uniform over the allowed actions of every head: works for any env."""

    name = "random"

    def __init__(self, spec: EnvSpec, seed: int = 0):
        self.spec = spec
        self.rng = np.random.default_rng(seed)
        self.offsets = head_offsets(spec.action_heads)

    def act(self, step: StepResult) -> np.ndarray:
        B, A, _ = step.action_mask.shape
        out = np.zeros((B, A, len(self.spec.action_heads)), dtype=np.int64)
        for h, (off, n) in enumerate(zip(self.offsets, self.spec.action_heads)):
            mask = step.action_mask[:, :, off:off + n]
            # Random keys, forbidden entries pushed below every allowed one: argmax is a uniform pick.
            keys = self.rng.random(mask.shape) + mask
            out[:, :, h] = keys.argmax(-1)
        return out


def generic_bot(name: str, spec: EnvSpec, seed: int = 0) -> ScriptedBot:
    """Bots every env has; envs add their own through ``make_bot``."""
    if name == "random":
        return RandomBot(spec, seed)
    raise KeyError(name)

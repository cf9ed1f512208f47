"""The rollout worker: plays B games with the latest policy against sampled opponents and turns the
learner's experience into samples.

Usage::

    >>> from rapid.config import ModelConfig, RolloutConfig
    >>> from rapid.envs.registry import make_env
    >>> from rapid.roles.startup import build_policy
    >>> cfg = Config(model=ModelConfig(hidden=16, lstm=16), rollout=RolloutConfig(bptt=4, samples_per_segment=2))
    >>> env = make_env(cfg.env.name, num_games=2)                     # connect four: 2 agents a game
    >>> policy = build_policy(cfg, env.spec)
    >>> worker = RolloutWorker(env, policy, RolloutSettings.of(cfg, env.spec), SelfPlay(), seed=0)
    >>> worker.set_params(3, policy.tensors())                        # a published version's weights
    >>> segments = []
    >>> for _ in range(4):                                            # while running
    ...     segment = worker.collect()      # samples of bptt decisions, GAE done, stamped with version
    ...     segments.append(segment)        # a worker hands it to its Uploader: uploader.add(segment)
    >>> batch = {k: np.concatenate([s.arrays[k] for s in segments]) for k in segments[0].arrays}
    >>> len(batch["obs"]) > 0, batch["obs"].shape[1:], set(batch["version"].tolist())   # [S, T, obs]
    (True, (4, 84), {3})

A sample holds one agent's decisions (``rapid.decisions``): in a turn-based game its own moves only, with the
opponent's replies folded into its rewards and discount. An opponent is fixed for a whole game and its LSTM
state starts at zero with the game; the learner's side is drawn per game so a policy learns both sides of
asymmetric games.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from rapid.config import Config
from rapid.decisions import Decisions
from rapid.envs.base import EnvSpec, ScriptedBot, StepResult, VecMultiAgentEnv
from rapid.league.sampling import LATEST
from rapid.opt import losses
from rapid.opt.model import Policy


@dataclass(frozen=True)
class RolloutSettings:
    """The worker's view of the config: values from the sections that hold the defaults and the checks
    (``rollout``, ``ppo``) and the env's step length, built in one place (``of``); no defaults of its own."""

    bptt: int
    segment_steps: int
    gamma: float
    gae_lambda: float
    team_spirit: float
    zero_sum: bool

    @classmethod
    def of(cls, cfg: Config, spec: EnvSpec) -> RolloutSettings:
        d = cfg.derive(spec.seconds_per_step)
        return cls(bptt=cfg.rollout.bptt, segment_steps=d.segment_steps, gamma=d.gamma,
                   gae_lambda=cfg.ppo.gae_lambda, team_spirit=cfg.ppo.team_spirit, zero_sum=cfg.ppo.zero_sum)


def stamped_team_spirit(meta: Mapping | None, default: float) -> float:
    """The team spirit a params object's meta names (the optimizer's schedule), else ``default``: a value that
    is not a number within [0, 1] is not trusted (stored objects may be hostile).

    >>> stamped_team_spirit({"team_spirit": 0.6}, 0.3), stamped_team_spirit({"team_spirit": "1"}, 0.3)
    (0.6, 0.3)
    """
    value = (meta or {}).get("team_spirit")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
        return float(value)
    return default


@dataclass
class Opponent:
    """Who plays the other side of a game: the latest policy itself, a past policy, or a bot."""

    id: str
    policy: Policy | None = None
    bot: ScriptedBot | None = None


class OpponentSource(Protocol):
    def choose(self, rng: np.random.Generator) -> Opponent:
        """The opponent for one new game."""


class SelfPlay:
    """Every game against the latest policy."""

    def choose(self, rng: np.random.Generator) -> Opponent:
        return Opponent(LATEST)


@dataclass
class Segment:
    arrays: dict[str, np.ndarray]
    opponents: list[str]
    episodes: list[dict] = field(default_factory=list)
    env_steps: int = 0


class RolloutWorker:
    def __init__(self, env: VecMultiAgentEnv, policy: Policy, settings: RolloutSettings,
                 opponents: OpponentSource | None = None, seed: int = 0):
        self.env, self.policy, self.settings = env, policy, settings
        self.opponents = opponents or SelfPlay()
        self.rng = np.random.default_rng(seed)
        spec = env.spec
        self.B, self.A = env.num_games, spec.num_agents
        self.sides = np.asarray(spec.side_of_agent)
        self.version = -1
        self.team_spirit = settings.team_spirit
        self.step_result: StepResult = env.reset(seed=seed)
        self.state = policy.initial_state(self.B * self.A)
        self.decisions = Decisions(self.B * self.A, settings.segment_steps, settings.bptt, spec.obs_dim,
                                   spec.mask_dim, len(spec.action_heads), policy.lstm_size)
        self.learner_side = self.rng.integers(0, 2, self.B)
        self.game_opponent = [self.opponents.choose(self.rng) for _ in range(self.B)]
        self._control: list[tuple[Opponent | None, torch.Tensor]] | None = None

    def set_params(self, version: int, tensors: dict[str, np.ndarray], meta: Mapping | None = None) -> None:
        """Play ``version`` from now on; its ``meta`` may carry the team spirit to mix rewards with."""
        self.policy.load_tensors(tensors)
        self.version = version
        self.team_spirit = stamped_team_spirit(meta, self.settings.team_spirit)

    def _controllers(self) -> list[tuple[Opponent | None, torch.Tensor]]:
        """Who acts for which agent: the rows of every controller (None for the learner). It only changes when a
        game ends, so it is kept until then."""
        if self._control is None:
            vs_latest = np.array([o.id == LATEST for o in self.game_opponent])
            own = (self.sides[None, :] == self.learner_side[:, None]) | vs_latest[:, None]
            rows: dict[int, tuple[Opponent | None, list[int]]] = {-1: (None, list(np.flatnonzero(own.ravel())))}
            for b, opp in enumerate(self.game_opponent):
                if opp.id != LATEST:
                    rows.setdefault(id(opp), (opp, []))[1].extend(b * self.A + np.flatnonzero(~own[b]))
            groups = [(opp, torch.as_tensor(np.asarray(r, dtype=np.int64))) for opp, r in rows.values() if len(r)]
            self._control = groups
        return self._control

    def _act(self, step: StepResult, moving: np.ndarray) -> np.ndarray:
        """Every controller's actions; the learner's decisions (its rows that move) are recorded. A policy
        steps only the rows that move, so their memory holds only the steps they decide."""
        B, A = self.B, self.A
        H = len(self.env.spec.action_heads)
        obs = torch.from_numpy(step.obs.reshape(B * A, -1))
        mask = torch.from_numpy(step.action_mask.reshape(B * A, -1))
        actions = np.zeros((B * A, H), dtype=np.int64)
        h, c = self.state
        for opp, rows in self._controllers():
            if opp is not None and opp.bot is not None:
                actions[rows.numpy()] = opp.bot.act(step).reshape(B * A, H)[rows.numpy()]
                continue
            rows = rows[torch.from_numpy(moving[rows.numpy()])]
            if not len(rows):
                continue
            idx = rows.numpy()
            if opp is None:
                net = self.policy
            elif opp.policy is not None:
                net = opp.policy
            else:  # the opponent sources give every past opponent a policy or a bot
                raise RuntimeError(f"opponent {opp.id} has neither a policy nor a bot")
            inputs, before = (obs[rows], mask[rows]), (h[rows], c[rows])  # indexing copies: read once, kept
            out = net.act(*inputs, before)
            actions[idx] = out.actions.numpy()
            h[rows], c[rows] = out.state
            if opp is None:
                self.decisions.record(idx, inputs[0].numpy(), inputs[1].numpy(), actions[idx], out.logp.numpy(),
                                      out.value.numpy(), step.active.reshape(B * A)[idx], before[0].numpy(),
                                      before[1].numpy(), version=self.version,
                                      opponents=[self.game_opponent[r // A].id for r in idx])
        return actions

    def _values_at_cuts(self, nxt: StepResult) -> np.ndarray | None:
        """[rows]: the learner's value of its view where a game was cut at a time limit the agent could not see
        (``EnvSpec.clock_in_obs``), from its memory before the reset; 0 elsewhere. None if nothing was cut."""
        if nxt.final_obs is None or self.env.spec.clock_in_obs:
            return None
        R = self.B * self.A
        values = np.zeros(R, np.float32)
        rows = np.flatnonzero(np.repeat(nxt.truncated, self.A) & self.decisions.in_game)
        if len(rows):
            index = torch.from_numpy(rows)
            views = torch.from_numpy(nxt.final_obs.reshape(R, -1)[rows])
            values[rows] = self.policy.value(views, (self.state[0][index], self.state[1][index])).numpy()
        return values

    def _game_over(self, b: int, ep, episodes: list[dict]) -> None:
        opp = self.game_opponent[b]
        side = int(self.learner_side[b])
        winner = "draw" if ep.winner < 0 else ("learner" if ep.winner == side else "opponent")
        episodes.append({"learner_version": int(self.version), "opponent": opp.id, "learner_side": side,
                         "winner": winner, "length": int(ep.length),
                         "learner_return": float(ep.side_returns[side])})
        self.learner_side[b] = self.rng.integers(0, 2)
        self.game_opponent[b] = self.opponents.choose(self.rng)
        self._control = None
        rows = slice(b * self.A, (b + 1) * self.A)
        self.state[0][rows] = 0.0
        self.state[1][rows] = 0.0

    def collect(self) -> Segment:
        """Play ``segment_steps`` steps and return the learner's complete segments as samples with advantages
        and returns (rows whose segment is not complete yet carry it over to the next call)."""
        s = self.settings
        R = self.B * self.A
        parts: list[dict[str, np.ndarray]] = [self.decisions.take(np.zeros(0, np.int64), s.gamma, s.gae_lambda)]
        episodes: list[dict] = []
        for _ in range(s.segment_steps):
            step = self.step_result
            moving = self.env.spec.moving(step.active).reshape(R)
            actions = self._act(step, moving)
            nxt = self.env.step(actions.reshape(self.B, self.A, -1))
            rewards = losses.mix_rewards(nxt.rewards, self.sides, self.team_spirit, s.zero_sum)
            self.decisions.after_step(rewards.reshape(R), np.repeat(nxt.done, self.A), self._values_at_cuts(nxt))
            for ep in nxt.episodes:
                self._game_over(ep.game, ep, episodes)
            self.step_result = nxt
            complete = self.decisions.complete()
            if len(complete):
                parts.append(self.decisions.take(complete, s.gamma, s.gae_lambda))
        arrays = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
        ids, index = np.unique(arrays["opponent"], return_inverse=True)
        arrays["opponent"] = index.astype(np.int32).reshape(-1)
        return Segment(arrays, ids.tolist(), episodes, s.segment_steps * R)

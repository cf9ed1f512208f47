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
    >>> for _ in range(2):                                            # while running
    ...     segment = worker.collect()      # samples of bptt steps, GAE done, stamped with version
    ...     segments.append(segment)        # a worker hands it to its Uploader: uploader.add(segment)
    >>> segment.arrays["obs"].shape, set(segment.arrays["version"].tolist()), segment.opponents   # [S, T, obs]
    ((8, 4, 84), {3}, ['latest'])

An opponent is fixed for a whole game and its LSTM state starts at zero with the game; the learner's
side is drawn per game so a policy learns both sides of asymmetric games.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from rapid.config import Config
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
        self.step_result: StepResult = env.reset(seed=seed)
        self.state = policy.initial_state(self.B * self.A)
        self.first = np.ones(self.B, dtype=bool)
        self.learner_side = self.rng.integers(0, 2, self.B)
        self.game_opponent = [self.opponents.choose(self.rng) for _ in range(self.B)]
        self._control: tuple[np.ndarray, list[tuple[Opponent | None, torch.Tensor]]] | None = None

    def set_params(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        self.policy.load_tensors(tensors)
        self.version = version

    def _controllers(self) -> tuple[np.ndarray, list[tuple[Opponent | None, torch.Tensor]]]:
        """Who acts for which agent: bool [B, A] of the learner's agents, and the rows of every controller
        (None for the learner). It only changes when a game ends, so it is kept until then."""
        if self._control is None:
            vs_latest = np.array([o.id == LATEST for o in self.game_opponent])
            own = (self.sides[None, :] == self.learner_side[:, None]) | vs_latest[:, None]
            rows: dict[int, tuple[Opponent | None, list[int]]] = {-1: (None, list(np.flatnonzero(own.ravel())))}
            for b, opp in enumerate(self.game_opponent):
                if opp.id != LATEST:
                    rows.setdefault(id(opp), (opp, []))[1].extend(b * self.A + np.flatnonzero(~own[b]))
            groups = [(opp, torch.as_tensor(np.asarray(r, dtype=np.int64))) for opp, r in rows.values() if len(r)]
            self._control = (own, groups)
        return self._control

    def _owners(self) -> np.ndarray:
        """bool [B, A]: agents the learner's policy controls this step."""
        return self._controllers()[0]

    def _act(self, step: StepResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        B, A = self.B, self.A
        H = len(self.env.spec.action_heads)
        obs = torch.from_numpy(step.obs.reshape(B * A, -1))
        mask = torch.from_numpy(step.action_mask.reshape(B * A, -1))
        actions = np.zeros((B * A, H), dtype=np.int64)
        logp = np.zeros(B * A, dtype=np.float32)
        value = np.zeros(B * A, dtype=np.float32)
        h, c = self.state
        for opp, rows in self._controllers()[1]:
            idx = rows.numpy()
            if opp is not None and opp.bot is not None:
                actions[idx] = opp.bot.act(step).reshape(B * A, H)[idx]
                continue
            net = self.policy if opp is None else opp.policy
            out = net.act(obs[rows], mask[rows], (h[rows], c[rows]))
            actions[idx] = out.actions.numpy()
            h[rows], c[rows] = out.state
            if opp is None:
                logp[idx] = out.logp.numpy()
                value[idx] = out.value.numpy()
        return actions, logp, value

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
        """Play ``segment_steps`` steps and return the learner's samples with advantages and returns."""
        s = self.settings
        T, R, T_b = s.segment_steps, self.B * self.A, s.bptt
        rec = {name: [] for name in ("obs", "mask", "actions", "logp", "values", "rewards", "dones", "active",
                                     "own", "first")}
        h0, c0, opp_at_start = [], [], []
        episodes: list[dict] = []
        for t in range(T):
            step = self.step_result
            if t % T_b == 0:
                h0.append(self.state[0].clone().numpy())
                c0.append(self.state[1].clone().numpy())
                opp_at_start.append([o.id for o in self.game_opponent])
            own = self._owners()
            actions, logp, value = self._act(step)
            nxt = self.env.step(actions.reshape(self.B, self.A, -1))
            rewards = losses.mix_rewards(nxt.rewards, self.sides, s.team_spirit, s.zero_sum)
            for name, val in (("obs", step.obs.reshape(R, -1)), ("mask", step.action_mask.reshape(R, -1)),
                              ("actions", actions), ("logp", logp), ("values", value),
                              ("rewards", rewards.reshape(R)), ("dones", np.repeat(nxt.done, self.A)),
                              ("active", step.active.reshape(R)), ("own", own.reshape(R)),
                              ("first", np.repeat(self.first, self.A))):
                rec[name].append(val)
            for ep in nxt.episodes:
                self._game_over(ep.game, ep, episodes)
            self.first = nxt.done.copy()
            self.step_result = nxt
        last_obs = torch.from_numpy(self.step_result.obs.reshape(R, -1))
        last_value = self.policy.value(last_obs, self.state).numpy()
        seg = {k: np.stack(v) for k, v in rec.items()}
        # A row's bootstrap only counts if the learner still controls it after the segment.
        last_value = last_value * self._owners().reshape(R)
        adv, ret = losses.gae(seg["rewards"], seg["values"], seg["dones"], last_value, s.gamma, s.gae_lambda)
        seg["advantages"], seg["returns"] = adv, ret
        return self._cut(seg, np.stack(h0), np.stack(c0), opp_at_start, episodes, T * R)

    def _cut(self, seg, h0, c0, opp_at_start, episodes, env_steps) -> Segment:
        """[T, R, ...] segment arrays → samples [n·R, bptt, ...], keeping those the learner played."""
        T_b = self.settings.bptt
        T, R = seg["rewards"].shape
        n = T // T_b

        def chunks(x: np.ndarray) -> np.ndarray:
            x = x.reshape(n, T_b, R, *x.shape[2:])
            return np.moveaxis(x, 2, 1).reshape(n * R, T_b, *x.shape[3:])

        names = ("obs", "mask", "actions", "logp", "values", "advantages", "returns", "active", "own", "first")
        arrays = {k: chunks(seg[k]) for k in names}
        arrays["active"] = arrays["active"] & arrays["own"]
        arrays["h0"] = h0.reshape(n * R, -1)
        arrays["c0"] = c0.reshape(n * R, -1)
        ids = sorted({o for row in opp_at_start for o in row})
        per_game = np.array([[ids.index(o) for o in row] for row in opp_at_start], dtype=np.int32)
        arrays["opponent"] = np.repeat(per_game, self.A, axis=1).reshape(n * R)
        arrays["version"] = np.full(n * R, self.version, dtype=np.int64)
        keep = arrays["own"].any(1)
        arrays = {k: np.ascontiguousarray(v[keep]) for k, v in arrays.items()}
        for k in ("obs", "logp", "values", "advantages", "returns", "h0", "c0"):
            arrays[k] = arrays[k].astype(np.float32, copy=False)
        return Segment(arrays, ids, episodes, env_steps)

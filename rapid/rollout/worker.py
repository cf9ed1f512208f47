"""The rollout worker: plays B games with the latest policy against sampled opponents and turns the
learner's experience into samples.

Usage::

    >>> from rapid.run.config import ModelConfig, RolloutConfig
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

A sample holds one agent's decisions (``rapid.rollout.decisions``): in a turn-based game its own moves only, with the
opponent's replies folded into its rewards and discount. An opponent is fixed for a whole game and its LSTM
state starts at zero with the game; the learner's side is drawn per game so a policy learns both sides of
asymmetric games.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from rapid.envs.base import EnvSpec, ScriptedBot, StepResult, VecMultiAgentEnv
from rapid.league.sampling import LATEST
from rapid.opt import losses
from rapid.opt.model import Policy
from rapid.rollout.decisions import Decisions
from rapid.rollout.inference import ActRequest, Group, Inference, InferenceLost, LocalInference
from rapid.run.config import Config

ACTION_STREAM = 0x5A17
log = logging.getLogger(__name__)


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


def stamped_share(meta: Mapping | None, key: str, default: float) -> float:
    """The share (team spirit, bot share) a params object's meta names under ``key`` (the optimizer's schedule),
    else ``default``: a value that is not a number within [0, 1] is not trusted (stored objects may be hostile).

    >>> stamped_share({"team_spirit": 0.6}, "team_spirit", 0.3), stamped_share({"team_spirit": "1"}, "team_spirit", 0.3)
    (0.6, 0.3)
    """
    value = (meta or {}).get(key)
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

    def follow(self, meta: Mapping | None) -> None:
        """Take what the version now played says of the games to come (its meta: the share against bots)."""


class SelfPlay:
    """Every game against the latest policy."""

    def choose(self, rng: np.random.Generator) -> Opponent:
        return Opponent(LATEST)

    def follow(self, meta: Mapping | None) -> None:
        """Self-play has nothing to schedule."""


@dataclass
class Segment:
    arrays: dict[str, np.ndarray]
    opponents: list[str]
    episodes: list[dict] = field(default_factory=list)
    env_steps: int = 0


class RolloutWorker:
    """Plays its env's B games; the policy runs where ``inference`` says (default: on this core). A step is two
    halves, :meth:`begin_step` (ask for the actions) and :meth:`finish_step` (take them, step the env, record), so
    that :class:`Lanes` can step one group of games while another's actions are being decided."""

    def __init__(self, env: VecMultiAgentEnv, policy: Policy, settings: RolloutSettings,
                 opponents: OpponentSource | None = None, seed: int = 0, inference: Inference | None = None):
        self.env, self.policy, self.settings = env, policy, settings
        self.opponents = opponents or SelfPlay()
        self.rng = np.random.default_rng(seed)
        self.draws = np.random.default_rng((seed, ACTION_STREAM))
        """The uniforms that pick sampled actions: one stream per worker, whichever process runs the policy."""
        spec = env.spec
        self.B, self.A = env.num_games, spec.num_agents
        self.R, self.H = self.B * self.A, len(spec.action_heads)
        self.sides = np.asarray(spec.side_of_agent)
        self.version = -1
        self.team_spirit = settings.team_spirit
        self.inference = inference or LocalInference(policy, self.R)
        self.restarts = 0
        """Times the games restarted because the node's inference server was lost."""
        self._new_games(seed)
        self._pending: tuple[np.ndarray, list[Group], int | None] | None = None
        self._parts: list[dict[str, np.ndarray]] = []
        self._episodes: list[dict] = []

    def _new_games(self, seed: int | None) -> None:
        spec, s = self.env.spec, self.settings
        self.step_result: StepResult = self.env.reset(seed=seed)
        self.decisions = Decisions(self.R, s.segment_steps, s.bptt, spec.obs_dim, spec.mask_dim, self.H,
                                   self.policy.lstm_size)
        self.learner_side = self.rng.integers(0, 2, self.B)
        # Before the first version the games' opponents wait for it: it may name them (a warm-up's bots).
        self.game_opponent = self._draw_opponents() if self.version >= 0 else [Opponent(LATEST)] * self.B
        self._control: list[tuple[Opponent | None, np.ndarray]] | None = None

    def _draw_opponents(self) -> list[Opponent]:
        return [self.opponents.choose(self.rng) for _ in range(self.B)]

    def set_params(self, version: int, tensors: dict[str, np.ndarray], meta: Mapping | None = None) -> None:
        """Play ``version`` from now on; its ``meta`` may carry the team spirit to mix rewards with, and the share
        of new games to play against bots."""
        self.inference.set_params(version, tensors)
        first, self.version = self.version < 0, version
        self.team_spirit = stamped_share(meta, "team_spirit", self.settings.team_spirit)
        self.opponents.follow(meta)
        if first:  # no game has begun: they take the opponents this version names
            self.game_opponent, self._control = self._draw_opponents(), None

    def _controllers(self) -> list[tuple[Opponent | None, np.ndarray]]:
        """Who acts for which agent: the rows of every controller (None for the learner). It only changes when a
        game ends, so it is kept until then."""
        if self._control is None:
            vs_latest = np.array([o.id == LATEST for o in self.game_opponent])
            own = (self.sides[None, :] == self.learner_side[:, None]) | vs_latest[:, None]
            rows: dict[int, tuple[Opponent | None, list[int]]] = {-1: (None, list(np.flatnonzero(own.ravel())))}
            for b, opp in enumerate(self.game_opponent):
                if opp.id != LATEST:
                    rows.setdefault(id(opp), (opp, []))[1].extend(b * self.A + np.flatnonzero(~own[b]))
            self._control = [(opp, np.asarray(r, dtype=np.int64)) for opp, r in rows.values() if len(r)]
        return self._control

    def begin_step(self) -> None:
        """Ask for the actions of the rows that move now (bots act at once)."""
        try:
            self._begin()
        except InferenceLost as e:
            self._restart(e)
            self._begin()

    def _begin(self) -> None:
        step, R = self.step_result, self.R
        moving = self.env.spec.moving(step.active).reshape(R)
        actions = np.zeros((R, self.H), dtype=np.int64)
        groups: list[Group] = []
        learner = None
        for opp, rows in self._controllers():
            if opp is not None and opp.bot is not None:
                actions[rows] = opp.bot.act(step).reshape(R, self.H)[rows]
                continue
            rows = rows[moving[rows]]
            if not len(rows):
                continue
            if opp is None:
                learner = len(groups)
            groups.append(Group(LATEST, rows) if opp is None else Group(opp.id, rows, opp.policy))
        uniforms = self.draws.random((R, self.H), dtype=np.float32)
        self.inference.submit(ActRequest(step.obs.reshape(R, -1), step.action_mask.reshape(R, -1), uniforms, groups))
        self._pending = (actions, groups, learner)

    def finish_step(self) -> None:
        """Take the actions, step the env and record the learner's decisions; complete segments become samples.
        If the node's server was lost, the games restart instead (their states are gone)."""
        if self._pending is None:
            return
        try:
            self._finish()
        except InferenceLost as e:
            self._restart(e)

    def _finish(self) -> None:
        assert self._pending is not None
        actions, groups, learner = self._pending
        self._pending = None
        result = self.inference.result()
        step, R, s = self.step_result, self.R, self.settings
        start = 0
        for i, group in enumerate(groups):
            part = slice(start, start + len(group.rows))
            start = part.stop
            actions[group.rows] = result.actions[part]
            if i == learner:
                idx = group.rows
                self.decisions.record(idx, step.obs.reshape(R, -1)[idx], step.action_mask.reshape(R, -1)[idx],
                                      result.actions[part], result.logp[part], result.value[part],
                                      step.active.reshape(R)[idx], result.h_before[part], result.c_before[part],
                                      version=result.version, opponents=[self.game_opponent[r // self.A].id
                                                                         for r in idx])
        nxt = self.env.step(actions.reshape(self.B, self.A, -1))
        rewards = losses.mix_rewards(nxt.rewards, self.sides, self.team_spirit, s.zero_sum)
        self.decisions.after_step(rewards.reshape(R), np.repeat(nxt.done, self.A), self._values_at_cuts(nxt))
        for ep in nxt.episodes:
            self._game_over(ep.game, ep, self._episodes)
        self.step_result = nxt
        complete = self.decisions.complete()
        if len(complete):
            self._parts.append(self.decisions.take(complete, s.gamma, s.gae_lambda))

    def _restart(self, why: Exception) -> None:
        """The states of every running game are gone with the server: start new games. Decisions not yet in a
        complete segment are dropped, so no sample mixes states or versions across the loss."""
        self.restarts += 1
        log.warning("the node's inference server was lost (%s): this worker's games start again", why)
        self._pending = None
        self._new_games(int(self.rng.integers(1 << 31)))
        self.inference.reset(np.arange(self.R))

    def _values_at_cuts(self, nxt: StepResult) -> np.ndarray | None:
        """[rows]: the learner's value of its view where a game was cut at a time limit the agent could not see
        (``EnvSpec.clock_in_obs``), from its memory before the reset; 0 elsewhere. None if nothing was cut."""
        if nxt.final_obs is None or self.env.spec.clock_in_obs:
            return None
        values = np.zeros(self.R, np.float32)
        rows = np.flatnonzero(np.repeat(nxt.truncated, self.A) & self.decisions.in_game)
        if len(rows):
            values[rows] = self.inference.value(rows, nxt.final_obs.reshape(self.R, -1)[rows])
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
        self.inference.reset(np.arange(b * self.A, (b + 1) * self.A))

    def start_segment(self) -> None:
        s = self.settings
        self._parts = [self.decisions.take(np.zeros(0, np.int64), s.gamma, s.gae_lambda)]
        self._episodes = []

    def end_segment(self) -> Segment:
        arrays = {k: np.concatenate([part[k] for part in self._parts]) for k in self._parts[0]}
        ids, index = np.unique(arrays["opponent"], return_inverse=True)
        arrays["opponent"] = index.astype(np.int32).reshape(-1)
        segment = Segment(arrays, ids.tolist(), self._episodes, self.settings.segment_steps * self.R)
        self._parts, self._episodes = [], []
        return segment

    def collect(self) -> Segment:
        """Play ``segment_steps`` steps and return the learner's complete segments as samples with advantages
        and returns (rows whose segment is not complete yet carry it over to the next call)."""
        self.start_segment()
        for _ in range(self.settings.segment_steps):
            self.begin_step()
            self.finish_step()
        return self.end_segment()


def merged(segments: list[Segment]) -> Segment:
    """One segment of several lanes' (their opponent indices renumbered into one list of ids)."""
    ids = sorted({i for s in segments for i in s.opponents})
    parts = []
    for s in segments:
        part = dict(s.arrays)
        remap = np.asarray([ids.index(i) for i in s.opponents], dtype=np.int32)
        part["opponent"] = remap[part["opponent"]] if len(remap) else part["opponent"]
        parts.append(part)
    arrays = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return Segment(arrays, ids, [e for s in segments for e in s.episodes], sum(s.env_steps for s in segments))


class Lanes:
    """A worker's games in groups (lanes), each with an env of its own, stepped in turn: while one lane's env
    steps, the node's server decides the next lane's actions. Used as one worker (``collect``, ``set_params``,
    ``version``)."""

    def __init__(self, lanes: list[RolloutWorker]):
        self.lanes = lanes

    @property
    def version(self) -> int:
        return min(w.version for w in self.lanes)

    @property
    def restarts(self) -> int:
        return sum(w.restarts for w in self.lanes)

    def set_params(self, version: int, tensors: dict[str, np.ndarray], meta: Mapping | None = None) -> None:
        for w in self.lanes:
            w.set_params(version, tensors, meta)

    def collect(self) -> Segment:
        steps = self.lanes[0].settings.segment_steps
        for w in self.lanes:
            w.start_segment()
            w.begin_step()
        for t in range(steps):
            for w in self.lanes:
                w.finish_step()
                if t + 1 < steps:
                    w.begin_step()
        return merged([w.end_segment() for w in self.lanes])

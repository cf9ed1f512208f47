"""rapid's own ``RolloutWorker`` in the scale model (``--real-workers N``: the first N workers), on a stand-in
game of configurable cost.

The stand-in ``SimSource`` makes samples itself, so a bug in the worker's own bookkeeping (which decisions make
a sample, where a segment is cut, the version a sample is stamped with) cannot show. Here the worker is
rapid's: its ``Decisions``, GAE, segment cuts and version stamps, its ``LocalInference`` running a small real
``Policy``, and its games' opponents drawn through the real ``OpponentSampler``. What stands in:

- the game (:class:`IdGames`): B games of two agents (one a side) that end every ``game_steps`` steps, random
  rewards; each agent's view carries a fleet-wide id in ``obs[..., 0]`` (exact in float32 below 2**24), so
  every decision can be followed into the sample that holds it. A segment costs ``segment_s`` of simulated
  time, whatever the policy's real CPU (the model's own cost);
- the weights: the learner is a stand-in whose weights only say its update count, so the worker plays a fixed
  small policy, stamped with the version it was handed (the check of the handed weights is ``SimSource``'s);
- past opponents play that fixed policy (their snapshot is still read and checked), bots play at random.

An observer beside the worker (:class:`RecordingInference`, rapid's ``LocalInference`` that notes what it is
asked) records which decisions were the learner's and which version made each one; every segment the worker
hands to its uploader is checked against it (:meth:`RealSource.decision_figures`): a learner decision in no
sample before the row's last one handed over, in two, or a decision not the learner's; a sample whose version
is not the oldest of its decisions'. The samples then go through the same ledger as the stand-in's.
"""

from __future__ import annotations

import numpy as np
import torch

from rapid.envs.base import EnvSpec, EpisodeStats, StepResult, VecMultiAgentEnv, winner_from_returns
from rapid.errors import FormatError
from rapid.infra.store import StoreError
from rapid.league.sampling import LATEST
from rapid.roles.startup import build_policy
from rapid.rollout.inference import ActRequest, LocalInference
from rapid.rollout.worker import Opponent, RolloutSettings, RolloutWorker, Segment

from .settings import REAL_GAMES, SHAPE
from .standins import SAMPLE_ID, check_weights

EXACT_IDS = 1 << 24  # float32 holds integers exactly below this


class IdGames(VecMultiAgentEnv):
    """B games of two agents, one a side, each ending after ``game_steps`` steps (staggered at the start);
    every agent's view of every step carries a new fleet-wide id (``next_ids``) in ``obs[..., 0]``."""

    spec = EnvSpec("fleet-ids", 2, SHAPE.obs_dim, (SHAPE.mask_dim,), (0, 1))

    def __init__(self, num_games: int, game_steps: int, next_ids, rng: np.random.Generator):
        self.num_games, self.game_steps, self.next_ids, self.rng = num_games, game_steps, next_ids, rng
        self.age = np.zeros(num_games, np.int64)
        self.ended = 0  # games finished: what the worker's segments must carry, counted where they end
        self.returns = np.zeros((num_games, 2), np.float64)
        self.views: list[list[list[int]]] = [[[], []] for _ in range(num_games)]  # game → agent → its views' ids
        self.finished: list[list[list[int]]] = []  # the views of each game ended, in the order they ended

    def _result(self, rewards, done, episodes) -> StepResult:
        B, A = self.num_games, 2
        ids = self.next_ids(B * A)
        if ids[-1] >= EXACT_IDS:
            raise ValueError("sample ids past float32's exact range: run --worker real on a smaller fleet")
        obs = np.zeros((B, A, SHAPE.obs_dim), np.float32)
        obs[..., 0] = ids.reshape(B, A)
        for b, pair in enumerate(ids.reshape(B, A).tolist()):
            for a, i in enumerate(pair):
                self.views[b][a].append(i)
        return StepResult(obs, np.ones((B, A, SHAPE.mask_dim), bool), rewards, done, np.zeros(B, bool),
                          np.ones((B, A), bool), episodes)

    def reset(self, seed: int | None = None) -> StepResult:
        self.age = self.rng.integers(0, self.game_steps, self.num_games)
        self.returns[:] = 0.0
        self.views = [[[], []] for _ in range(self.num_games)]  # games begun afresh: none of them ended
        return self._result(np.zeros((self.num_games, 2), np.float32), np.zeros(self.num_games, bool), [])

    def step(self, actions: np.ndarray) -> StepResult:
        rewards = self.rng.normal(0.0, 0.1, (self.num_games, 2)).astype(np.float32)
        self.age += 1
        self.returns += rewards
        done = self.age >= self.game_steps
        episodes = []
        for b in np.flatnonzero(done).tolist():
            sides = (float(self.returns[b, 0]), float(self.returns[b, 1]))
            episodes.append(EpisodeStats(b, winner_from_returns(sides), int(self.age[b]), sides))
            self.age[b], self.returns[b] = 0, 0.0
            self.finished.append(self.views[b])
            self.views[b] = [[], []]  # the views returned below are the next game's
        self.ended += len(episodes)
        return self._result(rewards, done, episodes)


class RecordingInference(LocalInference):
    """rapid's local inference, noting for every decision the learner's policy is asked for (the ``LATEST``
    group: every row the learner plays) its row and the version that decides it."""

    def __init__(self, policy, rows: int):
        super().__init__(policy, rows)
        self.learner_ids: list[list[int]] = [[] for _ in range(rows)]  # row → ids of its learner decisions
        self.decided_by: dict[int, int] = {}  # decision id → the version that made it
        self.group_of: dict[int, str] = {}  # decision id → the policy asked for it (LATEST or a snapshot's id)

    def submit(self, request: ActRequest) -> None:
        for group in request.groups:
            ids = request.obs[group.rows, 0].astype(np.int64).tolist()
            self.group_of.update(dict.fromkeys(ids, group.key))
            if group.key == LATEST:
                for row, i in zip(group.rows.tolist(), ids):
                    self.learner_ids[row].append(i)
                    self.decided_by[i] = self.version
        super().submit(request)


class PoolOpponents:
    """The worker's opponents, drawn by rapid's ``OpponentSampler`` from the pool: a past snapshot is read and
    checked as a worker would, then played by ``past`` (the fixed policy); a bot plays at random."""

    def __init__(self, sampler, env: VecMultiAgentEnv, past, on_failure):
        self.sampler, self.env, self.past, self.on_failure = sampler, env, past, on_failure

    def choose(self, rng: np.random.Generator) -> Opponent:
        g = self.sampler.choose(rng)
        if g.kind == "latest":
            return Opponent(LATEST)
        if g.kind == "bot":
            return Opponent(g.id, bot=self.env.make_bot("random", seed=int(rng.integers(1 << 31))))
        try:
            check_weights(self.sampler.load_params(g.id).tensors)
        except (StoreError, FormatError, ValueError, KeyError):  # rapid's worker plays the latest instead
            self.on_failure()
            return Opponent(LATEST)
        return Opponent(g.id, policy=self.past)

    def follow(self, meta) -> None:
        """The stand-in's versions carry no bot schedule to follow."""


class RealSource:
    """The worker's place in ``RolloutLoop``, filled by rapid's ``RolloutWorker`` (``collect``, ``set_params``,
    ``version``), with the figures ``SimSource`` keeps: ``produced`` (each sample's id, in the order handed over),
    ``swaps``, ``games``, ``wrong_weights``."""

    def __init__(self, clock, s, cfg, sampler, next_ids, on_snapshot_failure, seed: int):
        self.clock, self.sampler, self.segment_s = clock, sampler, s.segment_s
        rng = np.random.default_rng(seed)
        torch.set_num_threads(cfg.rollout.torch_threads)  # as run_rollout: a worker's policy on its one core
        per_segment = s.games_per_upload * s.segment_s / s.upload_s  # games a segment, as SimSource plays them
        env = IdGames(REAL_GAMES, max(2, round(REAL_GAMES * cfg.rollout.bptt / per_segment)), next_ids, rng)
        policy, past = build_policy(cfg, env.spec), build_policy(cfg, env.spec)
        past.eval()
        self.tensors = policy.tensors()  # what the worker plays, whatever version it is handed
        self.inference = RecordingInference(policy, REAL_GAMES * env.spec.num_agents)
        self.worker = RolloutWorker(env, policy, RolloutSettings.of(cfg, env.spec),
                                    PoolOpponents(sampler, env, past, on_snapshot_failure), seed=seed,
                                    inference=self.inference)
        self.produced: list[int] = []
        self.swaps: list[tuple[float, int]] = []
        self.env, self.wrong_weights = env, 0
        self.handed: set[int] = set()  # decision ids in the samples handed over
        self.repeated = self.foreign = self.misstamped = self.misplayed = 0

    @property
    def games(self) -> int:
        """Games played, as the game counts them (not the worker: a worker that loses or repeats one shows)."""
        return self.env.ended

    @property
    def version(self) -> int:
        return self.worker.version

    def set_params(self, version: int, tensors: dict, meta: dict) -> None:
        self.wrong_weights += int(not check_weights(tensors, meta))
        self.worker.set_params(version, self.tensors, meta)
        self.swaps.append((self.clock.t(), version))

    def collect(self) -> Segment:
        self.clock.charge(self.segment_s)
        self.sampler.refresh()
        segment = self.worker.collect()
        ids = segment.arrays["obs"][:, :, 0].astype(np.int64)
        decided = self.inference.decided_by
        for sample, version in zip(ids.tolist(), segment.arrays["version"].tolist()):
            made = [decided[i] for i in sample if i in decided]
            self.foreign += len(sample) - len(made)
            self.misstamped += int(not made or version != min(made))
            self.repeated += sum(i in self.handed for i in sample)
            self.handed.update(sample)
        self.produced.extend(segment.arrays["obs"][SAMPLE_ID].astype(np.int64).tolist())
        for ep in segment.episodes:
            self.misplayed += int(not self._played_as_recorded(ep, self.env.finished.pop(0)))
        return segment

    def _played_as_recorded(self, ep: dict, views: list[list[int]]) -> bool:
        """Whether the game the episode record names was played so: every decision of the learner's side by the
        learner's policy, every decision of the other by the opponent it names (the learner's again against
        ``latest``; none asked of a policy for a bot)."""
        groups = self.inference.group_of
        side, opponent = ep["learner_side"], ep["opponent"]
        theirs = None if opponent.startswith("bot:") else opponent
        return (all(groups.get(i) == LATEST for i in views[side] if i in groups)
                and all(groups.get(i) == theirs for i in views[1 - side]))

    def decision_figures(self) -> tuple[int, int]:
        """(learner decisions unaccounted, samples misstamped): a decision in no sample handed over although a
        later one of its row is, in two, or one the learner did not make; a sample whose version is not the
        oldest of its decisions' versions. What a row holds after its last sample handed over is still in the
        worker (an incomplete segment), not lost."""
        lost = 0
        for row in self.inference.learner_ids:
            last = max((k for k, i in enumerate(row) if i in self.handed), default=-1)
            lost += sum(1 for i in row[:last] if i not in self.handed)
        return lost + self.repeated + self.foreign, self.misstamped


def figures(fleet) -> dict:
    """The real workers' decision figures summed over every worker that ran (0 with the stand-in), and their games
    whose episode record names an opponent or a side other than the policies that played them."""
    real = [w.source for w in fleet.all_workers if isinstance(w.source, RealSource)]
    found = [source.decision_figures() for source in real]
    return {"decisions_unaccounted": sum(f[0] for f in found), "samples_misstamped": sum(f[1] for f in found),
            "games_misplayed": sum(source.misplayed for source in real)}

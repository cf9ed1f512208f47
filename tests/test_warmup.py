"""The run's warm-up (ppo.warmup_updates): its first updates clip PPO's ratio at ppo.warmup_clip, the optimizer
stamps the versions of those updates as the warm-up's, and the rollout workers play those versions' games against
league.warmup_bots only; then the usual clip and opponents."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from rapid.envs.registry import make_env
from rapid.errors import UsageError
from rapid.infra.store import LocalStore
from rapid.league import LATEST, League, PoolState, bot_ids, ensure_bots
from rapid.league.sampling import opponent_distribution
from rapid.opt.config import PPOConfig
from rapid.opt.learner import Learner
from rapid.roles.optimizer_settings import version_meta
from rapid.roles.rollout_loop import RolloutLoop
from rapid.roles.startup import build_policy
from rapid.rollout.opponents import LeagueOpponents
from rapid.rollout.uploader import Uploader
from rapid.rollout.worker import RolloutSettings, RolloutWorker
from rapid.run.config import Config, EnvConfig, LeagueConfig, ModelConfig, RolloutConfig
from rapid.run.config_files import load_config

C4 = "pettingzoo.classic.connect_four_v3"
WARM = LeagueConfig(bots=["lookahead"], warmup_bots=["random"], bot_prob=0.5, latest_prob=1.0)


def pool(*names: str) -> PoolState:
    return ensure_bots(PoolState(), bot_ids(list(names)), 0.0)


def test_the_warm_up_plays_its_bots_only_and_afterwards_they_are_not_drawn():
    state = pool("lookahead", "random")
    assert opponent_distribution(state, WARM, warmup=True) == {LATEST: 0.0, "bot:random": 1.0}
    assert opponent_distribution(state, WARM, warmup=False) == {LATEST: 0.5, "bot:lookahead": 0.5}
    both = LeagueConfig(bots=["random", "lookahead"], warmup_bots=["random"], bot_prob=0.5)
    assert opponent_distribution(state, both, warmup=False)["bot:random"] == 0.25  # named by league.bots too
    # A pool without the warm-up's bots (an older run's, resumed) plays as usual rather than not at all.
    assert opponent_distribution(pool("lookahead"), WARM, warmup=True) == {LATEST: 0.5, "bot:lookahead": 0.5}


def test_versions_are_stamped_as_the_warm_ups_through_its_updates():
    cfg = Config(ppo=PPOConfig(warmup_updates=400, warmup_clip=0.5), league=WARM)
    assert [version_meta(cfg, u, 1.0)["warmup"] for u in (0, 399, 400, 5000)] == [True, True, False, False]
    assert version_meta(Config(), 0, 0.0)["warmup"] is False


def test_the_learner_clips_at_the_warm_ups_clip_through_its_updates_then_at_the_usual_one():
    env = make_env(C4, num_games=2, seed=0)
    cfg = Config(env=EnvConfig(name=C4), model=ModelConfig(hidden=8, lstm=8))
    learner = Learner(build_policy(cfg, env.spec), PPOConfig(clip=0.2, warmup_updates=3, warmup_clip=0.5))
    clips = []
    for updates in (0, 2, 3, 10):
        learner.updates = updates  # as a --resume restores it
        clips.append(learner.clip())
    assert clips == [0.5, 0.5, 0.2, 0.2]
    learner.ppo = PPOConfig(clip=0.2, warmup_updates=3)  # no warm-up clip: the usual one throughout
    learner.updates = 0
    assert learner.clip() == 0.2


def test_the_warm_up_clip_is_the_one_the_update_clips_at():
    """An update whose every ratio sits between the two clips counts them clipped at 0.2 and not at 0.5."""
    env = make_env(C4, num_games=8, seed=0)
    cfg = Config(env=EnvConfig(name=C4), model=ModelConfig(hidden=8, lstm=8),
                 rollout=RolloutConfig(bptt=4, samples_per_segment=1))
    policy = build_policy(cfg, env.spec)
    worker = RolloutWorker(env, policy, RolloutSettings.of(cfg, env.spec), seed=0)
    worker.set_params(0, policy.tensors())
    segments = [worker.collect().arrays for _ in range(4)]
    batch = {k: np.concatenate([s[k] for s in segments]) for k in segments[0]}
    batch["logp"] = batch["logp"] + np.log(1.3)  # every ratio π/μ is 1/1.3 ≈ 0.77: outside 0.2, inside 0.5
    fractions = []
    for warmup_clip in (0.5, -1.0):
        torch.manual_seed(0)
        learner = Learner(build_policy(cfg, env.spec), PPOConfig(lr=1e-9, clip=0.2, warmup_updates=1,
                                                                  warmup_clip=warmup_clip))
        fractions.append(learner.update(batch)["clip_fraction"])
    assert fractions[0] == pytest.approx(0.0, abs=0.01) and fractions[1] > 0.9


def test_a_worker_plays_the_warm_up_versions_against_the_warm_up_bots_only(tmp_path):
    cfg = Config(env=EnvConfig(name=C4), model=ModelConfig(hidden=8, lstm=8),
                 rollout=RolloutConfig(bptt=4, samples_per_segment=1), league=WARM)
    env = make_env(C4, num_games=16, seed=0)
    league = League(LocalStore(tmp_path))
    league.update(lambda s: ensure_bots(s, bot_ids(WARM.bots + WARM.warmup_bots), 0.0))
    policy = build_policy(cfg, env.spec)
    opponents = LeagueOpponents(league, cfg, env, lambda: build_policy(cfg, env.spec))
    worker = RolloutWorker(env, policy, RolloutSettings.of(cfg, env.spec), opponents=opponents, seed=0)
    worker.set_params(1, policy.tensors(), {"bot_prob": 0.5, "warmup": True})
    assert {o.id for o in worker.game_opponent} == {"bot:random"}  # the first games too, drawn before v1 came
    seen = []
    for version, warmup in ((1, True), (2, False), (3, "yes")):  # a hostile stamp is not the warm-up
        worker.set_params(version, policy.tensors(), {"bot_prob": 0.5, "warmup": warmup})
        for _ in range(30):  # a connect four game lasts at most 42 moves: every game has restarted by now
            worker.collect()
        seen.append({o.id for o in worker.game_opponent})
    assert seen[0] == {"bot:random"}
    assert seen[1] == seen[2] == {"latest", "bot:lookahead"}


@pytest.mark.parametrize(("overrides", "field"), [
    (['league.warmup_bots=["random"]'], "ppo.warmup_updates"),
    (["ppo.warmup_updates=-1"], "ppo.warmup_updates"),
    (["ppo.warmup_clip=0"], "ppo.warmup_clip"),
    (["ppo.warmup_updates=10", 'league.warmup_bots=["no such!"]'], "league.warmup_bots"),
])
def test_a_bad_warm_up_is_refused_at_start_up(overrides, field):
    with pytest.raises(UsageError, match=field):
        load_config(None, overrides)


class _Worker:
    version = 0

    def set_params(self, version, tensors, meta=None):
        self.version = version


def test_a_worker_uploads_at_the_warm_ups_interval_while_it_plays_a_warm_up_version(tmp_path):
    uploader = Uploader(LocalStore(tmp_path), "w0", interval_s=2.0, max_backlog=8)  # not started: no threads
    loop = RolloutLoop(_Worker(), uploader, None, None, None, 2, 0.0, None, logging.getLogger("t"),
                       warmup_upload_s=0.5)
    intervals = []
    for version, meta in ((1, {"warmup": True}), (2, {"warmup": True}), (3, {"warmup": False}), (4, {}),
                          (5, {"warmup": 1})):  # an untrustworthy stamp is not the warm-up
        loop._swap((version, {}, meta))
        intervals.append(uploader.interval_s)
    assert intervals == [0.5, 0.5, 2.0, 2.0, 2.0]
    keeps = RolloutLoop(_Worker(), uploader, None, None, None, 2, 0.0, None, logging.getLogger("t"))
    keeps._swap((6, {}, {"warmup": True}))  # rollout.warmup_upload_interval_s unset: the uploader's own
    assert uploader.interval_s == 2.0


def test_a_warm_up_upload_interval_must_be_positive():
    assert load_config(None, ["rollout.warmup_upload_interval_s=0.5"]).rollout.warmup_upload_interval_s == 0.5
    with pytest.raises(UsageError, match="rollout.warmup_upload_interval_s"):
        load_config(None, ["rollout.warmup_upload_interval_s=0"])

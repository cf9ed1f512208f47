"""The league inside the roles: opponents fixed per game, LSTM state reset at game start, past opponents
played in the configured share during a real `rapid train`, and `rapid league` on the run."""

from __future__ import annotations

import numpy as np
import torch

from rapid.envs.base import RandomBot
from rapid.envs.registry import make_env
from rapid.formats.experience import Shape, decode_experience
from rapid.infra.store import LocalStore
from rapid.league import League
from rapid.roles.startup import build_policy
from rapid.rollout.worker import Opponent, RolloutSettings, RolloutWorker
from rapid.run.config_files import load_config
from tests.helpers import rapid

C4 = "pettingzoo.classic.connect_four_v3"


class CountingOpponents:
    """Every new game gets a brand-new opponent object, so any swap is visible."""

    def __init__(self, spec):
        self.spec, self.chosen = spec, 0

    def choose(self, rng):
        self.chosen += 1
        return Opponent(f"bot:random{self.chosen}", bot=RandomBot(self.spec, seed=self.chosen))

    def follow(self, meta):
        """No schedule."""


def test_opponent_fixed_for_a_whole_game_and_state_reset_at_game_start():
    torch.manual_seed(0)
    cfg = load_config(None, [f"env.name={C4}"])
    env = make_env(C4, num_games=8, seed=3)
    policy = build_policy(cfg, env.spec)
    source = CountingOpponents(env.spec)
    worker = RolloutWorker(env, policy, RolloutSettings(bptt=1, segment_steps=1, gamma=0.99, gae_lambda=0.95,
                                                        team_spirit=0.0, zero_sum=False), source, seed=1)
    worker.set_params(0, policy.tensors())
    A = env.spec.num_agents
    finished = 0
    for _ in range(150):  # one step per collect: every swap can be matched with a game end
        before = list(worker.game_opponent)
        segment = worker.collect()
        ended = {g for g in range(8) if before[g] is not worker.game_opponent[g]}
        assert len(segment.episodes) == len(ended)
        assert sorted(e["opponent"] for e in segment.episodes) == sorted(before[g].id for g in ended)
        for g in ended:  # the new game starts from a zero LSTM state
            assert torch.all(worker.inference.h[g * A:(g + 1) * A] == 0)
            assert torch.all(worker.inference.c[g * A:(g + 1) * A] == 0)
            assert worker.decisions.fresh[g * A:(g + 1) * A].all()
        finished += len(ended)
    assert finished >= 20
    assert source.chosen == 8 + finished


def test_training_plays_its_warm_up_then_bots_on_their_schedule_and_past_opponents_in_the_configured_share(tmp_path):
    run = tmp_path / "league"
    rapid("train", "--config", "configs/default.toml", "--run-dir", str(run), "--minutes", "0.5", "--no-progress",
          "--set", "rollout.upload_interval_s=1.0", "--set", "env.num_games=64", "--set", "league.snapshot_every=4",
          "--set", "league.latest_prob=0.7", "--set", "league.refresh_s=1", "--set", "eval.interval_s=10",
          "--set", 'league.bots=["lookahead"]', "--set", "league.bot_prob=0.0", "--set", "league.bot_prob_final=0.4",
          "--set", "eval.games=60", "--set", "store.retention_s=0", "--set", "ppo.warmup_updates=30",
          "--set", 'league.warmup_bots=["random"]', "--set", "eval.ladder={}", timeout=300)
    store = LocalStore(run / "store")
    state = League(store).read()
    snapshots = state.snapshots()
    assert len(snapshots) >= 3
    # Games reported with the experience (kept: retention off), once the pool had snapshots for a while.
    cfg = load_config(run / "config.toml")
    env = make_env(C4, 1)
    shape = Shape(cfg.rollout.bptt, env.spec.obs_dim, env.spec.mask_dim, 1, cfg.model.lstm)
    episodes = [e for key in store.list("experience/")
                for e in decode_experience(store.get(key), shape).episodes]
    # The warm-up's 30 updates: every game of its versions against bot:random, and none afterwards (a game that
    # began in the warm-up may end a few versions later).
    warm = [e["learner_version"] for e in episodes if e["opponent"] == "bot:random"]
    after = [e["learner_version"] for e in episodes if e["opponent"] != "bot:random"]
    assert len(warm) >= 50 and min(after) >= max(warm) - 3, (sorted(warm)[-5:], sorted(after)[:5])
    settled = [e for e in episodes if e["learner_version"] >= snapshots[0].version + 8]
    assert len(settled) >= 300
    # The bot's share rises from none to 0.4 over the 30 s: each version carries the schedule's value to the worker.
    settled.sort(key=lambda e: e["learner_version"])
    thirds = [np.mean([e["opponent"] == "bot:lookahead" for e in part]) for part in np.array_split(settled, 3)]
    assert thirds[0] < thirds[1] < thirds[2] <= 0.45 and thirds[2] >= 0.2, f"bot shares by version {thirds}"
    # Of the games not against the bot, 30% against past snapshots (within 3 sigma).
    past = np.mean([e["opponent"] != "latest" for e in settled if not e["opponent"].startswith("bot:")])
    assert abs(past - 0.3) < 0.09, f"past-opponent share {past:.3f}, configured 0.3"
    assert {e["opponent"] for e in settled} & {m.id for m in snapshots}
    # Rank 0 folded the results into the pool: games counted, qualities moved off their joining value.
    assert sum(m.games for m in snapshots) > 0 and state.latest_games > 0

    listing = rapid("league", "ls", "--run-dir", str(run)).stdout
    for m in snapshots:
        assert m.id in listing
    assert "±" in listing
    out = rapid("league", "plot", "--run-dir", str(run), "--out", str(tmp_path / "ratings.png"))
    assert (tmp_path / "ratings.png").stat().st_size > 10_000, out.stdout


def test_league_commands_on_a_missing_pool_are_usage_errors(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    (run / "config.toml").write_text("")
    out = rapid("league", "ls", "--run-dir", str(run), check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1
    out = rapid("league", "pin", "v000000000001", "--run-dir", str(run), check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr


def test_league_commands_on_an_s3_run(s3_store, s3_server, tmp_path):
    """`rapid league … --store s3://…` against the S3-compatible server, credentials from the environment."""
    import os
    import subprocess

    from rapid.run.param_store import ParameterStore
    from tests.helpers import RAPID, ROOT
    from tests.s3_server import DUMMY_CREDENTIALS

    ParameterStore(s3_store).publish(3, {"w": np.zeros(3, np.float32)})
    env = {**os.environ, **DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL": s3_server}
    url = s3_store.url

    def league(*args):
        return subprocess.run([RAPID, "league", *args, "--store", url], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=60)

    assert league("add", "--version", "3", "--pin").returncode == 0
    assert league("add", "--bot", "random").returncode == 0
    listing = league("ls")
    assert listing.returncode == 0 and "v000000000003" in listing.stdout and "bot:random" in listing.stdout
    assert league("export", str(tmp_path / "pool.rlp")).returncode == 0
    assert (tmp_path / "pool.rlp").stat().st_size > 0
    missing = league("retire", "v000000000099")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr

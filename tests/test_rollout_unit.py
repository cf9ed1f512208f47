"""Rollout worker → experience format → learner, and uploader → store → loader → buffer, in one process."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from rapid.envs.pettingzoo_adapter import PettingZooVecEnv
from rapid.formats.experience import ExperienceBatch, Shape, decode_experience, encode_experience
from rapid.infra.store import LocalStore
from rapid.opt.buffer import ExperienceBuffer
from rapid.opt.config import PPOConfig
from rapid.opt.learner import Learner
from rapid.opt.model import Policy
from rapid.optimizer.loader import ExperienceLoader
from rapid.rollout.uploader import Uploader
from rapid.rollout.worker import RolloutSettings, RolloutWorker

torch.set_num_threads(1)
BPTT, LSTM = 8, 16


@pytest.fixture(scope="module")
def worker():
    torch.manual_seed(0)
    env = PettingZooVecEnv("pettingzoo.classic.connect_four_v3", num_games=4, seed=0)
    policy = Policy(env.spec.obs_dim, env.spec.action_heads, hidden=32, encoder_layers=1, lstm=LSTM)
    settings = RolloutSettings(bptt=BPTT, segment_steps=4 * BPTT, gamma=0.99, gae_lambda=0.95,
                               team_spirit=0.3, zero_sum=True)
    w = RolloutWorker(env, policy, settings, seed=0)
    tensors = policy.tensors()
    tensors["return_scale"] = np.array(2.0)  # acting values are in return units
    w.set_params(3, tensors)
    return w


def shape_of(w) -> Shape:
    spec = w.env.spec
    return Shape(bptt=BPTT, obs_dim=spec.obs_dim, mask_dim=spec.mask_dim, heads=len(spec.action_heads), lstm=LSTM)


@pytest.fixture(scope="module")
def segments(worker):
    """Segments with samples: a row's segment of 32 decisions takes 64 steps of a two-player turn-based game."""
    out = [worker.collect() for _ in range(6)]
    assert sum(len(s.arrays["version"]) for s in out) >= 4 * 2 * 4
    return [s for s in out if len(s.arrays["version"])]


def test_samples_match_the_format(worker, segments):
    shape = shape_of(worker)
    for seg in segments:
        S = seg.arrays["version"].shape[0]
        assert S % 4 == 0  # a row's segment of 4 · BPTT decisions is 4 samples
        assert set(seg.arrays) == set(shape.fields())
        for name, (dtype, rest) in shape.fields().items():
            assert seg.arrays[name].dtype == np.dtype(dtype), name
            assert seg.arrays[name].shape == (S, *rest), name
        assert (seg.arrays["version"] == 3).all()
        assert seg.opponents == ["latest"] and (seg.arrays["opponent"] == 0).all()
        assert seg.env_steps == 4 * BPTT * 4 * 2
        batch = ExperienceBatch("w0", 0, time.time(), seg.arrays, seg.opponents, seg.episodes, seg.env_steps)
        out = decode_experience(encode_experience(batch), shape)
        for k, v in seg.arrays.items():
            assert out.arrays[k].tobytes() == v.tobytes()
        # returns = advantages + values, everything finite
        np.testing.assert_allclose(seg.arrays["returns"] - seg.arrays["advantages"], seg.arrays["values"],
                                   atol=1e-5)


def test_a_turn_based_sample_holds_the_agents_own_moves_only(segments):
    """Every step of a sample is a decision of its agent; between two of them the board gains two stones (its
    move and the reply), and the reply that ends a game is charged to the loser's last move."""
    a = {k: np.concatenate([s.arrays[k] for s in segments]) for k in segments[0].arrays}
    assert a["active"].all() and a["own"].all()
    stones = a["obs"].sum(-1)
    same_game = ~a["first"][:, 1:]
    assert (stones[:, 1:] - stones[:, :-1])[same_game].tolist() == [2.0] * int(same_game.sum())
    # The last move of a game (the next decision starts a game) returns the game's result: ±(1 + 1), zero-sum.
    last = a["returns"][:, :-1][a["first"][:, 1:]]
    assert len(last) >= 4 and set(np.round(np.abs(last), 4).tolist()) <= {0.0, 2.0}
    assert (last > 1).any() and (last < -1).any(), "wins and losses both end on the loser's move"


def test_first_marks_game_starts_and_zero_state(worker, segments):
    first_all = np.concatenate([s.arrays["first"] for s in segments])
    h0 = np.concatenate([s.arrays["h0"] for s in segments])
    c0 = np.concatenate([s.arrays["c0"] for s in segments])
    starts = first_all[:, 0]
    assert starts.sum() >= 2 * 4, "every row's first sample starts a game"
    assert (h0[starts] == 0).all() and (c0[starts] == 0).all()
    assert np.abs(h0[~starts]).sum(1).min() > 0, "a sample continuing a game carries its LSTM state"
    episodes = sum(len(s.episodes) for s in segments)
    assert episodes > 0
    for s in segments:
        for ep in s.episodes:
            assert ep["winner"] in ("learner", "opponent", "draw") and ep["learner_version"] == 3
            assert 7 <= ep["length"] <= 42
    # a game's first decision for each of its two agents, at most (some are still held by the worker)
    assert int(first_all.sum()) <= 2 * (4 + episodes)


def test_evaluate_reproduces_worker_logp_and_values(worker, segments):
    """The learner's BPTT from stored h0/c0 with `first` resets gives the worker's log-probs and values."""
    policy = worker.policy
    for seg in segments:
        a = {k: torch.from_numpy(v) for k, v in seg.arrays.items()}
        with torch.no_grad():
            logp, _, value = policy.evaluate(a["obs"], a["mask"], a["actions"], a["h0"], a["c0"], a["first"])
        torch.testing.assert_close(logp, a["logp"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(value * 2.0, a["values"], rtol=1e-4, atol=1e-4)
        # stored actions are legal
        mask = seg.arrays["mask"]
        acts = seg.arrays["actions"][..., 0]
        assert np.take_along_axis(mask, acts[..., None], -1).all()


def test_learner_update_changes_parameters(worker, segments):
    torch.manual_seed(1)
    policy = Policy(worker.env.spec.obs_dim, worker.env.spec.action_heads, hidden=32, encoder_layers=1, lstm=LSTM)
    policy.load_tensors(worker.policy.tensors())
    learner = Learner(policy, PPOConfig(lr=1e-3))
    before = {k: v.copy() for k, v in policy.tensors().items()}
    batch = {k: np.concatenate([s.arrays[k] for s in segments]) for k in segments[0].arrays}
    stats = learner.update(batch)
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm",
                "explained_variance"):
        assert math.isfinite(stats[key]), key
    assert stats["skipped"] == 0.0 and learner.updates == 1
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-4)  # same weights as the worker: ratio 1
    assert stats["entropy"] > 0
    after = policy.tensors()
    changed = [k for k in before if not np.array_equal(before[k], after[k])]
    assert "logits.weight" in changed and "value_head.weight" in changed and "obs_norm.mean" in changed
    assert all(np.isfinite(v).all() for v in after.values())


def _wait_for(cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_uploader_to_loader_end_to_end(tmp_path, worker, segments):
    segments = segments[:3]
    store = LocalStore(tmp_path / "store")
    shape = shape_of(worker)
    uploads = []
    up = Uploader(store, worker="w0", interval_s=0.05, max_backlog=4,
                  on_upload=lambda n, b, s: uploads.append((n, b)))
    up.start()
    try:
        up.add(segments[0])
        assert _wait_for(lambda: up.stats.objects >= 1)
        up.add(segments[1])
        up.add(segments[2])
        assert _wait_for(lambda: up.stats.objects >= 2)
    finally:
        up.stop()
    total = sum(s.arrays["version"].shape[0] for s in segments)
    assert up.stats.samples == total and up.stats.dropped_objects == 0
    assert sum(n for n, _ in uploads) == total
    keys = store.list("experience/")
    assert len(keys) == up.stats.objects and all(k.startswith("experience/s0000/") and "-w0-" in k
                                                 and k.endswith(".rxp") for k in keys)

    # a corrupt object and a stray non-experience key in the shard
    good = store.get(keys[0])
    store.put("experience/s0000/evil-0.rxp", good[: len(good) // 2])
    store.put("experience/s0000/evil-1.rxp", b"\x00" * 100)
    store.put("experience/s0000/evil-notes.txt", b"ignored")

    buf = ExperienceBuffer(capacity=4096, max_staleness=8)
    bad = []
    loader = ExperienceLoader(store, shape, buf, poll_s=0.05, retention_s=0, on_bad=lambda k, e: bad.append(k))
    loader.start()
    try:
        assert _wait_for(lambda: loader.stats.objects == len(keys) and loader.stats.bad_objects == 2)
        # the loader keeps going: a new object after the bad ones is loaded too
        store.put(f"experience/s0000/{int(time.time() * 1000)}-w1-late-00000000.rxp", good)
        assert _wait_for(lambda: loader.stats.objects == len(keys) + 1)
    finally:
        loader.stop()
    assert sorted(bad) == ["experience/s0000/evil-0.rxp", "experience/s0000/evil-1.rxp"]
    first_obj = decode_experience(good, shape).num_samples
    assert buf.stats().received == total + first_obj == loader.stats.samples
    assert loader.stats.env_steps == sum(s.env_steps for s in segments) + decode_experience(good, shape).env_steps
    episodes = loader.take_episodes()
    assert len(episodes) >= sum(len(s.episodes) for s in segments)
    out, staleness = buf.sample(16, current_version=3, rng=np.random.default_rng(0))
    assert (staleness == 0).all() and out["obs"].shape == (16, BPTT, shape.obs_dim)
    # polled again, nothing is loaded twice
    assert loader.poll_once() == 0


class _DownStore(LocalStore):
    """A narrow fake: every write fails as if the store were unreachable."""

    def put(self, key, data):
        from rapid.infra.store import StoreError

        raise StoreError("down")


def test_uploader_backlog_bound(tmp_path, segments):
    segments = segments[:3]
    up = Uploader(_DownStore(tmp_path / "s"), worker="w0", interval_s=3600, max_backlog=2)
    for seg in segments:
        up.add(seg)
        up.flush()
    assert up.stats.objects == 0 and up.stats.failures == 3
    assert up.stats.dropped_objects == 1
    assert up.stats.dropped_samples == segments[0].arrays["version"].shape[0]
    assert len(up._backlog) == 2  # the two newest objects wait
    # once the store is back, the waiting objects go out (newest kept, oldest was dropped)
    store = LocalStore(tmp_path / "s")
    up.store = store
    up.flush()
    assert up.stats.objects == 2 and len(store.list("experience/")) == 2
    assert up.stats.samples == sum(s.arrays["version"].shape[0] for s in segments[1:])


def test_uploader_backlog_stat_after_failed_flush(tmp_path, segments):
    segments = segments[:3]
    up = Uploader(_DownStore(tmp_path / "s"), worker="w0", interval_s=3600, max_backlog=2)
    for seg in segments:
        up.add(seg)
        up.flush()
    assert up.stats.backlog == 2


def test_settings_are_a_view_of_the_config():
    """The worker's settings come from the config's sections and the env's step length, in one place."""
    from rapid.run.config_files import load_config

    cfg = load_config("configs/default.toml", overrides=["ppo.horizon_s=25", "rollout.bptt=8"])
    env = PettingZooVecEnv("pettingzoo.classic.connect_four_v3", num_games=1)
    s = RolloutSettings.of(cfg, env.spec)
    assert s.bptt == 8 and s.segment_steps == 8 * cfg.rollout.samples_per_segment
    assert math.isclose(s.gamma, 1 - 0.5 / 25)          # a move is half a round of connect four
    assert (s.gae_lambda, s.team_spirit, s.zero_sum) == (cfg.ppo.gae_lambda, cfg.ppo.team_spirit, cfg.ppo.zero_sum)


def test_a_game_cut_at_a_time_limit_bootstraps_where_the_agent_cannot_see_the_clock():
    """With λ = 0 a decision's return is r + γ·V(next): the decision before a time-limit cut gains γ·V(view at
    the cut) (here V ≡ 3) unless the env's observation shows the clock, and no other decision changes."""
    import dataclasses

    def returns(bootstrap: float, clock_in_obs: bool) -> np.ndarray:
        torch.manual_seed(0)
        env = PettingZooVecEnv("tests.pz_tiny_parallel", num_games=2, seed=0, options={"max_steps": 5, "die_at": 2})
        env.spec = dataclasses.replace(env.spec, clock_in_obs=clock_in_obs)
        policy = Policy(env.spec.obs_dim, env.spec.action_heads, hidden=16, encoder_layers=1, lstm=8)
        policy.value = lambda obs, state: torch.full((len(obs),), bootstrap)
        settings = RolloutSettings(bptt=2, segment_steps=4, gamma=0.9, gae_lambda=0.0, team_spirit=0.0,
                                   zero_sum=False)
        w = RolloutWorker(env, policy, settings, seed=0)
        w.set_params(1, policy.tensors())
        return np.concatenate([w.collect().arrays["returns"].ravel() for _ in range(6)])

    base = returns(0.0, clock_in_obs=False)
    gain = returns(3.0, clock_in_obs=False) - base
    assert np.isclose(gain, 0.9 * 3.0).sum() >= 8, "each of the 8 agent rows' last decision before a cut"
    assert np.isclose(gain, 0.0).sum() + np.isclose(gain, 0.9 * 3.0).sum() == gain.size
    np.testing.assert_array_equal(returns(3.0, clock_in_obs=True), base)


def test_the_worker_mixes_rewards_with_the_team_spirit_its_version_was_stamped_with(monkeypatch):
    """The optimizer's team-spirit schedule reaches the games through each version's meta; a version without one,
    or with a value that is no team spirit, is played with the config's."""
    from rapid.envs.moba import MobaVecEnv
    from rapid.rollout import worker as rollout_worker

    used = []
    mix = rollout_worker.losses.mix_rewards
    monkeypatch.setattr(rollout_worker.losses, "mix_rewards",
                        lambda rewards, sides, spirit, zero_sum: used.append(spirit) or mix(rewards, sides, spirit,
                                                                                         zero_sum))
    env = MobaVecEnv(num_games=2, seed=0, heroes_per_side=2)
    policy = Policy(env.spec.obs_dim, env.spec.action_heads, hidden=16, encoder_layers=1, lstm=8)
    settings = RolloutSettings(bptt=4, segment_steps=4, gamma=0.99, gae_lambda=0.95, team_spirit=0.3, zero_sum=True)
    w = RolloutWorker(env, policy, settings, seed=0)
    for meta, expected in (({"updates": 9, "team_spirit": 0.75}, 0.75), ({"updates": 9}, 0.3),
                           ({"team_spirit": 7.0}, 0.3), ({"team_spirit": True}, 0.3)):
        used.clear()
        w.set_params(1, policy.tensors(), meta)
        w.collect()
        assert used == [expected] * 4, meta


def test_the_first_object_is_sealed_as_soon_as_a_sample_waits_the_rest_every_interval(tmp_path, segments):
    """A fresh run's first update waits for the first experience: it goes out at once, not after a whole interval;
    later segments wait for the interval as before."""
    store = LocalStore(tmp_path / "s")
    up = Uploader(store, worker="w0", interval_s=3600, max_backlog=4)
    up.start()
    try:
        up.add(segments[0])
        deadline = time.time() + 10
        while up.stats.objects == 0 and time.time() < deadline:
            time.sleep(0.02)
        assert up.stats.objects == 1
        up.add(segments[1])
        time.sleep(0.3)
        assert up.stats.objects == 1  # the second waits for the interval
    finally:
        t0 = time.time()
        up.stop()  # flushes the second; a sealer waiting out its interval stops at once
        assert time.time() - t0 < 5
    assert up.stats.objects == 2

"""The learner's update: which steps train, microbatches, normalizer timing, statistics pooled over ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rapid.opt import losses
from rapid.opt.config import PPOConfig
from rapid.opt.learner import Learner, bf16_native, indexed
from tests.learner_data import make_policy, played_batch
from tests.test_distributed import mpiexec

torch.set_num_threads(1)


class GradRecorder:
    """An all_reduce that records the gradients the update would apply (before clipping)."""

    def __init__(self):
        self.grads: dict[str, torch.Tensor] = {}

    def __call__(self, params, extra=()):
        self.grads = {str(i): p.grad.detach().clone() for i, p in enumerate(params)}


def gradients(batch, microbatch=0, **settings) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    record = GradRecorder()
    learner = Learner(make_policy(), PPOConfig(**settings), microbatch_samples=microbatch, all_reduce=record)
    stats = learner.update(batch)
    return record.grads, stats


def test_value_loss_trains_only_the_learners_steps():
    batch = played_batch(make_policy(), seed=1)
    other = {**batch, "returns": np.where(batch["active"], batch["returns"], 1e3).astype(np.float32),
             "values": np.where(batch["active"], batch["values"], -50.0).astype(np.float32)}
    g1, s1 = gradients(batch)
    g2, s2 = gradients(other)
    assert s1["value_loss"] == pytest.approx(s2["value_loss"], rel=1e-6)
    for key in g1:
        torch.testing.assert_close(g1[key], g2[key], rtol=1e-5, atol=1e-7)
    assert s1["explained_variance"] == pytest.approx(s2["explained_variance"], rel=1e-6)


def test_waiting_steps_train_the_value_but_not_the_policy():
    """In turn-based games the learner's row waits on the opponent's turns: those values feed GAE's
    bootstrap, so the value head learns them; the policy loss stays on the learner's own moves."""
    batch = played_batch(make_policy(), seed=4)
    batch["own"] = np.ones_like(batch["active"])
    waiting = batch["own"] & ~batch["active"]
    assert waiting.any()
    other = {**batch, "returns": np.where(waiting, batch["returns"] + 5.0, batch["returns"]).astype(np.float32)}
    _, s1 = gradients(batch)
    _, s2 = gradients(other)
    assert s2["value_loss"] > s1["value_loss"] * 1.5
    assert s1["policy_loss"] == pytest.approx(s2["policy_loss"], rel=1e-6)


def test_learning_rate_and_entropy_bonus_follow_the_runs_progress():
    """The step Adam takes is the scheduled learning rate's: halfway through an annealed run, half the step."""
    batch = played_batch(make_policy(), seed=2)
    steps = {}
    for progress in (0.0, 0.5, 1.0):
        learner = Learner(make_policy(), PPOConfig(lr=1e-3, lr_final=0.0, entropy_coef=0.02, entropy_final=0.0,
                                                      normalize_returns=False))
        before = [p.detach().clone() for p in learner.params]
        stats = learner.update(batch, progress=progress)
        assert stats["lr"] == pytest.approx(1e-3 * (1 - progress))
        assert stats["entropy_coef"] == pytest.approx(0.02 * (1 - progress))
        steps[progress] = max((p.detach() - b).abs().max().item() for p, b in zip(learner.params, before))
    assert steps[0.5] == pytest.approx(steps[0.0] / 2, rel=0.05) and steps[1.0] == 0.0
    late = Learner(make_policy(), PPOConfig(entropy_coef=0.0, entropy_final=0.04, entropy_begin=0.5))
    assert [late.schedule(p)[1] for p in (0.25, 0.5, 0.75)] == pytest.approx([0.0, 0.0, 0.02])


def test_settling_updates_move_adams_moments_but_not_the_weights():
    """After a surgery (ppo.settle_until_update) the learner steps with learning rate 0 until that update:
    the weights and normalizers stay, Adam's moments fill; from that update on it learns as usual."""
    batch = played_batch(make_policy(), seed=2)
    learner = Learner(make_policy(), PPOConfig(lr=1e-3, settle_until_update=2, normalize_returns=False))
    before = {k: v.copy() for k, v in learner.policy.tensors().items()}
    for _ in range(2):
        assert learner.update(batch)["lr"] == 0.0
    moved = [k for k, v in learner.policy.tensors().items() if not np.array_equal(v, before[k])]
    assert moved and all(k.startswith("obs_norm") for k in moved), moved
    assert any(float(s["exp_avg_sq"].abs().sum()) > 0 for s in learner.adam.state.values())
    assert learner.update(batch)["lr"] == 1e-3 and learner.updates == 3
    assert not np.array_equal(learner.policy.tensors()["logits.weight"], before["logits.weight"])


def test_microbatches_do_not_change_the_gradient():
    batch = played_batch(make_policy(), S=12, seed=2)
    batch["active"][:4] = False                # chunks with very different numbers of learner steps
    batch["active"][4:8, 1:] = False
    whole, s_whole = gradients(batch)
    parts, s_parts = gradients(batch, microbatch=4)
    for key in whole:
        torch.testing.assert_close(parts[key], whole[key], rtol=1e-5, atol=1e-6)
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm"):
        assert s_parts[key] == pytest.approx(s_whole[key], rel=1e-5, abs=1e-7), key


def test_fresh_data_has_ratio_one_although_the_normalizer_moves():
    policy = make_policy()
    batch = played_batch(policy, S=16, seed=3, obs_mean=3.0, obs_scale=2.0)  # far from the normalizer's 0 / 1
    learner = Learner(policy, PPOConfig(lr=0.0))
    mean_before = policy.obs_norm.mean.clone()
    stats = learner.update(batch)
    assert stats["skipped"] == 0.0
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert stats["clip_fraction"] == 0.0
    assert not torch.allclose(policy.obs_norm.mean, mean_before)  # the normalizer did move, afterwards
    again = learner.update(batch)  # the same data under the moved normalizer is no longer on-policy
    assert again["approx_kl"] > 1e-4


def test_normalizer_takes_the_batch_statistics_after_the_update():
    policy = make_policy()
    batch = played_batch(policy, S=16, seed=4)
    Learner(policy, PPOConfig()).update(batch)
    obs = batch["obs"].reshape(-1, batch["obs"].shape[-1]).astype(np.float64)
    n0 = 1e-4
    assert float(policy.obs_norm.count) == pytest.approx(n0 + obs.shape[0])
    np.testing.assert_allclose(policy.obs_norm.mean.numpy(), obs.mean(0) * obs.shape[0] / (obs.shape[0] + n0),
                               rtol=1e-6)
    np.testing.assert_allclose(policy.obs_norm.var.numpy(), obs.var(0), rtol=1e-4)


def test_value_outputs_preserved_when_the_return_scale_moves():
    """PopArt's invariant: the value head times the return scale (the output in return units) is unchanged."""
    batch = played_batch(make_policy(), S=16, seed=5)
    batch["returns"] *= 50.0  # the scale will grow
    for preserve in (True, False):
        policy = make_policy()
        w, b, scale = policy.value_head.weight.clone(), policy.value_head.bias.clone(), float(policy.return_scale)
        Learner(policy, PPOConfig(lr=0.0, preserve_value_outputs=preserve)).update(batch)
        new_scale = float(policy.return_scale)
        assert new_scale > scale * 1.5
        if preserve:
            torch.testing.assert_close(policy.value_head.weight * new_scale, w * scale)
            torch.testing.assert_close(policy.value_head.bias * new_scale, b * scale)
        else:
            torch.testing.assert_close(policy.value_head.weight, w)


def test_value_clipping_changes_only_the_value_gradient():
    batch = played_batch(make_policy(), seed=6)
    batch["values"] += 3.0  # collected by values far from today's: the clipped error is the larger one
    plain, _ = gradients(batch)
    clipped, _ = gradients(batch, value_clip=0.01)
    same, _ = gradients({**batch, "values": batch["values"] - 3.0}, value_clip=0.01)
    n = len(plain)  # ... logits.weight, logits.bias, value_head.weight, value_head.bias
    assert not torch.allclose(plain[str(n - 2)], clipped[str(n - 2)])
    torch.testing.assert_close(plain[str(n - 4)], clipped[str(n - 4)])
    torch.testing.assert_close(plain[str(n - 2)], same[str(n - 2)])  # fresh values: nothing to clip


def test_observation_statistics_pooled_over_two_real_ranks():
    """Two ranks (real mpiexec, gloo) with data centred at 0 and 4: pooled count, mean and variance, and the
    parameters of a single process that trained on both batches. On a pretend GPU host: a CPU learner's ranks
    must use gloo there too."""
    result = mpiexec(2, "learner_ranks.py", 180, fake_gpus=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("OK"), result.stdout + result.stderr[-3000:]


# --- V-trace (ppo.off_policy = "vtrace") ------------------------------------------------------------------------


def test_a_rollout_workers_samples_give_its_own_targets_back_on_policy():
    """End to end: connect four (a turn-based game: a decision is discounted over the reply) played by a rollout
    worker whose value head predicts in a return scale of 3. With λ = 0 the worker's GAE return of every step is
    r + γ·V(next decision); V-trace's target from the learner (the same policy: on-policy) is that very return,
    so the sample's rewards, discounts and bootstrap are what GAE used, and the learner's values are read in
    return units, as the worker's."""
    from rapid.envs.registry import make_env
    from rapid.roles.startup import build_policy
    from rapid.rollout.worker import RolloutSettings, RolloutWorker, SelfPlay
    from rapid.run.config import Config, ModelConfig, RolloutConfig

    cfg = Config(model=ModelConfig(hidden=16, lstm=16), rollout=RolloutConfig(bptt=4, samples_per_segment=2),
                 ppo=PPOConfig(gae_lambda=0.0, off_policy="vtrace"))
    env = make_env(cfg.env.name, num_games=4)
    torch.manual_seed(0)
    policy = build_policy(cfg, env.spec)
    policy.return_scale.fill_(3.0)
    worker = RolloutWorker(env, policy, RolloutSettings.of(cfg, env.spec), SelfPlay())
    segments = [worker.collect() for _ in range(12)]
    batch = {k: np.concatenate([seg.arrays[k] for seg in segments]) for k in segments[0].arrays if k != "opponent"}
    assert (batch["discounts"] == 0).any() and (batch["bootstrap"] != 0).any()  # games end, samples bootstrap
    learner = Learner(policy, cfg.ppo)
    _, returns = learner.targets(learner.stage(batch))
    np.testing.assert_allclose(returns.numpy(), batch["returns"], rtol=1e-5, atol=1e-5)


def test_the_off_policy_settings_are_checked():
    assert PPOConfig(off_policy="vtrace", vtrace_rho_bar=2.0, vtrace_c_bar=0.5).errors() == []
    assert PPOConfig(off_policy="v-trace", vtrace_rho_bar=0.0, vtrace_c_bar=float("nan")).errors() == [
        "ppo.off_policy must be 'none' or 'vtrace' (got 'v-trace')", "ppo.vtrace_rho_bar must be > 0 (got 0.0)",
        "ppo.vtrace_c_bar must be > 0 (got nan)"]


def evaluated(policy, batch) -> tuple[np.ndarray, np.ndarray]:
    """The log-probs ``policy`` gives the batch's actions and its values in return units."""
    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    with torch.no_grad():
        logp, _, value = policy.evaluate(t["obs"], t["mask"], t["actions"], t["h0"], t["c0"], t["first"])
    return logp.numpy(), (value * policy.return_scale.float()).numpy()


def vtrace_targets(policy, batch, **settings) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, value targets) an update of ``batch`` would train on."""
    learner = Learner(policy, PPOConfig(off_policy="vtrace", **settings))
    return tuple(t.numpy().copy() for t in learner.targets(learner.stage(batch)))


def test_a_vtrace_update_in_microbatches_equals_the_whole_batch():
    batch = played_batch(make_policy(1), S=12, seed=2)  # played by another policy: the traces are cut
    batch["active"][:4] = False
    whole, s_whole = gradients(batch, off_policy="vtrace", vtrace_rho_bar=1.5)
    parts, s_parts = gradients(batch, microbatch=4, off_policy="vtrace", vtrace_rho_bar=1.5)
    for key in whole:
        torch.testing.assert_close(parts[key], whole[key], rtol=1e-5, atol=1e-6)
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm",
                "explained_variance"):
        assert s_parts[key] == pytest.approx(s_whole[key], rel=1e-5, abs=1e-7), key


def test_on_fresh_data_a_vtrace_update_with_lambda_one_is_the_gae_update():
    """Behaviour = target (fresh data): V-trace's targets are GAE's on the learner's own values, and with λ = 1
    its advantages too, so the update is the one PPO makes when the worker's GAE fields hold those."""
    batch = played_batch(make_policy(), S=12, seed=3)
    _, values = evaluated(make_policy(), batch)
    ended = batch["discounts"] == 0
    adv, ret = losses.gae(batch["rewards"].T, values.T, ended.T, batch["bootstrap"],
                          np.where(ended, 1.0, batch["discounts"]).T, lam=1.0)
    gae_batch = {**batch, "advantages": adv.T.copy(), "returns": ret.T.copy()}
    targets = vtrace_targets(make_policy(), batch, gae_lambda=1.0)
    np.testing.assert_allclose(targets[0], gae_batch["advantages"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets[1], gae_batch["returns"], rtol=1e-5, atol=1e-5)
    plain, s_plain = gradients(gae_batch, microbatch=4, gae_lambda=1.0)
    vtrace, s_vtrace = gradients(batch, microbatch=4, gae_lambda=1.0, off_policy="vtrace")
    for key in plain:
        torch.testing.assert_close(vtrace[key], plain[key], rtol=1e-4, atol=1e-6)
    for key in ("policy_loss", "value_loss", "grad_norm", "explained_variance"):
        assert s_vtrace[key] == pytest.approx(s_plain[key], rel=1e-4, abs=1e-6), key
    assert not np.allclose(batch["returns"], gae_batch["returns"])  # the worker's fields were not used


def test_on_stale_data_the_ratio_clipping_changes_the_targets():
    """Played by another policy: ρ̄ and c̄ cap the importance weights, so the targets move with them; a step
    without a choice (inactive) counts as on-policy whatever the behaviour's log-prob of its action."""
    batch = played_batch(make_policy(1), S=12, seed=4)
    clipped = vtrace_targets(make_policy(), batch)
    loose = vtrace_targets(make_policy(), batch, vtrace_rho_bar=100.0, vtrace_c_bar=100.0)
    on_policy = vtrace_targets(make_policy(), {**batch, "logp": evaluated(make_policy(), batch)[0]})
    for a, b in ((clipped, loose), (clipped, on_policy)):
        assert np.abs(a[0] - b[0]).max() > 1e-2 and np.abs(a[1] - b[1]).max() > 1e-2
    other = {**batch, "logp": np.where(batch["active"], batch["logp"], batch["logp"] - 5.0).astype(np.float32)}
    for a, b in zip(clipped, vtrace_targets(make_policy(), other)):
        np.testing.assert_array_equal(a, b)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
def test_update_on_device(device):
    policy = make_policy(0, device)
    batch = played_batch(make_policy(0), S=16, seed=7)  # played on CPU, as the workers do
    learner = Learner(policy, PPOConfig(lr=1e-3), device, microbatch_samples=8)
    before = {k: v.copy() for k, v in policy.tensors().items()}
    stats = learner.update(batch)
    assert stats["skipped"] == 0.0 and learner.updates == 1
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-5)
    assert all(np.isfinite(v) for v in stats.values())
    assert {t.device.type for t in [*policy.parameters(), *policy.buffers()]} == {device}
    after = policy.tensors()
    assert all(isinstance(v, np.ndarray) for v in after.values())
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    assert {"logits.weight", "obs_norm.mean", "obs_norm.count", "return_scale"} <= changed
    # a non-finite batch is skipped on the device too, and changes nothing
    bad = {**batch, "obs": np.full_like(batch["obs"], 3e38)}
    assert learner.update(bad)["skipped"] == 1.0
    assert all(np.array_equal(after[k], v) for k, v in policy.tensors().items())


@pytest.mark.parametrize("device", DEVICES)
def test_a_bf16_update_follows_the_fp32_gradient(device):
    """bfloat16 autocast (``optimizer.precision``) on CPU or CUDA: fresh data stays near ratio 1 and the
    gradient points where the float32 one does."""
    batch = played_batch(make_policy(0), S=16, seed=10)
    grads, stats = {}, {}
    for bf16 in (False, True):
        record = GradRecorder()
        learner = Learner(make_policy(0, device), PPOConfig(lr=1e-3), device, bf16=bf16, all_reduce=record)
        stats[bf16] = learner.update(batch)
        grads[bf16] = torch.cat([g.flatten().float().cpu() for g in record.grads.values()])
        assert stats[bf16]["skipped"] == 0.0 and learner.updates == 1
    assert stats[False]["approx_kl"] == pytest.approx(0.0, abs=1e-5)
    assert 0.0 < abs(stats[True]["approx_kl"]) < 1e-2  # bfloat16 rounding shows, within PPO's noise
    cosine = torch.nn.functional.cosine_similarity(grads[False], grads[True], dim=0)
    assert cosine > 0.99
    assert not torch.equal(grads[False], grads[True])


def test_bf16_native_is_false_where_bfloat16_would_be_emulated(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert not bf16_native(cpu)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert bf16_native(cpu)
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    assert not bf16_native(cpu)  # a torch without the probes


@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_loads_onto_a_device_learner(device):
    from rapid.formats.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint

    batch = played_batch(make_policy(0), S=8, seed=8)
    first = Learner(make_policy(0, device), PPOConfig(lr=1e-3), device)
    first.update(batch)
    data = encode_checkpoint(Checkpoint.from_torch(1, 1, first.policy.tensors(), first.adam.state_dict()))
    ckpt = decode_checkpoint(data)
    resumed = Learner(make_policy(1, device), PPOConfig(lr=1e-3), device)
    resumed.policy.load_tensors(ckpt.model)
    resumed.adam.load_state_dict(ckpt.adam_state())
    moments = [t for s in resumed.adam.state.values() for name, t in s.items() if name != "step"]
    assert moments and {t.device.type for t in moments} == {device}
    first.update(batch)
    resumed.update(batch)  # the same next step as the learner that was never stopped
    for k, v in first.policy.tensors().items():
        np.testing.assert_allclose(resumed.policy.tensors()[k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_a_batch_staged_ahead_trains_as_the_arrays_do(device):
    batch = played_batch(make_policy(0), S=12, seed=9)
    a = Learner(make_policy(0, device), PPOConfig(lr=1e-3), device, microbatch_samples=4)
    b = Learner(make_policy(0, device), PPOConfig(lr=1e-3), device, microbatch_samples=4)
    staged = b.stage(batch)
    arrays = {**staged.whole(), **staged.chunk(0)[0]}
    assert {t.device.type for t in arrays.values()} == {device}
    sa, sb = a.update(batch), b.update(staged)
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm", "explained_variance"):
        assert sb[key] == pytest.approx(sa[key], rel=1e-6, abs=1e-9), key
    for k, v in a.policy.tensors().items():
        np.testing.assert_allclose(b.policy.tensors()[k], v, rtol=1e-6, atol=1e-7)


def test_learner_device_carries_its_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # no GPU needed: the index is injected
    assert indexed("cuda") == torch.device("cuda:1")
    assert indexed(torch.device("cuda", 0)) == torch.device("cuda:0")
    assert indexed("cpu") == torch.device("cpu")


@pytest.mark.cuda
def test_stage_keeps_a_batch_already_on_the_gpu():
    learner = Learner(make_policy(), PPOConfig(), "cuda")
    assert learner.device.index is not None
    on_gpu = {k: torch.as_tensor(v).to(learner.device) for k, v in played_batch(make_policy(), seed=3).items()}
    staged = learner.stage(on_gpu)
    arrays = {**staged.whole(), **staged.chunk(0)[0]}
    # No copy: each staged tensor reads the very memory the caller's tensor holds (slicing makes a new view
    # object, so identity is not the property; the storage is).
    assert all(arrays[k].data_ptr() == on_gpu[k].data_ptr() and arrays[k].device == on_gpu[k].device for k in arrays)


@pytest.mark.cuda
def test_phase_timings_on_cuda_measure_the_gpu():
    """On CUDA an update reports the phases of the update before it (their events are read once this update's
    one wait has passed them): the first reports zeros."""
    learner = Learner(make_policy(), PPOConfig(), "cuda")
    batch = played_batch(make_policy(), seed=4)
    first = learner.update(batch)  # warm-up: cuDNN plans, allocator
    assert [first[f"{p}_s"] for p in ("forward", "backward", "allreduce", "step")] == [0.0] * 4
    measured = learner.update(batch)
    stats = learner.update(batch)  # holds the phases of `measured`
    phases = stats["forward_s"] + stats["backward_s"] + stats["allreduce_s"] + stats["step_s"]
    # Host clocks read launch times: forward and backward near 0 and the GPU's time in step_s.
    assert stats["forward_s"] > 0 and stats["backward_s"] > 0, stats
    # The GPU may finish Adam's kernels after the host returned: a little slack over the host's time.
    assert phases <= measured["update_s"] * 1.2 + 1e-3 and stats["backward_s"] > 0.1 * stats["step_s"], stats

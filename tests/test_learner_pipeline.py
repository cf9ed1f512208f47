"""The learner's input pipeline (``rapid.opt.pipeline``) and the GPU-side choices of the update: the copies a
GPU would make, counted on the CPU through an injected copier; staging ahead changes no update; the heads in
float32 under bf16 autocast; fused Adam where it is decided to be. The ``cuda`` tests check what only a GPU
shows: one wait per update under ``torch.cuda.set_sync_debug_mode("error")``, and the side stream's results."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rapid.roles.optimizer as optimizer
from rapid.opt.buffer import ExperienceBuffer
from rapid.opt.config import PPOConfig
from rapid.opt.learner import Learner, fused_adam
from rapid.opt.model import Policy
from rapid.opt.pipeline import PackedBatch, stages_ahead
from rapid.roles.startup import StopFlag
from tests.learner_data import HEADS, LSTM, OBS, make_policy, played_batch
from tests.test_optimizer_loop import plant, small_config

torch.set_num_threads(1)


class CountingCopier:
    """The host-to-device copies a GPU would make, made on the CPU and counted."""

    def __init__(self):
        self.calls = 0

    def __call__(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.calls += 1
        dst.copy_(src)


def test_an_update_copies_its_batch_in_one_copy_per_chunk():
    """Today's staging made a copy per array and four more per chunk for the reset-free runs (batches with game
    starts inside samples: 80–99.8% of moba's): the pipeline packs them all, one copy per chunk."""
    batch = played_batch(make_policy(), S=12, reset_prob=0.3)
    assert batch["first"][:, 1:].any()  # runs to copy
    for chunk, copies in ((0, 1), (4, 3)):
        copier = CountingCopier()
        learner = Learner(make_policy(), PPOConfig(lr=1e-3), microbatch_samples=chunk, staging=True, copier=copier)
        assert learner.update(batch)["skipped"] == 0.0
        assert copier.calls == copies, (chunk, copier.calls)


def test_a_vtrace_update_through_staging_copies_a_chunk_again_and_equals_one_in_place():
    """V-trace's targets take a pass over the chunks before the losses' pass. Chunk 0 (with the whole batch's
    figures) stays on the device; every other chunk left it in the first pass (at most two chunks beside chunk
    0 at a time) and is copied again from the host arena: three chunks cost 3 + 2 copies. The update equals the
    one made where the batch lies."""
    batch = played_batch(make_policy(1), S=12, seed=2, reset_prob=0.3)  # another policy's: stale
    ppo = PPOConfig(lr=1e-3, off_policy="vtrace")
    for chunk, copies in ((0, 1), (4, 5)):
        copier = CountingCopier()
        staged = Learner(make_policy(), ppo, microbatch_samples=chunk, staging=True, copier=copier)
        plain = Learner(make_policy(), ppo, microbatch_samples=chunk)
        sa, sp = staged.update(batch), plain.update(batch)
        assert copier.calls == copies, (chunk, copier.calls)
        for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm", "explained_variance"):
            assert sa[key] == sp[key], (chunk, key, sa[key], sp[key])
        for (name, a), b in zip(staged.policy.state_dict().items(), plain.policy.state_dict().values()):
            assert torch.equal(a, b), name


def test_staging_ahead_trains_exactly_as_the_numpy_path():
    """Four updates, each drawing and staging the next batch through the double buffer, equal four updates
    handed numpy arrays: the same parameters, normalizers and figures, and each batch copied once."""
    batches = [played_batch(make_policy(), S=12, seed=s, reset_prob=0.3) for s in range(4)]
    copier = CountingCopier()
    ahead = Learner(make_policy(), PPOConfig(lr=1e-3), microbatch_samples=4, staging=True, copier=copier)
    plain = Learner(make_policy(), PPOConfig(lr=1e-3), microbatch_samples=4)
    for k, batch in enumerate(batches):
        if k + 1 < len(batches):
            ahead.prefetch(lambda k=k: batches[k + 1])
        sa, sp = ahead.update(batch), plain.update(batch)
        for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm", "explained_variance"):
            assert sa[key] == sp[key], (k, key, sa[key], sp[key])
    assert copier.calls == 3 * len(batches)  # three chunks each, staged once
    for (name, a), b in zip(ahead.policy.state_dict().items(), plain.policy.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_draw_that_finds_nothing_leaves_the_next_update_to_stage_its_own():
    batch = played_batch(make_policy(), S=8)
    learner = Learner(make_policy(), PPOConfig(lr=1e-3), staging=True, copier=CountingCopier())
    learner.prefetch(lambda: None)
    learner.update(batch)
    assert learner.update(batch)["skipped"] == 0.0


def test_a_staged_batch_cannot_outlive_its_half_of_the_double_buffer():
    learner = Learner(make_policy(), PPOConfig(lr=1e-3), microbatch_samples=4, staging=True,
                      copier=CountingCopier())
    old = learner.stage(played_batch(make_policy(), S=12, seed=1))
    learner.stage(played_batch(make_policy(), S=12, seed=2))
    learner.stage(played_batch(make_policy(), S=12, seed=3))  # the first batch's half again
    with pytest.raises(RuntimeError, match="host buffer was reused"):
        old.chunk(1)


def test_the_heads_run_in_float32_under_bf16_autocast():
    """Without an encoder the whole forward is the LSTM and the heads, float32 even under bf16 autocast: fresh
    data has a PPO ratio of 1 to float32's rounding and the values are the worker's (the heads in bf16 put the
    ratio up to ~1e-2 away)."""
    torch.manual_seed(0)
    policy = Policy(OBS, HEADS, hidden=16, encoder_layers=0, lstm=LSTM)
    with torch.no_grad():
        policy.logits.weight.normal_(0, 2.0)
    batch = played_batch(policy, S=12, seed=5)
    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    with torch.autocast("cpu", torch.bfloat16):
        logp, _, value = policy.evaluate(t["obs"], t["mask"], t["actions"], t["h0"], t["c0"], t["first"])
    assert logp.dtype == value.dtype == torch.float32
    ratio = (logp - t["logp"]).exp()
    assert (ratio - 1).abs().max().item() < 1e-6, (ratio - 1).abs().max().item()
    torch.testing.assert_close(value * policy.return_scale.float(), t["values"], rtol=1e-5, atol=1e-5)
    stats = Learner(policy, PPOConfig(lr=1e-3), bf16=True).update(batch)
    assert stats["clip_fraction"] == 0.0 and abs(stats["approx_kl"]) < 1e-9, stats


@pytest.mark.parametrize("device, fused", [("cuda:0", True), ("cuda:3", True), ("cpu", False)])
def test_adam_is_fused_on_cuda_only(device, fused):
    assert fused_adam(torch.device(device)) is fused
    assert stages_ahead(torch.device(device)) is fused  # pinned memory and a side stream only where a GPU is


def buffer_of(batches, keep_reference=False):
    buffer = ExperienceBuffer(64, max_staleness=8, keep_reference=keep_reference)
    for i, b in enumerate(batches):
        buffer.add({**{k: np.asarray(v) for k, v in b.items()}, "version": np.full(len(b["active"]), i, np.int64)})
    return buffer


@pytest.mark.parametrize("proximal", ["behaviour", "first_use"])
def test_a_batch_gathered_from_the_buffer_into_the_arena_trains_as_one_drawn_out_first(proximal):
    """Issue 59: a staging learner takes a drawn batch from the buffer's rows straight into its arena (one host copy,
    under the buffer's lock) instead of drawing it out and packing it (two). The same rows give the same update,
    with one device copy per chunk; the buffer's slots and generations ride along for its first-use references."""
    ppo = PPOConfig(lr=1e-3, proximal=proximal)
    batches = [played_batch(make_policy(), S=12, seed=s, reset_prob=0.3) for s in range(2)]
    gathered_from = buffer_of(batches, keep_reference=proximal == "first_use")
    drawn_from = buffer_of(batches, keep_reference=proximal == "first_use")
    copier = CountingCopier()
    gathering = Learner(make_policy(), ppo, microbatch_samples=4, staging=True, copier=copier)
    drawing = Learner(make_policy(), ppo, microbatch_samples=4, staging=True, copier=CountingCopier())
    for k in range(3):
        got, s1 = gathered_from.sample(12, 1, np.random.default_rng(k), into=gathering.gather)
        want, s2 = drawn_from.sample(12, 1, np.random.default_rng(k))
        assert isinstance(got, PackedBatch) and np.array_equal(s1, s2)
        assert not ({"obs", "mask", "actions"} & set(got)), "the arrays went to the arena only"
        ga, da = gathering.update(got), drawing.update(want)
        for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm"):
            assert ga[key] == da[key], (k, key)
        gathered_from.remember(got, gathering.reference_logp)
        drawn_from.remember(want, drawing.reference_logp)
    assert copier.calls == 3 * 3  # three chunks a batch, one copy each
    for (name, a), b in zip(gathering.policy.state_dict().items(), drawing.policy.state_dict().values()):
        assert torch.equal(a, b), name
    plain = Learner(make_policy(), ppo)  # no staging: the rows are drawn out as arrays, as the buffer would
    out, _ = buffer_of(batches).sample(4, 1, np.random.default_rng(0), into=plain.gather)
    assert not isinstance(out, PackedBatch) and out["obs"].shape[0] == 4


def test_the_cpu_learner_pins_nothing_and_copies_nothing():
    copier = CountingCopier()
    learner = Learner(make_policy(), PPOConfig(lr=1e-3), copier=copier)
    learner.prefetch(lambda: played_batch(make_policy(), S=8, seed=1))
    learner.update(played_batch(make_policy(), S=8))
    assert copier.calls == 0 and learner.adam.defaults["fused"] is False
    assert all(slot.arena.numel() == 0 for slot in learner.pipeline.slots) and learner.pipeline.side is None


def test_the_optimizer_loop_trains_batches_drawn_during_the_update_before(tmp_path, monkeypatch):
    cfg = small_config(tmp_path, "run.updates=4", "rollout.upload_interval_s=0.001")
    plant(cfg, objects=6)
    real = optimizer.Learner.update
    drawn_ahead = []

    def spying(self, batch, progress=0.0):
        drawn_ahead.append(self._ahead is not None and self._ahead[0] is batch)
        return real(self, batch, progress)
    monkeypatch.setattr(optimizer.Learner, "update", spying)
    assert optimizer.run_optimizer(cfg, stop=StopFlag(install_signals=False)) == 0
    assert len(drawn_ahead) == 4 and drawn_ahead[0] is False and any(drawn_ahead[1:]), drawn_ahead


# --- on a GPU ------------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("chunk", [0, 4])
@pytest.mark.parametrize("off_policy", ["none", "vtrace"])
def test_an_update_on_cuda_waits_for_the_device_exactly_once(monkeypatch, chunk, off_policy):
    """Under ``set_sync_debug_mode("error")`` every wait of the host for the device raises, except the one read
    this test lets through: staging the next batch, the copies, the runs, the timings, V-trace's pass and Adam
    wait for nothing."""
    learner = Learner(make_policy(0, "cuda"), PPOConfig(lr=1e-3, off_policy=off_policy), "cuda",
                      microbatch_samples=chunk)
    assert learner.adam.defaults["fused"] is True
    batches = [played_batch(make_policy(), S=12, seed=s, reset_prob=0.3) for s in range(3)]
    learner.prefetch(lambda: batches[1])
    learner.update(batches[0])  # warm-up: Adam's state, cuDNN plans, both pinned halves
    learner.prefetch(lambda: batches[2])
    reads, tolist = [], torch.Tensor.tolist

    def the_one_read(self):
        reads.append(tuple(self.shape))
        torch.cuda.set_sync_debug_mode("default")
        try:
            return tolist(self)
        finally:
            torch.cuda.set_sync_debug_mode("error")
    monkeypatch.setattr(torch.Tensor, "tolist", the_one_read)
    torch.cuda.set_sync_debug_mode("error")
    try:
        stats = learner.update(batches[1])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(reads) == 1 and stats["skipped"] == 0.0, (reads, stats)


@pytest.mark.cuda
def test_staging_ahead_on_the_side_stream_trains_as_the_numpy_path():
    """The copies run on a side stream beside the update before: what the update reads must be the batch, whole
    (a wait missing, or memory reused too early, shows here as a different update)."""
    batches = [played_batch(make_policy(), S=64, seed=s, reset_prob=0.3) for s in range(4)]
    ahead = Learner(make_policy(0, "cuda"), PPOConfig(lr=1e-3), "cuda", microbatch_samples=16)
    plain = Learner(make_policy(0, "cuda"), PPOConfig(lr=1e-3), "cuda", microbatch_samples=16)
    plain.pipeline.staging = False  # tensors copied as they are, on the learner's own stream
    for k, batch in enumerate(batches):
        if k + 1 < len(batches):
            ahead.prefetch(lambda k=k: batches[k + 1])
        sa, sp = ahead.update(batch), plain.update({key: torch.as_tensor(v) for key, v in batch.items()})
        diffs = {key: abs(sa[key] - sp[key]) for key in ("policy_loss", "value_loss", "grad_norm")}
        assert max(diffs.values()) < 1e-5, (k, diffs)
    worst = max((a - b).abs().max().item() for a, b in zip(ahead.policy.parameters(), plain.policy.parameters()))
    assert worst < 1e-5, worst
    assert {slot.arena.is_pinned() for slot in ahead.pipeline.slots} == {True}


@pytest.mark.cuda
def test_a_vtrace_update_on_cuda_equals_the_cpus():
    """Both passes over the chunks through the side stream (a chunk copied again for the second): the targets and
    the update are the CPU's, to float32 rounding."""
    batches = [played_batch(make_policy(1), S=64, seed=s, reset_prob=0.3) for s in range(3)]  # stale: traces cut
    ppo = PPOConfig(lr=1e-3, off_policy="vtrace")
    gpu = Learner(make_policy(0, "cuda"), ppo, "cuda", microbatch_samples=16)
    cpu = Learner(make_policy(0), ppo, microbatch_samples=16)
    for a, b in zip(gpu.targets(gpu.stage(batches[0])), cpu.targets(cpu.stage(batches[0]))):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)
    for k, batch in enumerate(batches):
        if k + 1 < len(batches):
            gpu.prefetch(lambda k=k: batches[k + 1])
        sg, sc = gpu.update(batch), cpu.update(batch)
        diffs = {key: abs(sg[key] - sc[key]) for key in ("policy_loss", "value_loss", "grad_norm")}
        assert max(diffs.values()) < 1e-4, (k, diffs)
    worst = max((a.cpu() - b).abs().max().item() for a, b in zip(gpu.policy.parameters(), cpu.policy.parameters()))
    assert worst < 1e-4, worst


@pytest.mark.cuda
def test_batches_gathered_from_the_buffer_ahead_on_the_side_stream_train_as_the_numpy_path():
    """The one-copy path on a GPU: each next batch gathered from the buffer's rows into the pinned arena during the
    update before (the loop's draw-ahead) and copied on the side stream trains as the same rows handed over whole."""
    batches = [played_batch(make_policy(), S=64, seed=s, reset_prob=0.3) for s in range(2)]
    gathered_from, drawn_from = buffer_of(batches), buffer_of(batches)
    ahead = Learner(make_policy(0, "cuda"), PPOConfig(lr=1e-3), "cuda", microbatch_samples=16)
    plain = Learner(make_policy(0, "cuda"), PPOConfig(lr=1e-3), "cuda", microbatch_samples=16)
    plain.pipeline.staging = False
    draws = [np.random.default_rng(k) for k in range(5)]
    batch, _ = gathered_from.sample(64, 1, draws[0], into=ahead.gather)
    for k in range(4):
        ahead.prefetch(lambda k=k: gathered_from.sample(64, 1, draws[k + 1], into=ahead.gather)[0])
        want, _ = drawn_from.sample(64, 1, np.random.default_rng(k))
        sa, sp = ahead.update(batch), plain.update({key: torch.as_tensor(v) for key, v in want.items()})
        diffs = {key: abs(sa[key] - sp[key]) for key in ("policy_loss", "value_loss", "grad_norm")}
        assert max(diffs.values()) < 1e-5, (k, diffs)
        batch = ahead._ahead[0]
    assert {slot.arena.is_pinned() for slot in ahead.pipeline.slots} == {True}

"""Decoupled PPO (``ppo.proximal = "first_use"``): the ratio clipped against the learner's own log-probs of each
sample's first use, each step weighted by π_first/π_behav; against a direct formula and against plain PPO where
the two must agree."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rapid.opt import losses
from rapid.opt.buffer import ExperienceBuffer
from rapid.opt.config import PPOConfig
from rapid.opt.learner import Learner
from tests.learner_data import make_policy, played_batch
from tests.test_learner import evaluated, gradients

torch.set_num_threads(1)


def _direct_decoupled(current, proximal, behaviour, advs, clip, rho_bar):
    terms = []
    for c, p, b, a in zip(current, proximal, behaviour, advs):
        weight = min(rho_bar, math.exp(p - b))
        r = math.exp(c - p)
        terms.append(weight * min(r * a, min(max(r, 1 - clip), 1 + clip) * a))
    return -sum(terms) / len(terms)


@pytest.mark.parametrize("rho_bar", [1.0, 2.0, 100.0])
def test_the_decoupled_loss_against_a_direct_formula(rho_bar):
    rng = np.random.default_rng(0)
    behaviour, proximal, current = (torch.tensor(rng.uniform(-2.5, -0.1, 32)) for _ in range(3))
    advs = torch.tensor(rng.normal(size=32))
    importance = losses.proximal_weights(proximal, behaviour, rho_bar)
    loss, diag = losses.ppo_policy_loss(current, proximal, advs, 0.2, torch.ones(32, dtype=torch.float64),
                                        importance=importance)
    expected = _direct_decoupled(current.tolist(), proximal.tolist(), behaviour.tolist(), advs.tolist(), 0.2, rho_bar)
    assert float(loss) == pytest.approx(expected, rel=1e-9)
    assert float(importance.max()) <= rho_bar
    clipped = sum(abs(math.exp(c - p) - 1) > 0.2 for c, p in zip(current.tolist(), proximal.tolist()))
    assert float(diag["clip_fraction"]) == pytest.approx(clipped / 32)  # of the ratio to the proximal, unweighted


def test_no_gradient_flows_through_the_weights():
    proximal = torch.tensor([-1.0, -0.5], requires_grad=True)
    assert not losses.proximal_weights(proximal, torch.tensor([-1.2, -0.4]), 1.0).requires_grad


def with_references(batch, reference_logp):
    return {**batch, "reference_logp": np.asarray(reference_logp, np.float32)}


def test_on_stale_data_a_first_use_clips_nothing():
    """Played by another policy: plain PPO clips many of the ratios at once; against the first use's own
    log-probs (none stored yet) nothing is clipped and the approximate KL is zero."""
    batch = played_batch(make_policy(1), S=12, seed=4)
    _, plain = gradients(batch)
    _, first = gradients(batch, proximal="first_use")
    assert plain["clip_fraction"] > 0.2 and plain["approx_kl"] > 0.05
    assert first["clip_fraction"] == 0.0
    assert first["approx_kl"] == pytest.approx(0.0, abs=1e-6)


def test_the_learner_hands_back_the_first_uses_log_probs_and_keeps_those_it_was_given():
    batch = played_batch(make_policy(1), S=12, seed=4)
    own = evaluated(make_policy(), batch)[0]
    kept = np.where(np.arange(12)[:, None] < 6, batch["logp"] - 0.5, np.nan)  # the first six samples were used
    learner = Learner(make_policy(), PPOConfig(proximal="first_use"))
    learner.update(with_references(batch, kept))
    np.testing.assert_allclose(learner.reference_logp[:6], kept[:6])
    np.testing.assert_allclose(learner.reference_logp[6:], own[6:], rtol=1e-5, atol=1e-5)
    assert Learner(make_policy(), PPOConfig()).reference_logp is None


def test_on_fresh_data_a_first_use_is_plain_ppo():
    """Played by the learner's own policy and never used: the reference is the behaviour, every weight 1."""
    batch = played_batch(make_policy(), S=12, seed=3)
    batch["logp"] = evaluated(make_policy(), batch)[0]
    plain, s_plain = gradients(batch)
    first, s_first = gradients(batch, proximal="first_use", proximal_rho_bar=100.0)
    for key in plain:
        torch.testing.assert_close(first[key], plain[key], rtol=1e-4, atol=1e-6)
    for key in ("policy_loss", "value_loss", "grad_norm"):
        assert s_first[key] == pytest.approx(s_plain[key], rel=1e-4, abs=1e-6), key


def test_a_reused_sample_is_clipped_against_its_first_use_weighted_by_first_over_behaviour():
    """References stored: the update is PPO's against them, each step's surrogate weighted by
    min(ρ̄, π_first/π_behav); its policy loss is the direct formula's."""
    batch = played_batch(make_policy(1), S=12, seed=2)
    own = evaluated(make_policy(), batch)[0]
    first_use = own - 0.3 * np.sign(np.random.default_rng(0).normal(size=own.shape))
    _, stats = gradients(with_references(batch, first_use), proximal="first_use", proximal_rho_bar=1.5)
    adv = losses.normalize_advantages(torch.as_tensor(batch["advantages"]), torch.as_tensor(batch["active"]).float())
    on = batch["active"]
    expected = _direct_decoupled(own[on].tolist(), first_use[on].tolist(), batch["logp"][on].tolist(),
                                 adv.numpy()[on].tolist(), 0.2, 1.5)
    assert stats["policy_loss"] == pytest.approx(expected, rel=1e-4)
    assert stats["clip_fraction"] > 0.5  # every ratio sits 0.3 away from its first use: outside the clip


def test_microbatches_do_not_change_the_first_use_gradient():
    batch = played_batch(make_policy(1), S=12, seed=2)
    references = np.where(np.arange(12)[:, None] % 2 == 0, batch["logp"] + 0.1, np.nan)
    whole, s_whole = gradients(with_references(batch, references), proximal="first_use", proximal_rho_bar=1.5)
    parts, s_parts = gradients(with_references(batch, references), microbatch=4, proximal="first_use",
                               proximal_rho_bar=1.5)
    for key in whole:
        torch.testing.assert_close(parts[key], whole[key], rtol=1e-5, atol=1e-6)
    for key in ("policy_loss", "approx_kl", "clip_fraction"):
        assert s_parts[key] == pytest.approx(s_whole[key], rel=1e-5, abs=1e-7), key


def test_the_proximal_settings_are_checked():
    assert PPOConfig(proximal="first_use", proximal_rho_bar=2.0).errors() == []
    assert PPOConfig(proximal="latest", proximal_rho_bar=0.0).errors() == [
        "ppo.proximal must be 'behaviour' or 'first_use' (got 'latest')", "ppo.proximal_rho_bar must be > 0 (got 0.0)"]


def test_the_buffer_keeps_a_samples_first_reference_while_it_holds_the_sample():
    buf = ExperienceBuffer(capacity=4, max_staleness=100, keep_reference=True)
    rng = np.random.default_rng(0)
    buf.add({"logp": np.zeros((4, 2), np.float32), "version": np.arange(4)})
    batch, _ = buf.sample(2, 4, rng)
    assert np.isnan(batch["reference_logp"]).all() and sorted(batch["generation"]) == [1, 1]
    buf.remember(batch, np.full((2, 2), -1.0, np.float32))
    buf.remember(batch, np.full((2, 2), -9.0, np.float32))  # a second use keeps the first's
    again, _ = buf.sample(4, 4, rng)
    kept = {int(s): r for s, r in zip(again["slot"], again["reference_logp"])}
    assert all((kept[int(s)] == -1.0).all() for s in batch["slot"])
    assert sum(np.isnan(r).all() for r in kept.values()) == 2
    buf.add({"logp": np.zeros((4, 2), np.float32), "version": np.full(4, 5)})  # every slot written again
    buf.remember(again, np.full((4, 2), -2.0, np.float32))  # for samples no longer held: dropped
    fresh, _ = buf.sample(4, 5, rng)
    assert np.isnan(fresh["reference_logp"]).all() and (fresh["generation"] == 2).all()


def test_without_references_the_buffer_serves_what_it_was_given():
    buf = ExperienceBuffer(capacity=4, max_staleness=100)
    buf.add({"logp": np.zeros((4, 2), np.float32), "version": np.arange(4)})
    batch, _ = buf.sample(2, 4, np.random.default_rng(0))
    assert sorted(batch) == ["logp", "version"]
    buf.remember(batch, np.zeros((2, 2), np.float32))  # nothing to keep


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_first_use_update_on_the_device_hands_back_host_references(device):
    batch = played_batch(make_policy(1), S=12, seed=4)
    references = np.where(np.arange(12)[:, None] < 6, batch["logp"] - 0.2, np.nan)
    cpu = Learner(make_policy(), PPOConfig(proximal="first_use"))
    on_device = Learner(make_policy(), PPOConfig(proximal="first_use"), device)
    s_cpu = cpu.update(with_references(batch, references))
    s_device = on_device.update(with_references(batch, references))
    assert isinstance(on_device.reference_logp, np.ndarray)
    np.testing.assert_allclose(on_device.reference_logp, cpu.reference_logp, rtol=1e-4, atol=1e-5)
    assert s_device["policy_loss"] == pytest.approx(s_cpu["policy_loss"], rel=1e-3, abs=1e-6)


def test_with_proximal_every_a_new_samples_reference_is_the_copy_of_every_nth_update():
    """A sample used once is clipped too: its reference comes from the copy taken at updates 0, 3, 6, …"""
    batch = played_batch(make_policy(1), S=12, seed=4)
    learner = Learner(make_policy(), PPOConfig(lr=1e-2, proximal="first_use", proximal_every=3))
    taken = {}
    for update in range(5):
        if update % 3 == 0:
            taken[update] = evaluated(learner.policy, batch)[0]
        stats = learner.update(batch)
        np.testing.assert_allclose(learner.reference_logp, taken[3 * (update // 3)], rtol=1e-4, atol=1e-4)
    assert stats["clip_fraction"] > 0.0  # update 4 trains against the copy of update 3
    assert not np.allclose(taken[0], taken[3], atol=1e-3)

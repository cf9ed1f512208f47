"""Decoupled PPO (``ppo.proximal_every``): the ratio clipped against the learner's recent policy, each sample
weighted by π_prox/π_behav; against a direct formula and against plain PPO where the two must agree."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rapid.opt import losses
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


def test_on_stale_data_the_first_update_clips_nothing():
    """Played by another policy: plain PPO clips many of the ratios at once, the proximal policy (the learner's
    own at its first update) none, and the approximate KL is the learner's own movement: zero."""
    batch = played_batch(make_policy(1), S=12, seed=4)
    _, plain = gradients(batch)
    _, decoupled = gradients(batch, proximal_every=4)
    assert plain["clip_fraction"] > 0.2 and plain["approx_kl"] > 0.05
    assert decoupled["clip_fraction"] == 0.0
    assert decoupled["approx_kl"] == pytest.approx(0.0, abs=1e-6)


def test_on_fresh_data_the_decoupled_update_is_plain_ppo():
    """Played by the learner's own policy: the proximal policy is the behaviour, every weight is 1."""
    batch = played_batch(make_policy(), S=12, seed=3)
    batch["logp"] = evaluated(make_policy(), batch)[0]
    plain, s_plain = gradients(batch)
    decoupled, s_decoupled = gradients(batch, proximal_every=4, proximal_rho_bar=100.0)
    for key in plain:
        torch.testing.assert_close(decoupled[key], plain[key], rtol=1e-4, atol=1e-6)
    for key in ("policy_loss", "value_loss", "grad_norm"):
        assert s_decoupled[key] == pytest.approx(s_plain[key], rel=1e-4, abs=1e-6), key


def test_microbatches_do_not_change_the_decoupled_gradient():
    batch = played_batch(make_policy(1), S=12, seed=2)
    whole, s_whole = gradients(batch, proximal_every=2, proximal_rho_bar=1.5)
    parts, s_parts = gradients(batch, microbatch=4, proximal_every=2, proximal_rho_bar=1.5)
    for key in whole:
        torch.testing.assert_close(parts[key], whole[key], rtol=1e-5, atol=1e-6)
    for key in ("policy_loss", "approx_kl", "clip_fraction"):
        assert s_parts[key] == pytest.approx(s_whole[key], rel=1e-5, abs=1e-7), key


def test_the_proximal_policy_is_the_policy_of_every_nth_update():
    learner = Learner(make_policy(), PPOConfig(lr=1e-2, proximal_every=3))
    batch = played_batch(make_policy(1), S=8, seed=5)
    snapshots = []
    for _ in range(7):
        snapshots.append({k: v.copy() for k, v in learner.policy.tensors().items()})
        learner.update(batch)
        held = learner.proximal.state_dict()
        taken = [i for i, s in enumerate(snapshots)
                 if all(np.array_equal(held[k].numpy(), s[k]) for k in ("logits.weight", "obs_norm.mean"))]
        assert taken == [3 * ((len(snapshots) - 1) // 3)]  # refreshed before updates 0, 3 and 6


def test_the_proximal_settings_are_checked():
    assert PPOConfig(proximal_every=8, proximal_rho_bar=2.0).errors() == []
    assert PPOConfig(proximal_every=-1, proximal_rho_bar=0.0).errors() == [
        "ppo.proximal_every must be ≥ 0 (got -1)", "ppo.proximal_rho_bar must be > 0 (got 0.0)"]

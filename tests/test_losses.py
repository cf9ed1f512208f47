"""The learning math (rapid.opt.losses) against plain reference loops and hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rapid.opt import losses

torch.set_num_threads(1)


# --- GAE ----------------------------------------------------------------------------------------------


def reference_gae(rewards, values, dones, last_value, gamma, lam):
    """Textbook GAE, one agent at a time, in plain Python floats; ``gamma`` a number or a [T][N] list."""
    T, N = len(rewards), len(rewards[0])
    discount = gamma if isinstance(gamma, list) else [[gamma] * N for _ in range(T)]
    adv = [[0.0] * N for _ in range(T)]
    ret = [[0.0] * N for _ in range(T)]
    for n in range(N):
        gae_run = 0.0
        for t in reversed(range(T)):
            if dones[t][n]:
                next_v, carry = 0.0, 0.0  # the game ended with this transition: nothing beyond it
            else:
                next_v = float(last_value[n]) if t == T - 1 else float(values[t + 1][n])
                carry = gae_run
            delta = float(rewards[t][n]) + discount[t][n] * next_v - float(values[t][n])
            gae_run = delta + discount[t][n] * lam * carry
            adv[t][n] = gae_run
            ret[t][n] = gae_run + float(values[t][n])
    return np.array(adv), np.array(ret)


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_reference_loop_with_episode_ends_inside(seed):
    rng = np.random.default_rng(seed)
    T, N = 24, 6
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    dones = rng.random((T, N)) < 0.15
    dones[5, 0] = True          # an end in the middle
    dones[T - 1, 1] = True      # an end on the last step: no bootstrap for that agent
    dones[:, 2] = False         # an agent with no end: bootstrapped from last_value
    last_value = rng.normal(size=N).astype(np.float32) * 3
    adv, ret = losses.gae(rewards, values, dones, last_value, gamma=0.97, lam=0.9)
    ref_adv, ref_ret = reference_gae(rewards.tolist(), values.tolist(), dones.tolist(), last_value, 0.97, 0.9)
    assert adv.shape == ret.shape == (T, N)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_gae_discounts_each_step_by_its_own_gamma():
    """A turn-based agent's decision is followed by a varying number of game steps (a player eliminated, a turn
    skipped): each decision carries its own discount."""
    rng = np.random.default_rng(7)
    T, N = 16, 4
    rewards, values = rng.normal(size=(2, T, N)).astype(np.float32)
    dones = rng.random((T, N)) < 0.1
    last_value = rng.normal(size=N).astype(np.float32)
    gamma = 0.99 ** rng.integers(1, 4, (T, N))
    adv, ret = losses.gae(rewards, values, dones, last_value, gamma=gamma, lam=0.9)
    ref_adv, ref_ret = reference_gae(rewards.tolist(), values.tolist(), dones.tolist(), last_value, gamma.tolist(),
                                     0.9)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)
    same, _ = losses.gae(rewards, values, dones, last_value, gamma=0.99, lam=0.9)
    assert not np.allclose(adv, same, atol=1e-3)


def test_gae_hand_computed_small_case():
    # One agent, 3 steps, the game ends on step 1; gamma = 0.5, lambda = 1 (plain discounted returns - V).
    rewards = np.array([[1.0], [2.0], [4.0]], np.float32)
    values = np.array([[0.0], [0.0], [0.0]], np.float32)
    dones = np.array([[False], [True], [False]])
    last = np.array([8.0], np.float32)
    adv, ret = losses.gae(rewards, values, dones, last, gamma=0.5, lam=1.0)
    # t=2: 4 + 0.5*8 = 8; t=1: 2 (done, nothing beyond); t=0: 1 + 0.5*2 = 2
    np.testing.assert_allclose(ret[:, 0], [2.0, 2.0, 8.0])
    np.testing.assert_allclose(adv[:, 0], [2.0, 2.0, 8.0])


def test_gae_bootstrap_only_at_segment_end():
    # No rewards, no dones: all the signal comes from last_value, discounted by gamma*lambda per step.
    T = 4
    rewards = np.zeros((T, 1), np.float32)
    values = np.zeros((T, 1), np.float32)
    dones = np.zeros((T, 1), bool)
    adv, ret = losses.gae(rewards, values, dones, np.array([1.0], np.float32), gamma=0.9, lam=0.5)
    expected = [0.9 * (0.45 ** (T - 1 - t)) for t in range(T)]
    np.testing.assert_allclose(adv[:, 0], expected, rtol=1e-6)
    # lambda = 1 gives the Monte Carlo return to the bootstrap
    adv1, ret1 = losses.gae(rewards, values, dones, np.array([1.0], np.float32), gamma=0.9, lam=1.0)
    np.testing.assert_allclose(ret1[:, 0], [0.9 ** (T - t) for t in range(T)], rtol=1e-6)


def test_gae_returns_are_advantages_plus_values():
    rng = np.random.default_rng(7)
    r, v = rng.normal(size=(10, 3)).astype(np.float32), rng.normal(size=(10, 3)).astype(np.float32)
    d = rng.random((10, 3)) < 0.3
    adv, ret = losses.gae(r, v, d, np.zeros(3, np.float32), 0.99, 0.95)
    np.testing.assert_allclose(ret - adv, v, atol=1e-6)


# --- reward mixing ------------------------------------------------------------------------------------

SIDES_2V2 = np.array([0, 0, 1, 1])
R_2V2 = np.array([1.0, 2.0, 3.0, 5.0], np.float32)


@pytest.mark.parametrize("tau, zero_sum, expected", [
    (0.0, False, [1.0, 2.0, 3.0, 5.0]),
    (1.0, False, [1.5, 1.5, 4.0, 4.0]),
    (0.3, False, [1.15, 1.85, 3.3, 4.7]),
    (0.0, True, [1.0 - 4.0, 2.0 - 4.0, 3.0 - 1.5, 5.0 - 1.5]),
    (1.0, True, [-2.5, -2.5, 2.5, 2.5]),
    (0.3, True, [1.15 - 4.0, 1.85 - 4.0, 3.3 - 1.5, 4.7 - 1.5]),
])
def test_mix_rewards_2v2_hand_computed(tau, zero_sum, expected):
    out = losses.mix_rewards(R_2V2, SIDES_2V2, tau, zero_sum)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tau", [0.0, 0.3, 1.0])
def test_mix_rewards_1v1(tau):
    sides = np.array([0, 1])
    np.testing.assert_allclose(losses.mix_rewards(np.array([1.0, 0.0]), sides, tau, False), [1.0, 0.0])
    np.testing.assert_allclose(losses.mix_rewards(np.array([1.0, 0.0]), sides, tau, True), [1.0, -1.0])
    np.testing.assert_allclose(losses.mix_rewards(np.array([1.0, -1.0]), sides, tau, True), [2.0, -2.0])


def test_mix_rewards_interleaved_sides_and_leading_dims():
    # Sides need not be contiguous; leading [T, B] dimensions are kept.
    sides = np.array([1, 0, 1, 0])
    rng = np.random.default_rng(3)
    r = rng.normal(size=(5, 3, 4)).astype(np.float32)
    out = losses.mix_rewards(r, sides, 0.3, True)
    assert out.shape == r.shape
    for t in range(5):
        for b in range(3):
            row = r[t, b]
            m0, m1 = row[sides == 0].mean(), row[sides == 1].mean()
            mixed = np.where(sides == 0, 0.7 * row + 0.3 * m0, 0.7 * row + 0.3 * m1)
            expected = np.where(sides == 0, mixed - m1, mixed - m0)
            np.testing.assert_allclose(out[t, b], expected, rtol=1e-5, atol=1e-6)
    # zero-sum with equal team sizes: the rewards of a step sum to zero
    np.testing.assert_allclose(out.sum(-1), 0.0, atol=1e-5)
    # the input is not modified
    assert not np.shares_memory(out, r)


# --- PPO pieces ---------------------------------------------------------------------------------------


def _direct_ppo(ratios, advs, clip):
    terms = []
    for r, a in zip(ratios, advs):
        clipped = min(max(r, 1 - clip), 1 + clip)
        terms.append(min(r * a, clipped * a))
    return -sum(terms) / len(terms)


RATIOS = [0.5, 0.85, 1.0, 1.1, 1.25, 2.0, 0.79, 1.21]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_ppo_policy_loss_against_direct_formula(sign):
    clip = 0.2
    advs = [sign * a for a in (1.0, 2.0, -0.5, 0.3, 1.5, -2.0, 0.7, -1.1)]
    old = torch.tensor([-1.0, -0.3, -2.0, -0.7, -1.2, -0.1, -0.9, -1.6], dtype=torch.float64)
    logp = old + torch.log(torch.tensor(RATIOS, dtype=torch.float64))
    w = torch.ones(len(RATIOS), dtype=torch.float64)
    loss, diag = losses.ppo_policy_loss(logp, old, torch.tensor(advs, dtype=torch.float64), clip, w)
    assert float(loss) == pytest.approx(_direct_ppo(RATIOS, advs, clip), rel=1e-9, abs=1e-12)
    outside = sum(abs(r - 1) > clip for r in RATIOS)
    assert float(diag["clip_fraction"]) == pytest.approx(outside / len(RATIOS))
    kl = sum((r - 1) - math.log(r) for r in RATIOS) / len(RATIOS)
    assert float(diag["approx_kl"]) == pytest.approx(kl, rel=1e-9)
    assert float(diag["approx_kl"]) >= 0


@pytest.mark.parametrize("ratio, adv, expected", [
    (1.5, 1.0, -1.2),    # positive advantage: gain capped at 1 + clip
    (0.5, 1.0, -0.5),    # positive advantage, ratio fell: unclipped (pessimistic) term
    (0.5, -1.0, 0.8),    # negative advantage: loss capped at 1 - clip
    (1.5, -1.0, 1.5),    # negative advantage, ratio rose: unclipped term
    (1.1, 2.0, -2.2),    # inside the clip
])
def test_ppo_single_ratio_cases(ratio, adv, expected):
    old = torch.zeros(1, dtype=torch.float64)
    logp = torch.tensor([math.log(ratio)], dtype=torch.float64)
    loss, _ = losses.ppo_policy_loss(logp, old, torch.tensor([adv], dtype=torch.float64), 0.2,
                                     torch.ones(1, dtype=torch.float64))
    assert float(loss) == pytest.approx(expected, rel=1e-9)


def test_ppo_gradient_zero_when_clipped_in_the_favourable_direction():
    old = torch.zeros(2, dtype=torch.float64)
    logp = torch.tensor([math.log(1.5), math.log(1.1)], dtype=torch.float64, requires_grad=True)
    loss, _ = losses.ppo_policy_loss(logp, old, torch.tensor([1.0, 1.0], dtype=torch.float64), 0.2,
                                     torch.ones(2, dtype=torch.float64))
    loss.backward()
    assert logp.grad[0] == 0.0           # clipped: no push further
    assert logp.grad[1] == pytest.approx(-1.1 / 2)  # d(-r*A/2)/dlogp = -r*A/2


def test_masked_means_ignore_zero_weight_entries():
    x = torch.tensor([1.0, 2.0, 3.0, 1e6, -1e6])
    w = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])
    assert float(losses.masked_mean(x, w)) == pytest.approx(2.0)
    # weights act as weights, not just a mask
    assert float(losses.masked_mean(torch.tensor([1.0, 3.0]), torch.tensor([3.0, 1.0]))) == pytest.approx(1.5)
    # all-zero weights: no division by zero
    assert float(losses.masked_mean(x, torch.zeros(5))) == 0.0

    # PPO loss, diagnostics and value loss: garbage in masked entries changes nothing
    old = torch.zeros(5)
    logp = torch.tensor([0.1, -0.1, 0.3, 5.0, -5.0])
    adv = torch.tensor([1.0, -1.0, 0.5, 1e3, -1e3])
    loss, diag = losses.ppo_policy_loss(logp, old, adv, 0.2, w)
    loss3, diag3 = losses.ppo_policy_loss(logp[:3], old[:3], adv[:3], 0.2, torch.ones(3))
    assert float(loss) == pytest.approx(float(loss3), rel=1e-6)
    assert float(diag["clip_fraction"]) == pytest.approx(float(diag3["clip_fraction"]))
    assert float(diag["approx_kl"]) == pytest.approx(float(diag3["approx_kl"]), rel=1e-6)
    pred, target = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0]), torch.tensor([2.0, 2.0, 1.0, 1e4, 1e4])
    assert float(losses.value_loss(pred, target, w)) == pytest.approx(0.5 * (1 + 0 + 4) / 3)


def test_normalize_advantages_weighted():
    adv = torch.tensor([1.0, 2.0, 3.0, 4.0, 100.0, -100.0])
    w = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    out = losses.normalize_advantages(adv, w)
    kept = out[:4].double().numpy()
    assert kept.mean() == pytest.approx(0.0, abs=1e-6)
    assert kept.std() == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(kept, (np.array([1, 2, 3, 4]) - 2.5) / np.std([1, 2, 3, 4]), rtol=1e-5)


def test_explained_variance():
    rng = np.random.default_rng(0)
    target = torch.from_numpy(rng.normal(size=1000))
    ones = torch.ones(1000, dtype=torch.float64)

    def ev(pred, tgt, w=None):
        return float(losses.explained_variance(pred, tgt, ones[:len(tgt)] if w is None else w))

    assert ev(target, target) == pytest.approx(1.0)
    assert ev(torch.full_like(target, float(target.mean())), target) == pytest.approx(0.0, abs=1e-12)
    noisy = target + torch.from_numpy(rng.normal(size=1000)) * 0.5
    expected = 1 - np.var((target - noisy).numpy()) / np.var(target.numpy())
    assert ev(noisy, target) == pytest.approx(expected)
    assert ev(-target, target) < 0  # worse than a constant
    assert math.isnan(ev(target[:5], torch.ones(5, dtype=torch.float64)))
    # only the weighted steps count: garbage where the weight is 0 changes nothing
    w = (torch.arange(1000) % 3 != 0).double()
    garbage = torch.where(w > 0, noisy, torch.full_like(noisy, 1e6))
    kept = w > 0
    assert ev(garbage, target, w) == pytest.approx(ev(noisy[kept], target[kept]), rel=1e-9)


def test_weighted_sums_pooled_over_chunks_normalize_like_the_whole():
    rng = np.random.default_rng(5)
    adv = torch.from_numpy(rng.normal(2.0, 3.0, size=(8, 5)).astype(np.float32))
    w = torch.from_numpy(rng.random((8, 5)) < 0.7).float()
    pooled = losses.weighted_sums(adv[:3], w[:3]) + losses.weighted_sums(adv[3:], w[3:])
    torch.testing.assert_close(losses.normalize_advantages(adv, w, pooled), losses.normalize_advantages(adv, w))


def test_masked_mean_with_total_adds_up_over_chunks():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    w = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0])
    whole = losses.masked_mean(x, w)
    parts = losses.masked_mean(x[:2], w[:2], total=4.0) + losses.masked_mean(x[2:], w[2:], total=4.0)
    assert float(parts) == pytest.approx(float(whole)) == pytest.approx(13 / 4)


@pytest.mark.parametrize("pred, old, target, expected", [
    (1.0, 0.0, 1.0, 0.5 * 0.8**2),   # moved past the clip toward the target: the clipped error counts
    (0.1, 0.0, 1.0, 0.5 * 0.9**2),   # inside the clip: plain error
    (-1.0, 0.0, 1.0, 0.5 * 2.0**2),  # moved away from the target: the larger, unclipped error
])
def test_value_loss_clipped(pred, old, target, expected):
    p, o, t, w = (torch.tensor([v], dtype=torch.float64) for v in (pred, old, target, 1.0))
    assert float(losses.value_loss(p, t, w, old=o, clip=0.2)) == pytest.approx(expected)
    assert float(losses.value_loss(p, t, w, old=o, clip=0.0)) == pytest.approx(0.5 * (pred - target) ** 2)


def test_merge_moments_is_the_pooled_mean_and_variance():
    rng = np.random.default_rng(6)
    a, b = rng.normal(0.0, 1.0, size=(512, 3)), rng.normal(4.0, 1.0, size=(512, 3))
    n, mean, m2 = losses.merge_moments(512.0, torch.from_numpy(a.mean(0)), torch.from_numpy(a.var(0) * 512),
                                       512.0, torch.from_numpy(b.mean(0)), torch.from_numpy(b.var(0) * 512))
    both = np.concatenate([a, b])
    assert n == 1024
    np.testing.assert_allclose(mean.numpy(), both.mean(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose((m2 / n).numpy(), both.var(0), rtol=1e-12)
    assert (m2 / n).numpy() == pytest.approx(5.0, abs=0.3)  # 1 within each, 4 between the centres 0 and 4


def test_shifted_sums_of_two_ranks_give_pooled_moments():
    """Sums from ranks centred at 0 and 4, added (or averaged, as all_reduce_scalars does), give the pooled
    count, mean and variance exactly: the spread between the rank means is kept."""
    rng = np.random.default_rng(7)
    a, b = rng.normal(0.0, 1.0, size=(512, 2)), rng.normal(4.0, 1.0, size=(512, 2))
    shift = torch.tensor([0.3, -0.2], dtype=torch.float64)
    sums = [losses.shifted_sums(torch.from_numpy(x), torch.ones(512), shift) for x in (a, b)]
    both = np.concatenate([a, b])
    n, mean, m2 = losses.moments_of_sums(sums[0] + sums[1], shift)
    assert float(n) == 1024
    np.testing.assert_allclose(mean.numpy(), both.mean(0), rtol=1e-12)
    np.testing.assert_allclose((m2 / n).numpy(), both.var(0), rtol=1e-10)
    n_avg, mean_avg, m2_avg = losses.moments_of_sums((sums[0] + sums[1]) / 2, shift)
    assert float(n_avg) == 512  # a mean over ranks: the caller multiplies the count by the world size
    np.testing.assert_allclose(mean_avg.numpy(), both.mean(0), rtol=1e-12)
    np.testing.assert_allclose((m2_avg / n_avg).numpy(), both.var(0), rtol=1e-10)


def test_linear_schedule():
    assert losses.linear_schedule(1.0, 0.0, 0.0) == 1.0
    assert losses.linear_schedule(1.0, 0.0, 0.5) == pytest.approx(0.5)
    assert losses.linear_schedule(1.0, 0.0, 1.0) == pytest.approx(0.0)
    assert losses.linear_schedule(1.0, 0.0, 5.0) == pytest.approx(0.0)  # held at the end
    assert losses.linear_schedule(1e-3, 2e-3, 0.5) == pytest.approx(1.5e-3)  # a warm-up too
    assert losses.linear_schedule(0.01, -1.0, 0.5) == 0.01  # negative end: constant


def test_linear_schedule_can_begin_late():
    """With ``begin`` the start value holds until that share of the budget, then moves over the rest."""
    assert losses.linear_schedule(0.0, 0.04, 0.1, begin=0.2) == 0.0
    assert losses.linear_schedule(0.0, 0.04, 0.2, begin=0.2) == 0.0
    assert losses.linear_schedule(0.0, 0.04, 0.6, begin=0.2) == pytest.approx(0.02)
    assert losses.linear_schedule(0.0, 0.04, 1.0, begin=0.2) == pytest.approx(0.04)
    assert losses.linear_schedule(0.0, 0.04, 1.0, begin=1.0) == 0.0  # begins at the end: held throughout

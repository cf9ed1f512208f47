"""V-trace (``rapid.opt.losses.vtrace``) against the paper's definition written out as a double sum, and against GAE
where the behaviour and target policies agree (as TorchBeast tests its own)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rapid.opt import losses


def reference(behaviour_logp, target_logp, rewards, discounts, values, bootstrap, rho_bar, c_bar, lam):
    """IMPALA's eq. 1, literally, in float64: v_s = V(x_s) + Σ_{t≥s} (Π_{i=s}^{t−1} γ_i·c_i)·ρ_t·(r_t + γ_t·V(x_{t+1})
    − V(x_t)), with V(x_T) the bootstrap; the advantage ρ_s·(r_s + γ_s·v_{s+1} − V(x_s)), v_T the bootstrap."""
    S, T = values.shape
    ratio = np.exp(target_logp.astype(np.float64) - behaviour_logp.astype(np.float64))
    rho, c = np.minimum(rho_bar, ratio), lam * np.minimum(c_bar, ratio)
    targets, advantages = np.zeros((S, T)), np.zeros((S, T))
    for n in range(S):
        v = np.append(values[n].astype(np.float64), bootstrap[n])
        for s in range(T):
            total = 0.0
            for t in range(s, T):
                product = 1.0
                for i in range(s, t):
                    product *= discounts[n, i] * c[n, i]
                total += product * rho[n, t] * (rewards[n, t] + discounts[n, t] * v[t + 1] - v[t])
            targets[n, s] = v[s] + total
        following = np.append(targets[n, 1:], bootstrap[n])
        advantages[n] = rho[n] * (rewards[n] + discounts[n] * following - v[:T])
    return targets, advantages


def sequences(seed: int, S: int = 5, T: int = 7, spread: float = 1.0) -> dict[str, np.ndarray]:
    """Random samples with games ending inside them (γ_s = 0 there) and discounts that vary step by step (a
    turn-based agent's decision is discounted over every game step until its next one)."""
    rng = np.random.default_rng(seed)
    done = rng.random((S, T)) < 0.2
    behaviour = -rng.random((S, T)) * 2
    return {"behaviour_logp": behaviour.astype(np.float32),
            "target_logp": (behaviour + rng.normal(size=(S, T)) * spread).astype(np.float32),
            "rewards": rng.normal(size=(S, T)).astype(np.float32),
            "discounts": (0.9 ** rng.integers(1, 4, (S, T)) * ~done).astype(np.float32),
            "values": rng.normal(size=(S, T)).astype(np.float32),
            "bootstrap": rng.normal(size=S).astype(np.float32)}


def run(data: dict[str, np.ndarray], **settings) -> tuple[np.ndarray, np.ndarray]:
    targets, advantages = losses.vtrace(**{k: torch.from_numpy(v) for k, v in data.items()}, **settings)
    return targets.numpy(), advantages.numpy()


@pytest.mark.parametrize("seed, rho_bar, c_bar, lam", [(0, 1.0, 1.0, 1.0), (1, 1.0, 1.0, 0.95), (2, 2.0, 0.5, 0.9),
                                                        (3, 0.5, 1.5, 0.7), (4, 100.0, 100.0, 1.0)])
def test_vtrace_matches_the_papers_definition_with_games_ending_inside(seed, rho_bar, c_bar, lam):
    data = sequences(seed)
    assert (data["discounts"] == 0).any() and (data["discounts"][:, :-1] == 0).any()  # ends inside samples
    targets, advantages = run(data, rho_bar=rho_bar, c_bar=c_bar, lam=lam)
    ref_targets, ref_advantages = reference(**data, rho_bar=rho_bar, c_bar=c_bar, lam=lam)
    np.testing.assert_allclose(targets, ref_targets, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(advantages, ref_advantages, rtol=1e-5, atol=1e-5)


def gae_of(data: dict[str, np.ndarray], lam: float) -> tuple[np.ndarray, np.ndarray]:
    """``losses.gae`` on the same samples ([T, N] there): the game's end as ``dones``, γ where it did not end."""
    done = data["discounts"] == 0
    gamma = np.where(done, 0.5, data["discounts"])  # any γ: GAE does not discount across an end
    adv, ret = losses.gae(data["rewards"].T, data["values"].T, done.T, data["bootstrap"], gamma.T, lam)
    return adv.T, ret.T


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("bars", [1.0, 3.0])
def test_on_policy_vtrace_targets_are_gae_returns_for_any_lambda(lam, bars):
    data = sequences(5, S=6, T=9)
    data["target_logp"] = data["behaviour_logp"].copy()
    targets, advantages = run(data, rho_bar=bars, c_bar=bars, lam=lam)
    gae_advantages, gae_returns = gae_of(data, lam)
    np.testing.assert_allclose(targets, gae_returns, rtol=1e-5, atol=1e-5)
    if lam == 1.0:
        np.testing.assert_allclose(advantages, gae_advantages, rtol=1e-5, atol=1e-5)
    else:  # V-trace's advantage bootstraps from v_{s+1}, not V(x_{s+1}): GAE's differs for λ < 1
        assert np.abs(advantages - gae_advantages).max() > 1e-2


def test_a_large_ratio_is_capped_at_rho_bar_and_cuts_no_trace_below_c_bar():
    """One step: the advantage is ρ·(r + γ·bootstrap − V) with ρ = min(ρ̄, π/μ); π/μ = e³ ≈ 20 is capped."""
    data = {"behaviour_logp": np.array([[-3.0, -1.0]], np.float32), "target_logp": np.array([[0.0, -1.0]], np.float32),
            "rewards": np.array([[1.0, 0.5]], np.float32), "discounts": np.array([[0.9, 0.9]], np.float32),
            "values": np.array([[0.2, 0.4]], np.float32), "bootstrap": np.array([2.0], np.float32)}
    for rho_bar in (0.5, 1.0, 4.0):
        targets, advantages = run(data, rho_bar=rho_bar, c_bar=1.0, lam=1.0)
        second = min(rho_bar, 1.0) * (0.5 + 0.9 * 2.0 - 0.4)  # step 1 (ratio 1): v_1 − V(x_1) = ρ_1·δ_1
        assert advantages[0, 0] == pytest.approx(rho_bar * (1.0 + 0.9 * (0.4 + second) - 0.2), rel=1e-6)
        # v_0 = V(x_0) + ρ_0·δ_0 + γ_0·c_0·(v_1 − V(x_1)), c_0 = min(c̄, e³) = 1
        assert targets[0, 0] == pytest.approx(0.2 + rho_bar * (1.0 + 0.9 * 0.4 - 0.2) + 0.9 * second, rel=1e-6)
    # c̄ caps the trace too: with c̄ = 0 nothing of step 1's correction reaches step 0
    targets, _ = run(data, rho_bar=1.0, c_bar=0.0, lam=1.0)
    assert targets[0, 0] == pytest.approx(0.2 + (1.0 + 0.9 * 0.4 - 0.2), rel=1e-6)


def test_a_sample_ending_its_game_does_not_bootstrap():
    data = sequences(6, S=2, T=4)
    data["discounts"][:, -1] = 0.0
    moved = {**data, "bootstrap": data["bootstrap"] + 100.0}
    for a, b in zip(run(data, rho_bar=1.0, c_bar=1.0, lam=0.9), run(moved, rho_bar=1.0, c_bar=1.0, lam=0.9)):
        np.testing.assert_array_equal(a, b)

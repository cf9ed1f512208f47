"""Learning math as small pure functions, each tested against a plain reference loop.

Shapes: time first, ``[T, N]`` for N agents (or samples); ``dones[t]`` means the game ended with the
transition of step t, so nothing is bootstrapped across it.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

Count = TypeVar("Count", float, torch.Tensor)  # merge_moments' counts: plain numbers or a running norm's buffers

def mix_rewards(rewards: np.ndarray, side_of_agent: np.ndarray, team_spirit: float, zero_sum: bool) -> np.ndarray:
    """OpenAI Five's reward mixing for ``rewards`` [..., A].

    Team spirit τ blends each agent's reward with its team's mean: r' = (1 − τ)·r + τ·mean_team(r).
    Zero-sum then subtracts the enemy team's mean of r', so a side cannot gain by both sides scoring.
    """
    sides = np.asarray(side_of_agent)
    out = np.array(rewards, dtype=np.float32, copy=True)
    means = []
    for side in (0, 1):
        cols = sides == side
        team_mean = rewards[..., cols].mean(-1, keepdims=True) if cols.any() else 0.0
        out[..., cols] = (1.0 - team_spirit) * rewards[..., cols] + team_spirit * team_mean
        means.append(out[..., cols].mean(-1, keepdims=True) if cols.any() else 0.0)
    if zero_sum:
        mixed = out.copy()
        for side in (0, 1):
            mixed[..., sides == side] -= means[1 - side]
        out = mixed
    return out


def gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, last_value: np.ndarray,
        gamma: float | np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation over a segment. Returns (advantages, returns), both [T, N].

    ``values`` [T, N] are the value estimates at each step, ``last_value`` [N] at the step after the
    segment. ``gamma`` is one discount, or each step's [T, N] (a decision followed by several game steps
    before the agent's next one is discounted over all of them).
    """
    T = rewards.shape[0]
    discount = np.broadcast_to(np.asarray(gamma, dtype=np.float32), rewards.shape)
    advantages = np.zeros_like(rewards, dtype=np.float32)
    running = np.zeros(rewards.shape[1:], dtype=np.float32)
    next_value = last_value.astype(np.float32)
    for t in reversed(range(T)):
        not_done = 1.0 - dones[t].astype(np.float32)
        delta = rewards[t] + discount[t] * next_value * not_done - values[t]
        running = delta + discount[t] * lam * not_done * running
        advantages[t] = running
        next_value = values[t]
    return advantages, advantages + values.astype(np.float32)


@torch.no_grad()
def vtrace(behaviour_logp: torch.Tensor, target_logp: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor,
           values: torch.Tensor, bootstrap: torch.Tensor, rho_bar: float, c_bar: float, lam: float
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace (IMPALA, Espeholt et al. 2018, eq. 1) over samples [S, T], time along dim 1: (value targets v_s,
    policy advantages ρ_s·(r_s + γ_s·v_{s+1} − V(x_s))), both [S, T]. Targets: no gradient flows through them.

    ``values`` [S, T] are the target policy's V(x_s), ``bootstrap`` [S] the value after each sample's last step
    (v_T = V(x_T) = bootstrap). ``discounts[s]`` is γ_s, the discount to the next step, 0 where the game ended
    at step s, so nothing is bootstrapped across it. With π/μ the ratio of the target's probability of the
    taken action to the behaviour's: ρ_s = min(ρ̄, π/μ) weighs each TD error, and the traces c_s = λ·min(c̄, π/μ)
    (the paper's §4.2 remark) cut the corrections carried back from later steps. When the policies agree and
    ρ̄, c̄ ≥ 1, v_s is GAE(λ)'s return, and the advantage GAE's for λ = 1.
    """
    ratio = (target_logp - behaviour_logp).exp()
    rho = ratio.clamp(max=rho_bar)
    traces = lam * ratio.clamp(max=c_bar)
    next_values = torch.cat([values[:, 1:], bootstrap[:, None]], 1)
    deltas = rho * (rewards + discounts * next_values - values)
    corrections = torch.empty_like(values)  # v_s − V(x_s) = δ_s + γ_s·c_s·(v_{s+1} − V(x_{s+1}))
    running = torch.zeros_like(bootstrap)
    for t in reversed(range(values.shape[1])):
        running = deltas[:, t] + discounts[:, t] * traces[:, t] * running
        corrections[:, t] = running
    targets = values + corrections
    next_targets = torch.cat([targets[:, 1:], bootstrap[:, None]], 1)
    return targets, rho * (rewards + discounts * next_targets - values)


def masked_mean(x: torch.Tensor, weights: torch.Tensor, total: torch.Tensor | float | None = None) -> torch.Tensor:
    """Weighted mean of ``x``; with ``total`` the weighted sum divided by that count instead of the local weight sum,
    so that chunks of one batch (microbatches, ranks) add up to the mean over the whole batch."""
    denom = weights.sum() if total is None else torch.as_tensor(total, dtype=x.dtype, device=x.device)
    return (x * weights).sum() / denom.clamp(min=1.0)


def weighted_sums(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """float64 (Σw, Σw·x, Σw·x²): the moments of a split batch (microbatches, ranks) add up."""
    x, w = x.double(), weights.double()
    return torch.stack([w.sum(), (w * x).sum(), (w * x * x).sum()])


def normalize_advantages(adv: torch.Tensor, weights: torch.Tensor, sums: torch.Tensor | None = None) -> torch.Tensor:
    """Weighted z-score; ``sums`` (:func:`weighted_sums` pooled over a whole batch) replaces the local moments."""
    n, s1, s2 = weighted_sums(adv, weights) if sums is None else sums
    mean = s1 / n.clamp(min=1.0)
    std = (s2 / n.clamp(min=1.0) - mean * mean).clamp(min=0.0).sqrt()
    return ((adv - mean) / (std + 1e-8)).to(adv.dtype)


def ppo_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float,
                    weights: torch.Tensor, total: torch.Tensor | float | None = None,
                    importance: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss (to minimize) and diagnostics: approximate KL and clip fraction, of ``logp``
    against ``old_logp``. ``importance`` (decoupled PPO, :func:`proximal_weights`) weighs each step's surrogate,
    not the diagnostics.

    ``total``: see :func:`masked_mean`."""
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    surrogate = torch.min(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv)
    loss = -masked_mean(surrogate if importance is None else surrogate * importance, weights, total)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1.0) - log_ratio, weights, total)  # the low-variance k3 estimator
        clip_fraction = masked_mean(((ratio - 1.0).abs() > clip).to(logp.dtype), weights, total)
    return loss, {"approx_kl": approx_kl, "clip_fraction": clip_fraction}


def proximal_weights(proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, rho_bar: float) -> torch.Tensor:
    """Decoupled PPO's importance weights (Hilton et al. 2021, "Batch size-invariance for policy optimization"):
    π_prox/π_behav of each taken action, capped at ``rho_bar`` as V-trace caps its ρ. Weighing the surrogate
    clipped against the proximal policy by them makes it an estimate under the proximal policy, whatever policy
    played. No gradient flows through them."""
    return (proximal_logp - behaviour_logp).detach().exp().clamp(max=rho_bar)


def value_loss(pred: torch.Tensor, target: torch.Tensor, weights: torch.Tensor,
               total: torch.Tensor | float | None = None, old: torch.Tensor | None = None,
               clip: float = 0.0) -> torch.Tensor:
    """Half the weighted squared error. With ``clip`` > 0 and the values ``old`` the data was collected with,
    the PPO2 clipped form: the larger of the errors of ``pred`` and of ``old`` moved at most ``clip``."""
    err = (pred - target) ** 2
    if clip > 0.0 and old is not None:
        moved = old + (pred - old).clamp(-clip, clip)
        err = torch.max(err, (moved - target) ** 2)
    return 0.5 * masked_mean(err, weights, total)


def merge_moments(count: Count, mean: torch.Tensor, m2: torch.Tensor, count_b: Count, mean_b: torch.Tensor,
                  m2_b: torch.Tensor) -> tuple[Count, torch.Tensor, torch.Tensor]:
    """Chan et al.'s parallel update: (count, mean, M2) of two sets pooled, M2 = Σ (x − mean)². count + count_b > 0."""
    total = count + count_b
    delta = mean_b - mean
    return total, mean + delta * (count_b / total), m2 + m2_b + delta**2 * (count * count_b / total)


def shifted_sums(x: torch.Tensor, weights: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """[3, D] float64: Σw, Σw·(x − shift), Σw·(x − shift)² over the leading dims of ``x`` [..., D].

    Sums over any split of the data (microbatches, ranks) add up; :func:`moments_of_sums` turns them into
    count, mean and M2 exactly. The shift (a mean every rank shares) keeps the squares from cancelling."""
    x = x.reshape(-1, x.shape[-1]).double() - shift.double()
    w = weights.reshape(-1, 1).double()
    return torch.stack([w.sum().expand(x.shape[-1]), (w * x).sum(0), (w * x * x).sum(0)])


def moments_of_sums(sums: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, M2) from :func:`shifted_sums`; Chan's pooled result, since M2 = Σ(x−s)² − n·(mean−s)²."""
    n, s1, s2 = sums[0, 0], sums[1], sums[2]
    d = s1 / n.clamp(min=1e-12)
    return n, shift.double() + d, (s2 - n * d * d).clamp(min=0.0)


def explained_variance(pred: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """1 − Var[target − pred] / Var[target] over the weighted steps: 1 is perfect, 0 is no better than a
    constant; NaN when the target does not vary."""
    _, _, v_t = _mean_var(target, weights)
    _, _, v_e = _mean_var(target - pred, weights)
    return torch.where(v_t > 0, 1.0 - v_e / v_t, torch.full_like(v_t, float("nan")))


def _mean_var(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, s1, s2 = weighted_sums(x, weights)
    mean = s1 / n.clamp(min=1.0)
    return n, mean, (s2 / n.clamp(min=1.0) - mean * mean).clamp(min=0.0)


def linear_schedule(start: float, end: float, progress: float, begin: float = 0.0) -> float:
    """``start`` held until ``progress`` reaches ``begin``, then moved linearly to ``end`` as it goes on to 1
    (held after); a negative ``end`` means no schedule."""
    if end < 0:
        return start
    moved = (progress - begin) / (1.0 - begin) if begin < 1.0 else 0.0
    return start + min(1.0, max(0.0, moved)) * (end - start)

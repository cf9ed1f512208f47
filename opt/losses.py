"""Learning math as small pure functions, each tested against a plain reference loop.

Shapes: time first, ``[T, N]`` for N agents (or samples); ``dones[t]`` means the game ended with the
transition of step t, so nothing is bootstrapped across it.
"""

from __future__ import annotations

import numpy as np
import torch


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
        gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation over a segment. Returns (advantages, returns), both [T, N].

    ``values`` [T, N] are the value estimates at each step, ``last_value`` [N] at the step after the
    segment.
    """
    T = rewards.shape[0]
    advantages = np.zeros_like(rewards, dtype=np.float32)
    running = np.zeros(rewards.shape[1:], dtype=np.float32)
    next_value = last_value.astype(np.float32)
    for t in reversed(range(T)):
        not_done = 1.0 - dones[t].astype(np.float32)
        delta = rewards[t] + gamma * next_value * not_done - values[t]
        running = delta + gamma * lam * not_done * running
        advantages[t] = running
        next_value = values[t]
    return advantages, advantages + values.astype(np.float32)


def masked_mean(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (x * weights).sum() / weights.sum().clamp(min=1.0)


def normalize_advantages(adv: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    mean = masked_mean(adv, weights)
    std = masked_mean((adv - mean) ** 2, weights).sqrt()
    return (adv - mean) / (std + 1e-8)


def ppo_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float,
                    weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss (to minimize) and diagnostics: approximate KL and clip fraction."""
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    surrogate = torch.min(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv)
    loss = -masked_mean(surrogate, weights)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1.0) - log_ratio, weights)  # the low-variance k3 estimator
        clip_fraction = masked_mean(((ratio - 1.0).abs() > clip).float(), weights)
    return loss, {"approx_kl": approx_kl, "clip_fraction": clip_fraction}


def value_loss(pred: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return 0.5 * masked_mean((pred - target) ** 2, weights)


def explained_variance(pred: np.ndarray, target: np.ndarray) -> float:
    """1 − Var[target − pred] / Var[target]: 1 is perfect, 0 is no better than a constant."""
    var = float(np.var(target))
    return float("nan") if var == 0.0 else 1.0 - float(np.var(target - pred)) / var


def linear_schedule(start: float, end: float, steps: int, step: int) -> float:
    if steps <= 0 or end < 0:
        return start
    frac = min(1.0, step / steps)
    return start + frac * (end - start)

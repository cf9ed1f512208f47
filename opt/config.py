"""The ``ppo`` config section: the learning settings with their defaults, docs and checks, in one place.

rapid.run.config loads it as the section ``[ppo]``; the learner and the rollout worker take it as it is::

    ppo = PPOConfig(lr=1e-3)
    errors = ppo.errors()          # ["ppo.lr must be > 0 (got -1)", ...]; empty when usable
    learner = Learner(policy, ppo, device, microbatch_samples=0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def check_positive(errors: list[str], where: str, value, allow_zero: bool = False) -> None:
    """Append '<where> must be > 0 (got …)' (or ≥ 0) to ``errors`` unless ``value`` is."""
    if not (value > 0 or (allow_zero and value == 0)) or (isinstance(value, float) and math.isnan(value)):
        errors.append(f"{where} must be {'≥ 0' if allow_zero else '> 0'} (got {value})")


def check_unit(errors: list[str], where: str, value) -> None:
    """Append '<where> must be within [0, 1] (got …)' to ``errors`` unless ``value`` is."""
    if not 0.0 <= value <= 1.0:
        errors.append(f"{where} must be within [0, 1] (got {value})")


OFF_POLICY = ("none", "vtrace")
PROXIMAL = ("behaviour", "first_use")


@dataclass
class PPOConfig:
    lr: float = 3e-4
    """Adam learning rate at the start of the run."""
    lr_final: float = -1.0
    """Learning rate at the end of the run's budget (run.minutes or run.updates), linearly (negative: lr
    throughout; so too in a run without a budget)."""
    settle_until_update: int = 0
    """Updates before this one (counted over the whole run, across --resume) step with learning rate 0:
    Adam's moments settle while the weights stay, as OpenAI Five did after each surgery (`rapid surgery
    --settle-updates N` sets it). 0: none."""
    clip: float = 0.2
    """PPO ratio clip."""
    warmup_updates: int = 0
    """The run's first updates (counted over the whole run, across --resume) are a warm-up: PPO's ratio is
    clipped at warmup_clip, and the rollout workers play every game against league.warmup_bots. A fixed opponent
    is a steady target that larger steps can follow, where self-play's larger steps chase the policy's own last
    change. 0: no warm-up."""
    warmup_clip: float = -1.0
    """PPO's ratio clip through the warm-up (negative: clip)."""
    gae_lambda: float = 0.95
    """GAE's λ: 0 bootstraps from the next value, 1 is the Monte Carlo return; V-trace's traces are λ·min(c̄, π/μ)."""
    off_policy: str = "none"
    """How the learner corrects for experience that a policy older than its own played: "none" trains on the
    worker's GAE advantages and returns (PPO's clipped ratio the only correction); "vtrace" recomputes them
    with IMPALA's V-trace from the learner's own values and log-probs (one more forward pass per update), its
    traces λ = gae_lambda."""
    vtrace_rho_bar: float = 1.0
    """V-trace's ρ̄: each step's importance weight is capped at ρ̄; the values learnt are those of a policy between
    the behaviour's (ρ̄ near 0) and the learner's (ρ̄ infinite). 1 is IMPALA's."""
    vtrace_c_bar: float = 1.0
    """V-trace's c̄: the traces that carry later steps' corrections back are capped at c̄ (how far stale
    experience reaches; 1 is IMPALA's)."""
    proximal: str = "behaviour"
    """What PPO's ratio is clipped against. "behaviour": the log-probs of the policy that played. "first_use":
    the learner's own log-probs the first time it trained on the sample (decoupled PPO, Hilton et al. 2021),
    each step weighted by π_first/π_behav capped at proximal_rho_bar; a sample that arrives many updates late
    still trains on its first use, where the clip against the behaviour would ignore much of it, and its reuses
    stay within the clip of that first use (as PPO's epochs do); see proximal_every."""
    proximal_every: int = 0
    """With proximal = "first_use": a new sample's reference is the learner's policy as it was at most N updates
    ago (a copy refreshed every N updates; one more forward pass per update), so that a sample used only once
    is clipped too. 0: the learner's policy now, so a first use has ratio 1 and only reuses are clipped."""
    proximal_rho_bar: float = 1.0
    """Cap of the importance weights π_first/π_behav (proximal = "first_use")."""
    horizon_s: float = 100.0
    """Reward horizon in game seconds; gamma = 1 - seconds_per_step / horizon_s."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    value_clip: float = 0.0
    """PPO2's value clipping, in normalized return units (0: off)."""
    entropy_coef: float = 0.01
    """Entropy bonus at the start of training."""
    entropy_final: float = -1.0
    """Entropy bonus at the end of the run's budget, linearly (negative: entropy_coef throughout)."""
    entropy_begin: float = 0.0
    """The share of the run's budget (0 to 1) through which the entropy bonus stays at entropy_coef; it moves
    linearly to entropy_final over the rest (0.2 of a 5-minute run: unchanged through the first minute)."""
    max_grad_norm: float = 5.0
    """Gradients are clipped to this global norm."""
    adam_beta1: float = 0.9
    """Adam's β₁."""
    adam_beta2: float = 0.999
    """Adam's β₂."""
    adam_eps: float = 1e-5
    """Adam's ε."""
    team_spirit: float = 0.3
    """0: each agent's own reward; 1: its team's mean reward (at the start of the run)."""
    team_spirit_final: float = -1.0
    """Team spirit at the end of the run's budget, linearly, as OpenAI Five raised it from 0.3 towards 1: heroes
    first learn what pays them, then play for the team (negative: team_spirit throughout). The optimizer stamps
    each published version with its value; rollout workers mix rewards with the value of the version they play."""
    zero_sum: bool = True
    """Subtract the enemy team's mean reward, so one side's gain is the other's loss."""
    obs_clip: float = 5.0
    """Normalized observations are clipped to ±obs_clip."""
    normalize_returns: bool = True
    """Value targets divided by the running std of returns."""
    preserve_value_outputs: bool = True
    """When the return scale moves, rescale the value head so its outputs in return units stay put (PopArt's
    'preserving outputs')."""

    def in_warmup(self, updates: int) -> bool:
        """Whether the update after ``updates`` updates (over the whole run) is the warm-up's."""
        return updates < self.warmup_updates

    def clip_at(self, updates: int) -> float:
        """PPO's ratio clip of the update after ``updates`` updates: warmup_clip in the warm-up (if set), else clip."""
        return self.warmup_clip if self.in_warmup(updates) and self.warmup_clip > 0 else self.clip

    def errors(self) -> list[str]:
        """Every value error of this section; an empty list means it is usable."""
        e: list[str] = []
        check_positive(e, "ppo.lr", self.lr)
        check_positive(e, "ppo.clip", self.clip)
        check_positive(e, "ppo.warmup_updates", self.warmup_updates, allow_zero=True)
        if self.warmup_clip >= 0:
            check_positive(e, "ppo.warmup_clip", self.warmup_clip)
        check_unit(e, "ppo.gae_lambda", self.gae_lambda)
        if self.off_policy not in OFF_POLICY:
            e.append(f"ppo.off_policy must be 'none' or 'vtrace' (got {self.off_policy!r})")
        check_positive(e, "ppo.vtrace_rho_bar", self.vtrace_rho_bar)
        check_positive(e, "ppo.vtrace_c_bar", self.vtrace_c_bar)
        if self.proximal not in PROXIMAL:
            e.append(f"ppo.proximal must be 'behaviour' or 'first_use' (got {self.proximal!r})")
        check_positive(e, "ppo.proximal_every", self.proximal_every, allow_zero=True)
        check_positive(e, "ppo.proximal_rho_bar", self.proximal_rho_bar)
        check_positive(e, "ppo.horizon_s", self.horizon_s)
        check_positive(e, "ppo.value_coef", self.value_coef, allow_zero=True)
        check_positive(e, "ppo.value_clip", self.value_clip, allow_zero=True)
        check_positive(e, "ppo.entropy_coef", self.entropy_coef, allow_zero=True)
        check_unit(e, "ppo.entropy_begin", self.entropy_begin)
        check_positive(e, "ppo.max_grad_norm", self.max_grad_norm)
        for key in ("adam_beta1", "adam_beta2"):
            value = getattr(self, key)
            if not 0.0 <= value < 1.0:
                e.append(f"ppo.{key} must be within [0, 1) (got {value})")
        check_positive(e, "ppo.adam_eps", self.adam_eps)
        check_unit(e, "ppo.team_spirit", self.team_spirit)
        if self.team_spirit_final >= 0:
            check_unit(e, "ppo.team_spirit_final", self.team_spirit_final)
        check_positive(e, "ppo.obs_clip", self.obs_clip)
        return e

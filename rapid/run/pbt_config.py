"""The ``[pbt]`` section: population-based training (docs/pbt.md), its checks, and where a member's store and
run directory are. A member is a whole run of its own under the population's store and run directory."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SEARCHABLE = ("lr", "lr_final", "entropy_coef", "entropy_final", "clip", "value_coef", "max_grad_norm",
              "vtrace_rho_bar", "vtrace_c_bar")
"""PPO fields a population may search: the learner's alone, so a change needs no rollout worker to know it."""


@dataclass
class PbtConfig:
    members: int = 0
    """Members of the population (0: no population-based training). Each is a whole run (its own optimizer,
    rollout workers, evaluator, parameters and checkpoints) under members/m<K>/ of the run's store and run
    directory; `rapid train --pbt N` sets it and starts them all on this machine."""
    member: int = -1
    """The member this process belongs to (0 … members-1); `rapid train --pbt N` sets it for each member's
    roles, and on a cluster each member's jobs set it (--set pbt.member=K). -1: not a member (the population's
    own commands, `rapid pbt ls`)."""
    interval_s: float = 600.0
    """Seconds between the population's exploit/explore rounds, counted from its start."""
    exploit_fraction: float = 0.25
    """Each round, the rated members in this bottom share of the ladder ranking (at least one) each copy a
    member of the same top share: its weights, Adam state, normalizer and hyperparameters."""
    min_gap_sigma: float = 1.0
    """A member copies a leader only when the leader's ladder rating is above its own by this many standard
    errors of the difference (0: whenever it is above): noise in the ratings moves no weights."""
    perturb: float = 1.25
    """Explore: each searched field of a member that copied a leader is the leader's value multiplied or divided
    (at random) by this, kept inside its range."""
    search: dict[str, tuple[float, float]] = field(default_factory=lambda: {"lr": (1e-4, 3e-3),
                                                                           "entropy_coef": (1e-3, 3e-2)})
    """The PPO fields the population searches, each with its range (low, high): member 0 starts at the config's
    values, the others at log-uniform draws from the ranges. Learner fields only: lr, lr_final, entropy_coef,
    entropy_final, clip, value_coef, max_grad_norm, vtrace_rho_bar, vtrace_c_bar."""


def member_folder(path_or_url: str, member: int) -> str:
    """A member's store URL or run directory under the population's (the same spelling for a path or s3://).

    >>> member_folder("s3://rapid-runs/exp1/", 2), member_folder("runs/c4", 0)
    ('s3://rapid-runs/exp1/members/m2', 'runs/c4/members/m0')
    """
    return f"{path_or_url.rstrip('/')}/members/m{int(member)}"


def pbt_errors(p: PbtConfig, has_ladder: bool, evaluates: bool) -> list[str]:
    """Every problem with the ``[pbt]`` section (none when ``members`` is 0 and ``member`` is -1)."""
    e: list[str] = []
    if p.members < 0:
        e.append(f"pbt.members must be 0 (off) or more (got {p.members})")
    if not -1 <= p.member < max(p.members, 0):
        e.append(f"pbt.member must be -1 or within [0, pbt.members) (got {p.member} with {p.members} members)")
    for name, bounds in p.search.items():
        if name not in SEARCHABLE:
            e.append(f"pbt.search: {name!r} is not a searchable PPO field ({', '.join(SEARCHABLE)})")
        elif not (len(bounds) == 2 and all(math.isfinite(b) for b in bounds) and 0 < bounds[0] <= bounds[1]):
            e.append(f"pbt.search.{name} must be a range [low, high] with 0 < low ≤ high (got {list(bounds)})")
    if p.members == 0:
        return e
    if p.members < 2:
        e.append(f"pbt.members must be at least 2: one member has nothing to copy (got {p.members})")
    if not has_ladder or not evaluates:
        e.append("pbt needs a strength ladder (eval.ladder) and the evaluator (eval.interval_s > 0): a member's "
                 "fitness is its ladder rating")
    if not (math.isfinite(p.interval_s) and p.interval_s > 0):
        e.append(f"pbt.interval_s must be > 0 (got {p.interval_s})")
    if not 0 < p.exploit_fraction <= 0.5:
        e.append(f"pbt.exploit_fraction must be within (0, 0.5] (got {p.exploit_fraction})")
    if not (math.isfinite(p.min_gap_sigma) and p.min_gap_sigma >= 0):
        e.append(f"pbt.min_gap_sigma must be ≥ 0 (got {p.min_gap_sigma})")
    if not (math.isfinite(p.perturb) and p.perturb > 1):
        e.append(f"pbt.perturb must be > 1 (got {p.perturb})")
    if not p.search:
        e.append("pbt.search must name at least one field")
    return e

"""Ladder ratings: one strength figure per policy on a fixed scale, from games against opponents of known strength.

The strength ladder (``eval.ladder``) is a set of opponents that training never meets (scripted bots and
frozen reference policies), each with a fixed rating on an Elo scale (400 points: 10 to 1 odds) anchored at
the random bot's 0. A policy's ladder rating is the one that best explains its scores against them: the
Bradley-Terry (Elo) model's maximum a posteriori estimate under a broad prior, so a policy that wins every game
still gets a finite figure, and its standard error (``sigma``) from the curvature there. The rungs' own ratings
come from :func:`calibrate`: the same model fitted to a round robin among them, the anchor held at 0.

Usage::

    >>> rungs = {"random": 0.0, "lookahead": 560.0}
    >>> est = rate({"random": Score(190, 200), "lookahead": Score(100, 200)}, rungs)
    >>> round(est.rating), round(est.sigma)                 # beats random 95%, evens with lookahead
    (553, 23)
    >>> ratings = calibrate(["random", "lookahead"], [("lookahead", "random", Score(190, 200))], anchor="random")
    >>> {k: round(v) for k, v in ratings.items()}
    {'random': 0, 'lookahead': 510}

Pure functions of numbers (numpy only), tested against a brute-force likelihood (tests/test_ladder.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

SCALE = 400.0 / math.log(10.0)
"""Elo points per unit of log-odds: a 400-point gap is 10 to 1."""
PRIOR_SD = 1000.0
"""The prior's spread around the rungs' mean: weak against a few hundred games, finite at a clean sweep."""


@dataclass(frozen=True)
class Score:
    """Points (a win 1, a draw ½) scored in ``games`` games."""

    points: float
    games: int

    @classmethod
    def of(cls, wins: int, losses: int, draws: int) -> Score:
        return cls(wins + 0.5 * draws, wins + losses + draws)


@dataclass(frozen=True)
class Estimate:
    rating: float
    sigma: float
    """The standard error of ``rating`` (Laplace approximation of the posterior)."""


def expected(rating: float | np.ndarray, other: float | np.ndarray) -> float | np.ndarray:
    """The expected score of ``rating`` against ``other`` (Elo's logistic curve)."""
    return 1.0 / (1.0 + np.exp((np.asarray(other) - np.asarray(rating)) / SCALE))


def log_posterior(rating: float, scores: Mapping[str, Score], rungs: Mapping[str, float],
                  prior_mean: float, prior_sd: float = PRIOR_SD) -> float:
    """The log posterior of ``rating`` (up to a constant): the binomial log-likelihood of the points scored against
    each rung plus a Gaussian prior."""
    total = -0.5 * ((rating - prior_mean) / prior_sd) ** 2
    for name, s in scores.items():
        p = float(expected(rating, rungs[name]))
        total += s.points * math.log(max(p, 1e-300)) + (s.games - s.points) * math.log(max(1.0 - p, 1e-300))
    return total


def rate(scores: Mapping[str, Score], rungs: Mapping[str, float], prior_sd: float = PRIOR_SD) -> Estimate:
    """The ladder rating that best explains ``scores`` (rung → Score) against rungs of fixed ratings (rung →
    rating). Newton's method on the log posterior, which is concave, from the prior's mean."""
    played = {k: s for k, s in scores.items() if s.games > 0}
    unknown = sorted(set(played) - set(rungs))
    if unknown:
        raise ValueError(f"no rating for rung(s) {', '.join(unknown)}")
    mean = float(np.mean(list(rungs.values()))) if rungs else 0.0
    others = np.array([rungs[k] for k in played], dtype=np.float64)
    points = np.array([s.points for s in played.values()], dtype=np.float64)
    games = np.array([s.games for s in played.values()], dtype=np.float64)
    r = mean
    for _ in range(100):
        p = expected(r, others)
        grad = float(((points - games * p) / SCALE).sum()) - (r - mean) / prior_sd ** 2
        curv = float((games * p * (1 - p) / SCALE ** 2).sum()) + 1.0 / prior_sd ** 2
        step = grad / curv
        r += max(-400.0, min(400.0, step))  # bounded steps: far from the optimum the curvature is tiny
        if abs(step) < 1e-6:
            break
    p = expected(r, others)
    curv = float((games * p * (1 - p) / SCALE ** 2).sum()) + 1.0 / prior_sd ** 2
    return Estimate(r, 1.0 / math.sqrt(curv))


Pairing = tuple[str, str, Score]
"""A match between two rungs: A, B and A's score against B."""


def calibrate(names: Sequence[str], matches: Sequence[Pairing], anchor: str, prior_sd: float = PRIOR_SD,
              ) -> dict[str, float]:
    """Every rung's rating from the matches among them (Bradley-Terry by Newton's method), with ``anchor`` held
    at 0 and a weak prior pulling the others towards it (finite where a rung wins or loses every game)."""
    if anchor not in names:
        raise ValueError(f"the anchor {anchor!r} is not among the rungs")
    index = {n: i for i, n in enumerate(names)}
    free = [i for i, n in enumerate(names) if n != anchor]
    r = np.zeros(len(names))
    for _ in range(200):
        grad = np.zeros(len(names))
        hess = np.zeros((len(names), len(names)))
        for a, b, s in matches:
            i, j = index[a], index[b]
            p = float(expected(r[i], r[j]))
            g = (s.points - s.games * p) / SCALE
            w = s.games * p * (1 - p) / SCALE ** 2
            grad[i] += g
            grad[j] -= g
            hess[i, i] += w
            hess[j, j] += w
            hess[i, j] -= w
            hess[j, i] -= w
        grad -= r / prior_sd ** 2
        hess += np.eye(len(names)) / prior_sd ** 2
        sub = np.ix_(free, free)
        step = np.linalg.solve(hess[sub], grad[free])
        r[free] += np.clip(step, -400.0, 400.0)
        if np.abs(step).max(initial=0.0) < 1e-6:
            break
    return {n: float(r[index[n]]) for n in names}

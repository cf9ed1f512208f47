"""TrueSkill ratings of learner versions, snapshots and bots, with the ``trueskill`` library.

Parameters as the OpenAI Five paper: μ₀ = 25, σ₀ = 25/3, β = σ₀/2, τ = 0, draw probability 0.02.
The evaluator (or ``rapid league rate``) plays a match, e.g. ``play_match("v000000000042", "bot:lane", 20)``,
and rates its outcome in the league's pool.

Usage::

    >>> import tempfile
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.league.pool import League
    >>> league = League(LocalStore(tempfile.mkdtemp()))
    >>> rating_of(league.read_or_empty(), "v000000000042")               # the prior for ids never rated
    Rating(mu=25.0, sigma=8.333333333333334, games=0)
    >>> wins_a, wins_b, draws = 14, 5, 1                                 # the match's outcome
    >>> state = league.update(lambda s: rate_games(s, "v000000000042", "bot:lane", wins_a, wins_b, draws, 0.0))
    >>> r = rating_of(league.read(), "v000000000042")
    >>> r.games, round(r.mu, 2), round(conservative(r), 2)              # conservative: μ − 3σ
    (20, 27.19, 21.25)
    >>> round(conservative(rating_of(state, "bot:lane")), 2)
    16.87
"""

from __future__ import annotations

import trueskill

from rapid.league.state import HISTORY_LIMIT, PoolState, Rating, RatingPoint

MU = 25.0
SIGMA = 25.0 / 3.0
BETA = SIGMA / 2.0
TAU = 0.0
DRAW_PROBABILITY = 0.02
OUTCOMES = ("a", "b", "draw")

# One environment object: the library's global setup() would leak into other users of trueskill.
ENV = trueskill.TrueSkill(mu=MU, sigma=SIGMA, beta=BETA, tau=TAU, draw_probability=DRAW_PROBABILITY)


def rating_of(state: PoolState, rated_id: str) -> Rating:
    """The rating of any id (member or learner version); the prior for ids never rated."""
    return state.ratings.get(rated_id, Rating(MU, SIGMA, 0))


def conservative(rating: Rating) -> float:
    """μ − 3σ: a lower bound that only rises with evidence, the usual value to rank or plot by."""
    return rating.mu - 3.0 * rating.sigma


def rate_1v1(a: Rating, b: Rating, outcome: str) -> tuple[Rating, Rating]:
    """Both ratings after one game; ``outcome`` is "a" (a won), "b" (b won) or "draw"."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    ranks = {"a": [0, 1], "b": [1, 0], "draw": [0, 0]}[outcome]  # lower rank is better
    (ra,), (rb,) = ENV.rate([(ENV.create_rating(a.mu, a.sigma),), (ENV.create_rating(b.mu, b.sigma),)],
                            ranks=ranks)
    return Rating(ra.mu, ra.sigma, a.games + 1), Rating(rb.mu, rb.sigma, b.games + 1)


def rate_games(state: PoolState, a_id: str, b_id: str, wins_a: int, wins_b: int, draws: int,
               now: float) -> PoolState:
    """``state`` with a and b rated after a series of games, plus one history point each.

    TrueSkill updates depend on order, so the outcomes are interleaved rather than applied as a run of
    wins followed by a run of losses.
    """
    if a_id == b_id:
        raise ValueError(f"cannot rate {a_id} against itself")
    if min(wins_a, wins_b, draws) < 0:
        raise ValueError("game counts must be non-negative")
    state = state.clone()
    ra, rb = rating_of(state, a_id), rating_of(state, b_id)
    counts = {"a": wins_a, "b": wins_b, "draw": draws}
    left = dict(counts)
    total = wins_a + wins_b + draws
    for i in range(total):
        # Play the outcome furthest ahead of its share of the games still to come.
        outcome = max((o for o in OUTCOMES if left[o] > 0),
                      key=lambda o: left[o] - (total - i) * counts[o] / total)
        left[outcome] -= 1
        ra, rb = rate_1v1(ra, rb, outcome)
    state.ratings[a_id], state.ratings[b_id] = ra, rb
    state.history.extend([RatingPoint(now, a_id, ra.mu, ra.sigma), RatingPoint(now, b_id, rb.mu, rb.sigma)])
    del state.history[:-HISTORY_LIMIT]
    return state

"""Population-based training's decisions as plain data and pure functions (docs/pbt.md); the store I/O is
``rapid.run.population``.

A round ranks the members that have a usable ladder rating; the bottom ``exploit_fraction`` each copy a member
of the top share whose rating is higher by at least ``min_gap_sigma`` standard errors (exploit), with that
member's hyperparameters perturbed (explore)::

    >>> import numpy as np
    >>> pop = Population(members=4, start=0.0, interval_s=60.0, search={"lr": (1e-4, 1e-2)},
    ...                  initial=[{"lr": 1e-3}, {"lr": 2e-3}, {"lr": 4e-3}, {"lr": 5e-4}])
    >>> pop.round_at(59.0), pop.round_at(125.0)
    (0, 2)
    >>> fit = {0: Fitness(1, 300.0, 20.0), 1: Fitness(1, 900.0, 20.0), 2: Fitness(1, 450.0, 20.0), 3: None}
    >>> r = decide(pop, 1, 60.0, fit, [dict(h) for h in pop.initial], {1: 7}, perturb=1.25, exploit_fraction=0.25,
    ...            min_gap_sigma=1.0, rng=np.random.default_rng(0))
    >>> [(m.member, m.leader, m.checkpoint) for m in r.moves]       # the worst rated copies the best
    [(0, 1, 7)]
    >>> r.hparams[0]["lr"] in (2e-3 * 1.25, 2e-3 / 1.25), r.hparams[1:] == pop.initial[1:]
    (True, True)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from rapid.errors import FormatError

POPULATION_FORMAT = "rapid.pbt_population"
ROUND_FORMAT = "rapid.pbt_round"
MAX_MEMBERS = 1024


@dataclass(frozen=True)
class Fitness:
    """A member's newest ladder rating: of its version ``version``, at ``time``."""

    version: int
    rating: float
    sigma: float
    time: float = 0.0


@dataclass(frozen=True)
class Move:
    """One exploit: ``member`` takes ``leader``'s checkpoint ``checkpoint`` (its newest when decided)."""

    member: int
    leader: int
    checkpoint: int


@dataclass
class Population:
    """What every member agrees on from the start (written once, ``put_if_absent``)."""

    members: int
    start: float
    interval_s: float
    search: dict[str, tuple[float, float]]
    initial: list[dict[str, float]]
    """Each member's hyperparameters (the searched fields) at the start."""

    def round_at(self, now: float) -> int:
        """The newest round due at ``now`` (0: none yet; round r is due at start + r·interval_s)."""
        return max(0, math.floor((now - self.start) / self.interval_s))


@dataclass
class Round:
    round: int
    time: float
    fitness: dict[int, Fitness | None]
    """The ratings the decision used (None: the member had no usable one)."""
    moves: list[Move]
    hparams: list[dict[str, float]]
    """Every member's hyperparameters after this round."""


def initial_hparams(base: dict[str, float], search: dict[str, tuple[float, float]], members: int,
                    rng: np.random.Generator) -> list[dict[str, float]]:
    """Member 0 at the config's values (kept inside the ranges), the others log-uniform in each range."""
    first = {k: float(min(max(base[k], lo), hi)) for k, (lo, hi) in search.items()}
    rest = [{k: float(math.exp(rng.uniform(math.log(lo), math.log(hi)))) for k, (lo, hi) in search.items()}
            for _ in range(members - 1)]
    return [first, *rest]


def explore(hparams: dict[str, float], search: dict[str, tuple[float, float]], perturb: float,
            rng: np.random.Generator) -> dict[str, float]:
    """Each searched field multiplied or divided by ``perturb`` (a coin each), kept inside its range."""
    out = dict(hparams)
    for k, (lo, hi) in search.items():
        factor = perturb if rng.random() < 0.5 else 1.0 / perturb
        out[k] = float(min(max(hparams[k] * factor, lo), hi))
    return out


def decide(pop: Population, round_: int, now: float, fitness: dict[int, Fitness | None],
           hparams: list[dict[str, float]], checkpoints: dict[int, int], *, perturb: float, exploit_fraction: float,
           min_gap_sigma: float, rng: np.random.Generator) -> Round:
    """Round ``round_``'s decision. ``fitness``: each member's usable rating (None: none yet, or none since it
    last copied); ``hparams``: each member's now; ``checkpoints``: each member's newest checkpoint version (a
    member without one cannot lead)."""
    ratings = {m: f.rating for m, f in fitness.items() if f is not None}
    rated = sorted(ratings, key=lambda m: (-ratings[m], m))
    cut = max(1, math.floor(len(rated) * exploit_fraction)) if len(rated) >= 2 else 0
    leaders = [m for m in rated[:cut] if m in checkpoints]
    moves: list[Move] = []
    after = [dict(h) for h in hparams]
    for loser in rated[len(rated) - cut:] if cut else []:
        lf = fitness[loser]
        able = [w for w in leaders if w != loser and _gap(fitness[w], lf) > min_gap_sigma * _sd(fitness[w], lf)]
        if not able or lf is None:
            continue
        leader = able[int(rng.integers(len(able)))]
        moves.append(Move(loser, leader, checkpoints[leader]))
        after[loser] = explore(hparams[leader], pop.search, perturb, rng)
    return Round(round_, now, dict(fitness), moves, after)


def _gap(a: Fitness | None, b: Fitness | None) -> float:
    return -math.inf if a is None or b is None else a.rating - b.rating


def _sd(a: Fitness | None, b: Fitness | None) -> float:
    return 0.0 if a is None or b is None else math.hypot(a.sigma, b.sigma)


def dump_population(pop: Population) -> dict:
    return {"format": POPULATION_FORMAT, "members": pop.members, "start": pop.start, "interval_s": pop.interval_s,
            "search": {k: list(v) for k, v in pop.search.items()}, "initial": pop.initial}


def load_population(doc: object) -> Population:
    """FormatError unless ``doc`` is a population document this rapid writes."""
    try:
        if not isinstance(doc, dict) or doc.get("format") != POPULATION_FORMAT:
            raise ValueError("not a population document")
        members = _int(doc["members"], 2, MAX_MEMBERS)
        search = {str(k): (_pos(v[0]), _pos(v[1])) for k, v in dict(doc["search"]).items()}
        initial = [_hparams(h, search) for h in doc["initial"]]
        if len(initial) != members:
            raise ValueError(f"{len(initial)} initial settings for {members} members")
        return Population(members, _num(doc["start"]), _pos(doc["interval_s"]), search, initial)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise FormatError(f"bad population document: {e}") from None


def dump_round(r: Round) -> dict:
    return {"format": ROUND_FORMAT, "round": r.round, "time": r.time,
            "fitness": {str(m): (asdict(f) if f else None) for m, f in r.fitness.items()},
            "moves": [asdict(m) for m in r.moves], "hparams": r.hparams}


def load_round(doc: object, pop: Population) -> Round:
    """FormatError unless ``doc`` is a round of ``pop`` (members in range, every hyperparameter in its range)."""
    try:
        if not isinstance(doc, dict) or doc.get("format") != ROUND_FORMAT:
            raise ValueError("not a round document")
        fitness = {_int(m, 0, pop.members - 1): (None if f is None else Fitness(
            _int(f["version"], 0, 1 << 62), _num(f["rating"]), _num(f["sigma"]), _num(f["time"])))
                   for m, f in dict(doc["fitness"]).items()}
        moves = [Move(_int(m["member"], 0, pop.members - 1), _int(m["leader"], 0, pop.members - 1),
                      _int(m["checkpoint"], 0, 1 << 62)) for m in doc["moves"]]
        hparams = [_hparams(h, pop.search) for h in doc["hparams"]]
        if len(hparams) != pop.members:
            raise ValueError(f"{len(hparams)} settings for {pop.members} members")
        return Round(_int(doc["round"], 1, 1 << 40), _num(doc["time"]), fitness, moves, hparams)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise FormatError(f"bad round document: {e}") from None


def _hparams(h: object, search: dict[str, tuple[float, float]]) -> dict[str, float]:
    if not isinstance(h, dict) or set(h) != set(search):
        raise ValueError(f"hyperparameters {h!r} are not the searched fields {sorted(search)}")
    return {k: _pos(v) for k, v in h.items()}


def _num(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{v!r} is not a number")
    if not math.isfinite(v):
        raise ValueError(f"{v!r} is not finite")
    return float(v)


def load_fitness(doc: object) -> Fitness:
    """A fitness document (ValueError unless it is one)."""
    if not isinstance(doc, dict):
        raise ValueError("not a fitness document")
    return Fitness(_int(doc.get("version"), 0, 1 << 62), _num(doc.get("rating")), _num(doc.get("sigma")),
                   _num(doc.get("time")))


def _pos(v: object) -> float:
    if (x := _num(v)) <= 0:
        raise ValueError(f"{v!r} is not positive")
    return x


def _int(v: object, lo: int, hi: int) -> int:
    if isinstance(v, str) and v.isascii() and v.isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{v!r} is not an integer within [{lo}, {hi}]")
    return v

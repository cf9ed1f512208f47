"""What the scale model counts of the requests its stores answer, and what each request costs in time.

:class:`Latency` is the seconds a request takes (a lognormal draw per op, the object's modelled bytes over a
stream's bandwidth, the keys of a LIST page). :class:`Meter` is fed by both stores (``store.py``'s
:class:`ModelStore` and ``metered_s3.py``'s :class:`MeteredS3`): requests and bytes per key family and type,
split at half time (growth), error answers and errors raised, the time requests took, the GETs of the hottest
key, and a ledger of experience objects (when each became visible, which actors loaded it) for discovery delay
and "never loaded".
"""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .clock import SimClock

FAMILIES = ("experience", "params", "params/LATEST", "league/results", "league/pool", "league/snapshots",
            "checkpoints", "loader", "other")
OPS = ("PUT", "GET", "LIST", "DELETE", "HEAD")
WRITES = {"PUT", "DELETE"}
PRICE_PER_1000 = {"PUT": 0.005, "LIST": 0.005, "GET": 0.0004, "HEAD": 0.0004, "DELETE": 0.0}
"""S3 Standard list prices (us-east-1): PUT/COPY/POST/LIST $0.005 per 1,000, GET and others $0.0004, DELETE free."""


def family(key: str) -> str:
    if key.startswith("experience"):
        return "experience"
    if key == "params/LATEST":
        return "params/LATEST"
    for prefix in ("params", "league/results", "league/snapshots", "checkpoints", "loader"):  # loader/: marks
        if key.startswith(prefix):
            return prefix
    if key.startswith("league/pool"):
        return "league/pool"
    return "other"


@dataclass
class Latency:
    """Seconds a request takes: a draw for its op plus its bytes over ``bandwidth`` (bytes/s of one stream)
    plus, for a LIST page, ``per_key`` seconds a key it returns.

    The draw is lognormal with mean ``base[op]`` and shape ``sigma[op]`` (p99 = e^(2.33 σ) × the median:
    σ = 1 gives 10×; no σ: always the mean). Bytes are the object's modelled size: ``len(data) *
    size_scale[family]`` (objects are made small so thousands of workers fit in memory; the latency and the
    byte rates are those of the real size)."""

    base: dict
    bandwidth: float
    size_scale: dict
    sigma: dict = field(default_factory=dict)
    per_key: float = 0.0
    seed: int = 0

    def __post_init__(self):
        self._rng = random.Random(self.seed)

    def bytes(self, key: str, n: int) -> float:
        return n * self.size_scale.get(family(key), 1.0)

    def draw(self, op: str) -> float:
        mean, sigma = self.base[op], self.sigma.get(op, 0.0)
        if not sigma or mean <= 0:
            return mean
        return self._rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)

    def of(self, op: str, key: str = "", n: int = 0) -> float:
        return self.draw(op) + self.bytes(key, n) / self.bandwidth


class Meter:
    def __init__(self, clock: SimClock, latency: Latency, half_at: float, end_at: float):
        self.clock, self.latency, self.half_at, self.end_at = clock, latency, half_at, end_at
        # (family, op, half) → requests (every attempt: S3 bills them)
        self.requests: collections.Counter[tuple[str, str, int]] = collections.Counter()
        # (family, op, half) → modelled bytes
        self.bytes: collections.defaultdict[tuple[str, str, int], float] = collections.defaultdict(float)
        # (family, op) → seconds the successful requests took
        self.took: collections.defaultdict[tuple[str, str], float] = collections.defaultdict(float)
        self.done: collections.Counter[tuple[str, str]] = collections.Counter()  # (family, op) → successful requests
        self.throttled: collections.Counter[str] = collections.Counter()  # family → SlowDown answers
        # family → SlowDown raised to the caller after every retry
        self.failed: collections.Counter[str] = collections.Counter()
        # (family, code) → error answers: SlowDown, InternalError, reset
        self.errors: collections.Counter[tuple[str, str]] = collections.Counter()
        # (family, code) → StoreError raised, by the last answer's code
        self.raised: collections.Counter[tuple[str, str | None]] = collections.Counter()
        self.gets_by_key: collections.Counter[str] = collections.Counter()
        self.worker_requests: collections.Counter[str] = collections.Counter()  # op → requests of rollout workers
        self.visible_at: dict[str, float] = {}  # experience key → when its PUT completed
        self.loads: dict[str, list] = collections.defaultdict(list)  # experience key → [(actor, time)]
        self.store_cpu = 0.0  # CPU seconds spent inside the stores (the model's own cost, not rapid's)
        self.slow_put: dict[object, float] = {}  # actor → extra seconds on each experience PUT (a slow link)
        self.muted = False  # the model reading the pool for its own figures: not a request of the fleet
        self.client = ""  # the store client whose CPU is worth reporting beside rapid's ("botocore" on moto)
        # Ledger.stored (fleet/ledger.py): what every completed PUT stored, read back for the figures
        self.on_stored: Callable[[str, bytes, float], None] | None = None

    def extra(self, op: str, key: str) -> float:
        if op == "PUT" and key.startswith("experience/"):
            return self.slow_put.get(self.clock.actor, 0.0)
        return 0.0

    def half(self) -> int:
        return int(self.clock.t() >= self.half_at)

    def counting(self) -> bool:
        return not self.muted and self.clock.t() < self.end_at  # the drain after the run is not in the rates

    def count(self, op: str, key: str, nbytes: int = 0, pages: int = 1) -> None:
        if not self.counting():
            return
        fam, h = family(key), self.half()
        self.requests[fam, op, h] += pages
        if str(getattr(self.clock.actor, "process", "")).startswith("w"):  # a rollout worker's process
            self.worker_requests[op] += pages
        self.bytes[fam, op, h] += self.latency.bytes(key, nbytes)
        if op == "GET":
            self.gets_by_key[key] += 1

    def took_s(self, op: str, key: str, seconds: float) -> None:
        if self.counting():
            self.took[family(key), op] += seconds
            self.done[family(key), op] += 1

    def put_done(self, key: str, data: bytes) -> None:
        if key.startswith("experience/") and key.endswith(".rxp"):
            self.visible_at[key] = self.clock.t()
        if self.on_stored is not None:
            self.on_stored(key, data, self.clock.t())

    def got(self, key: str) -> None:
        if key in self.visible_at:
            self.loads[key].append((self.clock.actor, self.clock.t()))

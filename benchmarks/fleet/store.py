"""Request-counting stores for the scale model.

:class:`ModelStore` is an in-memory :class:`rapid.infra.store.Store` that behaves like S3 where the data
plane can tell (the rules are in ``s3rules.py``):

- LIST answers 1,000 keys a page (each page one request, ``start_after`` honoured);
- a PUT or DELETE takes effect when it completes: until then readers see the object as it was (an
  overwritten key serves its old bytes; a new key is absent);
- latency is drawn per request: lognormal around the op's mean with a tail (:class:`Latency`), plus the
  object's modelled bytes over a per-stream bandwidth, plus the keys of a LIST page;
- 503 SlowDown past a partition's rate (each prefix starts as one partition of 3,500 writes/s and 5,500
  reads/s and splits under sustained load), 500 InternalError and connection resets at set rates, all
  retried as botocore's standard mode does; ``StoreError`` only once the retries are spent;
- faults on call: :meth:`ModelStore.hang_gets` and :meth:`ModelStore.fail_puts`.

Every request charges its latency to the simulated clock of the actor that made it; draws come from seeds.

:class:`MeteredS3` wraps a real ``S3Store`` (moto_server on loopback): requests counted from botocore's own
events, each call charging the wall-clock time it took (moto's pace, no modelled latency) plus the transfer
time the objects' size scaling adds.

Both feed a :class:`Meter`: requests and bytes per key family and type, split at half time (growth), error
answers and errors raised, the time requests took, the GETs of the hottest key, and a ledger of experience
objects (when each became visible, which actors loaded it) for discovery delay and "never loaded".
"""

from __future__ import annotations

import collections
import contextlib
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rapid.infra.store import (
    DEFAULT_MAX_BYTES,
    KeyNotFound,
    ObjectTooLarge,
    Store,
    StoreError,
    validate_key,
    validate_prefix,
)

from .clock import SimClock
from .s3rules import READ_LIMIT, THROTTLE, WRITE_LIMIT, Objects, Partitions, Retry

FAMILIES = ("experience", "params", "params/LATEST", "league/results", "league/pool", "league/snapshots",
            "checkpoints", "loader", "other")
OPS = ("PUT", "GET", "LIST", "DELETE", "HEAD")
WRITES = {"PUT", "DELETE"}
PRICE_PER_1000 = {"PUT": 0.005, "LIST": 0.005, "GET": 0.0004, "HEAD": 0.0004, "DELETE": 0.0}
"""S3 Standard list prices (us-east-1): PUT/COPY/POST/LIST $0.005 per 1,000, GET and others $0.0004, DELETE free."""
PAGE = 1000


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


class ModelStore(Store):
    def __init__(self, meter: Meter, write_limit: float = WRITE_LIMIT, read_limit: float = READ_LIMIT,
                 attempts: int = 5, seed: int = 0, error_rate: float = 0.0, reset_rate: float = 0.0,
                 split_after_s: float = 0.0):
        self.url, self.meter, self.clock = "model://fleet", meter, meter.clock
        self.error_rate, self.reset_rate = error_rate, reset_rate
        self.rng = random.Random(seed)
        self.partitions = Partitions(write_limit, read_limit, split_after_s)
        self.retry = Retry(attempts, self.rng)
        self.objects = Objects()
        self._hangs: dict[str, list] = {}  # key → [extra seconds, GETs left]
        self._put_outages: list[tuple[str, float, float]] = []  # (prefix, start, end): PUTs answer 500

    # -- faults ---------------------------------------------------------------------------------------------

    def hang_gets(self, key: str, seconds: float, count: int = 1) -> None:
        """The next ``count`` GETs of ``key`` each take ``seconds`` longer (a read stuck until its timeout)."""
        self._hangs[key] = [seconds, count]

    def fail_puts(self, prefix: str, start_s: float, end_s: float) -> None:
        """Every PUT attempt of a key under ``prefix`` from simulated second ``start_s`` until ``end_s``
        answers 500 InternalError (retried as any 500 is)."""
        self._put_outages.append((prefix, start_s, end_s))

    # -- the S3 behaviour -----------------------------------------------------------------------------------

    def _answer(self, op: str, key: str) -> str | None:
        """The error this attempt is answered with, or None: it is served."""
        t = self.clock.t()
        if op == "PUT" and any(key.startswith(p) and a <= t < b for p, a, b in self._put_outages):
            return "InternalError"
        if not self.partitions.admit("write" if op in WRITES else "read", key, math.floor(t)):
            return THROTTLE
        draw = self.rng.random()
        if draw < self.error_rate:
            return "InternalError"
        if draw < self.error_rate + self.reset_rate:
            return "reset"
        return None

    def _admit(self, op: str, key: str) -> None:
        """One request, retried like botocore's standard mode; each refused attempt is counted and charged
        its latency, then the backoff; raises once the attempts or the client's retry quota are spent."""
        client, taken, fam = self.clock.actor, 0, family(key)
        for attempt in range(1, self.retry.attempts + 1):
            code = self._answer(op, key)
            if code is None:
                self.retry.succeeded(client, taken)
                return
            self.meter.count(op, key)  # a refused request is still a request (and billed)
            self.meter.errors[fam, code] += 1
            if code == THROTTLE:
                self.meter.throttled[fam] += 1
            self.clock.charge(self.meter.latency.draw(op))
            taken = self.retry.take(client, code) if attempt < self.retry.attempts else 0
            if not taken:
                break
            self.clock.charge(self.retry.wait(attempt, code))
        self.meter.raised[fam, code] += 1
        if code == THROTTLE:
            self.meter.failed[fam] += 1
        raise StoreError(f"{code}: {op} {key!r} failed after {attempt} attempt(s) (retry quota left "
                         f"{self.retry.quota(client)})")

    def _served(self, op: str, key: str, took: float, nbytes: int = 0) -> None:
        self.meter.count(op, key, nbytes)
        self.clock.charge(took)
        self.meter.took_s(op, key, took)

    def _request(self, op: str, key: str, nbytes: int = 0) -> None:
        self._admit(op, key)
        self._served(op, key, self.meter.latency.of(op, key, nbytes) + self.meter.extra(op, key), nbytes)

    def _hang(self, key: str) -> float:
        hang = self._hangs.get(key)
        if hang is None:
            return 0.0
        hang[1] -= 1
        if not hang[1]:
            del self._hangs[key]
        return hang[0]

    @contextlib.contextmanager
    def _call(self):
        """One call of the interface: what completed by the scheduler's time settles first; the CPU it
        spends is the model's own, not rapid's."""
        t0 = time.thread_time()
        self.objects.settle(self.clock.now)
        try:
            yield
        finally:
            self.meter.store_cpu += time.thread_time() - t0

    # -- the Store interface --------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        validate_key(key)
        with self._call():
            self._request("PUT", key, len(data))
            self.objects.write(key, bytes(data), self.clock.t())  # the PUT completes now
            self.meter.put_done(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        validate_key(key)
        with self._call():
            self._request("PUT", key, len(data))
            if self.objects.newest(key) is not None:  # S3 answers 412 (409 while another write of it is in flight)
                return False
            self.objects.write(key, bytes(data), self.clock.t())
            self.meter.put_done(key, data)
            return True

    def get(self, key: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
        validate_key(key)
        with self._call():
            self._admit("GET", key)
            data = self.objects.read(key, self.clock.t())
            n = 0 if data is None or len(data) > max_bytes else len(data)
            self._served("GET", key, self.meter.latency.of("GET", key, n) + self._hang(key), n)
            if data is None:
                raise KeyNotFound(key)
            if len(data) > max_bytes:
                raise ObjectTooLarge(f"{key} is {len(data)} bytes, more than the {max_bytes} allowed")
            self.meter.got(key)
            return data

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        validate_prefix(prefix)
        with self._call():
            keys = self.objects.keys(prefix, start_after, self.clock.t())
            latency, at = self.meter.latency, prefix or "other"
            for page in range(max(1, math.ceil(len(keys) / PAGE))):  # each page a request: admitted and timed
                self._admit("LIST", at)
                self._served("LIST", at, latency.draw("LIST") + latency.per_key * min(PAGE, len(keys) - page * PAGE))
            return keys

    def delete(self, key: str) -> None:
        validate_key(key)
        with self._call():
            self._request("DELETE", key)
            if self.objects.newest(key) is not None:
                self.objects.write(key, None, self.clock.t())

    def exists(self, key: str) -> bool:
        validate_key(key)
        with self._call():
            self._admit("HEAD", key)
            found = self.objects.read(key, self.clock.t()) is not None
            self._served("HEAD", key, self.meter.latency.of("HEAD", key))
            return found

    def peek(self, key: str) -> bytes | None:
        """The object's newest bytes for the model's own figures: no request, no latency."""
        return self.objects.newest(key)

    def keys_now(self, prefix: str) -> tuple[str, ...]:
        """The keys under ``prefix`` that hold an object now, for the model's own figures: no request."""
        return tuple(sorted(k for k in self.objects.all_keys()
                            if k.startswith(prefix) and self.objects.newest(k) is not None))

    def live(self) -> dict[str, tuple[int, float]]:
        """Family → (objects, modelled bytes) stored now (the newest version of each key)."""
        out: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
        for key in self.objects.all_keys():
            data = self.objects.newest(key)
            if data is not None:
                entry = out[family(key)]
                entry[0] += 1
                entry[1] += self.meter.latency.bytes(key, len(data))
        return {k: (v[0], v[1]) for k, v in out.items()}


_S3_OPS = {"PutObject": "PUT", "GetObject": "GET", "ListObjectsV2": "LIST", "DeleteObject": "DELETE",
           "HeadObject": "HEAD"}


class MeteredS3(Store):
    """A real S3Store, its requests counted from botocore's events (one per API call: each LIST page, each
    HEAD), bytes and the experience ledger kept. Each call charges the simulated clock the wall-clock time
    it took (moto's pace and botocore's, as the caller waits for them) plus the transfer time the size
    scaling adds to the real bytes; the model's latency is never charged here."""

    def __init__(self, inner, meter: Meter):
        self.inner, self.meter, self.url = inner, meter, inner.url
        meter.client = "botocore"
        self.root = f"{inner.prefix}/" if inner.prefix else ""
        self._started: tuple[str, str, float] | None = None
        # S3Store keeps its client private; a benchmark may look inside to count what goes on the wire.
        events = inner.client.meta.events
        events.register("provide-client-params.s3", self._on_call)
        events.register("after-call.s3", self._on_done)

    def _on_call(self, params, model, **_):
        op = _S3_OPS.get(model.name)
        if op is None or self.meter.muted:
            return
        key = str(params.get("Key", params.get("Prefix", "")))[len(self.root):] or "other"
        self.meter.count(op, key)
        self.meter.clock.charge(self.meter.extra(op, key))
        self._started = (op, key, time.perf_counter())

    def _on_done(self, **_):
        if self._started is not None:
            op, key, t0 = self._started
            self.meter.took_s(op, key, time.perf_counter() - t0)
            self._started = None

    def _bytes(self, key: str, n: int) -> None:
        self.meter.bytes[family(key), "GET" if n < 0 else "PUT", self.meter.half()] += \
            self.meter.latency.bytes(key, abs(n))
        self.meter.clock.charge((self.meter.latency.bytes(key, abs(n)) - abs(n)) / self.meter.latency.bandwidth)

    def _timed(self, fn, *args):
        """Run the S3 call: its wall time charged to the simulated clock, its CPU (botocore's) kept apart
        from rapid's."""
        t0, wall0 = time.thread_time(), time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.meter.store_cpu += time.thread_time() - t0
            self.meter.clock.charge(time.perf_counter() - wall0)

    def put(self, key, data):
        self._timed(self.inner.put, key, data)
        self._bytes(key, len(data))
        self.meter.put_done(key, data)

    def put_if_absent(self, key, data):
        done = self._timed(self.inner.put_if_absent, key, data)
        if done:
            self._bytes(key, len(data))
            self.meter.put_done(key, data)
        return done

    def get(self, key, max_bytes=DEFAULT_MAX_BYTES):
        data = self._timed(self.inner.get, key, max_bytes)
        self._bytes(key, -len(data))
        self.meter.got(key)
        return data

    def list(self, prefix="", start_after=None):
        return self._timed(self.inner.list, prefix, start_after)

    def delete(self, key):
        self._timed(self.inner.delete, key)

    def exists(self, key):
        return self._timed(self.inner.exists, key)

    def peek(self, key: str) -> bytes | None:
        self.meter.muted = True
        try:
            return self.inner.get(key)
        except KeyNotFound:
            return None
        finally:
            self.meter.muted = False

    def keys_now(self, prefix: str) -> tuple[str, ...]:
        self.meter.muted = True
        try:
            return tuple(self.inner.list(prefix))
        finally:
            self.meter.muted = False

    def live(self) -> dict[str, tuple[int, float]]:
        out: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
        self.meter.muted = True
        try:
            pages = self.inner.client.get_paginator("list_objects_v2").paginate(Bucket=self.inner.bucket,
                                                                                  Prefix=self.root)
            for page in pages:
                for obj in page.get("Contents", ()):
                    key = obj["Key"][len(self.root):]
                    out[family(key)][0] += 1
                    out[family(key)][1] += self.meter.latency.bytes(key, obj["Size"])
        finally:
            self.meter.muted = False
        return {k: (v[0], v[1]) for k, v in out.items()}

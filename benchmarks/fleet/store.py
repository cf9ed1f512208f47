"""Request-counting stores for the scale model.

:class:`ModelStore` is an in-memory :class:`rapid.infra.store.Store` that behaves like S3 where the data
plane can tell: LIST answers 1,000 keys a page (each page one request, ``start_after`` honoured), an object
becomes visible only when its PUT completes, and past ~3,500 writes/s or ~5,500 reads/s on one prefix (the
key up to its last '/', as S3 partitions) a request is answered 503 SlowDown. Like ``S3Store`` (botocore's
``standard`` retry mode, 5 attempts) it retries a SlowDown with jittered exponential backoff and raises
``StoreError("SlowDown …")`` only when every attempt was refused. Every request charges modelled latency
(a per-request time plus bytes over a per-stream bandwidth) to the simulated clock of the actor that made it.

:class:`MeteredS3` wraps a real ``S3Store`` (moto_server on loopback) for the calibration run: requests are
counted from botocore's own events (each LIST page, each HEAD), and the same latency model is charged, so
both runs follow the same simulated timeline and differ only in what the stores answer.

Both feed a :class:`Meter`: requests and bytes per key family and type, split at half time (growth), the
GETs of the hottest key, and a ledger of experience objects (when each became visible, which actors loaded
it) from which the fleet computes discovery delay and "never loaded".
"""

from __future__ import annotations

import bisect
import collections
import math
import random
import time
from dataclasses import dataclass

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
    """Seconds a request takes: ``base[op]`` plus its bytes over ``bandwidth`` (bytes/s of one stream).
    Bytes are the object's modelled size: ``len(data) * size_scale[family]`` (objects are made small so
    thousands of workers fit in memory; the latency and the byte rates are those of the real size)."""

    base: dict
    bandwidth: float
    size_scale: dict

    def bytes(self, key: str, n: int) -> float:
        return n * self.size_scale.get(family(key), 1.0)

    def of(self, op: str, key: str = "", n: int = 0) -> float:
        return self.base[op] + self.bytes(key, n) / self.bandwidth


class Meter:
    def __init__(self, clock: SimClock, latency: Latency, half_at: float, end_at: float):
        self.clock, self.latency, self.half_at, self.end_at = clock, latency, half_at, end_at
        self.requests = collections.Counter()  # (family, op, half) → requests
        self.bytes = collections.Counter()  # (family, op, half) → modelled bytes
        self.throttled = collections.Counter()  # family → SlowDown answers
        self.failed = collections.Counter()  # family → SlowDown raised to the caller after every retry
        self.gets_by_key = collections.Counter()
        self.visible_at: dict[str, float] = {}  # experience key → when its PUT completed
        self.loads: dict[str, list] = collections.defaultdict(list)  # experience key → [(actor, time)]
        self.store_cpu = 0.0  # CPU seconds spent inside the stores (the model's own cost, not rapid's)
        self.slow_put: dict[object, float] = {}  # actor → extra seconds on each experience PUT (a slow link)
        self.muted = False  # the model reading the pool for its own figures: not a request of the fleet
        self.client = ""  # the store client whose CPU is worth reporting beside rapid's ("botocore" on moto)

    def extra(self, op: str, key: str) -> float:
        if op == "PUT" and key.startswith("experience/"):
            return self.slow_put.get(self.clock.actor, 0.0)
        return 0.0

    def half(self) -> int:
        return int(self.clock.t() >= self.half_at)

    def count(self, op: str, key: str, nbytes: int = 0, pages: int = 1) -> None:
        if self.muted or self.clock.t() >= self.end_at:  # the drain after the run is not part of the rates
            return
        fam, h = family(key), self.half()
        self.requests[fam, op, h] += pages
        self.bytes[fam, op, h] += self.latency.bytes(key, nbytes)
        if op == "GET":
            self.gets_by_key[key] += 1

    def put_done(self, key: str) -> None:
        if key.startswith("experience/") and key.endswith(".rxp"):
            self.visible_at[key] = self.clock.t()

    def got(self, key: str) -> None:
        if key in self.visible_at:
            self.loads[key].append((self.clock.actor, self.clock.t()))


class ModelStore(Store):
    def __init__(self, meter: Meter, write_limit: float = 3500.0, read_limit: float = 5500.0,
                 attempts: int = 5, seed: int = 0):
        self.url, self.meter, self.clock = "model://fleet", meter, meter.clock
        self.write_limit, self.read_limit, self.attempts = write_limit, read_limit, attempts
        self.rng = random.Random(seed)
        self._data: dict[str, bytes] = {}
        self._keys: list[str] = []  # sorted: LIST is a bisect and a slice
        self._hidden: dict[str, float] = {}  # key → when its PUT completes (invisible until then)
        # (prefix, read|write, second) → requests admitted: actors' steps interleave seconds, so every second
        # keeps its own count
        self._window: collections.Counter = collections.Counter()
        self._next_prune = 0

    # -- the S3 behaviour -----------------------------------------------------------------------------

    def _admit(self, op: str, key: str) -> None:
        """One request, retried like botocore through SlowDown; charges its latency, or raises."""
        prefix = key.rsplit("/", 1)[0] if "/" in key else ""
        kind = "write" if op in WRITES else "read"
        limit = self.write_limit if kind == "write" else self.read_limit
        now = math.floor(self.clock.t())
        if now >= self._next_prune:  # seconds long past: steps run within seconds of each other
            for old in [k for k in self._window if k[2] < now - 60]:
                del self._window[old]
            self._next_prune = now + 60
        for attempt in range(1, self.attempts + 1):
            slot = (prefix, kind, math.floor(self.clock.t()))
            if self._window[slot] < limit:
                self._window[slot] += 1
                return
            self.meter.throttled[family(key)] += 1
            self.meter.count(op, key)  # a refused request is still a request (and billed)
            if attempt < self.attempts:
                self.clock.charge(self.rng.random() * min(20.0, 2.0 ** attempt))  # botocore standard backoff
        self.meter.failed[family(key)] += 1
        raise StoreError(f"SlowDown: {op} {key!r} refused {self.attempts} times (> {limit:.0f} {kind}s/s on "
                         f"prefix {prefix!r})")

    def _visible(self, key: str) -> bool:
        due = self._hidden.get(key)
        if due is None:
            return key in self._data
        if due <= self.clock.t():
            del self._hidden[key]
            return True
        return False

    def _request(self, op: str, key: str, nbytes: int = 0) -> None:
        self._admit(op, key)
        self.meter.count(op, key, nbytes)
        self.clock.charge(self.meter.latency.of(op, key, nbytes) + self.meter.extra(op, key))

    # -- the Store interface ----------------------------------------------------------------------------

    def _write(self, key: str, data: bytes) -> None:
        if key not in self._data:
            bisect.insort(self._keys, key)
        self._data[key] = bytes(data)
        self._hidden[key] = self.clock.t()  # called after the request's latency: visible once it completes

    def put(self, key: str, data: bytes) -> None:
        t0 = time.thread_time()
        validate_key(key)
        self._request("PUT", key, len(data))
        self._write(key, data)
        self.meter.put_done(key)
        self.meter.store_cpu += time.thread_time() - t0

    def put_if_absent(self, key: str, data: bytes) -> bool:
        t0 = time.thread_time()
        validate_key(key)
        self._request("PUT", key, len(data))
        try:
            if key in self._data:  # S3 answers 412 for an object that exists, even one still being written
                return False
            self._write(key, data)
            self.meter.put_done(key)
            return True
        finally:
            self.meter.store_cpu += time.thread_time() - t0

    def get(self, key: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
        t0 = time.thread_time()
        validate_key(key)
        try:
            self._admit("GET", key)
            data = self._data.get(key) if self._visible(key) else None
            n = 0 if data is None or len(data) > max_bytes else len(data)
            self.meter.count("GET", key, n)
            self.clock.charge(self.meter.latency.of("GET", key, n))
            if data is None:
                raise KeyNotFound(key)
            if len(data) > max_bytes:
                raise ObjectTooLarge(f"{key} is {len(data)} bytes, more than the {max_bytes} allowed")
            self.meter.got(key)
            return data
        finally:
            self.meter.store_cpu += time.thread_time() - t0

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        t0 = time.thread_time()
        validate_prefix(prefix)
        lo = bisect.bisect_left(self._keys, prefix)
        if start_after is not None:
            lo = max(lo, bisect.bisect_right(self._keys, start_after))
        hi = bisect.bisect_left(self._keys, prefix[:-1] + chr(ord(prefix[-1]) + 1)) if prefix else len(self._keys)
        keys = self._keys[lo:hi]
        now = self.clock.t()
        for key in [k for k, due in self._hidden.items() if due <= now]:
            del self._hidden[key]
        if self._hidden:
            keys = [k for k in keys if k not in self._hidden]
        pages = max(1, math.ceil(len(keys) / PAGE))
        for _ in range(pages):  # each page is a request: admitted, counted and timed on its own
            self._request("LIST", prefix or "other")
        self.meter.store_cpu += time.thread_time() - t0
        return keys

    def delete(self, key: str) -> None:
        t0 = time.thread_time()
        validate_key(key)
        self._request("DELETE", key)
        if self._data.pop(key, None) is not None:
            del self._keys[bisect.bisect_left(self._keys, key)]
            self._hidden.pop(key, None)
        self.meter.store_cpu += time.thread_time() - t0

    def exists(self, key: str) -> bool:
        validate_key(key)
        self._request("HEAD", key)
        return self._visible(key)

    def peek(self, key: str) -> bytes | None:
        """The object's bytes for the model's own figures: no request, no latency."""
        return self._data.get(key)

    def live(self) -> dict[str, tuple[int, float]]:
        """Family → (objects, modelled bytes) stored now."""
        out: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
        for key, data in self._data.items():
            entry = out[family(key)]
            entry[0] += 1
            entry[1] += self.meter.latency.bytes(key, len(data))
        return {k: (v[0], v[1]) for k, v in out.items()}


_S3_OPS = {"PutObject": "PUT", "GetObject": "GET", "ListObjectsV2": "LIST", "DeleteObject": "DELETE",
           "HeadObject": "HEAD"}


class MeteredS3(Store):
    """A real S3Store, its requests counted from botocore's events (one per API call: each LIST page, each
    HEAD), the model's latency charged to the simulated clock, bytes and the experience ledger kept."""

    def __init__(self, inner, meter: Meter):
        self.inner, self.meter, self.url = inner, meter, inner.url
        meter.client = "botocore"
        self.root = f"{inner.prefix}/" if inner.prefix else ""
        # S3Store keeps its client private; a benchmark may look inside to count what goes on the wire.
        inner._client.meta.events.register("provide-client-params.s3", self._on_call)

    def _on_call(self, params, model, **_):
        op = _S3_OPS.get(model.name)
        if op is None:
            return
        key = str(params.get("Key", params.get("Prefix", "")))[len(self.root):] or "other"
        if self.meter.muted:
            return
        self.meter.count(op, key)
        self.meter.clock.charge(self.meter.latency.base[op] + self.meter.extra(op, key))

    def _bytes(self, key: str, n: int) -> None:
        self.meter.bytes[family(key), "GET" if n < 0 else "PUT", self.meter.half()] += \
            self.meter.latency.bytes(key, abs(n))
        self.meter.clock.charge(self.meter.latency.bytes(key, abs(n)) / self.meter.latency.bandwidth)

    def _timed(self, fn, *args):
        """Run the S3 call, its CPU (botocore's) kept apart from rapid's."""
        t0 = time.thread_time()
        try:
            return fn(*args)
        finally:
            self.meter.store_cpu += time.thread_time() - t0

    def put(self, key, data):
        self._timed(self.inner.put, key, data)
        self._bytes(key, len(data))
        self.meter.put_done(key)

    def put_if_absent(self, key, data):
        done = self._timed(self.inner.put_if_absent, key, data)
        if done:
            self._bytes(key, len(data))
            self.meter.put_done(key)
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

    def live(self) -> dict[str, tuple[int, float]]:
        out: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
        self.meter.muted = True
        try:
            pages = self.inner._client.get_paginator("list_objects_v2").paginate(Bucket=self.inner.bucket,
                                                                                  Prefix=self.root)
            for page in pages:
                for obj in page.get("Contents", ()):
                    key = obj["Key"][len(self.root):]
                    out[family(key)][0] += 1
                    out[family(key)][1] += self.meter.latency.bytes(key, obj["Size"])
        finally:
            self.meter.muted = False
        return {k: (v[0], v[1]) for k, v in out.items()}

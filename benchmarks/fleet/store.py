"""The scale model's in-memory store: a :class:`rapid.infra.store.Store` that behaves like S3 where the data
plane can tell (the rules are in ``s3rules.py``):

- LIST answers 1,000 keys a page (each page one request, ``start_after`` honoured);
- a PUT or DELETE takes effect when it completes: until then readers see the object as it was (an
  overwritten key serves its old bytes; a new key is absent);
- latency is drawn per request (``meter.py`` :class:`Latency`);
- 503 SlowDown past a partition's rate (each prefix starts as one partition of 3,500 writes/s and 5,500
  reads/s and splits under sustained load), 500 InternalError and connection resets at set rates, all
  retried as botocore's standard mode does; ``StoreError`` only once the retries are spent;
- faults on call: :meth:`ModelStore.hang_gets` and :meth:`ModelStore.fail_puts`.

Every request charges its latency to the simulated clock of the actor that made it; draws come from seeds;
every request is counted by the :class:`Meter` it is given.
"""

from __future__ import annotations

import collections
import contextlib
import math
import random
import time

from rapid.infra.store import (
    DEFAULT_MAX_BYTES,
    KeyNotFound,
    ObjectTooLarge,
    Store,
    StoreError,
    validate_key,
    validate_prefix,
)

from .meter import WRITES, Meter, family
from .s3rules import READ_LIMIT, THROTTLE, WRITE_LIMIT, Objects, Partitions, Retry

PAGE = 1000


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

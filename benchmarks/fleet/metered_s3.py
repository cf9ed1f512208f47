"""A real ``S3Store`` (moto_server on loopback) counted for the scale model: requests counted from botocore's
own events, each call charging the wall-clock time it took (moto's pace, no modelled latency) plus the transfer
time the objects' size scaling adds, all fed to the same :class:`Meter` as the model's own store.
"""

from __future__ import annotations

import collections
import time

from rapid.infra.store import DEFAULT_MAX_BYTES, KeyNotFound, Store

from .meter import Meter, family

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

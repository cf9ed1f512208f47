"""The node inference server's metrics (``rapid/rollout/inference_server.py``): batch sizes, how long requests wait
to be batched, and the share of time the device is busy deciding."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from rapid.monitoring.metrics import RoleMetrics

BATCH_BUCKETS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
WAIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
BUSY_WINDOW_S = 10.0


class InferenceMetrics(RoleMetrics):
    role = "inference"

    def __init__(self, run: str, rank: int = 0, registry: CollectorRegistry | None = None, clock=time.monotonic):
        super().__init__(run, rank, registry)
        self._rows = self._histogram("rapid_inference_batch_rows", "Agent rows decided in one batch.",
                                     BATCH_BUCKETS)
        self._wait = self._histogram("rapid_inference_queue_wait_seconds",
                                     "Seconds a worker's request waited for its batch to start.", WAIT_BUCKETS)
        self._busy = self._gauge("rapid_inference_busy_share",
                                 f"Share of the last {BUSY_WINDOW_S:.0f}s the server spent deciding (its device "
                                 "busy or waited for).")
        self._workers = self._gauge("rapid_inference_workers", "Rollout workers connected to the server.")
        self._version = self._gauge("rapid_param_version", "Parameter version in use.")
        self._store_metrics()  # it reads parameters and snapshots from the store
        self._clock = clock
        self._window_start, self._busy_s = clock(), 0.0

    def batch(self, rows: int, waits: list[float], busy_s: float) -> None:
        self._rows.observe(rows)
        for w in waits:
            self._wait.observe(w)
        self._busy_s += busy_s
        now = self._clock()
        if now - self._window_start >= BUSY_WINDOW_S:
            self._busy.set(self._busy_s / (now - self._window_start))
            self._window_start, self._busy_s = now, 0.0

    def workers(self, n: int) -> None:
        self._workers.set(n)

    def param_version(self, v: int) -> None:
        self._version.set(v)

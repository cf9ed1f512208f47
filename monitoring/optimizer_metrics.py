"""An optimizer rank's metrics: samples in and out of its buffer, updates, their phases and staleness, the
balancer's decisions, the league's folds. The shared parts (registry, labels, exporter) are
:class:`rapid.monitoring.metrics.RoleMetrics`."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from rapid.monitoring.metrics import BASE_LABELS, OP_EXPERIENCE_GET, RoleMetrics

PHASE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Staleness in parameter versions; OpenAI Five saw learning slow badly from 8 on, so resolve 0..8 finely.
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)
UPDATE_PHASES = ("load", "forward", "backward", "allreduce", "step", "publish", "checkpoint", "report")
# update(stats) key -> (gauge name, help); keys missing from a stats dict leave the gauge at its last value.
UPDATE_STATS = {
    "policy_loss": ("rapid_policy_loss", "PPO clipped surrogate loss of the last update."),
    "value_loss": ("rapid_value_loss", "Value loss of the last update."),
    "entropy": ("rapid_entropy", "Policy entropy in the last update."),
    "approx_kl": ("rapid_approx_kl", "Approximate KL between behaviour and updated policy."),
    "clip_fraction": ("rapid_clip_fraction", "Share of probability ratios clipped in the last update."),
    "explained_variance": ("rapid_explained_variance", "Explained variance of the value predictions."),
    "grad_norm": ("rapid_grad_norm", "Global gradient norm of the last update."),
    "learning_rate": ("rapid_learning_rate", "Learning rate of the last update."),
}
# The optimizer's balancing decisions: balance(decision) key -> (gauge name, help).
BALANCE_GAUGES = {
    "batch": ("rapid_balance_batch_samples", "Samples per update chosen by the balancer."),
    "publish_interval_s": ("rapid_balance_publish_interval_seconds", "Seconds between published versions."),
    "target_reuse": ("rapid_balance_target_reuse", "The run's sample reuse target (optimizer.target_reuse; "
                     "max_reuse without balancing): the buffer keeps reuse at or below it."),
    "arrival_per_s": ("rapid_balance_arrival_samples_per_second", "Samples received per second (window)."),
    "consumed_per_s": ("rapid_balance_consumed_samples_per_second", "Samples consumed per second (window)."),
    "capacity_per_s": ("rapid_balance_capacity_samples_per_second",
                       "Samples per second the optimizer consumes while busy (window)."),
    "waste_share": ("rapid_balance_waste_ratio", "Share of received samples that left unused (window)."),
    "overloaded": ("rapid_balance_overloaded", "1 while rollouts produce more than the optimizer can use."),
    "pace": ("rapid_balance_rollout_pace", "Share of their time rank 0 asks rollout workers to play (1: full "
             "speed; lower while unused samples pile up: optimizer.pace_rollouts)."),
}
# Why the optimizer rejects an experience object: undecodable bytes, wrong schema/shapes, NaN/inf inside.
# Exported at 0 from the start so the dashboard and alerts see the series before the first rejection.
BAD_OBJECT_REASONS = ("decode", "invalid", "nonfinite", "future", "error")
# Why samples left the optimizer's buffer before any update used them.
DROP_REASONS = ("stale", "evicted")


class _StalenessCollector(Collector):
    """A histogram fed whole arrays at once: one numpy pass per batch instead of one observe() per sample.

    Integer staleness (the normal case) is counted per value 0..top+1 with one bincount and folded into
    buckets only at scrape time; float arrays take the general searchsorted path.
    """

    def __init__(self, labels: tuple[str, str, str]):
        self._labels = list(labels)
        self._bounds = np.asarray(STALENESS_BUCKETS, dtype=np.float64)
        self._top = int(STALENESS_BUCKETS[-1]) + 1  # integer values >= top all land above the last bucket
        # side="left": a value equal to a bound belongs to that bound's bucket (le is inclusive).
        self._bucket_of_int = np.searchsorted(self._bounds, np.arange(self._top + 1), side="left")
        self._per_int = np.zeros(self._top + 1, dtype=np.int64)
        self._per_bucket = np.zeros(len(STALENESS_BUCKETS) + 1, dtype=np.int64)  # last slot: above the top
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, values) -> None:
        arr = np.asarray(values).ravel()
        if arr.size == 0:
            return
        if arr.dtype.kind in "iu":
            # Negative values are clipped into le=0, which is where Prometheus would count them too.
            counts = np.bincount(np.clip(arr, 0, self._top), minlength=self._top + 1)
            target = self._per_int
        else:
            counts = np.bincount(np.searchsorted(self._bounds, arr, side="left"), minlength=self._per_bucket.size)
            target = self._per_bucket
        total = float(arr.sum())
        with self._lock:
            target += counts
            self._sum += total

    def collect(self):
        with self._lock:
            per_bucket = self._per_bucket + np.bincount(
                self._bucket_of_int, weights=self._per_int, minlength=self._per_bucket.size).astype(np.int64)
            total = self._sum
        cumulative = np.cumsum(per_bucket).tolist()
        family = HistogramMetricFamily(
            "rapid_sample_staleness", "Optimizer version minus the version that generated each sample.",
            labels=list(BASE_LABELS),
        )
        buckets = [(str(float(b)), c) for b, c in zip(STALENESS_BUCKETS, cumulative)]
        buckets.append(("+Inf", cumulative[-1]))
        family.add_metric(self._labels, buckets, total)
        yield family

    def describe(self):
        return [HistogramMetricFamily("rapid_sample_staleness", "", labels=list(BASE_LABELS))]


class OptimizerMetrics(RoleMetrics):
    role = "optimizer"

    def __init__(self, run: str, rank: int = 0, registry: CollectorRegistry | None = None):
        super().__init__(run, rank, registry)
        self._downloaded = self._counter("rapid_samples_downloaded_total", "Samples downloaded and accepted.")
        self._consumed = self._counter("rapid_samples_consumed_total", "Samples used by updates (with reuse).")
        self._dropped = self._counter("rapid_samples_dropped_total", "Samples dropped before use.", ("reason",))
        self._dropped_stale = self._dropped["stale"]
        self._dropped_evicted = self._dropped["evicted"]
        self._used = self._counter("rapid_samples_used_total", "Samples used by at least one update.")
        self._staleness = _StalenessCollector(self._labels)
        self.registry.register(self._staleness)
        self._reuse = self._gauge("rapid_sample_reuse", "Samples consumed by updates / samples received.")
        self._updates = self._counter("rapid_updates_total", "Optimizer updates applied.")
        self._nonfinite = self._counter(
            "rapid_nonfinite_updates_skipped_total", "Updates skipped because loss or gradients were NaN/inf.")
        self._bad = self._counter("rapid_bad_objects_total", "Experience objects rejected.", ("reason",))
        self._stats = {key: self._gauge(name, doc) for key, (name, doc) in UPDATE_STATS.items()}
        self._stats["lr"] = self._stats["learning_rate"]  # the optimizer's JSON log calls it "lr"
        self._phase = self._histogram(
            "rapid_update_phase_duration_seconds", "Time per update phase.", PHASE_BUCKETS, ("phase",))
        self._version = self._gauge("rapid_param_version", "Parameter version of the model being trained.")
        self._buffer = self._gauge("rapid_buffer_samples", "Samples in the local experience buffer.")
        self._capacity = self._gauge("rapid_buffer_capacity_samples", "Samples the local experience buffer holds "
                                     "at most (grown with the arrival rate: optimizer.max_buffer_mb).")
        self._win = self._gauge("rapid_win_rate", "Recent win rate of the learning side.", ("opponent",))
        self._update_failures = self._counter(
            "rapid_update_failures_total", "Updates that raised on their batch and were skipped.")
        self._loader_alive = self._gauge("rapid_loader_alive", "1 while the experience loader thread runs.")
        self._loader_errors = self._counter(
            "rapid_loader_errors_total", "Unexpected errors the experience loader caught and went on from.")
        self._balance = {key: self._gauge(name, doc) for key, (name, doc) in BALANCE_GAUGES.items()}
        self._store_metrics()
        self._episode_metrics()
        # Touching a child exports it at 0 from the start, so dashboards and rate() see every series.
        for phase in UPDATE_PHASES:
            self._phase[phase]
        for reason in BAD_OBJECT_REASONS:
            self._bad[reason]
        self._loader_alive.set(1)
        self._dl_bytes = self._store_bytes[OP_EXPERIENCE_GET]
        self._dl_seconds = self._store_seconds[OP_EXPERIENCE_GET]
        self._store_errors[OP_EXPERIENCE_GET]

    def samples_downloaded(self, n: int, nbytes: int, seconds: float) -> None:
        self._downloaded.inc(n)
        self._dl_bytes.inc(nbytes)
        self._dl_seconds.observe(seconds)

    def samples_consumed(self, n: int) -> None:
        self._consumed.inc(n)

    def samples_dropped_stale(self, n: int) -> None:
        self._dropped_stale.inc(n)

    def samples_evicted_unused(self, n: int) -> None:
        self._dropped_evicted.inc(n)

    def samples_used(self, n: int) -> None:
        """Samples drawn for the first time."""
        self._used.inc(n)

    def update_failed(self) -> None:
        self._update_failures.inc()

    def loader(self, alive: bool, new_errors: int = 0) -> None:
        self._loader_alive.set(1 if alive else 0)
        if new_errors:
            self._loader_errors.inc(new_errors)

    def balance(self, decision: Mapping[str, float]) -> None:
        """The balancer's decisions (BALANCE_GAUGES keys; others are ignored)."""
        for key, value in decision.items():
            gauge = self._balance.get(key)
            if gauge is not None:
                gauge.set(float(value))

    def staleness(self, values) -> None:
        """Staleness of a batch of samples (array-like of version differences)."""
        self._staleness.observe(values)

    def sample_reuse(self, x: float) -> None:
        self._reuse.set(x)

    def update(self, stats: Mapping[str, float]) -> None:
        """One applied update: counts it and sets the gauges of the UPDATE_STATS keys present ("lr" works too)."""
        self._updates.inc()
        for key, value in stats.items():
            gauge = self._stats.get(key)
            if gauge is not None:
                gauge.set(float(value))

    def update_phase(self, phase: str, seconds: float) -> None:
        self._phase[phase].observe(seconds)

    def param_version(self, v: int) -> None:
        self._version.set(v)

    def nonfinite_skipped(self) -> None:
        self._nonfinite.inc()

    def bad_object(self, reason: str) -> None:
        self._bad[reason].inc()

    def buffer_size(self, n: int, capacity: int) -> None:
        self._buffer.set(n)
        self._capacity.set(capacity)

    def win_rate(self, opponent_kind: str, x: float) -> None:
        """Win rate against ``opponent_kind`` ("pool" or "bots")."""
        self._win[opponent_kind].set(x)

"""Prometheus metrics for every rapid role and the /metrics exporter; discovery is in targets.py.

A role serves its metrics with ``port = metrics.serve(port=0, run_dir=run_dir)``: /metrics on a free port,
registered as ``<run_dir>/metrics/rollout-3.json`` for discovery (the example below writes that file itself).

Usage (a rollout worker; the optimizer, evaluator and launcher look the same)::

    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from rapid.monitoring.targets import register_process
    >>> run_dir = Path(tempfile.mkdtemp())
    >>> metrics = RolloutMetrics(run="demo", rank=3)     # own CollectorRegistry, labels role/rank/run
    >>> register_process(run_dir, "rollout", 3, 9100)    # what metrics.serve(port=0, run_dir=run_dir) records
    PosixPath('.../metrics/rollout-3.json')
    >>> for _ in range(2):                               # while training, once per vector step of 64 games
    ...     metrics.env_steps(64)                        # batched counts: one call per vector step
    ...     metrics.agent_steps(64 * 2)
    >>> metrics.episode(1.0, 30)                         # for each finished game: its return and length
    >>> metrics.registry.get_sample_value("rapid_env_steps_total", {"role": "rollout", "rank": "3", "run": "demo"})
    128.0
    >>> metrics.close()
    >>> path = write_file_sd(collect_targets(run_dir), run_dir / "metrics" / "targets.json", run="demo")
    >>> json.loads(path.read_text())
    [{'targets': ['127.0.0.1:9100'], 'labels': {'role': 'rollout', 'rank': '3', 'run': 'demo'}}]

Every metric is defined once here; each role object owns a private registry,
so several roles can live in one process (tests, the local launcher) without name clashes. Metrics carry
``role``, ``rank`` and ``run`` as real labels and the scrape config sets ``honor_labels`` so that the file_sd
target labels (the same three) only add them to ``up``. Hot-path methods touch pre-bound children only.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from rapid.monitoring.targets import collect_targets, register_process, unregister_process, write_file_sd

__all__ = [
    "RolloutMetrics", "OptimizerMetrics", "EvaluatorMetrics", "LauncherMetrics", "RoleMetrics",
    "metric_names", "register_process", "collect_targets", "write_file_sd",
]

BASE_LABELS = ("role", "rank", "run")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
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
}
# Store operations the role helpers report under; store_op() accepts any other name too.
OP_EXPERIENCE_PUT, OP_EXPERIENCE_GET, OP_PARAMS_GET = "experience_put", "experience_get", "params_get"
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


class RoleMetrics:
    """Shared parts: a private registry, the base labels, the exporter; subclasses add their metrics."""

    role = "process"

    def __init__(self, run: str, rank: int = 0, registry: CollectorRegistry | None = None):
        self.run, self.rank = str(run), int(rank)
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._labels = (self.role, str(self.rank), self.run)
        self._server: WSGIServer | None = None
        self._registration: Path | None = None
        self._gauge("rapid_process_start_time_seconds", "Unix time the process started its role.").set(time.time())

    # Definitions: every metric gets the base labels, plus `extra` label names bound later by the caller.
    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()):
        # prometheus_client appends "_total" itself; names here are spelled as exposed, for grep-ability.
        counter = Counter(name.removesuffix("_total"), doc, BASE_LABELS + extra, registry=self.registry)
        return self._bind(counter, extra)

    def _gauge(self, name: str, doc: str, extra: tuple[str, ...] = ()):
        return self._bind(Gauge(name, doc, BASE_LABELS + extra, registry=self.registry), extra)

    def _histogram(self, name: str, doc: str, buckets, extra: tuple[str, ...] = ()):
        return self._bind(Histogram(name, doc, BASE_LABELS + extra, buckets=buckets, registry=self.registry), extra)

    def _summary(self, name: str, doc: str):
        return self._bind(Summary(name, doc, BASE_LABELS, registry=self.registry), ())

    def _bind(self, metric, extra):
        # Without extra labels: the child itself. With: a cache, so hot paths do one dict lookup, not .labels().
        if not extra:
            return metric.labels(*self._labels)
        return _ChildCache(metric, self._labels)

    def _store_metrics(self) -> None:
        self._store_bytes = self._counter("rapid_store_bytes_total", "Bytes moved to/from the store.", ("op",))
        self._store_seconds = self._histogram(
            "rapid_store_op_duration_seconds", "Store operation latency.", LATENCY_BUCKETS, ("op",))
        self._store_errors = self._counter("rapid_store_errors_total", "Failed store operations.", ("op",))

    def store_op(self, op: str, nbytes: int, seconds: float) -> None:
        """One finished store operation (``op`` e.g. experience_get, params_put, list, delete)."""
        self._store_bytes[op].inc(nbytes)
        self._store_seconds[op].observe(seconds)

    def store_error(self, op: str) -> None:
        self._store_errors[op].inc()

    def _episode_metrics(self) -> None:
        self._ep_return = self._summary("rapid_episode_return", "Return of finished episodes (learning side).")
        self._ep_length = self._summary("rapid_episode_length_steps", "Length of finished episodes in env steps.")

    def episode(self, ret: float, length: int) -> None:
        self._ep_return.observe(ret)
        self._ep_length.observe(length)

    def serve(self, port: int = 0, addr: str = "127.0.0.1", run_dir: str | os.PathLike | None = None) -> int:
        """Serve /metrics; with ``run_dir`` also register this process as a scrape target. Returns the port."""
        self._server, _ = start_http_server(port, addr=addr, registry=self.registry)
        bound = self._server.server_port
        if run_dir is not None:
            # A wildcard bind is reachable from other hosts under this host's name, not under 0.0.0.0.
            host = socket.gethostname() if addr in ("", "0.0.0.0", "::") else addr
            self._registration = register_process(run_dir, self.role, self.rank, bound, host=host, run=self.run)
        return bound

    def close(self) -> None:
        """Stop serving; a clean stop also removes the registration (a process that dies leaves it: up == 0)."""
        server, self._server = self._server, None
        if server is None:
            return
        if self._registration is not None:
            unregister_process(self._registration, server.server_port)
            self._registration = None
        server.shutdown()
        server.server_close()


class _ChildCache(dict):
    """label value -> bound child; the first use of a new value creates it (then it is a plain dict hit)."""

    def __init__(self, metric, base: tuple[str, ...]):
        super().__init__()
        self._metric, self._base = metric, base

    def __missing__(self, value: str):
        child = self[value] = self._metric.labels(*self._base, value)
        return child


class RolloutMetrics(RoleMetrics):
    role = "rollout"

    def __init__(self, run: str, rank: int = 0, registry: CollectorRegistry | None = None):
        super().__init__(run, rank, registry)
        self._env_steps = self._counter("rapid_env_steps_total", "Environment (game) steps.")
        self._agent_steps = self._counter("rapid_agent_steps_total", "Agent steps (one per acting agent).")
        self._uploaded = self._counter("rapid_samples_uploaded_total", "Samples uploaded to the store.")
        self._backlog = self._gauge("rapid_upload_backlog_objects", "Experience objects waiting for upload.")
        self._dropped = self._counter(
            "rapid_upload_dropped_objects_total", "Experience objects dropped because the upload backlog was full.")
        self._version = self._gauge("rapid_param_version", "Parameter version in use.")
        self._param_failures = self._counter(
            "rapid_param_refresh_failures_total", "Parameter refreshes that failed (store error or bad object).")
        self._param_behind = self._gauge(
            "rapid_param_behind_seconds", "Seconds a newer parameter version has existed without being fetched.")
        self._store_metrics()
        self._episode_metrics()
        self._upload_bytes = self._store_bytes[OP_EXPERIENCE_PUT]
        self._upload_seconds = self._store_seconds[OP_EXPERIENCE_PUT]
        self._store_errors[OP_EXPERIENCE_PUT]  # exported at 0 from the start, so rate() and alerts see it

    def env_steps(self, n: int) -> None:
        self._env_steps.inc(n)

    def agent_steps(self, n: int) -> None:
        self._agent_steps.inc(n)

    def samples_uploaded(self, n: int, nbytes: int, seconds: float) -> None:
        self._uploaded.inc(n)
        self._upload_bytes.inc(nbytes)
        self._upload_seconds.observe(seconds)

    def upload_failed(self) -> None:
        self._store_errors[OP_EXPERIENCE_PUT].inc()

    def backlog(self, n_objects: int) -> None:
        self._backlog.set(n_objects)

    def backlog_dropped(self, n: int) -> None:
        self._dropped.inc(n)

    def param_version(self, v: int) -> None:
        self._version.set(v)

    def param_refresh_failed(self, why: str = "") -> None:
        self._param_failures.inc()

    def params_behind(self, seconds: float) -> None:
        self._param_behind.set(seconds)

    def params_fetch(self, seconds: float, nbytes: int) -> None:
        self.store_op(OP_PARAMS_GET, nbytes, seconds)


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

    def buffer_size(self, n: int) -> None:
        self._buffer.set(n)

    def win_rate(self, opponent_kind: str, x: float) -> None:
        """Win rate against ``opponent_kind`` ("pool" or "bots")."""
        self._win[opponent_kind].set(x)


class EvaluatorMetrics(RoleMetrics):
    role = "evaluator"

    def __init__(self, run: str, rank: int = 0, registry: CollectorRegistry | None = None):
        super().__init__(run, rank, registry)
        self._win = self._gauge("rapid_win_rate", "Win rate of the latest policy in evaluation.", ("opponent",))
        self._mu = self._gauge("rapid_rating_mu", "TrueSkill mean of a league member.", ("member",))
        self._sigma = self._gauge("rapid_rating_sigma", "TrueSkill uncertainty of a league member.", ("member",))
        self._games = self._counter("rapid_games_total", "Evaluation games played.")
        self._store_metrics()  # the evaluator reads params and writes ratings through the store too

    def win_rate(self, opponent: str, x: float) -> None:
        self._win[opponent].set(x)

    def rating(self, member: str, mu: float, sigma: float) -> None:
        self._mu[member].set(mu)
        self._sigma[member].set(sigma)

    def games(self, n: int) -> None:
        self._games.inc(n)


class LauncherMetrics(RoleMetrics):
    role = "launcher"

    def __init__(self, run: str, rank: int = 0, registry: CollectorRegistry | None = None):
        super().__init__(run, rank, registry)
        self._alive = self._gauge("rapid_processes_alive", "Child processes alive, by their role.", ("child_role",))
        self._restarts = self._counter("rapid_process_restarts_total", "Child process restarts.", ("child_role",))

    def processes_alive(self, child_role: str, n: int) -> None:
        self._alive[child_role].set(n)
        self._restarts[child_role]  # restarts exported at 0 from a role's first report

    def restart(self, child_role: str) -> None:
        self._restarts[child_role].inc()


def metric_names(registry: CollectorRegistry) -> list[str]:
    """Exposed family names in a registry (counters with their ``_total``), for convention checks."""
    names = []
    for family in registry.collect():
        names.append(family.name + "_total" if family.type == "counter" else family.name)
    return sorted(names)

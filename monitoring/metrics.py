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

Every metric is defined once, here or (a role with many) in a module of its own (``optimizer_metrics.py``,
``inference_metrics.py``); each role object owns a private registry,
so several roles can live in one process (tests, the local launcher) without name clashes. Metrics carry
``role``, ``rank`` and ``run`` as real labels and the scrape config sets ``honor_labels`` so that the file_sd
target labels (the same three) only add them to ``up``. Hot-path methods touch pre-bound children only.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary
from prometheus_client.exposition import start_http_server

from rapid.monitoring.targets import collect_targets, register_process, unregister_process, write_file_sd

__all__ = [
    "RolloutMetrics", "EvaluatorMetrics", "LauncherMetrics", "RoleMetrics",
    "metric_names", "register_process", "collect_targets", "write_file_sd",
]

BASE_LABELS = ("role", "rank", "run")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Store operations the role helpers report under; store_op() accepts any other name too.
OP_EXPERIENCE_PUT, OP_EXPERIENCE_GET, OP_PARAMS_GET = "experience_put", "experience_get", "params_get"


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
        self._pace = self._gauge("rapid_rollout_pace", "Share of its time the worker plays, as the optimizer asks "
                                 "(1: full speed; optimizer.pace_rollouts).")
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

    def pace(self, share: float) -> None:
        self._pace.set(share)

    def param_refresh_failed(self, why: str = "") -> None:
        self._param_failures.inc()

    def params_behind(self, seconds: float) -> None:
        self._param_behind.set(seconds)

    def params_fetch(self, seconds: float, nbytes: int) -> None:
        self.store_op(OP_PARAMS_GET, nbytes, seconds)


class EvaluatorMetrics(RoleMetrics):
    role = "evaluator"

    def __init__(self, run: str, rank: int = 0, registry: CollectorRegistry | None = None):
        super().__init__(run, rank, registry)
        self._win = self._gauge("rapid_win_rate", "Win rate of the latest policy in evaluation.", ("opponent",))
        self._mu = self._gauge("rapid_rating_mu", "TrueSkill mean of a league member.", ("member",))
        self._sigma = self._gauge("rapid_rating_sigma", "TrueSkill uncertainty of a league member.", ("member",))
        self._games = self._counter("rapid_games_total", "Evaluation games played.")
        self._ladder = self._gauge("rapid_ladder_rating", "Ladder rating of the latest policy rated (Elo scale, the "
                                   "random bot at 0), against opponents training never meets.")
        self._ladder_sigma = self._gauge("rapid_ladder_rating_sigma", "Standard error of rapid_ladder_rating.")
        self._ladder_win = self._gauge("rapid_ladder_win_rate", "Win rate of the latest policy rated against each "
                                       "rung of the strength ladder.", ("rung",))
        self._store_metrics()  # the evaluator reads params and writes ratings through the store too

    def win_rate(self, opponent: str, x: float) -> None:
        """The rated match's win rate: with sampled and greedy matches against the baseline, the sampled one's
        (the greedy one's is in the evaluator's log and curves)."""
        self._win[opponent].set(x)

    def rating(self, member: str, mu: float, sigma: float) -> None:
        self._mu[member].set(mu)
        self._sigma[member].set(sigma)

    def games(self, n: int) -> None:
        self._games.inc(n)

    def ladder(self, rating: float, sigma: float, win_rates: dict[str, float]) -> None:
        self._ladder.set(rating)
        self._ladder_sigma.set(sigma)
        for rung, x in win_rates.items():
            self._ladder_win[rung].set(x)


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

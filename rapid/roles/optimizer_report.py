"""Everything the optimizer reports per update — Prometheus metrics and one JSON-lines record — in one
place, done on a thread of its own so the update loop only hands over what it measured.

Usage::

    >>> import json, os, tempfile
    >>> from rapid.optimizer.balance import Balancer, BalanceSettings
    >>> from rapid.formats.experience import Shape
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.optimizer.loader import ExperienceLoader
    >>> from rapid.monitoring.optimizer_metrics import OptimizerMetrics
    >>> from rapid.opt.buffer import ExperienceBuffer
    >>> from rapid.roles.startup import JsonlLog
    >>> run_dir = tempfile.mkdtemp()
    >>> buffer = ExperienceBuffer(capacity=64, max_staleness=8)
    >>> loader = ExperienceLoader(LocalStore(run_dir), Shape(bptt=4, obs_dim=3, mask_dim=2, heads=1, lstm=8), buffer)
    >>> oplog = JsonlLog(os.path.join(run_dir, "logs", "optimizer.jsonl"))
    >>> report = OptimizerReport(OptimizerMetrics(run="demo"), oplog, buffer, loader, skipped=lambda: 0)
    >>> stats = {"loss": 0.5, "forward_s": 0.01, "backward_s": 0.02, "allreduce_s": 0.0, "step_s": 0.01}
    >>> decision = Balancer(BalanceSettings(batch=2, max_batch=8, target_reuse=1.0, publish_interval_s=2.0)).step(
    ...     0.0, received=0, consumed=0, wasted=0, backlog=0, busy_s=0.04)
    >>> report.update(1, 3, stats, np.array([0, 1]), decision, 0.005)   # one call per applied update
    >>> report.writer_done("publish v3", 0.02)      # from the background writer
    >>> report.update_failed(ValueError("bad batch"))   # an update that raised on its batch
    >>> report.close()                              # drains: the last record is written
    >>> oplog.close()
    >>> record = json.loads(open(os.path.join(run_dir, "logs", "optimizer.jsonl")).read())
    >>> record["update"], record["version"], record["staleness_max"], record["balance_batch"]
    (1, 3, 1, 2)
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from rapid.monitoring.logs import read_jsonl
from rapid.optimizer.balance import WINDOW_S

log = logging.getLogger("rapid.optimizer")

STALENESS_BINS = 64

CURVES = {
    "loss/policy": "policy_loss", "loss/value": "value_loss", "loss/entropy": "entropy", "loss/approx_kl": "approx_kl",
    "loss/clip_fraction": "clip_fraction", "loss/grad_norm": "grad_norm",
    "loss/explained_variance": "explained_variance", "schedule/lr": "lr", "schedule/entropy_coef": "entropy_coef",
    "schedule/clip": "clip",
    "throughput/samples_per_s": "samples_per_s", "throughput/update_s": "update_s", "throughput/wait_s": "wait_s",
    "balance/staleness_mean": "staleness_mean", "balance/staleness_p99": "staleness_p99",
    "balance/sample_reuse": "sample_reuse", "balance/batch": "balance_batch", "samples/received": "samples_received",
    "samples/dropped_stale": "samples_dropped_stale", "games/episode_return": "episode_return",
    "games/episode_length": "episode_length", "games/win_rate_latest": "win_rate_latest",
    "games/win_rate_pool": "win_rate_pool", "games/win_rate_bots": "win_rate_bots", "version": "version"}
"""TensorBoard / W&B tag → field of the optimizer's JSON-lines record (the fields a record has)."""


def curve_values(record: dict, previous: dict | None) -> dict[str, float]:
    """The curves of one optimizer record; agent-steps per second over the time since the previous record.

    >>> curve_values({"update": 2, "policy_loss": 0.1, "env_steps": 3000, "time": 12.0},
    ...              {"env_steps": 1000, "time": 10.0})
    {'loss/policy': 0.1, 'throughput/env_steps_per_s': 1000.0}
    """
    values = {tag: record[key] for tag, key in CURVES.items() if key in record}
    if previous and record["time"] > previous["time"]:
        values["throughput/env_steps_per_s"] = ((record["env_steps"] - previous["env_steps"])
                                                / (record["time"] - previous["time"]))
    return values


def summarize_episodes(episodes: list[dict]) -> dict[str, float]:
    """Win rates of the learner by opponent kind, and mean game length/return."""
    out: dict[str, float] = {}
    if not episodes:
        return out
    out["episodes"] = float(len(episodes))
    out["episode_length"] = float(np.mean([e["length"] for e in episodes]))
    out["episode_return"] = float(np.mean([e["learner_return"] for e in episodes]))
    for kind, match in (("latest", lambda o: o == "latest"), ("bots", lambda o: o.startswith("bot:")),
                        ("pool", lambda o: o != "latest" and not o.startswith("bot:"))):
        games = [e for e in episodes if match(e["opponent"])]
        if games:
            score = [1.0 if e["winner"] == "learner" else 0.5 if e["winner"] == "draw" else 0.0 for e in games]
            out[f"win_rate_{kind}"] = float(np.mean(score))
    return out


def optimizer_summary(run_dir: str | Path, started: float, exit_code: int) -> str:
    """What a standalone optimizer (`rapid optimizer`, rank 0) prints when it ends, as `rapid train` does:
    figures from this invocation's records of ``logs/optimizer.jsonl``, where to look, how to go on."""
    from rapid.run.progress import balance_lines

    path = Path(run_dir) / "logs" / "optimizer.jsonl"
    ops = [r for r in read_jsonl(path) if r.get("time", 0.0) >= started]
    elapsed = time.time() - started
    lines = [f"\nrapid optimizer finished (exit code {exit_code}) after {elapsed // 60:.0f} min {elapsed % 60:.0f} s"]
    if ops:
        last = ops[-1]
        lines += [f"  versions published : up to v{last['version']} ({len(ops)} updates now, {last['update']} in all)",
                  f"  agent-steps        : {last['env_steps']:,}",
                  f"  samples            : {last['samples_received']:,} received, {last['samples_consumed']:,} "
                  f"consumed, {last['samples_dropped_stale']:,} went stale unused",
                  *balance_lines(last)]
    else:
        lines.append("  no update: no experience arrived (are rollout workers running against the same store?)")
    lines += [f"  log                : {path} (plots: rapid report {run_dir})",
              "  continue with      : the same command with --resume"]
    return "\n".join(lines)


def quantile_of_counts(counts: np.ndarray, q: float) -> float:
    """The q-quantile of integer values given as counts per value (the last bin holds everything above)."""
    total = counts.sum()
    if total == 0:
        return 0.0
    return float(np.searchsorted(np.cumsum(counts), q * total, side="left"))


class OptimizerReport:
    """``curves`` (rank 0: ``rapid.roles.curves.open_curves``) get the record's figures as TensorBoard/W&B
    curves by update."""

    def __init__(self, metrics, oplog, buffer, loader, skipped=lambda: 0, curves=None):
        self.metrics, self.oplog, self.buffer, self.loader = metrics, oplog, buffer, loader
        self.skipped, self.curves = skipped, curves
        self._last_record: dict | None = None
        self.started = time.time()
        self.failures = 0
        self._staleness = np.zeros(STALENESS_BINS, np.int64)
        self._seen = {"dropped_stale": 0, "evicted_unused": 0, "used": 0, "loader_errors": 0}
        self._queue: queue.Queue = queue.Queue(maxsize=256)
        self._thread = threading.Thread(target=self._run, name="report", daemon=True)
        self._thread.start()

    def update(self, updates: int, version: int, stats: dict, staleness: np.ndarray, decision, wait_s: float):
        self._queue.put((time.time(), updates, version, stats, staleness, decision, wait_s))

    def writer_done(self, job: str, seconds: float) -> None:
        """A background job finished: publish and checkpoint times are update phases."""
        phase = job.split()[0]
        if phase in ("publish", "checkpoint"):
            self.metrics.update_phase(phase, seconds)

    def version(self, version: int) -> None:
        self.metrics.param_version(version)

    def skipped_nonfinite(self, total: int) -> None:
        self.metrics.nonfinite_skipped()
        log.warning("non-finite loss or gradients: update skipped (%d so far)", total)

    def update_failed(self, error: BaseException) -> None:
        self.failures += 1
        self.metrics.update_failed()
        log.error("update failed on its batch and was skipped (%d so far): %s: %s",
                  self.failures, type(error).__name__, error)

    def loader_failed(self, failure: str) -> None:
        """The one line a dead loader thread gets; its gauge drops to 0 for the dashboards and alerts."""
        self.metrics.loader(False)
        log.error("%s; stopping the optimizer", failure)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
        if self.curves is not None:
            self.curves.close()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._emit(*item)
            except Exception as e:  # reporting must never stop training
                log.warning("optimizer report failed: %s: %s", type(e).__name__, e)

    def _delta(self, key: str, value: int) -> int:
        new, self._seen[key] = value - self._seen[key], value
        return new

    def _emit(self, now, updates, version, stats, staleness, decision, wait_s) -> None:
        m, b, ls = self.metrics, self.buffer.stats(), self.loader.stats
        m.update_phase("load", wait_s)
        for phase in ("forward", "backward", "allreduce", "step"):
            m.update_phase(phase, stats[f"{phase}_s"])
        m.update(stats)
        m.staleness(staleness)
        m.samples_consumed(len(staleness))
        m.samples_used(self._delta("used", b.used))
        m.samples_dropped_stale(self._delta("dropped_stale", b.dropped_stale))
        m.samples_evicted_unused(self._delta("evicted_unused", b.evicted_unused))
        m.sample_reuse(b.reuse)
        m.buffer_size(b.size, b.capacity)
        m.loader(self.loader.failure is None, self._delta("loader_errors", ls.errors))
        self._staleness += np.bincount(np.clip(staleness, 0, STALENESS_BINS - 1).astype(np.int64),
                                       minlength=STALENESS_BINS)
        balance = asdict(decision)
        if self.loader.loading_backlog(within_s=WINDOW_S):  # a resumed run's backlog is no rollout load
            balance["overloaded"] = False
        elif balance["message"]:
            log.warning("%s", decision.message)
        del balance["message"]
        m.balance(balance)
        episodes = summarize_episodes(self.loader.take_episodes())
        for kind in ("latest", "pool", "bots"):
            if f"win_rate_{kind}" in episodes:
                m.win_rate(kind, episodes[f"win_rate_{kind}"])
        if "episode_return" in episodes:
            m.episode(episodes["episode_return"], int(episodes["episode_length"]))
        if self.oplog is None and self.curves is None:
            return
        elapsed = now - self.started
        record = {
            "update": updates, "version": version, **stats, "wait_s": wait_s,
            "staleness_mean": float(staleness.mean()), "staleness_max": int(staleness.max()),
            "staleness_p50": quantile_of_counts(self._staleness, 0.5),
            "staleness_p99": quantile_of_counts(self._staleness, 0.99),
            "sample_reuse": b.reuse, "samples_received": b.received, "samples_consumed": b.consumed,
            "samples_used": b.used, "samples_dropped_stale": b.dropped_stale,
            "samples_evicted_unused": b.evicted_unused, "buffer_size": b.size, "buffer_unused": b.unused,
            "buffer_capacity": b.capacity,
            "env_steps": ls.env_steps, "bad_objects": ls.bad_objects, "loader_errors": ls.errors,
            "skipped_updates": self.skipped(), "failed_updates": self.failures, "elapsed_s": elapsed,
            "samples_per_s": ls.samples / max(elapsed, 1e-6),
            **{f"balance_{k}": v for k, v in balance.items()}, **episodes}
        if self.oplog is not None:
            self.oplog.write(record)
        if self.curves is not None:
            record["time"] = now
            self.curves.scalars(curve_values(record, self._last_record), step=updates)
            self._last_record = record

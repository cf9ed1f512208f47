"""The optimizer's lines in a cluster walk (issue 24): no overload line that contradicts itself or counts a
resumed run's backlog, and no log flood in a store outage or from retention."""

from __future__ import annotations

import logging
import time

import numpy as np

from rapid.formats.experience import ExperienceBatch, Shape, encode_experience
from rapid.infra.store import LocalStore, StoreError
from rapid.monitoring.optimizer_metrics import OptimizerMetrics
from rapid.opt.buffer import ExperienceBuffer
from rapid.optimizer.balance import Balancer, BalanceSettings, Decision, overload_line
from rapid.optimizer.loader import ExperienceLoader
from rapid.roles.optimizer_report import OptimizerReport
from rapid.run.store_map import experience_key

SHAPE = Shape(bptt=4, obs_dim=3, mask_dim=2, heads=1, lstm=8)


def experience(samples: int = 2) -> bytes:
    arrays = {name: np.zeros((samples, *dims), dtype) for name, (dtype, dims) in SHAPE.fields().items()}
    arrays["mask"][:] = True
    return encode_experience(ExperienceBatch("w0", 0, 0.0, arrays, ["latest"]))


def test_no_overload_line_while_the_optimizer_keeps_up():
    # The walk's line: "receives 1,862 samples/s and can consume 1,925/s … add about 2.9× the capacity".
    assert overload_line(1862, 1925, 1.0, 0.3, at_max=True) is None
    assert overload_line(1000, 1000, 1.0, 0.3, at_max=True) is None  # "about 1.0×" is no advice
    line = overload_line(3000, 1000, 1.0, 0.3, at_max=True)
    assert "about 3.0×" in line


def test_no_overload_line_from_a_start_up_burst():
    balancer = Balancer(BalanceSettings(batch=256, max_batch=256, target_reuse=1.0, publish_interval_s=2.0))
    messages = []
    for t in range(1, 20):  # 19 s of a burst: 5,000 samples/s arrive, 1,000/s can be consumed
        d = balancer.step(float(t), received=5000 * t, consumed=1000 * t, wasted=4000 * t, backlog=0, busy_s=1.0)
        messages.append(d.message)
    assert messages == [None] * 19


def test_a_resumed_runs_backlog_is_not_called_rollout_load(tmp_path, caplog):
    store = LocalStore(tmp_path)
    hour_ago_ms = (time.time() - 3600) * 1000
    for seq in range(3):  # uploaded while the run had no optimizer
        store.put(experience_key(0, hour_ago_ms + seq, "w0", "a1", seq), experience())
    loader = ExperienceLoader(store, SHAPE, ExperienceBuffer(64, 8), decode_workers=0, current_version=lambda: 0)
    assert loader.poll_once() == 3
    report = OptimizerReport(OptimizerMetrics(run="r"), None, loader.buffer, loader)
    overloaded = Decision(256, 2.0, 10313.0, 400.0, 412.0, 0.6, True, 1.0,
                          message="rollouts outrun the optimizer: it receives 10,313 samples/s …")
    with caplog.at_level(logging.INFO):
        report.update(1, 1, dict.fromkeys(("forward_s", "backward_s", "allreduce_s", "step_s"), 0.0),
                      np.zeros(2, np.int64), overloaded, 0.0)
        report.close()
    loader.stop()
    assert "outrun" not in caplog.text
    assert report.metrics.registry.get_sample_value(
        "rapid_balance_overloaded", {"role": "optimizer", "rank": "0", "run": "r"}) == 0.0


class DownStore(LocalStore):
    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        raise StoreError("connection refused")


def test_a_store_outage_writes_one_warning_not_one_per_poll(tmp_path, caplog):
    loader = ExperienceLoader(DownStore(tmp_path), SHAPE, ExperienceBuffer(64, 8), poll_s=0.01, poll_max_s=0.01,
                              decode_workers=0, mark_s=0)
    with caplog.at_level(logging.WARNING):
        loader.start()
        time.sleep(1.0)
        loader.stop()
    assert loader.stats.store_errors > 20
    assert caplog.text.count("listing experience failed") == 1, caplog.text[:2000]


def test_retention_notes_deletions_once_a_minute_not_every_poll(tmp_path, caplog):
    now = [time.time()]
    store = LocalStore(tmp_path)
    loader = ExperienceLoader(store, SHAPE, ExperienceBuffer(64, 8), retention_s=1.0, decode_workers=0, mark_s=0,
                              clock=lambda: now[0])
    with caplog.at_level(logging.INFO):
        for seq in range(10):
            store.put(experience_key(0, now[0] * 1000, "w0", "a1", seq), experience())
            loader.poll_once()
            now[0] += 2.0
        loader.stop()
    assert loader.stats.deleted >= 8
    assert caplog.text.count("retention") == 1, caplog.text

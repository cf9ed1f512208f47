"""The optimizer loop in-process: a batch whose update raises is skipped, a dead loader ends the role with
one line, publishing in the background keeps versions in order with LATEST last."""

from __future__ import annotations

import logging
import time

import rapid.roles.optimizer as optimizer
from rapid.formats.experience import encode_experience
from rapid.infra.store import LocalStore
from rapid.monitoring.logs import read_jsonl
from rapid.optimizer.loader import ExperienceLoader
from rapid.roles.startup import StopFlag
from rapid.run.config_files import load_config
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import experience_key
from tests.test_scale_mpi import connect_four_shape, make_experience


def small_config(tmp_path, *extra):
    return load_config(None, [f"run.dir='{tmp_path}'", "metrics.enabled=false", "model.hidden=16", "model.lstm=16",
                              "model.encoder_layers=1", "rollout.bptt=4", "optimizer.batch_samples=8",
                              "optimizer.buffer_samples=256", "optimizer.decode_workers=0", "optimizer.poll_s=0.05",
                              "league.snapshot_every=0", "optimizer.checkpoint_every=2", *extra])


def plant(cfg, objects: int = 4, samples: int = 16) -> None:
    store = LocalStore(cfg.derive().store_url)
    shape = connect_four_shape(cfg)
    for seq in range(objects):
        key = experience_key(0, time.time() * 1000, "w0", "a", seq)  # a one-rank run has one shard
        store.put(key, encode_experience(make_experience(shape, "w0", seq, samples)))


def test_an_update_that_raises_is_skipped_and_counted(tmp_path, monkeypatch, caplog):
    cfg = small_config(tmp_path, "run.updates=3", "rollout.upload_interval_s=0.001")
    plant(cfg)
    real = optimizer.Learner.update
    calls = []

    def flaky(self, batch, progress=0.0):
        calls.append(1)
        if len(calls) == 1:
            raise IndexError("Target 99 is out of bounds.")
        return real(self, batch, progress)
    monkeypatch.setattr(optimizer.Learner, "update", flaky)
    with caplog.at_level(logging.ERROR):
        assert optimizer.run_optimizer(cfg, stop=StopFlag(install_signals=False)) == 0
    records = read_jsonl(tmp_path / "logs" / "optimizer.jsonl")
    assert records[-1]["update"] == 3 and records[-1]["failed_updates"] == 1
    assert sum("update failed on its batch" in r.message for r in caplog.records) == 1
    # published in the background, in order, LATEST on the last one: the last record's version, or one more when
    # the last update came after the last publish (a clean stop publishes it, so the final checkpoint holds it)
    params = ParameterStore(LocalStore(cfg.derive().store_url))
    last, latest = records[-1]["version"], params.latest_version()
    assert latest is not None and params.versions() == list(range(latest + 1))
    assert latest in (last, last + 1) and last >= 2


def test_a_dead_loader_thread_ends_the_role_with_one_line(tmp_path, monkeypatch, caplog):
    cfg = small_config(tmp_path, "run.minutes=2")

    def die(self):
        raise SystemExit("loader gone")
    monkeypatch.setattr(ExperienceLoader, "poll_once", die)
    with caplog.at_level(logging.ERROR):
        assert optimizer.run_optimizer(cfg, stop=StopFlag(install_signals=False)) == 1
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert lines == ["the experience loader thread ended unexpectedly; stopping the optimizer"]

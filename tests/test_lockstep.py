"""The optimizer's waits: a line while it waits for experience, and its time limit kept while the store is down
(the background writer's retries never hold the update loop; at run.minutes the run ends in one line)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import rapid.roles.optimizer as optimizer
from rapid.formats.experience import encode_experience
from rapid.monitoring.logs import read_jsonl
from rapid.roles.lockstep import NOTICE_EVERY_S, QUIET_WAIT_S, WaitNotice
from rapid.roles.startup import StopFlag
from rapid.run.config_files import load_config
from rapid.run.store_map import experience_key, params_key
from tests.helpers import RefusingStore
from tests.test_scale_mpi import connect_four_shape, make_experience

SMALL = ['env.name="pettingzoo.classic.connect_four_v3"', "env.num_games=8", "model.hidden=16", "model.lstm=16",
         "model.encoder_layers=1", "rollout.bptt=8", "optimizer.device=\"cpu\"", "optimizer.batch_samples=32",
         "optimizer.buffer_samples=1024", "optimizer.poll_s=0.2", "optimizer.max_reuse=1000.0",
         "optimizer.max_staleness=1000", "optimizer.balance=false", "optimizer.decode_workers=0",
         "eval.interval_s=0", "league.snapshot_every=0", "metrics.enabled=false"]


def test_waiting_for_experience_is_said_once_quiet_then_each_minute_and_its_end(caplog):
    log = logging.getLogger("optimizer-test")
    notice = WaitNotice(log, "file:///run/store", now=0.0)
    with caplog.at_level(logging.INFO, logger="optimizer-test"):
        notice.still(0, QUIET_WAIT_S - 1)
        assert not caplog.records
        notice.still(0, QUIET_WAIT_S)
        notice.still(0, QUIET_WAIT_S + 1)
        notice.still(3, QUIET_WAIT_S + NOTICE_EVERY_S)
        notice.over(QUIET_WAIT_S + NOTICE_EVERY_S + 2)
        notice.still(0, 500.0)  # a short wait later: quiet again
        notice.over(501.0)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "none in file:///run/store yet" in lines[0] and "rollout workers" in lines[0]
    assert "3 experience object(s) loaded" in lines[1]
    assert lines[2].startswith("experience arrived after 77s")


class ParamsDown(RefusingStore):
    """A run store whose parameter writes fail after version 0, like S3 in an outage."""

    def refuses(self, key: str) -> bool:
        return key.startswith("params/") and self.exists("params/LATEST")


def test_a_store_outage_to_the_end_stops_the_run_at_its_limit_in_one_line(tmp_path, monkeypatch, caplog):
    """The store never takes a version after v0: the optimizer trains on, holding versions, and at run.minutes
    it stops at once (the writer's retry ends at its next failure) with one line and exit code 1, no traceback."""
    cfg = load_config(None, [*SMALL, f'run.dir="{tmp_path / "run"}"', "run.minutes=0.1"])
    store = ParamsDown(tmp_path / "run" / "store")
    shape = connect_four_shape(cfg)
    now_ms = int(time.time() * 1000)
    for seq in range(8):
        store.put(experience_key(0, now_ms + seq, "w0", "a", seq),
                  encode_experience(make_experience(shape, "w0", seq, samples=64)))
    monkeypatch.setattr(optimizer, "open_run_store", lambda cfg, metrics=None: store)
    outcome = {}

    def run():
        outcome["code"] = optimizer.run_optimizer(cfg, stop=StopFlag(install_signals=False))

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    with caplog.at_level(logging.INFO):
        thread.start()
        thread.join(timeout=60)
    assert not thread.is_alive(), "the optimizer was still retrying 60s into a 6s run"
    assert time.monotonic() - started < 6 + 5, "it stops at its limit, not after the writer's next retry wait"
    assert outcome == {"code": 1}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "stopped (minutes)" in errors[0] and "the store failed as the run stopped" in \
        errors[0] and "connection refused" in errors[0], errors
    assert params_key(0) in store.list("params/") and params_key(1) not in store.list("params/")
    assert read_jsonl(tmp_path / "run" / "logs" / "optimizer.jsonl")[-1]["update"] > 10, "it trained on"


if __name__ == "__main__":
    pytest.main([__file__])

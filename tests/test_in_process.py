"""`rapid train --in-process`: the same role mains as threads of one process, sharing one stop flag."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from rapid.errors import UsageError
from rapid.infra.store import LocalStore
from rapid.roles.launcher import ThreadRole
from rapid.roles.startup import StopFlag
from rapid.run.param_store import ParameterStore
from tests.helpers import check_beats_random, kill_group, rapid, start_rapid, wait_for
from tests.test_train_e2e import FAST


@pytest.mark.timeout(900)
def test_in_process_self_play_beats_random(tmp_path):
    """The process mode's learning check (tests/test_train_e2e.py), with every role on a thread of one process,
    coarser: the roles share one interpreter lock, so on two cores the run has about half the process mode's
    throughput, and what this checks is the wiring. ≥ 70% wins against random over ≥ 200 games within 10
    minutes, confirmed by 400 more games with other seeds (a policy that learnt nothing wins about 50%)."""
    run = tmp_path / "c4"
    started = time.time()
    out = rapid("train", "--in-process", "--config", "configs/default.toml", "--run-dir", str(run), "--minutes", "10",
                "--set", "run.target_win_rate=0.7", "--set", "optimizer.keep_versions=0",  # an early one is evaluated
                "--no-progress", timeout=780)
    assert "as threads of one process" in out.stdout
    log = (run / "logs" / "in-process.log").read_text()  # every role's records in the one process's log
    assert all(f"rapid.{role} " in log for role in ("optimizer-0", "rollout-w0", "evaluator"))
    assert not (run / "logs" / "optimizer.log").exists()  # no role ran as a process of its own
    check_beats_random(run, started, out, within_s=10 * 60, target=0.7)


def test_in_process_sigint_stops_every_role_and_checkpoints(tmp_path):
    run = tmp_path / "stop"
    log = tmp_path / "train.log"
    # Node inference: the node's server is one more thread of the one process.
    proc = start_rapid("train", "--in-process", "--config", "configs/default.toml", "--run-dir", str(run),
                       "--workers", "1", "--no-progress", *FAST, "--set", "rollout.inference=node", log=log)
    try:
        params = ParameterStore(LocalStore(run / "store"))
        wait_for(lambda: (params.latest_version() or 0) >= 2, 180, "version 2")
        assert _children(proc.pid) == [], "every role is a thread of the one process, decoding included"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=150) == 0, log.read_text()
    finally:
        kill_group(proc)
    assert int((run / "store" / "checkpoints" / "LATEST").read_text()) == params.latest_version()
    assert "rapid train finished: stopped by SIGINT" in log.read_text()
    roles_log = (run / "logs" / "in-process.log").read_text()
    assert "rapid.optimizer-0 INFO stopped (SIGINT)" in roles_log and "worker w0 stopped" in roles_log
    assert "node inference" in roles_log
    assert re.search(r"rapid.inference INFO inference server stopped: [1-9]", roles_log), roles_log[-3000:]


def test_a_role_thread_ends_like_its_process_would(tmp_path, caplog):
    """Exit codes as the launcher reads them from processes: 0 done, 2 a usage error, 1 a crash (traceback logged);
    stopping one role sets the flag every role shares."""
    flag = StopFlag(install_signals=False)

    def usage():
        raise UsageError("optimizer.device='cuda' but CUDA is not available")

    roles = [ThreadRole(name, main, tmp_path / "in-process.log", flag)
             for name, main in (("evaluator", lambda: 0), ("optimizer", usage), ("rollout-0", lambda: 1 // 0))]
    for role in roles:
        role.start()
        role.wait(10)
    assert [(r.alive(), r.returncode) for r in roles] == [(False, 0), (False, 2), (False, 1)]
    assert "CUDA is not available" in caplog.text and "ZeroDivisionError" in caplog.text
    waiting = ThreadRole("rollout-1", lambda: int(flag.wait(30)), tmp_path / "in-process.log", flag)
    waiting.start()
    roles[0].stop()
    waiting.wait(10)
    assert flag and waiting.returncode == 1 and not waiting.alive()


def _children(pid: int) -> list[str]:
    return [c for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]

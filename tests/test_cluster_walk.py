"""docs/cluster.md walked as a user (issue 24): worker names, run directories, and what `rapid monitor`
labels and counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rapid.infra.distributed import Identity
from rapid.monitoring import metrics as M
from rapid.monitoring import prom
from rapid.run.config import Config, RunConfig, StoreConfig
from rapid.run.config_files import load_config, to_toml
from tests.helpers import ROOT, rapid

ALONE = Identity(0, 1, 0, 1, "h")
RANK_3_OF_4 = Identity(3, 4, 3, 4, "h")


def test_a_pods_name_is_the_worker_name_as_is():
    from rapid.roles.rollout import worker_name

    pod = "rapid-rollout-7d9f8c-xk2pq"
    assert worker_name("", {"RAPID_WORKER_ID": pod}, ALONE) == pod
    assert worker_name("a17", {"RAPID_WORKER_ID": pod}, RANK_3_OF_4) == "a17"


def test_rapid_worker_id_comes_before_the_rank_and_ranks_sharing_it_stay_apart():
    from rapid.roles.rollout import worker_name

    assert worker_name("", {"RAPID_WORKER_ID": "node7"}, RANK_3_OF_4) == "node7-3"
    assert worker_name("", {}, RANK_3_OF_4) == "w3"
    assert worker_name("", {}, ALONE) == f"w{os.getpid()}"


def test_runs_on_different_stores_get_different_run_dirs():
    def run_dir(url: str) -> str:
        return Config(run=RunConfig(name="c4"), store=StoreConfig(url=url)).derive().run_dir

    assert run_dir("s3://rapid-runs/exp1") != run_dir("s3://rapid-runs/exp2")
    assert run_dir("") == os.path.join("runs", "c4")  # the local store keeps its familiar place


def test_an_optimizer_refuses_a_run_dir_that_holds_a_run_on_another_store(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = load_config(None, [f'run.dir="{run_dir}"', f'store.url="{tmp_path / "store-a"}"'])
    (run_dir / "config.toml").write_text(to_toml(first))
    out = rapid("optimizer", "--set", f'run.dir="{run_dir}"', "--set", f'store.url="{tmp_path / "store-b"}"',
                "--set", "metrics.enabled=false", timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "store-a" in out.stderr and "run.dir" in out.stderr, out.stderr
    assert not (run_dir / "logs").exists()


def test_targets_carry_the_run_name_not_the_folder_name(tmp_path):
    run_dir = tmp_path / "c4b"
    metrics = M.RolloutMetrics(run="connect4", rank=0)
    port = metrics.serve(port=0, run_dir=run_dir)
    try:
        path = prom.refresh_targets(run_dir)
        assert json.loads(path.read_text())[0]["labels"]["run"] == "connect4"
        assert prom.run_name(run_dir) == "connect4"
        assert prom.answering(M.collect_targets(run_dir)) == 1
    finally:
        metrics.close()
    # A clean stop leaves no registration behind: a monitor started later counts no ghosts.
    assert M.collect_targets(run_dir) == []
    assert port > 0


def test_a_process_that_dies_stays_registered(tmp_path):
    code = ("import os; from rapid.monitoring.optimizer_metrics import OptimizerMetrics; "
            f"OptimizerMetrics(run='r').serve(port=0, run_dir={str(tmp_path)!r}); os._exit(1)")
    subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT)
    targets = M.collect_targets(tmp_path)
    assert [t["role"] for t in targets] == ["optimizer"] and prom.answering(targets) == 0


def test_monitor_writes_the_file_sd_list_without_a_prometheus(tmp_path):
    (tmp_path / "config.toml").write_text(to_toml(load_config(None, ["run.name=connect4"])))
    M.register_process(tmp_path, "rollout", 2, 9555, host="node12")
    out = rapid("monitor", str(tmp_path), "--targets-only", "--once", timeout=60)
    assert "1 registered processes" in out.stdout and "'connect4'" in out.stdout, out.stdout
    groups = json.loads((tmp_path / "metrics" / "targets.json").read_text())
    assert groups == [{"targets": ["node12:9555"], "labels": {"role": "rollout", "rank": "2", "run": "connect4"}}]


def _finished_run(store_dir, cfg) -> None:
    """A store as an optimizer leaves it at a clean stop: layout, a published version, a released lease."""
    from rapid.infra.store import LocalStore
    from rapid.roles.startup import build_policy, env_spec
    from rapid.run.lease import RunLease
    from rapid.run.param_store import ParameterStore
    from rapid.run.store_map import write_layout

    store = LocalStore(store_dir)
    write_layout(store, 1)
    ParameterStore(store).publish(0, build_policy(cfg, env_spec(cfg)).tensors())
    RunLease(store).acquire().release()


def test_a_worker_of_a_stopped_run_stops_by_itself_and_uploads_nothing(tmp_path, caplog):
    import logging
    import threading

    from rapid.infra.store import LocalStore
    from rapid.roles.rollout import run_rollout
    from rapid.roles.startup import StopFlag

    cfg = load_config(None, [f'run.dir="{tmp_path}"', "env.num_games=2", "model.hidden=16", "model.lstm=16",
                             "rollout.upload_interval_s=0.2", "rollout.linger_s=1", "metrics.enabled=false"])
    _finished_run(tmp_path / "store", cfg)
    stop, result = StopFlag(install_signals=False), []
    worker = threading.Thread(target=lambda: result.append(run_rollout(cfg, "w0", 1, stop=stop)), daemon=True)
    with caplog.at_level(logging.INFO):
        worker.start()
        worker.join(30)
    stop.set("test")  # old code plays on: end it
    worker.join(30)
    assert result == [0] and stop.reason == "run stopped", caplog.text[-2000:]
    assert LocalStore(tmp_path / "store").list("experience/") == []
    assert "the run's optimizer stopped" in caplog.text


def test_a_standalone_optimizer_ends_with_a_summary(tmp_path):
    out = rapid("optimizer", "--set", f'run.dir="{tmp_path}"', "--set", "run.minutes=0.05", "--set",
                "metrics.enabled=false", "--set", "env.num_games=2", timeout=120)
    assert "rapid optimizer finished (exit code 0)" in out.stdout, out.stdout + out.stderr
    assert "no experience arrived" in out.stdout and "--resume" in out.stdout


def test_the_evaluator_of_a_stopped_run_rates_its_last_version_and_stops(tmp_path):
    import threading

    from rapid.roles.evaluator import run_evaluator
    from rapid.roles.startup import StopFlag

    cfg = load_config(None, [f'run.dir="{tmp_path}"', "env.num_games=2", "model.hidden=16", "model.lstm=16",
                             "eval.games=2", "eval.interval_s=0.2", "metrics.enabled=false"])
    _finished_run(tmp_path / "store", cfg)
    stop, result = StopFlag(install_signals=False), []
    evaluator = threading.Thread(target=lambda: result.append(run_evaluator(cfg, stop=stop)), daemon=True)
    evaluator.start()
    evaluator.join(30)
    stopped_by_itself = not evaluator.is_alive()
    stop.set("test")
    evaluator.join(30)
    assert stopped_by_itself and result == [0]
    assert [json.loads(line)["version"] for line in (tmp_path / "logs" / "eval.jsonl").read_text().splitlines()] == [0]


def test_the_evaluator_of_a_resumed_run_goes_on_when_the_optimizer_takes_the_run_a_moment_later(tmp_path):
    """A --resume starts the evaluator beside its optimizer: the evaluator may rate the newest version and read
    the last run's released lease before the new optimizer takes it. It must not stop for good then."""
    import threading
    import time

    from rapid.infra.store import LocalStore
    from rapid.roles.evaluator import run_evaluator
    from rapid.roles.startup import StopFlag
    from rapid.run.lease import RunLease
    from rapid.run.param_store import ParameterStore

    cfg = load_config(None, [f'run.dir="{tmp_path}"', "env.num_games=2", "model.hidden=16", "model.lstm=16",
                             "eval.games=2", "eval.interval_s=0.2", "metrics.enabled=false"])
    _finished_run(tmp_path / "store", cfg)
    store, log = LocalStore(tmp_path / "store"), tmp_path / "logs" / "eval.jsonl"
    stop, result = StopFlag(install_signals=False), []
    evaluator = threading.Thread(target=lambda: result.append(run_evaluator(cfg, stop=stop)), daemon=True)
    evaluator.start()
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # v0 rated and the released lease read: now the resumed optimizer takes the run
        lease = RunLease(store).acquire()
        params = ParameterStore(store)
        params.publish(1, params.fetch(0).tensors)
        deadline = time.monotonic() + 30
        while 1 not in [json.loads(line)["version"] for line in log.read_text().splitlines()]:
            assert evaluator.is_alive() and time.monotonic() < deadline, "the evaluator stopped before the resume's v1"
            time.sleep(0.1)
        lease.release()
    finally:
        stop.set("test")
        evaluator.join(30)
    assert result == [0]

"""rapid.monitoring: metric conventions, shipped Prometheus/Grafana assets checked by the real tools, report."""

from __future__ import annotations

import ast
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rapid.monitoring import metrics as M
from rapid.monitoring import optimizer_metrics as O
from rapid.monitoring import prom
from rapid.monitoring.inference_metrics import InferenceMetrics
from rapid.monitoring.report import write_report
from tests.prometheus_server import prometheus  # noqa: F401  (fixture)

MONITORING = Path(prom.__file__).resolve().parent
ROLE_CLASSES = (M.RolloutMetrics, O.OptimizerMetrics, M.EvaluatorMetrics, M.LauncherMetrics, InferenceMetrics)


def promtool() -> str:
    path = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(path).exists():
        pytest.fail("promtool not found: apt-get install -y --no-install-recommends prometheus")
    return path


def run_promtool(*args) -> subprocess.CompletedProcess:
    res = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def drive(roles: dict, n: int) -> None:
    """Fake numbers through every public method, like the roles would call them."""
    r, o, e, l, i = roles["rollout"], roles["optimizer"], roles["evaluator"], roles["launcher"], roles["inference"]
    r.env_steps(64), r.agent_steps(128), r.samples_uploaded(64, 50_000, 0.02), r.backlog(n % 3)
    r.episode(1.0 + n % 5, 100 + n), r.param_version(n // 2), r.params_fetch(0.01, 20_000)
    if n % 7 == 0:
        r.upload_failed(), r.backlog_dropped(1)
    o.samples_downloaded(64, 50_000, 0.03), o.samples_consumed(128), o.samples_dropped_stale(n % 2)
    o.staleness(np.arange(n % 10)), o.sample_reuse(1.5), o.buffer_size(512, 4096), o.param_version(n)
    o.update({"policy_loss": -0.01, "value_loss": 0.5, "entropy": 1.2, "approx_kl": 0.01, "clip_fraction": 0.1,
              "explained_variance": 0.3, "grad_norm": 2.0, "learning_rate": 3e-4})
    for phase in O.UPDATE_PHASES:
        o.update_phase(phase, 0.001 * (1 + n % 4))
    o.store_op("params_put", 20_000, 0.005), o.episode(2.0, 90), o.win_rate("pool", 0.55), o.win_rate("bots", 0.8)
    if n % 11 == 0:
        o.nonfinite_skipped(), o.bad_object("decode"), o.store_error("list")
    e.win_rate("pool", 0.5), e.rating("v00001", 25.0 + n * 0.01, 3.0), e.rating("v00002", 24.0, 4.0), e.games(2)
    e.ladder(500.0 + n, 20.0, {"lookahead": 0.6})
    l.processes_alive("rollout", 2), l.processes_alive("optimizer", 1)
    if n == 3:
        l.restart("rollout")
    i.batch(64 + n % 5 * 100, [0.0005, 0.002 * (n % 3)], 0.001), i.workers(2 + n % 2), i.param_version(n)


def make_roles(run: str) -> dict:
    return {cls.role: cls(run, rank=0) for cls in ROLE_CLASSES}


# --- shipped files, checked by promtool -----------------------------------------------------------------------


def test_promtool_accepts_shipped_config_and_rules(tmp_path):
    # The shipped config names targets.json and alerts.yml relative to itself, as a user would lay them out.
    shutil.copy(MONITORING / "prometheus.yml", tmp_path)
    shutil.copy(MONITORING / "alerts.yml", tmp_path)
    (tmp_path / "targets.json").write_text("[]")
    run_promtool("check", "config", str(tmp_path / "prometheus.yml"))
    out = run_promtool("check", "rules", str(MONITORING / "alerts.yml")).stdout
    assert "SUCCESS" in out


def test_promtool_accepts_generated_config(tmp_path):
    targets = M.write_file_sd([{"role": "rollout", "rank": 0, "host": "127.0.0.1", "port": 9100}],
                              tmp_path / "targets.json", run="t")
    (tmp_path / "p.yml").write_text(prom.render_config(targets, prom.ALERTS_PATH, "1s"))
    run_promtool("check", "config", str(tmp_path / "p.yml"))


def test_alerts_cover_the_required_conditions():
    text = (MONITORING / "alerts.yml").read_text()
    for needle in ("rapid_samples_downloaded_total", "rapid_sample_staleness", "rapid_sample_reuse",
                   "rapid_nonfinite_updates_skipped_total", "rapid_store_errors_total", "up{"):
        assert needle in text


# --- metric definitions -----------------------------------------------------------------------------------------


def test_metric_names_follow_prometheus_conventions():
    types: dict[str, str] = {}
    for cls in ROLE_CLASSES:
        role = cls("conv", rank=2)
        for family in role.registry.collect():
            name = family.name + "_total" if family.type == "counter" else family.name
            assert re.fullmatch(r"rapid_[a-z0-9_]+", name), name
            assert not name.endswith("_total") or family.type == "counter", name
            assert types.setdefault(name, family.type) == family.type, f"{name} has two types across roles"
            if family.type in ("histogram", "summary") and "duration" in name:
                assert name.endswith("_seconds"), name
            for sample in family.samples:
                assert {"role": cls.role, "rank": "2", "run": "conv"}.items() <= sample.labels.items(), sample
    required = {"rapid_env_steps_total", "rapid_samples_uploaded_total", "rapid_samples_downloaded_total",
                "rapid_samples_consumed_total", "rapid_samples_dropped_total", "rapid_sample_staleness",
                "rapid_sample_reuse", "rapid_updates_total", "rapid_param_version", "rapid_policy_loss",
                "rapid_value_loss", "rapid_entropy", "rapid_approx_kl", "rapid_clip_fraction",
                "rapid_explained_variance", "rapid_grad_norm", "rapid_learning_rate", "rapid_episode_return",
                "rapid_episode_length_steps", "rapid_win_rate", "rapid_rating_mu", "rapid_store_bytes_total",
                "rapid_store_op_duration_seconds", "rapid_store_errors_total", "rapid_bad_objects_total",
                "rapid_update_phase_duration_seconds", "rapid_nonfinite_updates_skipped_total"}
    assert required <= set(types)


def test_roles_have_private_registries():
    a, b = M.RolloutMetrics("x", 0), M.RolloutMetrics("x", 1)  # would raise "Duplicated timeseries" if shared
    a.env_steps(5)
    assert a.registry.get_sample_value("rapid_env_steps_total", {"role": "rollout", "rank": "0", "run": "x"}) == 5
    assert b.registry.get_sample_value("rapid_env_steps_total", {"role": "rollout", "rank": "1", "run": "x"}) == 0


def test_staleness_histogram_counts_whole_arrays():
    o = O.OptimizerMetrics("s", 0)
    ints, floats = np.array([0, 0, 1, 3, 8, 9, 32, 33, 100]), np.array([0.5, 8.0, 40.0])
    o.staleness(ints)  # the integer fast path
    o.staleness(floats)  # the general path
    o.staleness([])
    values = np.concatenate([ints, floats])
    labels = {"role": "optimizer", "rank": "0", "run": "s"}
    get = o.registry.get_sample_value
    for bound in O.STALENESS_BUCKETS:
        assert get("rapid_sample_staleness_bucket", {**labels, "le": str(float(bound))}) == (values <= bound).sum()
    assert get("rapid_sample_staleness_bucket", {**labels, "le": "+Inf"}) == len(values)
    assert get("rapid_sample_staleness_sum", labels) == values.sum()


def test_module_imports_only_its_own_layer():
    for path in MONITORING.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith("torch"), path
                assert not name.startswith("rapid.") or name.startswith("rapid.monitoring"), (path, name)


# --- target discovery -------------------------------------------------------------------------------------------


def test_register_and_collect_targets(tmp_path):
    M.register_process(tmp_path, "optimizer", 1, 9101)
    M.register_process(tmp_path, "rollout", 0, 9200)
    (tmp_path / "metrics" / "broken-3.json").write_text("{not json")
    sd = M.write_file_sd(M.collect_targets(tmp_path), tmp_path / "metrics" / "targets.json", run="r1")
    targets = M.collect_targets(tmp_path)  # targets.json shares the folder and must not be read as a process
    assert [(t["role"], t["rank"], t["port"]) for t in targets] == [("optimizer", 1, 9101), ("rollout", 0, 9200)]
    assert json.loads(sd.read_text())[0] == {"targets": ["127.0.0.1:9101"],
                                            "labels": {"role": "optimizer", "rank": "1", "run": "r1"}}
    with pytest.raises(ValueError):
        M.register_process(tmp_path, "../evil", 0, 1)


# --- a real Prometheus scraping every role ----------------------------------------------------------------------


def test_dashboard_structure():
    dash = json.loads(prom.DASHBOARD_PATH.read_text())
    assert dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert "label_values(rapid_updates_total, run)" in json.dumps(variables["run"])
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows == ["Throughput", "Node inference", "Staleness and reuse", "Learning", "League", "Store", "Health"]
    defined = {n for cls in ROLE_CLASSES for n in M.metric_names(cls("d").registry)} | {"up"}
    for expr in prom.dashboard_queries(prom.DASHBOARD_PATH, "d"):
        for name in re.findall(r"\b(rapid_[a-z0-9_]+|up)\b", expr):
            assert re.sub(r"_(bucket|sum|count)$", "", name) in defined or name in defined, (name, expr)


def test_every_dashboard_query_returns_data_from_a_real_prometheus(prometheus):  # noqa: F811
    run = "unit"
    roles = make_roles(run)
    targets = []
    for role in roles.values():
        targets.append({"role": role.role, "rank": 0, "host": "127.0.0.1", "port": role.serve(port=0)})
    # A registered rank that is not listening: `up` must be 0 and the rank-down alert must fire (pending).
    targets.append({"role": "rollout", "rank": 1, "host": "127.0.0.1", "port": prom.free_port()})
    stop = threading.Event()

    def loop():
        n = 0
        while not stop.is_set():
            drive(roles, n)
            n += 1
            stop.wait(0.1)

    driver = threading.Thread(target=loop, daemon=True)
    driver.start()
    try:
        M.write_file_sd(targets, prometheus.targets_file, run=run)
        prometheus.wait_for(f'count(up{{run="{run}"}} == 1) == {len(roles)}')
        missing = prom.check_dashboard_queries(prometheus.url, prom.DASHBOARD_PATH, run, timeout=20)
        assert missing == [], f"dashboard queries without data: {missing}\n{prometheus.log_tail()}"
        # ...and the check is not vacuous: another run's selection has no data anywhere.
        assert prom.check_dashboard_queries(prometheus.url, prom.DASHBOARD_PATH, "other") == \
            prom.dashboard_queries(prom.DASHBOARD_PATH, "other")
        # The $run variable's own query lists the run.
        assert run in prometheus.api("/api/v1/label/run/values?match[]=rapid_updates_total")["data"]
        rules = [r for g in prometheus.api("/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        assert {r["name"] for r in rules} >= {"RapidNoSamplesArriving", "RapidStalenessHigh", "RapidSampleReuseHigh",
                                              "RapidNonFiniteLoss", "RapidStoreErrors", "RapidRankDown"}
        assert all(r["health"] != "err" for r in rules), rules
        down = prometheus.wait_for(f'ALERTS{{alertname="RapidRankDown",run="{run}"}}')
        assert [a["metric"]["rank"] for a in down] == ["1"]
    finally:
        stop.set()
        driver.join()
        for role in roles.values():
            role.close()


def test_start_prometheus_for_a_run_dir(tmp_path):
    roles = make_roles("rd")
    port = roles["optimizer"].serve(port=0, run_dir=tmp_path)
    proc = prom.start_prometheus(tmp_path, scrape_interval="1s", run="rd")
    try:
        proc.wait_ready()
        assert json.loads((tmp_path / "metrics" / "targets.json").read_text())[0]["targets"] == [f"127.0.0.1:{port}"]
        assert prom.query(proc.url, "vector(1)")[0]["value"][1] == "1"
        with pytest.raises(ValueError):
            prom.query(proc.url, "sum(")
    finally:
        proc.stop()
        roles["optimizer"].close()
    run_promtool("check", "config", str(proc.config_path))


def test_run_monitor_starts_prometheus_and_stops_on_ctrl_c(tmp_path):
    M.register_process(tmp_path, "rollout", 0, prom.free_port())
    code = ("import sys; from rapid.monitoring.prom import run_monitor; "
            f"sys.exit(run_monitor({str(tmp_path)!r}, port={prom.free_port()}, refresh_s=0.2))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[0].startswith("Prometheus: http://127.0.0.1:") and "1 registered processes" in lines[0], lines
        assert "grafana-dashboard.json" in lines[2]
        url = lines[0].split()[1]
        assert prom.query(url, "vector(1)")
        M.register_process(tmp_path, "optimizer", 0, 9999)  # a process that starts later joins the list
        deadline = time.monotonic() + 10
        while len(json.loads((tmp_path / "metrics" / "targets.json").read_text())) < 2:
            assert time.monotonic() < deadline, "targets.json not refreshed"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(OSError):  # its prometheus went away with it
        prom.query(url, "vector(1)", timeout=2)


# --- static report ----------------------------------------------------------------------------------------------


def test_report_writes_pngs_from_logs(tmp_path):
    logs = tmp_path / "run" / "logs"
    logs.mkdir(parents=True)
    t0 = time.time()
    with open(logs / "optimizer.jsonl", "w") as f:
        for u in range(20):
            f.write(json.dumps({"time": t0 + 3 * u, "update": u, "version": u, "samples_per_s": 1000 + u,
                                "policy_loss": -0.01 * u, "value_loss": 1 / (u + 1), "entropy": 1.5 - 0.01 * u,
                                "approx_kl": 0.01, "clip_fraction": 0.1, "explained_variance": u / 20,
                                "staleness_mean": 1.5, "sample_reuse": 1.2, "grad_norm": 0.5, "lr": 3e-4}) + "\n")
        f.write('{"time": 1')  # a line still being written
    with open(logs / "eval.jsonl", "w") as f:
        for v in range(5):
            for opp in ("pool", "bots"):
                f.write(json.dumps({"time": t0 + 10 * v, "version": v, "opponent": opp, "games": 20,
                                    "win_rate": 0.1 * v}) + "\n")
    files = write_report(tmp_path / "run", tmp_path / "out")
    names = sorted(p.name for p in files)
    assert names == ["losses.png", "report.md", "staleness_reuse.png", "throughput.png", "win_rate.png"]
    for p in files:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_report_skips_missing_logs_and_keys(tmp_path):
    logs = tmp_path / "run" / "logs"
    logs.mkdir(parents=True)
    (logs / "optimizer.jsonl").write_text(json.dumps({"update": 1, "samples_per_s": 5.0}) + "\n"
                                          + json.dumps({"update": 2, "samples_per_s": 6.0}) + "\n")
    files = write_report(tmp_path / "run", tmp_path / "out")
    assert sorted(p.name for p in files) == ["report.md", "throughput.png"]
    notes = (tmp_path / "out" / "report.md").read_text()
    assert "policy_loss" in notes and "eval.jsonl" in notes

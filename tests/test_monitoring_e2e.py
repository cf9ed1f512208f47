"""A real Prometheus scrapes a real `rapid train`; every panel of the shipped dashboard shows data."""

from __future__ import annotations

from rapid.monitoring.prom import check_dashboard_queries
from rapid.monitoring.targets import collect_targets, write_file_sd
from tests.helpers import kill_group, start_rapid, wait_for

RUN = "mon"


def test_dashboard_queries_return_data_from_a_real_run(tmp_path, prometheus):
    run = tmp_path / RUN
    proc = start_rapid(
        "train", "--config", "configs/default.toml", "--run-dir", str(run), "--no-progress", "--minutes", "4",
        "--set", f'run.name="{RUN}"', "--set", "rollout.upload_interval_s=1.0", "--set", "env.num_games=32",
        "--set", "eval.interval_s=3", "--set", "eval.games=40", "--set", "optimizer.batch_samples=64",
        "--set", "league.snapshot_every=5", "--set", 'league.bots=["random"]', "--set", "league.bot_prob=0.2",
        "--set", "eval.ladder={}", "--set", "eval.ladder.lookahead2=615", "--set", "eval.ladder_interval_s=3",
        "--set", "eval.ladder_games=20",
        "--set", "league.refresh_s=2", "--set", "rollout.inference=node", log=tmp_path / "train.log")
    try:
        def targets():
            found = collect_targets(run)
            if len(found) >= 5:
                write_file_sd(found, prometheus.targets_file, run=RUN)
            return len(found) >= 5

        # Node inference: the node's server serves its metrics too (the dashboard's node-inference row).
        wait_for(targets, 90, "launcher, optimizer, inference server, rollout and evaluator to serve metrics")
        prometheus.wait_for(f'rapid_updates_total{{run="{RUN}"}}', timeout=90)
        missing = check_dashboard_queries(prometheus.url, run=RUN, timeout=120)
        assert missing == [], f"panels without data: {missing}\n{prometheus.log_tail()}"
        rules = prometheus.api("/api/v1/rules")["data"]["groups"]
        assert sum(len(g["rules"]) for g in rules) >= 6
        assert all(r.get("health") != "err" for g in rules for r in g["rules"])
    finally:
        kill_group(proc)

"""The shipped alert rules evaluated by promtool's rule unit tests (`promtool test rules`): the reuse alert
follows the run's own target, exported by the optimizer as ``rapid_balance_target_reuse``."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rapid.monitoring.prom import ALERTS_PATH

OPTIMIZER = 'role="optimizer",run="c4",job="rapid"'


def promtool() -> str:
    path = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(path).exists():
        pytest.fail("promtool not found: apt-get install -y --no-install-recommends prometheus")
    return path


def reuse_case(reuse: dict[int, float], target: float, expect_alert: float | None) -> dict:
    """Ten minutes of each rank at a constant reuse and target; the alert checked at the end."""
    series = []
    for rank, value in reuse.items():
        labels = f'{OPTIMIZER},rank="{rank}",instance="n{rank}:9400"'
        series.append({"series": f"rapid_sample_reuse{{{labels}}}", "values": f"{value}x10"})
        series.append({"series": f"rapid_balance_target_reuse{{{labels}}}", "values": f"{target}x10"})
    expected = [] if expect_alert is None else [{
        "exp_labels": {"severity": "warning", "run": "c4"},
        "exp_annotations": {"summary": f"run c4: sample reuse {expect_alert:.2f} above the run's target "
                                       "(optimizer.target_reuse; max_reuse without balancing)"}}]
    return {"interval": "1m", "input_series": series,
            "alert_rule_test": [{"eval_time": "10m", "alertname": "RapidSampleReuseHigh", "exp_alerts": expected}]}


def test_reuse_alert_compares_reuse_with_the_runs_target(tmp_path):
    tests = [
        reuse_case({0: 2.5}, target=3.0, expect_alert=None),        # the quick start holds reuse near 3.0
        reuse_case({0: 3.0}, target=3.0, expect_alert=None),        # at the target: the balancer's job
        reuse_case({0: 3.5}, target=3.0, expect_alert=3.5),         # above it
        reuse_case({0: 0.9, 1: 1.2}, target=1.0, expect_alert=1.2),  # one rank of two above it
    ]
    spec = tmp_path / "reuse_test.yml"  # JSON is YAML: no YAML writer needed
    spec.write_text(json.dumps({"rule_files": [str(ALERTS_PATH)], "evaluation_interval": "1m", "tests": tests}))
    res = subprocess.run([promtool(), "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout

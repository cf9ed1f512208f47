"""The box model (benchmarks/bench_box.py) reproduces the recorded H200 run's failure (most of what was loaded
dropped stale, the GPU mostly idle, the optimizer's interpreter lock saturated) and is sensitive to rapid's own
balance code: today's settings train what they load at full pace, and turning the rollouts' pace off wastes more."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_box  # noqa: E402

SIM = ["--minutes", "2.5"]


def run(*extra: str) -> dict:
    a = bench_box.parse_args([*SIM, *extra])
    from box.box import Box

    return Box(bench_box.settings_of(a, a.setting)).run()


@pytest.fixture(scope="module")
def recorded() -> dict:
    return run("--setting", "as-recorded")


@pytest.fixture(scope="module")
def paced() -> dict:
    return run("--setting", "today")


def test_the_recorded_run_drops_most_of_what_it_loads_with_the_gpu_mostly_idle(recorded):
    assert recorded["stale_share"] > 0.5
    assert recorded["staleness_p99"] >= 14
    assert recorded["busy"]["gpu"] < 0.3
    assert recorded["bottleneck"] == "optimizer"
    assert recorded["busy"]["optimizer"] > 0.9


def test_today_trains_what_it_loads_at_full_pace_and_without_the_pace_wastes_more(recorded, paced):
    """Today's code on the same box: the buffer grows with the arrivals (a 4,096-sample buffer held about one upload
    of one worker) and the pace comes back up while the optimizer waits for data (it stayed near its floor when a
    look just after an upload saw a backlog), so what is made is trained at full speed."""
    unpaced = run("--setting", "today", "--set", "optimizer.pace_rollouts=false")
    assert paced["wasted_share"] < recorded["wasted_share"] - 0.2
    assert paced["trained_share"] > 0.9 and paced["stale_share"] < 0.05
    assert paced["pace_end"] > 0.9 and paced["agent_steps_per_s"] > recorded["agent_steps_per_s"] / 2
    assert unpaced["wasted_share"] > paced["wasted_share"] + 0.2


def test_the_table_prints_each_setting_beside_the_recorded_run(capsys, tmp_path):
    out = tmp_path / "box.json"
    assert bench_box.main(["--minutes", "0.2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "recorded" in text and "bottleneck" in text and out.exists()

"""benchmarks/bench_head_to_head.py on two tiny untrained runs: a score line, and one clear line for bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rapid.api import publish_untrained
from rapid.run.config_files import load_config
from tests.helpers import ROOT

TINY = ["model.hidden=16", "model.lstm=16"]
SCRIPT = str(ROOT / "benchmarks" / "bench_head_to_head.py")


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("h2h")
    torch.manual_seed(0)
    a = publish_untrained(load_config(None, TINY), root / "a")
    torch.manual_seed(1)
    b = publish_untrained(load_config(None, TINY), root / "b", version=3)
    moba = publish_untrained(load_config(None, ["env.name=moba", *TINY]), root / "moba")
    return a, b, moba


def test_plays_the_games_asked_for_half_on_each_side(runs):
    a, b, _ = runs
    out = bench(str(a), str(b), "--games", "40", "--greedy-b")
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert f"{a} v1 (sampled) vs {b} v3 (greedy)" in line and "of 40 games" in line, line
    won, lost, drew = (int(line.split(word)[1].split()[0].strip(",")) for word in ("won ", "lost ", "drew "))
    assert won + lost + drew == 40


def test_runs_of_two_games_and_a_missing_run_are_one_line_and_exit_2(runs, tmp_path):
    a, _, moba = runs
    for args in ([str(a), str(moba)], [str(a), str(tmp_path / "nothing")]):
        out = bench(*args, "--games", "4")
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1, out.stderr


def test_a_side_may_be_a_bot_and_two_bots_need_the_game(runs):
    a, _, _ = runs
    out = bench(str(a), "bot:lookahead", "--games", "20")
    assert out.returncode == 0 and f"{a} v1 (sampled) vs bot:lookahead" in out.stdout, out.stderr
    out = bench("bot:lookahead2", "bot:lookahead", "--games", "20", "--env", "pettingzoo.classic.connect_four_v3")
    assert out.returncode == 0 and "bot:lookahead2 vs bot:lookahead" in out.stdout, out.stderr
    for args in (["bot:lookahead2", "bot:lookahead"], [str(a), "bot:nosuch"]):
        out = bench(*args, "--games", "4")
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr

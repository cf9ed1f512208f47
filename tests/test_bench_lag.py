"""benchmarks/bench_lag.py on a tiny model: rounds that train and evaluate, both proximal settings, and one
clear line for bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT

SCRIPT = str(ROOT / "benchmarks" / "bench_lag.py")
TINY = ["--set", "model.hidden=16", "--set", "model.lstm=16", "--set", "model.conv_channels=[]",
        "--set", "env.num_games=8", "--set", "optimizer.batch_samples=16"]


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=180, cwd=ROOT)


@pytest.mark.parametrize("proximal", ["behaviour", "first_use"])
def test_it_trains_lagging_rounds_and_evaluates_them(proximal):
    out = bench(*TINY, "--lag", "2", "--games", "20", "--eval-every", "1000", "--max-decisions", "3000",
                "--target", "1.01", "--set", f"ppo.proximal={proximal}")
    assert out.returncode == 1, out.stderr  # a target above 100% is never reached
    rounds = [line for line in out.stdout.splitlines() if line.startswith("decisions")]
    assert len(rounds) >= 3, out.stdout
    updates = [int(line.split("updates")[1].split()[0]) for line in rounds]
    assert updates == sorted(updates) and updates[-1] > updates[0] > 0
    assert "not reached 101%" in out.stdout


def bot_shares(out: subprocess.CompletedProcess) -> list[str]:
    return [line.split("games against bots ")[1].split()[0] for line in out.stdout.splitlines()
            if line.startswith("decisions") and "games against bots -" not in line]


def test_bots_plays_the_configs_warm_up_against_its_bots_and_self_play_without_it():
    warm = [*TINY, "--games", "10", "--eval-every", "1000", "--max-decisions", "3000", "--target", "1.01",
            "--set", "ppo.warmup_updates=1000", "--set", 'league.warmup_bots=["random"]', "--set", "eval.ladder={}"]
    with_bots, without = bench(*warm, "--bots"), bench(*warm)
    assert with_bots.returncode == 1 and without.returncode == 1, with_bots.stderr + without.stderr
    assert bot_shares(with_bots) and set(bot_shares(with_bots)) == {"100%"}  # before: the flag did nothing
    assert bot_shares(without) and set(bot_shares(without)) == {"0%"}


def test_bad_input_is_one_line_and_exit_2():
    out = bench("--set", "ppo.proximal=latest")
    assert out.returncode == 2 and "ppo.proximal must be" in out.stderr and "Traceback" not in out.stderr
    out = bench("--lag", "-1")
    assert out.returncode == 2 and "--lag must be" in out.stderr

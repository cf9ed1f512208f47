"""connect four learns from the shipped defaults: two minutes of `rapid train`, then `rapid eval --greedy`.

The full figures (5 minutes, 1,000 games against random and against the lookahead bot) are a benchmark
(benchmarks/bench_learning.py, BENCHMARKS.md); this is the coarse version for the test suite: greedy
against random only.
"""

from __future__ import annotations

from tests.helpers import rapid

# The shipped config with one rollout worker and no evaluator, as on a machine where other tests run.
QUICK = ["--set", "eval.interval_s=0", "--set", "run.num_workers=1"]


def win_rate(out: str) -> float:
    return float(out.split("win rate ")[1].split()[0])


def test_connect_four_two_minutes_greedy_beats_random(tmp_path):
    run = tmp_path / "c4"
    rapid("train", "--config", "configs/default.toml", "--run-dir", str(run), "--minutes", "2", "--no-progress",
          *QUICK, timeout=420)
    vs_random = rapid("eval", "--run-dir", str(run), "--against", "bot:random", "--games", "200", "--greedy",
                      "--seed", "4242", timeout=300).stdout
    print(vs_random)
    # Measured at 88% under a load of 20 on 2 cores. Against the lookahead bot two minutes give 5-15%: too
    # unstable for a test, so that figure lives in the benchmark only.
    assert win_rate(vs_random) >= 0.75, vs_random

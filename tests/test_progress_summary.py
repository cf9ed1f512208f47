"""The end-of-run summary says how well the optimizer kept up with its rollout workers, how the launch's first
minutes went, and how the evaluator's policy did in each mode it played; so does the live status line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapid.roles.launcher import target_reached
from rapid.run import progress
from rapid.run.config_files import load_config
from rapid.run.progress import (
    Launch,
    RunLogs,
    balance_lines,
    baseline_evals,
    evaluation_lines,
    final_summary,
    first_minutes,
    status_line,
)


def test_summary_reports_use_waste_reuse_and_staleness():
    last = {"samples_received": 1000, "samples_used": 960, "samples_dropped_stale": 30, "samples_evicted_unused": 10,
            "sample_reuse": 0.96, "balance_target_reuse": 1.0, "staleness_p50": 1.0, "staleness_p99": 4.0}
    text = "\n".join(balance_lines(last))
    assert "96.0% of received samples" in text and "3.0% dropped stale" in text and "1.0% evicted" in text
    assert "target 1.00: within 10%" in text and "p50 1, p99 4" in text
    assert "off by more than 10%" in "\n".join(balance_lines({**last, "sample_reuse": 0.5}))
    assert "experience buffer" not in text, "a buffer that kept its size is no news"
    assert "grown to 32,768 samples per rank" in "\n".join(balance_lines({**last, "balance_buffer": 32768.0}))


def test_summary_of_an_older_log_leaves_the_new_lines_out():
    assert balance_lines({"samples_received": 10, "sample_reuse": 1.2}) == ["  sample reuse       : 1.20"]


# The evaluator's modes (eval.play) and the first minutes, from synthetic logs of a run launched at T0.
T0 = 1_700_000_000.0


def _eval(t: float, version: int, rate: float, greedy: bool | None) -> dict:
    row = {"time": T0 + t, "version": version, "opponent": "random", "games": 200, "win_rate": rate,
           "ci_low": rate - 0.05, "ci_high": min(rate + 0.05, 1.0)}
    return row if greedy is None else {**row, "greedy": greedy}  # None: a record from before eval.play


def _op(t: float, update: int, version: int) -> dict:
    return {"time": T0 + t, "elapsed_s": t - 3.9, "update": update, "version": version, "env_steps": 1000 * update,
            "samples_received": 100, "samples_consumed": 100, "samples_dropped_stale": 0, "sample_reuse": 1.0,
            "skipped_updates": 0, "bad_objects": 0, "staleness_mean": 0.5, "entropy": 1.2}


def _logs(run_dir: Path, ops: list[dict], evals: list[dict]) -> RunLogs:
    (run_dir / "logs").mkdir(parents=True)
    for name, rows in (("optimizer.jsonl", ops), ("eval.jsonl", evals)):
        (run_dir / "logs" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    logs = RunLogs(run_dir)
    logs.refresh()
    return logs


BOTH = [_eval(9.5, 1, 0.53, False), _eval(10.1, 1, 0.61, True), _eval(20.0, 7, 0.85, False),
        _eval(20.6, 7, 0.93, True), _eval(28.1, 9, 0.91, False), _eval(28.7, 9, 0.97, True),
        {"time": T0 + 29.0, "version": 9, "opponent": "v000000000004", "games": 100, "win_rate": 0.6}]  # pool
OPS = [_op(7.3, 1, 0), _op(7.4, 2, 1), _op(8.0, 3, 1)]


def test_the_status_line_shows_each_mode_played(tmp_path):
    logs = _logs(tmp_path / "both", OPS, BOTH)
    assert status_line(logs, 30.0).endswith("| win vs random 91% (v9), greedy 97%")
    greedy = _logs(tmp_path / "greedy", OPS, [e for e in BOTH if e.get("greedy")])
    assert status_line(greedy, 30.0).endswith("| win vs random greedy 97% (v9)")
    mid_round = _logs(tmp_path / "mid", OPS, BOTH[:5])  # v9 sampled is logged, its greedy match still plays
    assert status_line(mid_round, 30.0).endswith("| win vs random 91% (v9), greedy 93% (v7)")
    old = _logs(tmp_path / "old", OPS, [_eval(9.5, 1, 0.53, None)])
    assert status_line(old, 30.0).endswith("| win vs random 53% (v1)")


def test_a_record_without_the_key_reads_as_sampled(tmp_path):
    _logs(tmp_path, [], [_eval(1.0, 1, 0.5, None), _eval(2.0, 1, 0.7, True), BOTH[-1]])
    assert [e["win_rate"] for e in baseline_evals(tmp_path, "sampled")] == [0.5]
    assert [e["win_rate"] for e in baseline_evals(tmp_path, "greedy")] == [0.7]
    assert len(baseline_evals(tmp_path)) == 2  # the pool match is no baseline evaluation


@pytest.mark.parametrize("play, stops", [("both", ""), ("sampled", ""),
                                         ("greedy", "target win rate 0.95 reached by v9 (greedy)")])
def test_the_target_win_rate_reads_the_rated_mode(tmp_path, play, stops):
    cfg = load_config(None, ["run.target_win_rate=0.95", f'eval.play="{play}"'])
    assert target_reached(cfg, _logs(tmp_path, OPS, BOTH)) == stops
    lower = load_config(None, ["run.target_win_rate=0.9", f'eval.play="{play}"'])
    assert target_reached(lower, _logs(tmp_path / "again", OPS, BOTH)).startswith("target win rate 0.9 reached by v9")


def test_the_summary_gives_the_last_and_best_evaluation_of_each_mode():
    lines = evaluation_lines([e for e in BOTH if "ci_low" in e])
    assert lines == ["  last evaluation    : v9 won 91.0% of 200 sampled games vs random (95% CI 86.0%–96.0%)",
                     "                       v9 won 97.0% of 200 greedy games vs random (95% CI 92.0%–100.0%)",
                     "  best evaluation    : v9 91.0% sampled, v9 97.0% greedy"]
    assert evaluation_lines([_eval(1.0, 3, 0.4, None), _eval(2.0, 4, 0.3, None)])[1:] == [
        "  best evaluation    : v3 40.0% sampled"]


def test_the_first_minutes_split_of_a_run_playing_both_modes():
    evals = [e for e in BOTH if "ci_low" in e]
    assert first_minutes(OPS, evals, Launch(T0)) == (
        "start-up 3.9 s · first update 7.3 s · first version 7.4 s · first evaluation 9.5 s (v1 53.0%, greedy 61.0%)"
        " · first ≥ 90% at 28.1 s (v9), greedy at 20.6 s (v7)")
    greedy = [e for e in evals if e["greedy"]]
    assert first_minutes(OPS, greedy, Launch(T0)).endswith(
        "first evaluation 10.1 s (v1 greedy 61.0%) · first ≥ 90% greedy at 20.6 s (v7)")
    assert first_minutes(OPS, evals[:2], Launch(T0)).endswith("(v1 53.0%, greedy 61.0%)")  # nothing reached 90%
    assert first_minutes([], [], Launch(T0)) == ""


def test_the_first_minutes_say_when_the_warm_up_ended():
    warm = [{**_op(7.3, 1, 0), "warmup": 1.0}, {**_op(7.4, 2, 1), "warmup": 1.0}, {**_op(8.0, 3, 1), "warmup": 0.0}]
    evals = [e for e in BOTH if "ci_low" in e]
    assert " · first version 7.4 s · warm-up of 2 updates to 7.4 s · first evaluation" in first_minutes(
        warm, evals, Launch(T0))
    assert "warm-up" not in first_minutes(warm[:2], evals, Launch(T0))  # not over yet
    assert "warm-up" not in first_minutes(OPS, evals, Launch(T0))  # none (or an older log)


def test_a_resumed_launch_times_its_own_records():
    """Records from before the launch are the earlier run's; its first version is the first past the store's."""
    before = [_op(-50.0, 1, 40), _eval(-40.0, 40, 0.95, False)]
    after = [_op(5.0, 41, 41), _op(6.0, 42, 42)]
    text = first_minutes([*before[:1], *after], [before[1], _eval(8.0, 41, 0.96, False)],
                         Launch(T0, resumed=True, version=41))
    assert text == ("this launch: start-up 3.9 s · first update 5.0 s · first version 6.0 s · "
                    "first evaluation 8.0 s (v41 96.0%) · first ≥ 90% at 8.0 s (v41)")
    assert "first version" not in first_minutes(after, [], Launch(T0, resumed=True, version=None))


def test_the_summary_prints_the_split_after_the_balance(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "_write_report", lambda run_dir: "")  # plots cost seconds and are tested elsewhere
    _logs(tmp_path, OPS, BOTH)
    text = final_summary(tmp_path, "time limit", 30.0, 0, Launch(T0)).splitlines()
    split = next(i for i, line in enumerate(text) if line.startswith("  first minutes      : start-up 3.9 s"))
    assert text[split - 1].startswith("  skipped updates") and text[split + 1].startswith("  last evaluation")
    assert not any("first minutes" in line for line in final_summary(tmp_path, "x", 30.0, 0).splitlines())

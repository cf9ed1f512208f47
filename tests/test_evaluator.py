"""The evaluator's cost on a small machine (how many pool games it plays, the share of a core it may take, its early
cadence) and how its policy acts against the baseline (``eval.play``: sampled, greedy or both)."""

from __future__ import annotations

import json
import threading

import pytest

from rapid.roles import evaluator as evaluator_role
from rapid.roles.evaluator import eval_interval_s, eval_wait_s
from rapid.run import run_watch
from rapid.run.config import EvalConfig
from rapid.run.config_files import load_config
from tests.test_cluster_walk import _finished_run


@pytest.fixture(autouse=True)
def prompt_rechecks(monkeypatch):
    """An evaluator that found its run stopped asks the lease again 1, 2 and 4 s later before it exits (that wait is
    tests/test_cluster_walk.py's to check); here it would add 7 s to every test of one round's games."""
    monkeypatch.setattr(run_watch, "FIRST_RECHECK_S", 0.01)


def _evaluate_once(tmp_path, *overrides: str) -> list[dict]:
    """One evaluation round of a finished run with a snapshot in its pool; the rows it logged."""
    from rapid.infra.store import LocalStore
    from rapid.league import League
    from rapid.roles.evaluator import run_evaluator
    from rapid.roles.startup import StopFlag, build_policy, env_spec
    from rapid.run.param_store import ParameterStore

    cfg = load_config(None, [f'run.dir="{tmp_path}"', "env.num_games=2", "model.hidden=16", "model.lstm=16",
                             "eval.games=4", "eval.interval_s=0.2", "metrics.enabled=false", *overrides])
    _finished_run(tmp_path / "store", cfg)
    store = LocalStore(tmp_path / "store")
    League(store).add_snapshot_from_params(0, member_id="past")
    ParameterStore(store).publish(1, build_policy(cfg, env_spec(cfg)).tensors())  # the newest is not in the pool
    stop, result = StopFlag(install_signals=False), []
    evaluator = threading.Thread(target=lambda: result.append(run_evaluator(cfg, stop=stop)), daemon=True)
    evaluator.start()
    evaluator.join(60)
    stop.set("test")
    evaluator.join(30)
    assert result == [0]
    return [json.loads(line) for line in (tmp_path / "logs" / "eval.jsonl").read_text().splitlines()]


def test_pool_games_default_to_half_the_games(tmp_path):
    rows = _evaluate_once(tmp_path)
    assert [(r["opponent"], r["games"]) for r in rows] == [("random", 4), ("past", 2)]


@pytest.mark.parametrize("pool_games, expected", [(0, [("random", 4)]), (3, [("random", 4), ("past", 3)])])
def test_pool_games_are_set_apart(tmp_path, pool_games, expected):
    rows = _evaluate_once(tmp_path, f"eval.pool_games={pool_games}")
    assert [(r["opponent"], r["games"]) for r in rows] == expected


def test_the_core_share_stretches_the_wait_after_a_long_round():
    assert eval_wait_s(60.0, 35.0, 0.0) == 60.0            # no limit: the interval alone
    assert eval_wait_s(60.0, 35.0, 0.25) == pytest.approx(105.0)  # 35 s of every 140 s
    assert eval_wait_s(60.0, 10.0, 0.25) == 60.0           # a short round: the interval still holds
    assert eval_wait_s(60.0, 0.0, 0.25) == 60.0            # no round played: poll again after the interval
    assert eval_wait_s(0.5, 30.0, 1.0) == 0.5              # a whole core: back to back


def _rated_points(tmp_path) -> list[str]:
    """The members the evaluator's round rated, one entry per rating (the pool's rating history)."""
    from rapid.infra.store import LocalStore
    from rapid.league import League

    return [p.id for p in League(LocalStore(tmp_path / "store")).read_or_empty().history]


@pytest.fixture
def greedy_flags(monkeypatch) -> list[bool]:
    """The ``greedy`` of every policy player the evaluator makes, in order."""
    flags: list[bool] = []

    class Recording(evaluator_role.PolicyPlayer):
        def __init__(self, *args, greedy: bool = False, **kwargs):
            flags.append(greedy)
            super().__init__(*args, greedy=greedy, **kwargs)

    monkeypatch.setattr(evaluator_role, "PolicyPlayer", Recording)
    return flags


def test_both_plays_the_baseline_sampled_then_greedy_and_rates_the_sampled_match(tmp_path, greedy_flags):
    rows = _evaluate_once(tmp_path, 'eval.play="both"', "eval.pool_games=0")
    assert greedy_flags == [False, True]
    assert [(r["opponent"], r["greedy"], r["games"]) for r in rows] == [("random", False, 4), ("random", True, 4)]
    assert "rating" in rows[0] and "rating" not in rows[1]
    assert _rated_points(tmp_path) == ["v000000000001", "bot:random"]  # one rated match, not two


def test_a_greedy_evaluator_rates_its_greedy_match(tmp_path, greedy_flags):
    rows = _evaluate_once(tmp_path, 'eval.play="greedy"', "eval.pool_games=0")
    assert greedy_flags == [True]
    assert [(r["greedy"], "rating" in r) for r in rows] == [(True, True)]
    assert _rated_points(tmp_path) == ["v000000000001", "bot:random"]


def test_the_default_plays_sampled_and_says_so(tmp_path, greedy_flags):
    rows = _evaluate_once(tmp_path, "eval.pool_games=0")
    assert greedy_flags == [False] and [r["greedy"] for r in rows] == [False]


def test_the_early_cadence_holds_for_early_s_then_the_interval():
    early = EvalConfig(interval_s=20.0, early_interval_s=2.0, early_s=60.0)
    assert [eval_interval_s(early, t) for t in (0.0, 59.9, 60.0, 600.0)] == [2.0, 2.0, 20.0, 20.0]
    assert eval_interval_s(EvalConfig(interval_s=20.0, early_s=60.0), 0.0) == 20.0  # early_interval_s 0: off
    assert eval_interval_s(EvalConfig(interval_s=20.0, early_interval_s=2.0, early_s=0.0), 0.0) == 20.0
    # the core share still stretches the wait after a long round in the early seconds
    assert eval_wait_s(eval_interval_s(early, 1.0), 3.0, 0.5) == pytest.approx(3.0)

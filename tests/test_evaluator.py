"""The evaluator's cost on a small machine: how many pool games it plays, and the share of a core it may take."""

from __future__ import annotations

import json
import threading

import pytest

from rapid.roles.evaluator import eval_wait_s
from rapid.run.config_files import load_config
from tests.test_cluster_walk import _finished_run


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

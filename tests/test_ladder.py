"""The strength ladder: its rating math against a brute-force likelihood, the rungs a config may name (never a
training opponent), frozen reference files (hostile ones included), and the evaluator's and `rapid eval`'s ratings."""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import pytest

from rapid.errors import UsageError
from rapid.league.ladder import Score, calibrate, expected, log_posterior, rate
from rapid.run.config_files import load_config
from rapid.run.ladder_rungs import check_ladder, read_reference, rung_name, write_reference
from tests.helpers import rapid

SMALL = ["model.hidden=16", "model.lstm=16", "model.conv_channels=[]", "metrics.enabled=false"]


# -- the math, against a grid search of the same posterior --------------------------------------------------------

def _grid_argmax(f, lo=-1500.0, hi=3000.0, step=0.25) -> float:
    xs = np.arange(lo, hi, step)
    return float(xs[np.argmax([f(x) for x in xs])])


@pytest.mark.parametrize("scores", [
    {"random": Score(190, 200), "lookahead": Score(100, 200), "search4": Score(12, 200)},
    {"random": Score(200, 200), "lookahead": Score(200, 200)},          # a clean sweep: finite all the same
    {"random": Score(0, 200), "lookahead": Score(0, 200)},
    {"lookahead": Score(37.5, 50)},
])
def test_rate_is_the_posterior_mode_and_its_curvature(scores):
    rungs = {"random": 0.0, "lookahead": 560.0, "search4": 1100.0}
    est = rate(scores, rungs)
    mean = float(np.mean(list(rungs.values())))
    post = lambda r: log_posterior(r, scores, rungs, mean)  # noqa: E731
    assert est.rating == pytest.approx(_grid_argmax(post), abs=0.3)
    h = 1e-2  # the Laplace approximation: sigma² is minus the inverse second derivative at the mode
    second = (post(est.rating + h) - 2 * post(est.rating) + post(est.rating - h)) / h ** 2
    assert est.sigma == pytest.approx(1 / math.sqrt(-second), rel=1e-3)


def test_more_games_narrow_the_rating_and_a_win_raises_it():
    rungs = {"random": 0.0, "lookahead": 560.0}
    few, many = rate({"lookahead": Score(30, 50)}, rungs), rate({"lookahead": Score(600, 1000)}, rungs)
    assert many.sigma < few.sigma / 3
    assert rate({"lookahead": Score(31, 50)}, rungs).rating > few.rating
    assert abs(many.rating - (560 + 400 * math.log10(0.6 / 0.4))) < 5  # Elo's own figure when the prior is weak


def test_rate_refuses_a_rung_without_a_rating():
    with pytest.raises(ValueError, match="search4"):
        rate({"search4": Score(1, 2)}, {"random": 0.0})


def test_calibrate_holds_the_anchor_and_matches_a_grid_search():
    matches = [("b", "random", Score(150, 200)), ("c", "b", Score(120, 200)), ("c", "random", Score(180, 200))]
    got = calibrate(["random", "b", "c"], matches, anchor="random")
    assert got["random"] == 0.0

    def post(rb, rc):
        r = {"random": 0.0, "b": rb, "c": rc}
        total = -0.5 * (rb ** 2 + rc ** 2) / 1000.0 ** 2
        for a, o, s in matches:
            p = float(expected(r[a], r[o]))
            total += s.points * math.log(p) + (s.games - s.points) * math.log(1 - p)
        return total

    xs = np.arange(0, 700, 1.0)
    grid = np.array([[post(b, c) for c in xs] for b in xs])
    b, c = np.unravel_index(grid.argmax(), grid.shape)
    assert got["b"] == pytest.approx(xs[b], abs=1.0) and got["c"] == pytest.approx(xs[c], abs=1.0)


# -- the config: a ladder rung is never a training opponent ---------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ('league.bots=["lookahead"]', "'lookahead' is also a training opponent"),
    ('league.warmup_bots=["random"]', "'random' is also a training opponent"),
])
def test_a_ladder_rung_that_training_meets_is_refused_in_one_line(override, message):
    out = rapid("config", "show", "--set", "eval.ladder={random = 0, lookahead = 560}", "--set", override,
                "--set", "ppo.warmup_updates=10", check=False)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_train_refuses_a_ladder_rung_in_league_bots(tmp_path):
    out = rapid("train", "--run-dir", str(tmp_path / "r"), "--set", 'league.bots=["lookahead"]', "--set",
                "eval.ladder={lookahead = 560}", check=False)
    assert out.returncode == 2 and "training opponent" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "r").exists()  # refused before anything started


def test_an_empty_table_clears_the_configs_ladder_so_a_curriculum_may_use_its_bots():
    cfg = load_config("configs/default.toml", ["eval.ladder={}", 'league.bots=["lookahead"]', "league.bot_prob=0.5"])
    assert cfg.eval.ladder == {} and cfg.league.bots == ["lookahead"]
    assert load_config("configs/default.toml", ["eval.ladder.lookahead=500"]).eval.ladder["lookahead"] == 500


def test_bad_ratings_and_names_are_reported_together():
    with pytest.raises(UsageError) as e:
        load_config(None, ['eval.ladder={random = nan, "../x" = 1, "ref:" = 2}', "eval.ladder_games=0"])
    text = str(e.value)
    for part in ("'random' must be a finite number", "'../x' is neither", "names no reference file",
                 "eval.ladder_games"):
        assert part in text


def test_rungs_the_game_lacks_are_named_before_the_run_starts(tmp_path):
    cfg = load_config(None, ['eval.ladder={random = 0, lane = 100, "ref:%s" = 5}' % (tmp_path / "none.rpm")])
    with pytest.raises(UsageError) as e:
        check_ladder(cfg)
    assert "'lane' is not a bot of" in str(e.value) and "none.rpm: cannot read it" in str(e.value)


# -- frozen reference files ----------------------------------------------------------------------------------------

def _policy_file(tmp_path, overrides=()):
    import torch

    from rapid.roles.startup import build_policy, env_spec

    cfg = load_config(None, [*SMALL, *overrides])
    torch.manual_seed(3)
    policy = build_policy(cfg, env_spec(cfg))
    return cfg, policy, write_reference(tmp_path / "ref.rpm", policy.tensors(), cfg, 42)


def test_a_reference_plays_exactly_the_policy_it_was_written_from(tmp_path):
    import torch

    from rapid.envs.registry import make_env
    from rapid.run.ladder import Ladder

    cfg, policy, path = _policy_file(tmp_path)
    env = make_env(cfg.env.name, num_games=4, seed=0)
    ladder = Ladder.build({"random": 0.0, f"ref:{path}": 300.0}, load_config(None, SMALL), env)
    player = ladder.players["ref:ref"](0)
    obs = torch.rand(6, env.spec.obs_dim)
    mask = torch.ones(6, env.spec.mask_dim, dtype=torch.bool)
    a = player.policy.act(obs, mask, policy.initial_state(6), greedy=True).actions
    b = policy.eval().act(obs, mask, policy.initial_state(6), greedy=True).actions
    assert torch.equal(a, b)
    result = ladder.play(player, games=8, seed=1)   # the reference against itself, as a ladder
    assert set(result.scores) == {"random", "ref:ref"} and result.scores["ref:ref"].games == 8


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[: len(b) // 2], "not a reference policy file"),       # torn
    (lambda b: b"\x80\x04\x95" + b[3:], "not a reference policy file"),  # a pickle's header
    (lambda b: b"", "not a reference policy file"),
])
def test_a_damaged_reference_is_one_clear_error(tmp_path, damage, message):
    cfg, _, path = _policy_file(tmp_path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(UsageError, match=message):
        read_reference(path, cfg)


def test_a_reference_of_another_game_or_shape_is_refused(tmp_path):
    from rapid.envs.registry import make_env
    from rapid.run.ladder import load_reference

    _, _, path = _policy_file(tmp_path, ["env.name=pettingzoo.classic.tictactoe_v3"])
    with pytest.raises(UsageError, match="plays pettingzoo.classic.tictactoe_v3"):
        read_reference(path, load_config(None, SMALL))
    cfg, _, path = _policy_file(tmp_path)
    other = load_config(None, [*SMALL, "env.name=pettingzoo.classic.tictactoe_v3"])
    other.env.name = cfg.env.name  # a config that names the game but builds another's observations
    env = make_env("pettingzoo.classic.tictactoe_v3", num_games=1)
    with pytest.raises(UsageError, match="does not fit"):
        load_reference(str(path), other, env)


def test_a_reference_file_loads_on_its_own_as_a_trained_policy(tmp_path):
    import rapid

    _, policy, path = _policy_file(tmp_path)
    trained = rapid.load_policy(path)
    assert trained.version == 42 and trained.env_name == "pettingzoo.classic.connect_four_v3"
    assert all((trained.model.tensors()[k] == v).all() for k, v in policy.tensors().items())
    with pytest.raises(UsageError, match="not moba"):
        rapid.load_policy(path, env="moba")
    (tmp_path / "junk.rpm").write_bytes(b"junk")
    with pytest.raises(UsageError, match="not a reference policy file"):
        rapid.load_policy(tmp_path / "junk.rpm")


def test_rung_names():
    assert rung_name("bot:lane") == "lane" and rung_name("ref:a/b/c4-5min.rpm") == "ref:c4-5min"


# -- the evaluator and `rapid eval --ladder` --------------------------------------------------------------------------

def _run_with_version(tmp_path, *overrides):
    from rapid.run.config_files import to_toml
    from tests.test_cluster_walk import _finished_run

    cfg = load_config(None, [f'run.dir="{tmp_path}"', "env.num_games=2", *SMALL, "eval.games=4",
                             "eval.interval_s=0.2", "eval.pool_games=0", *overrides])
    _finished_run(tmp_path / "store", cfg)
    (tmp_path / "config.toml").write_text(to_toml(cfg))
    return cfg


def test_the_evaluator_logs_a_ladder_rating_and_the_summary_shows_it(tmp_path, monkeypatch):
    from rapid.roles.evaluator import run_evaluator
    from rapid.roles.startup import StopFlag
    from rapid.run import run_watch
    from rapid.run.progress import final_summary

    # The run is stopped: the evaluator rates v0, then asks the lease again before it exits, 1, 2 and 4 s later
    # by default (tests/test_cluster_walk.py checks that wait); at once here.
    monkeypatch.setattr(run_watch, "FIRST_RECHECK_S", 0.01)

    cfg = _run_with_version(tmp_path, "eval.ladder={random = 0, lookahead = 560, lookahead2 = 640}",
                            "eval.ladder_games=6", "eval.ladder_interval_s=0.01")
    stop, result = StopFlag(install_signals=False), []
    thread = threading.Thread(target=lambda: result.append(run_evaluator(cfg, stop=stop)), daemon=True)
    thread.start()
    thread.join(90)
    stop.set("test")
    thread.join(30)
    assert result == [0]
    rows = [json.loads(line) for line in (tmp_path / "logs" / "eval.jsonl").read_text().splitlines()]
    ladder = [r for r in rows if "ladder_rating" in r]
    assert len(ladder) == 1 and ladder[0]["version"] == 0
    assert set(ladder[0]["ladder"]) == {"random", "lookahead", "lookahead2"}
    assert all(v["wins"] + v["losses"] + v["draws"] == 6 for v in ladder[0]["ladder"].values())
    scores = {k: Score.of(v["wins"], v["losses"], v["draws"]) for k, v in ladder[0]["ladder"].items()}
    assert ladder[0]["ladder_rating"] == pytest.approx(
        rate(scores, {"random": 0.0, "lookahead": 560.0, "lookahead2": 640.0}).rating)
    summary = final_summary(tmp_path, "test", 1.0, 0)
    assert f"ladder rating      : {ladder[0]['ladder_rating']:.0f} ±" in summary


def test_rapid_eval_rates_a_version_on_another_configs_ladder_and_calibrates(tmp_path):
    _run_with_version(tmp_path / "run")
    ladder_cfg = tmp_path / "ladder.toml"
    ladder_cfg.write_text("[eval.ladder]\nrandom = 0\nlookahead = 560\n")
    out = rapid("eval", "--run-dir", str(tmp_path / "run"), "--ladder", str(ladder_cfg), "--games", "10")
    assert "v0 vs lookahead: won" in out.stdout and "v0: ladder rating" in out.stdout
    out = rapid("eval", "--ladder", str(ladder_cfg), "--calibrate", "--games", "40")
    table = out.stdout.split("[eval.ladder]")[1]
    ratings = dict(line.split(" = ") for line in table.strip().splitlines())
    assert float(ratings['"random"']) == 0.0 and float(ratings['"lookahead"']) > 200  # lookahead beats random
    out = rapid("eval", "--run-dir", str(tmp_path / "run"), "--ladder", check=False)
    assert out.returncode == 2 and "has no [eval.ladder]" in out.stderr

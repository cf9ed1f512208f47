"""Issue 12 (low): every usage error of the real console scripts is one line on stderr and exit code 2 —
never a traceback, never a half-started run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rapid.envs.registry import make_env
from rapid.infra.store import LocalStore
from rapid.league.pool import League
from rapid.league.state import ensure_bots
from rapid.roles.startup import build_policy
from rapid.run.config import Config, ModelConfig
from rapid.run.config_files import to_toml
from rapid.run.param_store import ParameterStore

BIN = Path(sys.executable).parent

CASES = {
    "config is a folder": (["rapid", "config", "show", "--config", "/etc"], "/etc"),
    "config not UTF-8": (["rapid", "config", "show", "--config", "{tmp}/latin1.toml"], "not UTF-8"),
    "config is /dev/zero": (["rapid", "config", "show", "--config", "/dev/zero"], "/dev/zero"),
    "seed overflows": (["rapid", "config", "show", "--set", "run.seed=99999999999999999999999"], "run.seed"),
    "bad bot id": (["rapid", "config", "show", "--set", 'league.bots=["bad id!"]'], "league.bots"),
    "run name ..": (["rapid", "train", "--no-progress", "--set", "run.name=.."], "run.name"),
    "run name a/b": (["rapid", "config", "show", "--set", "run.name=a/b"], "run.name"),
    "pin unicode digits": (["rapid", "league", "pin", "²", "--store", "{tmp}/store"], "unknown league member"),
    "pin arabic digits": (["rapid-league", "pin", "٣", "--store", "{tmp}/store"], "unknown league member"),
    "add negative version": (["rapid", "league", "add", "--version", "-1", "--store", "{tmp}/store"], "--version"),
    "store is /dev/null": (["rapid", "league", "ls", "--store", "/dev/null"], "/dev/null"),
    "import /dev/zero": (["rapid", "league", "import", "/dev/zero", "--store", "{tmp}/store"], "/dev/zero"),
    "import a folder": (["rapid", "league", "import", "/etc", "--store", "{tmp}/store"], "/etc"),
    "bad worker id": (["rapid-rollout", "--worker-id", "bad id"], "worker-id"),
    "worker id ..": (["rapid-rollout", "--worker-id", ".."], "worker-id"),
    "unknown flag": (["rapid", "train", "--bogus-flag"], "--bogus-flag"),
    "no command": (["rapid"], "required"),
    "league unknown flag": (["rapid-league", "ls", "--bogus"], "--bogus"),
    "not an int": (["rapid", "train", "--workers", "many"], "--workers"),
    "optimizer unknown flag": (["rapid-optimizer", "--resumed"], "--resumed"),
    "bad choice": (["rapid", "config", "shw"], "shw"),
    "replay frame-every 0": (["rapid", "replay", "lane", "idle", "--frame-every", "0"], "--frame-every"),
    "params of another model": (["rapid", "eval", "--run-dir", "{tmp}/run", "--games", "2"], "model settings"),
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "latin1.toml").write_bytes('[run]\nname = "caf\xe9"\n'.encode("latin-1"))
    League(LocalStore(tmp / "store")).update(lambda s: ensure_bots(s, ["bot:random"], 0.0))
    # A run whose config.toml no longer matches its published weights (trained without convolutions).
    fully_connected = Config()
    policy = build_policy(fully_connected, make_env(fully_connected.env.name, num_games=1).spec)
    ParameterStore(LocalStore(tmp / "run" / "store")).publish(1, policy.tensors())
    (tmp / "run" / "config.toml").write_text(to_toml(Config(model=ModelConfig(conv_channels=[16, 32]))))
    return tmp


@pytest.mark.parametrize("case", CASES)
def test_usage_error_is_one_line_exit_2(case, workdir, tmp_path):
    argv, needle = CASES[case]
    argv = [str(BIN / argv[0]), *(a.replace("{tmp}", str(workdir)) for a in argv[1:])]
    before = sorted(p.name for p in workdir.rglob("*"))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert needle in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == [], "nothing written in the current directory"
    assert sorted(p.name for p in workdir.rglob("*")) == before


def test_eval_plays_a_variant_of_the_runs_game_and_refuses_one_of_another_shape(tmp_path):
    """`rapid eval --set env.options.…` plays the run's policy in a changed game (e.g. the default fountain of
    a run trained with a weaker one); a change the policy's inputs cannot take is one line and exit code 2."""
    from tests.helpers import rapid

    cfg = Config()
    cfg.env.name, cfg.env.options = "moba", {"heroes_per_side": 1, "max_seconds": 10.0}
    policy = build_policy(cfg, make_env("moba", num_games=1, options=cfg.env.options).spec)
    ParameterStore(LocalStore(tmp_path / "run" / "store")).publish(1, policy.tensors())
    (tmp_path / "run" / "config.toml").write_text(to_toml(cfg))
    run = str(tmp_path / "run")
    plain = rapid("eval", "--run-dir", run, "--against", "lane", "--games", "4").stdout
    varied = rapid("eval", "--run-dir", run, "--against", "lane", "--games", "4",
                   "--set", "env.options.max_seconds=5.0").stdout
    assert "mean length 20.0" in plain and "mean length 10.0" in varied, (plain, varied)
    out = rapid("eval", "--run-dir", run, "--against", "lane", "--set", "env.options.observe_cooldowns=true",
                check=False)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "does not fit" in out.stderr, out.stderr

"""Typed config: defaults, TOML + overrides, unknown keys, wrong types and values, all errors at once."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rapid.errors import UsageError
from rapid.run import config as C
from rapid.run import config_files as F
from rapid.run.config_validate import validate

ROOT = Path(__file__).resolve().parents[1]


def errors_of(overrides: list[str], path=None) -> str:
    with pytest.raises(UsageError) as info:
        F.load_config(path, overrides)
    msg = str(info.value)
    assert "\n" not in msg, "a config error is one line"
    return msg


def test_defaults_are_valid():
    cfg = F.load_config()
    assert validate(cfg) == []
    assert cfg.ppo.clip == 0.2 and cfg.ppo.gae_lambda == 0.95 and cfg.rollout.bptt == 16
    assert cfg.rollout.upload_interval_s == 60.0
    assert (cfg.ppo.adam_beta1, cfg.ppo.adam_beta2) == (0.9, 0.999)
    d = cfg.derive(seconds_per_step=0.5)
    assert d.gamma == pytest.approx(1 - 0.5 / 100.0)
    assert d.segment_steps == 16 * 4
    assert d.run_dir == os.path.join("runs", "run") and d.store_url == os.path.join("runs", "run", "store")
    assert F.build_config({}) == cfg


def test_every_field_has_a_type_and_sections_are_complete():
    assert set(F.SECTIONS) == {"run", "env", "model", "ppo", "rollout", "optimizer", "league", "eval", "store",
                               "metrics", "pbt"}


def test_shipped_configs_are_valid():
    files = sorted((ROOT / "configs").glob("*.toml"))
    assert files
    for path in files:
        F.load_config(path)


def test_toml_file_and_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[ppo]\nlr = 1e-3\nclip = 0.1\n[env]\nname = "moba"\nnum_games = 8\n'
                    '[env.options]\nheroes_per_side = 2\nlanes = 3\n[league]\nbots = ["idle", "lane"]\n')
    cfg = F.load_config(path, ["ppo.lr=3e-4", "env.options.max_seconds=120", "env.options.lanes=2", "run.name=demo",
                               "metrics.enabled=false", "ppo.zero_sum=true", "rollout.bptt=8", "ppo.horizon_s=50",
                               'run.dir="/tmp/r x"', "league.bots=[\"random\"]"])
    assert cfg.ppo.lr == 3e-4                      # override wins over the file
    assert cfg.ppo.clip == 0.1                     # file wins over the default
    assert cfg.env.name == "moba" and cfg.env.num_games == 8
    assert cfg.env.options == {"heroes_per_side": 2, "lanes": 2, "max_seconds": 120.0}  # nested merge
    assert cfg.run.name == "demo"                  # a bare word is a string
    assert cfg.metrics.enabled is False and cfg.ppo.zero_sum is True
    assert cfg.rollout.bptt == 8 and isinstance(cfg.rollout.bptt, int)
    assert cfg.ppo.horizon_s == 50.0 and isinstance(cfg.ppo.horizon_s, float)  # int → float is lossless
    assert cfg.run.dir == "/tmp/r x"
    assert cfg.league.bots == ["random"]
    # the effective config round-trips through TOML
    out = tmp_path / "out.toml"
    out.write_text(F.to_toml(cfg))
    assert F.load_config(out) == cfg


def test_unknown_section_and_key():
    assert "ppo.lrr: unknown key" in errors_of(["ppo.lrr=1"])
    assert "[nosuch]: unknown section" in errors_of(["nosuch.key=1"])


def test_unknown_keys_in_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[ppo]\nlearning_rate = 1.0\n[extra]\na = 1\n")
    msg = errors_of([], path)
    assert "ppo.learning_rate" in msg and "extra" in msg


def test_bad_files():
    with pytest.raises(UsageError, match="not found"):
        F.load_config("/nonexistent/run.toml")


def test_invalid_toml(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[ppo\nlr = \n")
    with pytest.raises(UsageError, match="TOML"):
        F.load_config(path)


def test_section_must_be_a_table(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("ppo = 3\n")
    assert "[ppo] must be a table" in errors_of([], path)


@pytest.mark.parametrize("override, field", [
    ("ppo.lr=fast", "ppo.lr"),               # a string for a float
    ("rollout.bptt=2.5", "rollout.bptt"),    # a float for an int (lossy)
    ("rollout.bptt=true", "rollout.bptt"),   # a bool is not an int
    ("ppo.zero_sum=1", "ppo.zero_sum"),      # an int is not a bool
    ("run.name=3", "run.name"),              # an int is not a string
    ("env.options=3", "env.options"),        # not a table
    ("league.bots=[1, 2]", "league.bots"),   # list of the wrong item type
    ("ppo.lr.x=1", "ppo.lr"),                # a table for a float
])
def test_wrong_types(override, field):
    assert field in errors_of([override])


def test_malformed_overrides():
    with pytest.raises(UsageError, match="section.key=value"):
        F.load_config(None, ["ppo.lr"])
    with pytest.raises(UsageError, match="section.key"):
        F.load_config(None, ["lr=3"])


# At least one wrong value per section, each named in the error.
BAD_VALUES = {
    "run": [("run.minutes=-1", "run.minutes"), ("run.target_win_rate=1.5", "run.target_win_rate"),
            ("run.name=a/b", "run.name"), ("run.num_workers=-2", "run.num_workers"), ("run.updates=-1", "run.updates")],
    "env": [("env.num_games=0", "env.num_games"), ('env.name=""', "env.name")],
    "model": [("model.hidden=0", "model.hidden"), ("model.lstm=-4", "model.lstm"),
              ("model.encoder_layers=0", "model.encoder_layers")],
    "ppo": [("ppo.lr=-1", "ppo.lr"), ("ppo.lr=nan", "ppo.lr"), ("ppo.clip=0", "ppo.clip"),
            ("ppo.gae_lambda=1.1", "ppo.gae_lambda"), ("ppo.horizon_s=0", "ppo.horizon_s"),
            ("ppo.entropy_begin=1.5", "ppo.entropy_begin"),
            ("ppo.adam_beta1=1.0", "ppo.adam_beta1"), ("ppo.adam_beta2=-0.1", "ppo.adam_beta2"),
            ("ppo.team_spirit=2", "ppo.team_spirit"), ("ppo.entropy_coef=-0.1", "ppo.entropy_coef"),
            ("ppo.max_grad_norm=0", "ppo.max_grad_norm"), ("ppo.adam_eps=0", "ppo.adam_eps"),
            ("ppo.obs_clip=-5", "ppo.obs_clip"), ("ppo.value_coef=-1", "ppo.value_coef")],
    "rollout": [("rollout.bptt=0", "rollout.bptt"), ("rollout.upload_interval_s=0", "rollout.upload_interval_s"),
                ("rollout.max_backlog=0", "rollout.max_backlog"),
                ("rollout.samples_per_segment=0", "rollout.samples_per_segment"),
                ("rollout.param_poll_s=-1", "rollout.param_poll_s")],
    "optimizer": [("optimizer.batch_samples=0", "optimizer.batch_samples"),
                  ("optimizer.max_staleness=-1", "optimizer.max_staleness"),
                  ("optimizer.max_reuse=0", "optimizer.max_reuse"), ("optimizer.device=tpu", "optimizer.device"),
                  ("optimizer.microbatch_samples=100", "optimizer.microbatch_samples"),
                  ("optimizer.buffer_samples=10", "optimizer.buffer_samples"),
                  ("optimizer.publish_every=0", "optimizer.publish_every"),
                  ("optimizer.precision=fp16", "optimizer.precision")],
    "league": [("league.latest_prob=1.5", "league.latest_prob"), ("league.scheme=elo", "league.scheme"),
               ("league.eta=0", "league.eta"), ("league.bot_prob=1.5", "league.bot_prob"),
               ("league.snapshot_every=-1", "league.snapshot_every")],
    "eval": [("eval.games=0", "eval.games"), ("eval.interval_s=-1", "eval.interval_s"),
             ("eval.core_share=1.5", "eval.core_share"), ("eval.pool_games=-2", "eval.pool_games"),
             ("eval.play=argmax", "eval.play"), ("eval.early_interval_s=-1", "eval.early_interval_s"),
             ("eval.early_s=-1", "eval.early_s")],
    "store": [("store.max_attempts=0", "store.max_attempts"), ("store.retention_s=-1", "store.retention_s")],
    "metrics": [("metrics.base_port=70000", "metrics.base_port"), ("metrics.base_port=-1", "metrics.base_port")],
    "pbt": [("pbt.members=-1", "pbt.members"), ("pbt.member=3", "pbt.member"), ("pbt.members=1", "pbt.members"),
            ("pbt.search.clip=[0.3, 0.1]", "pbt.search.clip")],
}


def test_bad_values_cover_every_section():
    assert set(BAD_VALUES) == set(F.SECTIONS)


@pytest.mark.parametrize("override, field", [case for cases in BAD_VALUES.values() for case in cases])
def test_wrong_value_names_the_field(override, field):
    msg = errors_of([override])
    assert field in msg
    assert msg.startswith("invalid config")


def test_all_errors_reported_at_once(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[ppo]\nlr = -1.0\nbogus = 1\n[model]\nlstm = 0\n")
    msg = errors_of(["rollout.bptt=0", "metrics.base_port=99999", "eval.games=x", "league.scheme=elo"], path)
    for field in ("ppo.lr", "ppo.bogus", "model.lstm", "rollout.bptt", "metrics.base_port", "eval.games",
                  "league.scheme"):
        assert field in msg, (field, msg)
    assert msg.count(";") >= 6


def test_validate_lists_errors_without_raising():
    cfg = C.Config()
    cfg.ppo.lr = -1.0
    cfg.model.hidden = 0
    errs = validate(cfg)
    assert len(errs) == 2 and any("ppo.lr" in e for e in errs) and any("model.hidden" in e for e in errs)


def test_every_field_is_documented_typed_dataclass():
    for name, cls in F.SECTIONS.items():
        cls = C.Config.__dataclass_fields__[name].default_factory
        assert dataclasses.is_dataclass(cls)


def _rapid_cli() -> list[str]:
    exe = Path(sys.executable).with_name("rapid")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from rapid.cli import main; sys.exit(main())"]


@pytest.mark.skipif(not (ROOT / "rapid" / "cli.py").exists(), reason="rapid/cli.py not written yet")
@pytest.mark.parametrize("args, field", [
    (["--set", "ppo.lr=-1"], "ppo.lr"),
    (["--set", "nosuch.key=1"], "nosuch"),
    (["--set", "rollout.bptt=0", "--set", "model.lstm=0"], "model.lstm"),
])
def test_cli_config_show_bad_value_exit_2(args, field, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([*_rapid_cli(), "config", "show", *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert field in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(not (ROOT / "rapid" / "cli.py").exists(), reason="rapid/cli.py not written yet")
def test_cli_config_show_prints_effective_config(tmp_path):
    proc = subprocess.run([*_rapid_cli(), "config", "show", "--set", "ppo.lr=0.00123"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr
    assert "0.00123" in proc.stdout and "[ppo]" in proc.stdout


def test_password_in_endpoint_url_is_redacted_in_show_and_saved_config(tmp_path):
    from rapid.run.config_files import redact_url

    secret = "Pa55w0rdCanary"
    url = f"http://minio-user:{secret}@127.0.0.1:9000"
    out = subprocess.run([*_rapid_cli(), "config", "show", "--set", f'store.endpoint_url="{url}"'],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and secret not in out.stdout + out.stderr
    assert 'endpoint_url = "http://minio-user:***@127.0.0.1:9000"' in out.stdout
    cfg = F.load_config(None, [f'store.endpoint_url="{url}"'])
    assert secret not in F.to_toml(cfg) and cfg.store.endpoint_url == url, "redacted on output only"
    assert redact_url("s3://bucket/x") == "s3://bucket/x" and redact_url("") == ""

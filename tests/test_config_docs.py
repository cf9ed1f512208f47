"""One source of config: every field documented and listed by `rapid config show --doc`; the env's options typed
by the env and checked when the config is loaded, so a bad option is one line and exit 2 before anything starts."""

from __future__ import annotations

import dataclasses
import typing

import pytest

import rapid.run.config as C
import rapid.run.config_files as F
from rapid.envs.moba import MobaConfig
from rapid.errors import UsageError
from rapid.run.config_schema import describe, field_docs
from tests.helpers import rapid

TYPED = "tests.pz_typed_options"


def config_fields():
    for section in dataclasses.fields(C.Config):
        cls = typing.get_type_hints(C.Config)[section.name]
        for f in dataclasses.fields(cls):
            yield section.name, cls, f.name


def test_every_config_field_has_a_doc():
    missing = [f"{s}.{name}" for s, cls, name in config_fields() if not field_docs(cls).get(name)]
    assert missing == []


def test_every_moba_option_has_a_doc():
    docs = field_docs(MobaConfig)
    assert [f.name for f in dataclasses.fields(MobaConfig) if not docs.get(f.name)] == []


def test_config_show_doc_lists_every_field_with_type_default_and_doc():
    out = rapid("config", "show", "--doc", "--config", "configs/moba-1v1.toml", "--set", "ppo.lr=1e-4").stdout
    for section, cls, name in config_fields():
        assert f"{section}.{name}: " in out, name
    assert "ppo.lr: float = 0.0001  (default 0.0003)\n    Adam learning rate at the start of the run." in out
    assert "rollout.bptt: int = 16\n    Decisions of one agent per sample (truncated BPTT length)" in out
    # the env's options, as moba types them: set ones with their default, the others at their default
    assert "env.options.heroes_per_side: int = 1\n" in out
    assert "env.options.tower_hp: float = 500.0  (default 1400.0)" in out
    assert "env.options.max_seconds: float = 300.0\n" in out  # set to its default: no "(default …)"
    assert "env.options.tower_x: tuple[float, float] = (30.0, 16.0)" in out
    assert "(no doc)" not in out


def test_describe_an_env_without_an_options_type():
    text = describe(F.load_config("configs/default.toml"))
    assert "connect_four_v3 declares no options type" in text


@pytest.mark.parametrize("override, message", [
    ("env.options.heros_per_side=2", "env.options.heros_per_side: unknown option of moba"),
    ('env.options.max_seconds="long"', "env.options.max_seconds: expected float, got str 'long'"),
    ("env.options.heroes_per_side=2.5", "env.options.heroes_per_side: expected int"),
    ("env.options.tower_x=[1, 2, 3]", "env.options.tower_x: expected tuple[float, float]"),
    ("env.options.heroes_per_side=9", "env.options: moba: heroes_per_side must be 1..5, got 9"),
])
def test_moba_options_are_checked_at_load(override, message):
    with pytest.raises(UsageError) as e:
        F.load_config(None, ["env.name=moba", override])
    assert message in str(e.value)


def test_moba_options_are_converted_and_every_error_is_reported_together():
    cfg = F.load_config(None, ["env.name=moba", "env.options.max_seconds=120", "env.options.tower_x=[20, 10]"])
    assert cfg.env.options == {"max_seconds": 120.0, "tower_x": [20.0, 10.0]}
    assert isinstance(cfg.env.options["max_seconds"], float)
    with pytest.raises(UsageError) as e:
        F.load_config(None, ["env.name=moba", "env.options.lane=2", "ppo.lr=-1", "env.options.max_seconds=true"])
    assert str(e.value).count("env.options.") == 2 and "ppo.lr" in str(e.value)


def test_an_env_name_that_is_no_env_is_a_config_error():
    with pytest.raises(UsageError, match="env.name: cannot import env 'no_such.env_v0'"):
        F.load_config(None, ["env.name=no_such.env_v0"])


def test_a_pettingzoo_module_declares_its_options_type():
    cfg = F.load_config(None, [f"env.name={TYPED}", "env.options.max_steps=7"])
    assert cfg.env.options == {"max_steps": 7}
    for override, message in (("env.options.maxsteps=7", "env.options.maxsteps: unknown option of " + TYPED),
                              ("env.options.max_steps=0", "max_steps must be ≥ 1, got 0")):
        with pytest.raises(UsageError, match=message):
            F.load_config(None, [f"env.name={TYPED}", override])
    assert "env.options.die_at: int = 2\n    Step at which blue_1 leaves the game." in describe(cfg)


def test_train_with_a_mistyped_moba_option_starts_nothing(tmp_path):
    run = tmp_path / "typo"
    out = rapid("train", "--run-dir", str(run), "--minutes", "0.2", "--no-progress", "--set", "env.name=moba",
                "--set", "env.options.heros_per_side=2", check=False, timeout=90)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr == "rapid: error: invalid config: env.options.heros_per_side: unknown option of moba\n"
    assert out.stdout == ""
    assert not run.exists(), "the run directory was created before the config was checked"

"""The Python API (rapid.load_policy, TrainedPolicy.act) and the PettingZoo adapter (rapid.PettingZooAgent).

Tiny untrained policies, no training: about 3 s on 2 cores. rapid.train runs in the README's examples
(tests/test_readme_examples.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from pettingzoo.classic import connect_four_v3, tictactoe_v3

import rapid
from rapid.api import load_policy, publish_untrained
from rapid.envs.moba.pz import MobaParallelEnv
from rapid.envs.registry import make_env
from rapid.errors import UsageError
from rapid.infra.store import LocalStore
from rapid.roles.startup import build_policy, env_spec
from rapid.run.config_files import load_config
from rapid.run.matches import PolicyPlayer
from rapid.run.param_store import ParameterStore

TINY = ["model.hidden=16", "model.lstm=16"]
MOBA = ["env.name=moba", "env.options.max_seconds=30", *TINY]


@pytest.fixture(scope="module")
def c4_run(tmp_path_factory):
    torch.manual_seed(0)
    return publish_untrained(load_config(None, TINY), tmp_path_factory.mktemp("c4") / "run")


def test_rapid_exposes_the_api_lazily():
    code = ("import sys, rapid; assert 'torch' not in sys.modules and 'rapid.api' not in sys.modules; "
            "f = rapid.load_policy; assert 'rapid.api' in sys.modules; print(f.__module__, rapid.PettingZooAgent)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("rapid.api <class 'rapid.agents.pz_agent.PettingZooAgent'>")
    with pytest.raises(AttributeError):
        rapid.no_such_thing  # noqa: B018


def test_load_policy_from_run_dir_and_store_url(c4_run):
    policy = load_policy(c4_run)
    assert (policy.version, policy.env_name) == (1, "pettingzoo.classic.connect_four_v3")
    params = ParameterStore(LocalStore(c4_run / "store"))
    params.publish(2, policy.model.tensors())
    assert load_policy(c4_run).version == 2 and load_policy(c4_run, "v1").version == 1
    by_url = load_policy(c4_run / "store", 1, config=c4_run / "config.toml")
    cfg = load_config(c4_run / "config.toml")
    assert load_policy(c4_run / "store", "v2", config=cfg).version == 2 and cfg.store.url == "", "the caller's Config"
    obs = np.random.default_rng(0).normal(size=(3, 84)).astype(np.float32)
    a, b = (p.act(obs, None, p.initial_state(3), greedy=True) for p in (policy, by_url))
    np.testing.assert_array_equal(a.actions, b.actions)
    np.testing.assert_array_equal(a.value, b.value)


def test_act_carries_the_lstm_state(c4_run):
    policy = load_policy(c4_run)
    obs = np.random.default_rng(1).normal(size=(2, 84)).astype(np.float32)
    first = policy.act(obs, None, None, greedy=True)
    second = policy.act(obs, None, first.state, greedy=True)
    assert not np.allclose(first.state[0], second.state[0]), "the state moves on"
    again = policy.act(obs, None, policy.initial_state(2), greedy=True)
    np.testing.assert_array_equal(first.value, again.value)
    mask = np.zeros((2, 7), bool)
    mask[:, 3] = True
    assert (policy.act(obs, mask, None).actions == 3).all(), "a sampled action respects the mask"


@pytest.mark.parametrize("source, version, message", [
    ("missing", "latest", "no such run directory"),
    (".", "latest", "is not a run directory (no config.toml)"),
    ("RUN", "9", "parameter version 9 is not in the store"),
    ("RUN", "v-1", "is not a version"),
])
def test_bad_sources_and_versions_are_one_line(c4_run, tmp_path, source, version, message):
    source = c4_run if source == "RUN" else tmp_path / source
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_policy(source, version)


def test_a_version_of_another_shape_or_env_is_refused(c4_run, tmp_path):
    run = publish_untrained(load_config(None, TINY), tmp_path / "run")
    other = build_policy(load_config(None, ["model.hidden=8", "model.lstm=8"]), env_spec(load_config(None)))
    ParameterStore(LocalStore(run / "store")).publish(2, other.tensors())
    with pytest.raises(UsageError, match="parameter version 2 does not fit this config's model"):
        load_policy(run)
    with pytest.raises(UsageError, match="plays pettingzoo.classic.connect_four_v3, not moba"):
        load_policy(run, 1, env="moba")
    with pytest.raises(UsageError, match="observations have 9 values; this policy .* takes 84"):
        load_policy(run, 1).act(np.zeros((1, 9), np.float32))
    with pytest.raises(UsageError, match=r"this env's agents \['player_1', 'player_2'\] are not those of"):
        rapid.PettingZooAgent(load_policy(run, 1), tictactoe_v3.env())


def test_pettingzoo_agent_plays_aec_as_the_vector_env_does(c4_run):
    """Greedy self-play through PettingZoo's own AEC loop makes the moves PolicyPlayer makes in rapid's
    vector env: the adapter lays out observations and masks as training saw them."""
    policy = load_policy(c4_run)
    env = connect_four_v3.env()
    env.reset(seed=0)
    agent = rapid.PettingZooAgent(policy, env, greedy=True)
    moves = []
    for name in env.agent_iter():
        obs, _, terminated, truncated, info = env.last()
        action = None if terminated or truncated else agent.act(name, obs, info)
        moves += [] if action is None else [action]
        env.step(action)
    vec = make_env(policy.env_name, num_games=1)
    player = PolicyPlayer(policy.model, vec.spec, "v1", greedy=True)
    step, expected = vec.reset(seed=0), []
    while not step.episodes:
        actions = player.act(step)
        expected.append(int(actions[0, step.active[0].argmax(), 0]))
        step = vec.step(actions)
    assert moves == expected and len(moves) >= 7


def test_pettingzoo_agent_plays_a_parallel_env_as_the_vector_env_does(tmp_path):
    torch.manual_seed(0)
    policy = load_policy(publish_untrained(load_config(None, MOBA), tmp_path / "moba"))
    env = MobaParallelEnv(max_seconds=30)
    observations, infos = env.reset(seed=3)
    agent = rapid.PettingZooAgent(policy, env, greedy=True)
    vec = make_env("moba", num_games=1, seed=3, options={"max_seconds": 30})
    player = PolicyPlayer(policy.model, vec.spec, "v1", greedy=True)
    step = vec.reset(seed=3)
    for _ in range(40):
        actions = agent.act_parallel(observations, infos)
        expected = player.act(step)
        assert sorted(actions) == list(env.possible_agents)
        for i, name in enumerate(env.possible_agents):
            np.testing.assert_array_equal(actions[name], expected[0, i])
        observations, _, _, _, infos = env.step(actions)
        step = vec.step(expected)
    assert set(agent.last_value) == set(env.possible_agents)
    with pytest.raises(UsageError, match=r"agent side0_hero0 observes 109 values .* takes ≤ 101 values"):
        rapid.PettingZooAgent(policy, MobaParallelEnv(max_seconds=30, observe_cooldowns=True))

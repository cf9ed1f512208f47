"""`rapid export`: the exported policy computes what rapid's policy computes, and runs without rapid.

Untrained policies built from the shipped configs (connect four with its convolutions, moba 5v5), given a
normalizer and return scale of their own so those are checked too, play 100 steps with game starts in them.
The in-process checks take about 4 s; the fresh virtual environment (torch==2.13.0 and onnxruntime from
pip, no rapid) 15-20 s on a quiet 2-core machine, most of it pip unpacking torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rapid.api import TrainedPolicy, load_policy, publish_untrained
from rapid.cli import main
from rapid.infra.store import LocalStore
from rapid.run.config_files import load_config
from rapid.run.param_store import ParameterStore
from tests.helpers import ROOT

STEPS = 100
TOL = 1e-5
# (config, overrides, games): moba's games cut at 20 s (40 steps), so 100 steps hold two game starts.
CASES = {"connect_four": ("configs/default.toml", [], 4),
         "moba_5v5": ("configs/moba-5v5.toml", ["env.options.max_seconds=20.0"], 1)}


def trained_looking(tmp: Path, name: str) -> TrainedPolicy:
    """v2 of a run: the config's untrained model with normalizer statistics and a return scale of its own."""
    path, overrides, _ = CASES[name]
    torch.manual_seed(1)
    run = publish_untrained(load_config(ROOT / path, overrides), tmp / name)
    model = load_policy(run).model
    dim = model.obs_dim
    model.obs_norm.set(torch.tensor(500.0, dtype=torch.float64), torch.linspace(-0.5, 0.5, dim, dtype=torch.float64),
                       torch.linspace(0.05, 3.0, dim, dtype=torch.float64))
    model.return_scale.fill_(2.5)
    ParameterStore(LocalStore(run / "store")).publish(2, model.tensors())
    return load_policy(run)


def play(policy: TrainedPolicy, games: int) -> list[dict]:
    """STEPS steps of greedy self-play, rapid's policy stepping the agents the rollout worker steps; each
    step's inputs for an exported policy (``first``: the agent's game started since it last moved) and rapid's
    outputs: greedy actions, value, state, the greedy action's log-prob and a sampled action with its log-prob."""
    env = policy.make_env(num_games=games, seed=5)
    step = env.reset(seed=5)
    n = games * policy.spec.num_agents
    h, c = (torch.from_numpy(x) for x in policy.initial_state(n))
    first = np.ones(n, bool)
    records, starts = [], 0
    torch.manual_seed(2)
    for _ in range(STEPS):
        first |= np.repeat(step.done, policy.spec.num_agents)
        starts += int(step.done.sum())
        rows = np.flatnonzero(policy.spec.moving(step.active).reshape(n))
        obs = torch.from_numpy(step.obs.reshape(n, -1))[rows]
        mask = torch.from_numpy(step.action_mask.reshape(n, -1))[rows]
        keep = torch.from_numpy(~first[rows]).float().unsqueeze(-1)
        h0, c0 = h[rows] * keep, c[rows] * keep
        greedy = policy.model.act(obs, mask, (h0, c0), greedy=True)
        sampled = policy.model.act(obs, mask, (h0, c0))
        records.append({"obs": obs.tolist(), "mask": mask.tolist(), "h": h[rows].tolist(), "c": c[rows].tolist(),
                        "first": first[rows].tolist(), "actions": greedy.actions.tolist(),
                        "value": greedy.value.tolist(), "h_out": greedy.state[0].tolist(),
                        "c_out": greedy.state[1].tolist(), "logp": greedy.logp.tolist(),
                        "sampled": sampled.actions.tolist(), "sampled_logp": sampled.logp.tolist()})
        h[rows], c[rows] = greedy.state
        first[rows] = False
        actions = np.zeros((n, len(policy.spec.action_heads)), np.int64)
        actions[rows] = greedy.actions.numpy()
        step = env.step(actions.reshape(games, policy.spec.num_agents, -1))
    assert starts >= 2, "the steps hold game starts"
    return records


def check(records: list[dict], outputs: list[list], heads: tuple[int, ...]) -> None:
    """An exported policy's outputs (actions, logp of every action, value, h, c) against rapid's."""
    offsets = np.concatenate([[0], np.cumsum(heads)[:-1]])
    assert len(outputs) == len(records) == STEPS
    for rec, (actions, logp, value, h, c) in zip(records, outputs):
        np.testing.assert_array_equal(np.asarray(actions), rec["actions"])
        for key, got in (("value", value), ("h_out", h), ("c_out", c)):
            np.testing.assert_allclose(np.asarray(got, np.float32), rec[key], rtol=0, atol=TOL, err_msg=key)
        logp = np.asarray(logp, np.float64)
        for chosen, want in (("actions", "logp"), ("sampled", "sampled_logp")):
            picked = np.take_along_axis(logp, np.asarray(rec[chosen]) + offsets, 1).sum(1)
            np.testing.assert_allclose(picked, rec[want], rtol=0, atol=TOL, err_msg=chosen)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """Each case: rapid's records and its policy exported in both formats (through `rapid export`)."""
    tmp = tmp_path_factory.mktemp("export")
    cases = {}
    for name, (_, _, games) in CASES.items():
        policy = trained_looking(tmp, name)
        files = {}
        for fmt, ext in (("torchscript", "pt"), ("onnx", "onnx")):
            files[fmt] = tmp / f"{name}.{ext}"
            assert main(["export", "--run-dir", str(tmp / name), "--version", "v2", "--format", fmt,
                         "--out", str(files[fmt])]) == 0
        cases[name] = {"records": play(policy, games), "files": files, "heads": policy.spec.action_heads}
    (tmp / "records.json").write_text(json.dumps({k: v["records"] for k, v in cases.items()}))
    return {"tmp": tmp, "cases": cases}


TORCH_RUNNER = """
import importlib.util, json, sys, torch
assert importlib.util.find_spec("rapid") is None, "rapid is importable"
records, out = json.load(open(sys.argv[2])), {}
for name, path in json.loads(sys.argv[1]).items():
    extra = {"rapid.json": ""}
    module = torch.jit.load(path, _extra_files=extra)
    assert json.loads(extra["rapid.json"])["version"] == 2
    out[name] = [[t.tolist() for t in module(torch.tensor(r["obs"]), torch.tensor(r["mask"]), torch.tensor(r["h"]),
                                             torch.tensor(r["c"]), torch.tensor(r["first"]))]
                 for r in records[name]]
print(json.dumps(out))
"""

ONNX_RUNNER = """
import importlib.util, json, sys
import numpy as np, onnxruntime
assert importlib.util.find_spec("rapid") is None, "rapid is importable"
records, out = json.load(open(sys.argv[2])), {}
for name, path in json.loads(sys.argv[1]).items():
    session = onnxruntime.InferenceSession(path)
    assert json.loads(session.get_modelmeta().custom_metadata_map["rapid.json"])["version"] == 2
    types = {"obs": np.float32, "mask": bool, "h": np.float32, "c": np.float32, "first": bool}
    out[name] = [[o.tolist() for o in session.run(None, {k: np.asarray(r[k], t) for k, t in types.items()})]
                 for r in records[name]]
assert "torch" not in sys.modules
print(json.dumps(out))
"""


def run_exported(python: str, runner: str, files: dict[str, Path], records: Path) -> dict:
    out = subprocess.run([python, "-I", "-c", runner, json.dumps({k: str(v) for k, v in files.items()}),
                          str(records)], capture_output=True, text=True, timeout=120, cwd=records.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize("name", sorted(CASES))
def test_exported_policies_compute_what_rapid_computes(exported, name):
    import onnxruntime

    case = exported["cases"][name]
    module = torch.jit.load(str(case["files"]["torchscript"]))
    session = onnxruntime.InferenceSession(str(case["files"]["onnx"]))
    types = {"obs": torch.float32, "mask": torch.bool, "h": torch.float32, "c": torch.float32, "first": torch.bool}
    torchscript = [[t.tolist() for t in module(*(torch.tensor(r[k], dtype=t) for k, t in types.items()))]
                   for r in case["records"]]
    check(case["records"], torchscript, case["heads"])
    onnx = [[o.tolist() for o in session.run(None, {k: torch.tensor(r[k], dtype=t).numpy() for k, t in types.items()})]
            for r in case["records"]]
    check(case["records"], onnx, case["heads"])


@pytest.mark.timeout(300)
def test_exported_files_run_in_a_fresh_venv_without_rapid(exported, tmp_path):
    """torch alone runs the TorchScript file; onnxruntime alone (torch never imported) the ONNX one."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile", "torch==2.13.0",
                    "onnxruntime"], check=True, timeout=240, capture_output=True)
    records = exported["tmp"] / "records.json"
    cases = exported["cases"]
    for fmt, runner in (("torchscript", TORCH_RUNNER), ("onnx", ONNX_RUNNER)):
        outputs = run_exported(python, runner, {k: v["files"][fmt] for k, v in cases.items()}, records)
        for name, case in cases.items():
            check(case["records"], outputs[name], case["heads"])


def test_export_refusals_are_one_line(exported, tmp_path, monkeypatch, capsys):
    run = str(exported["tmp"] / "connect_four")
    for args, message in (
            (["--run-dir", str(tmp_path / "none")], "no such run directory"),
            (["--run-dir", run, "--version", "7"], "parameter version 7 is not in the store"),
            (["--run-dir", run, "--out", str(tmp_path / "no" / "p.pt")], "no folder"),
            (["--run-dir", run, "--format", "onnx", "--out", str(tmp_path / "p.onnx")], "one ONNX file holds less")):
        monkeypatch.setattr("rapid.agents.export.ONNX_MAX_BYTES", 1000)  # this policy's weights are 130 kB
        assert main(["export", "--out", str(tmp_path / "p.pt"), *args]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "p.onnx").exists()
    (Path(run) / "store" / "params" / "000000000001.rpm").write_bytes(b"not a params object")
    assert main(["export", "--run-dir", run, "--version", "1", "--out", str(tmp_path / "p.pt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rapid: FormatError: ") and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "p.pt").exists()

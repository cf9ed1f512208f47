"""Issue 12, items 7 and 8: no run is ever left unresumable.

The end-to-end tests copy one finished real run (`rapid train`, LocalStore), damage its store the way a
kill or a bad update would, and resume it with the real command. The unit tests drive
:func:`rapid.optimizer.checkpoints.resume_point` with a real policy and Adam.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rapid.errors import FormatError, UsageError
from rapid.formats import codec
from rapid.formats.checkpoint import FORMAT as CHECKPOINT_FORMAT
from rapid.formats.checkpoint import FORMAT_VERSION as CHECKPOINT_FORMAT_VERSION
from rapid.formats.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from rapid.formats.params import ParamsObject, encode_params
from rapid.infra.store import LocalStore
from rapid.opt.model import Policy
from rapid.optimizer.checkpoints import check_checkpoint, load_checkpoint, resume_point, save_checkpoint
from rapid.roles import optimizer as optimizer_role
from rapid.roles.startup import StopFlag
from rapid.run.config_files import load_config
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import CHECKPOINTS_LATEST, checkpoint_key, params_key, write_version_pointer
from tests.helpers import rapid

SMALL = ["env.num_games=16", "model.hidden=32", "model.lstm=32", "model.encoder_layers=1", "rollout.bptt=8",
         "rollout.samples_per_segment=2", "rollout.upload_interval_s=0.5", "rollout.param_poll_s=0.5",
         "optimizer.batch_samples=32", "optimizer.buffer_samples=2048", "optimizer.poll_s=0.2",
         "optimizer.checkpoint_every=3", "eval.interval_s=0", "league.snapshot_every=0", "ppo.horizon_s=50.0",
         "metrics.enabled=false", "optimizer.balance=false"]  # one version per update: the resume arithmetic below
LOG = logging.getLogger("test")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A real run stopped cleanly after 6 updates: versions 0–6, checkpoints v3 and v6."""
    run = tmp_path_factory.mktemp("finished") / "run"
    sets = [a for s in SMALL for a in ("--set", s)]
    rapid("train", "--run-dir", str(run), "--workers", "1", "--updates", "6", "--no-progress", *sets, timeout=300)
    store = LocalStore(run / "store")
    assert ParameterStore(store).latest_version() == 6 and load_checkpoint(store, 6).updates == 6
    return run


def copy_run(finished_run: Path, tmp_path: Path) -> tuple[Path, LocalStore]:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    return run, LocalStore(run / "store")


def resume(run: Path, updates: int):
    return rapid("train", "--run-dir", str(run), "--resume", "--updates", str(updates), "--no-progress",
                 "--set", "metrics.enabled=false", timeout=300)


def test_killed_between_params_and_latest_resumes_after_the_orphan(finished_run, tmp_path):
    run, store = copy_run(finished_run, tmp_path)
    params = ParameterStore(store)
    # The kill: version 7 written, params/LATEST still at 6 (the checkpoint is at 6 too).
    orphan = encode_params(ParamsObject(7, {k: v + 1 for k, v in params.fetch(6).tensors.items()}, {"updates": 7}))
    store.put(params_key(7), orphan)
    resume(run, 9)
    assert store.get(params_key(7)) == orphan, "the published version 7 is never rewritten"
    versions = params.versions()
    assert versions == list(range(versions[0], versions[-1] + 1)) and versions[-1] >= 10
    log = (run / "logs" / "optimizer.log").read_text()
    assert "resumed from checkpoint v6 (update 6); next version 8" in log
    assert "Traceback" not in log


def test_checkpoint_with_nan_adam_state_falls_back_to_an_older_one(finished_run, tmp_path):
    run, store = copy_run(finished_run, tmp_path)
    bad = decode_checkpoint(store.get(checkpoint_key(6)))
    moment = bad.adam["state"][0]["exp_avg"].copy()
    moment.flat[0] = np.nan
    bad.adam["state"][0]["exp_avg"] = moment
    store.put(checkpoint_key(6), unchecked_bytes(bad))  # what an unchecked save of a broken update leaves
    with pytest.raises(FormatError, match="not finite"):
        load_checkpoint(store, 6)
    resume(run, 9)
    log = (run / "logs" / "optimizer.log").read_text()
    assert "checkpoint v6 is not usable" in log and "resumed from checkpoint v3 (update 3); next version 7" in log
    newest = load_checkpoint(store, ParameterStore(store).latest_version())  # finite, fully checked
    assert newest.updates == 9
    resume(run, 11)  # and the run stays resumable
    assert load_checkpoint(store, ParameterStore(store).latest_version()).updates == 11


def unchecked_bytes(ckpt: Checkpoint) -> bytes:
    """The checkpoint's bytes without the checks ``encode_checkpoint`` makes before it writes: a bad object on
    disk, as an older rapid (or a broken disk) could leave."""
    tree = {"version": ckpt.version, "updates": ckpt.updates, "model": ckpt.model, "adam": ckpt.adam,
            "meta": ckpt.meta}
    return codec.encode(CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION, tree)


# --- unit: the checks and the fallbacks ----------------------------------------------------------------

def trained(seed: int = 0) -> tuple[Policy, torch.optim.Adam]:
    torch.manual_seed(seed)
    policy = Policy(5, (3, 2), hidden=8, encoder_layers=1, lstm=4)
    adam = torch.optim.Adam(policy.parameters(), lr=1e-3)
    for _ in range(2):
        logp, ent, value = policy.evaluate(torch.randn(2, 3, 5), torch.ones(2, 3, 5, dtype=torch.bool),
                                           torch.zeros(2, 3, 2, dtype=torch.int64), torch.zeros(2, 4),
                                           torch.zeros(2, 4), torch.zeros(2, 3, dtype=torch.bool))
        (logp.sum() + value.pow(2).sum()).backward()
        adam.step()
        adam.zero_grad()
    return policy, adam


def ckpt_of(version: int, updates: int, policy: Policy, adam) -> Checkpoint:
    return Checkpoint.from_torch(version, updates, policy.tensors(), adam.state_dict())


def edit(ckpt: Checkpoint, fn) -> Checkpoint:
    copy = decode_checkpoint(encode_checkpoint(ckpt))
    fn(copy)
    return copy


BROKEN = {
    "nan moment": lambda c: c.adam["state"][1].update(exp_avg_sq=np.full_like(c.adam["state"][1]["exp_avg_sq"],
                                                                              np.nan)),
    "inf step": lambda c: c.adam["state"][0].update(step=np.array(np.inf, np.float32)),
    "negative second moment": lambda c: c.adam["state"][0].update(exp_avg_sq=-np.ones_like(
        c.adam["state"][0]["exp_avg_sq"])),
    "moments of two shapes": lambda c: c.adam["state"][0].update(exp_avg=np.zeros(3, np.float32)),
    "parameter in two groups": lambda c: c.adam["param_groups"].append(dict(c.adam["param_groups"][0])),
    "state outside every group": lambda c: c.adam["state"].update({999: dict(c.adam["state"][0])}),
    "nan lr": lambda c: c.adam["param_groups"][0].update(lr=float("nan")),
}


@pytest.mark.parametrize("name", BROKEN)
def test_checkpoint_checks(name):
    ckpt = ckpt_of(4, 40, *trained())
    check_checkpoint(ckpt)
    with pytest.raises(FormatError):
        check_checkpoint(edit(ckpt, BROKEN[name]))


def test_save_refuses_a_non_finite_checkpoint_and_writes_nothing(tmp_path):
    store = LocalStore(tmp_path / "s")
    good = ckpt_of(3, 30, *trained())
    save_checkpoint(store, good, keep=3)
    before = {k: store.get(k) for k in store.list("")}
    with pytest.raises(FormatError):
        save_checkpoint(store, edit(ckpt_of(4, 40, *trained()), BROKEN["nan moment"]), keep=3)
    assert {k: store.get(k) for k in store.list("")} == before


def test_resume_falls_back_checkpoint_by_checkpoint_then_to_published_weights(tmp_path):
    store = LocalStore(tmp_path / "s")
    params = ParameterStore(store)
    policy, adam = trained(1)
    for v in range(8):
        params.publish(v, policy.tensors(), {"updates": 10 * v})
    store.put(checkpoint_key(4), encode_checkpoint(ckpt_of(4, 40, policy, adam)))
    wrong_shape = edit(ckpt_of(5, 50, policy, adam), lambda c: c.adam["state"][0].update(
        exp_avg=np.zeros(7, np.float32), exp_avg_sq=np.zeros(7, np.float32)))
    store.put(checkpoint_key(5), encode_checkpoint(wrong_shape))
    store.put(checkpoint_key(6), b"truncated")
    write_version_pointer(store, CHECKPOINTS_LATEST, 6)
    fresh_policy, fresh_adam = trained(2)
    point = resume_point(store, fresh_policy, fresh_adam, LOG)
    assert (point.version, point.updates, point.source) == (7, 40, "checkpoint v4")
    assert all(np.array_equal(a, b) for a, b in zip(fresh_policy.tensors().values(), policy.tensors().values()))
    # No usable checkpoint at all: the newest published weights, a fresh Adam, the update count they carry.
    for v in (4, 5):
        store.put(checkpoint_key(v), b"x")
    fresh_policy = trained(2)[0]
    fresh_adam = torch.optim.Adam(fresh_policy.parameters(), lr=1e-3)  # as the optimizer role starts
    point = resume_point(store, fresh_policy, fresh_adam, LOG)
    assert (point.version, point.updates) == (7, 70) and point.source.startswith("published v7")
    assert fresh_adam.state_dict()["state"] == {}
    with pytest.raises(UsageError, match="no usable checkpoint"):
        resume_point(LocalStore(tmp_path / "empty"), *trained(), LOG)


def test_no_final_checkpoint_after_an_unexpected_error(tmp_path, monkeypatch):
    cfg = load_config(None, [*SMALL, f'run.dir="{tmp_path / "run"}"'])

    def broken_sample(*args, **kwargs):
        raise RuntimeError("injected: the update loop fails")

    monkeypatch.setattr(optimizer_role.ExperienceBuffer, "sample", broken_sample)
    stop = StopFlag(install_signals=False)
    with pytest.raises(RuntimeError, match="injected"):
        optimizer_role.run_optimizer(cfg, stop=stop)
    store = LocalStore(tmp_path / "run" / "store")
    assert ParameterStore(store).versions() == [0]
    assert store.list("checkpoints/") == [], "a crash never writes a checkpoint"

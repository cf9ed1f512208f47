"""Issue 21, step 3: `rapid surgery` on a real run. A tiny moba run trained by the real command is carried through
new observations (the moba game's ``observe_cooldowns``) and a doubled LSTM; `rapid train --resume` then goes on
in the new shape with the transformed snapshots. Refusals write nothing, and a crash at any write leaves a run
that resumes in its old shape (before the commit) or is finished by running the command again (after it)."""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rapid.envs.registry import make_env
from rapid.errors import UsageError
from rapid.infra.store import LocalStore, Store
from rapid.league import League
from rapid.optimizer.checkpoints import load_latest_checkpoint, resume_point
from rapid.roles.startup import build_policy, env_spec
from rapid.rollout.opponents import LeagueOpponents
from rapid.run.config_files import load_config
from rapid.run.lease import RunLease
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import surgery_states
from rapid.surgery import run_store
from rapid.surgery.__main__ import main as surgery
from tests.helpers import rapid

SMALL = ["env.name=moba", "env.options.max_seconds=30.0", "env.num_games=8", "model.hidden=32", "model.lstm=16",
         "model.encoder_layers=1", "rollout.bptt=8", "rollout.samples_per_segment=2", "rollout.upload_interval_s=0.5",
         "rollout.param_poll_s=0.5", "optimizer.batch_samples=16", "optimizer.poll_s=0.2",
         "optimizer.checkpoint_every=3", "eval.interval_s=0", "league.snapshot_every=2", "metrics.enabled=false",
         "optimizer.balance=false", "store.retention_s=0"]
CHANGE = ["--set", "model.lstm=32", "--set", "env.options.observe_cooldowns=true"]
LOG = logging.getLogger("test")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A real moba run stopped after 6 updates: versions 0–6, checkpoint v6, snapshots v2, v4, v6."""
    run = tmp_path_factory.mktemp("trained") / "run"
    sets = [a for s in SMALL for a in ("--set", s)]
    rapid("train", "--run-dir", str(run), "--workers", "1", "--updates", "6", "--no-progress", *sets, timeout=120)
    return run


def copy_run(trained: Path, tmp_path: Path) -> tuple[Path, LocalStore]:
    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("node-cache", "report"))
    return run, LocalStore(run / "store")


def contents(run: Path) -> dict[str, bytes]:
    """Every file of the run dir but the logs, with its bytes."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()
            and "logs" not in p.parts}


def call(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = surgery(list(argv))
    return code, out.getvalue(), err.getvalue()


def resumed_policy(run: Path, store: Store):
    """What `--resume` loads with the run dir's config: (resume point, policy, cfg)."""
    cfg = load_config(run / "config.toml", [f'run.dir="{run}"'])
    policy = build_policy(cfg, env_spec(cfg))
    adam = torch.optim.Adam(policy.parameters())
    return resume_point(store, policy, adam, LOG), policy, cfg


def test_the_plan_is_shown_and_nothing_is_written(trained, tmp_path):
    run, _ = copy_run(trained, tmp_path)
    before = contents(run)
    code, out, err = call("--run-dir", str(run), *CHANGE)
    assert code == 0, err
    assert "model.lstm: 16 → 32" in out and "lstm.weight_hh_l0 [64, 16] → [128, 32]" in out
    assert "obs_norm.mean [101] → [109]" in out and "snapshots: 3 transformed" in out
    assert "preserved on the run's experience" in out and "preserved on fresh games" in out
    assert contents(run) == before


def test_settle_updates_hold_the_learning_rate_at_zero_after_the_surgery(trained, tmp_path):
    run, store = copy_run(trained, tmp_path)
    code, out, err = call("--run-dir", str(run), *CHANGE, "--settle-updates", "4")
    assert code == 0, err
    assert "ppo.settle_until_update: 0 → 10" in out  # the checkpoint holds 6 updates
    code, _, err = call("--run-dir", str(run), *CHANGE, "--settle-updates", "-1")
    assert code == 2 and "--settle-updates must be 0 or more" in err


def test_surgery_then_resume_goes_on_in_the_new_shape(trained, tmp_path):
    run, store = copy_run(trained, tmp_path)
    old_snapshots = {m: store.get(f"league/snapshots/{m}.rpm") for m in ("v000000000002", "v000000000004")}
    code, out, err = call("--run-dir", str(run), *CHANGE, "--apply")
    assert code == 0, err
    assert surgery_states(store) == {7: True} and not store.list("surgery/000000000007/")
    ckpt = load_latest_checkpoint(store)
    assert (ckpt.version, ckpt.updates, ckpt.model["lstm.weight_hh_l0"].shape) == (7, 6, (128, 32))
    assert ckpt.model["obs_norm.mean"].shape == (109,)
    moments = [e["exp_avg"].shape for e in ckpt.adam["state"].values()]
    assert (128, 32) in moments and all(float(e["step"]) == 6 for e in ckpt.adam["state"].values())
    assert ParameterStore(store).latest_version() == 7
    point, policy, cfg = resumed_policy(run, store)
    assert point.source == "checkpoint v7" and cfg.model.lstm == 32 and cfg.env.options["observe_cooldowns"]
    # Every snapshot loads in the new shape, as a rollout worker loads it.
    env = make_env(cfg.env.name, num_games=2, seed=0, options=cfg.env.options)
    opponents = LeagueOpponents(League(store), cfg, env, lambda: build_policy(cfg, env.spec))
    for member in League(store).read().snapshots():
        assert opponents._build(member.id, "snapshot").policy.lstm_size == 32
        if member.id in old_snapshots:
            assert store.get(f"league/snapshots/{member.id}.rpm") != old_snapshots[member.id]

    # The real command goes on from v7: new versions in the new shape, workers play the snapshots.
    seen = {p: len(p.read_text()) for p in (run / "logs").glob("rollout*.log")}  # the training's own lines
    rapid("train", "--run-dir", str(run), "--resume", "--updates", "9", "--no-progress", "--set",
          "metrics.enabled=false", timeout=120)
    log = (run / "logs" / "optimizer.log").read_text()
    assert "resumed from checkpoint v7 (update 6); next version 8" in log and "Traceback" not in log
    assert "bad experience" not in log  # the old shape's objects went with the surgery
    newest = ParameterStore(store).latest_version()
    assert newest >= 9 and ParameterStore(store).fetch(newest).tensors["lstm.weight_hh_l0"].shape == (128, 32)
    workers = "".join(p.read_text()[seen.get(p, 0):] for p in (run / "logs").glob("rollout*.log"))
    assert "cannot load opponent" not in workers and "Traceback" not in workers
    listed = rapid("league", "ls", "--run-dir", str(run)).stdout
    assert all(m in listed for m in ("v000000000002", "v000000000004", "v000000000006"))


REFUSED = {
    "LSTM units removed": ["--set", "model.lstm=8"],
    "number of encoder layers": ["--set", "model.encoder_layers=2"],
    "observation column": ["--set", "env.options.k_creeps=5"],       # not appended: the slots move
    "nothing for surgery to do": ["--set", "ppo.lr=1e-4"],
}


@pytest.mark.parametrize("why", REFUSED, ids=list(REFUSED))
def test_refusals_are_one_line_exit_2_and_write_nothing(trained, tmp_path, why):
    run, _ = copy_run(trained, tmp_path)
    before = contents(run)
    code, out, err = call("--run-dir", str(run), *REFUSED[why], "--apply")
    assert code == 2 and len(err.strip().splitlines()) == 1 and why in err, err
    assert contents(run) == before


def test_a_run_without_a_checkpoint_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('[env]\nname = "moba"\n')
    code, _, err = call("--run-dir", str(run), *CHANGE, "--apply")
    assert code == 2 and "has no checkpoint" in err


def test_a_run_held_by_another_optimizer_is_refused(trained, tmp_path):
    run, store = copy_run(trained, tmp_path)
    RunLease(store, host="another-host").acquire()
    before = contents(run)
    code, _, err = call("--run-dir", str(run), *CHANGE, "--apply")
    assert code == 2 and "another optimizer holds this run" in err
    assert contents(run) == before


def test_a_transform_that_does_not_preserve_the_policy_is_refused(trained, tmp_path, monkeypatch):
    run, _ = copy_run(trained, tmp_path)
    grow = run_store.grow_tensors

    def naive(tensors, plan, rng, **kw):  # random weights from the new LSTM units into the old ones
        out = grow(tensors, plan, rng, **kw)
        out["lstm.weight_hh_l0"][:16, 16:] = rng.uniform(-0.5, 0.5, (16, 16))
        return out

    monkeypatch.setattr(run_store, "grow_tensors", naive)
    before = contents(run)
    code, _, err = call("--run-dir", str(run), *CHANGE, "--apply")
    assert code == 2 and "not function-preserving" in err, err
    assert contents(run) == before


class CrashingStore(LocalStore):
    """A local store whose process dies at its n-th write (put, put_if_absent or delete) outside the lease."""

    def __init__(self, root, writes: int):
        super().__init__(root)
        self.left = writes

    def _write(self, key: str) -> None:
        if key.startswith("optimizer/lease/"):
            return
        if self.left == 0:
            raise KeyboardInterrupt(f"killed before writing {key}")
        self.left -= 1

    def put(self, key, data):
        self._write(key)
        return super().put(key, data)

    def put_if_absent(self, key, data):
        self._write(key)
        return super().put_if_absent(key, data)

    def delete(self, key):
        self._write(key)
        return super().delete(key)


def test_a_crash_at_any_write_leaves_a_resumable_run(trained, tmp_path):
    """Before the commit the run resumes in its old shape, untouched where any role looks; after it, --resume
    refuses in one line until the command is run again, which finishes the surgery."""
    run, store = copy_run(trained, tmp_path / "probe")
    old_cfg = load_config(run / "config.toml", [f'run.dir="{run}"'])
    new_cfg = load_config(run / "config.toml", [f'run.dir="{run}"', "model.lstm=32",
                                                 "env.options.observe_cooldowns=true"])
    prepared = run_store.prepare(store, old_cfg, new_cfg)
    counter = CrashingStore(run / "store", writes=10_000)
    run_store.stage(counter, prepared), run_store.commit(counter, prepared), run_store.finish(counter, 7, str(run))
    total = 10_000 - counter.left
    staged = len(prepared.snapshots) + 3  # stage's writes: the commit is the next one
    for writes in range(total):
        run, store = copy_run(trained, tmp_path / f"crash{writes}")
        before = contents(run)
        crashing = CrashingStore(run / "store", writes)
        with pytest.raises(KeyboardInterrupt):
            run_store.stage(crashing, prepared)
            run_store.commit(crashing, prepared)
            run_store.finish(crashing, 7, str(run))
        state = surgery_states(store)
        assert (state == {}) == (writes <= staged)
        if not state:  # the commit never happened: everything a role reads is as it was
            assert {k: v for k, v in contents(run).items() if "surgery" not in k} == before
            point, policy, _ = resumed_policy(run, store)
            assert point.source == "checkpoint v6" and policy.lstm_size == 16
            continue
        if not state[7]:
            with pytest.raises(UsageError, match="interrupted after its commit"):
                resumed_policy(run, store)
        code, out, err = call("--run-dir", str(run), "--apply")  # finishes it, or clears what a crash left staged
        assert code == 0 and ("finished surgery v7" in out or state[7]), err
        assert surgery_states(store) == {7: True} and not store.list("surgery/000000000007/")
        point, policy, _ = resumed_policy(run, store)
        assert point.source == "checkpoint v7" and policy.lstm_size == 32


def test_resuming_with_the_config_from_before_the_surgery_is_refused(trained, tmp_path):
    run, store = copy_run(trained, tmp_path)
    old_config = (run / "config.toml").read_text()
    assert call("--run-dir", str(run), *CHANGE, "--apply")[0] == 0
    (run / "config.toml").write_text(old_config)
    with pytest.raises(UsageError, match="went through surgery at v7"):
        resumed_policy(run, store)


def test_surgery_on_an_s3_run(trained, tmp_path, s3_store, s3_server, monkeypatch):
    run, local = copy_run(trained, tmp_path)
    for key in local.list(""):
        s3_store.put(key, local.get(key))
    url = s3_store.url
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    code, out, err = call("--run-dir", str(run), "--store", url, *CHANGE, "--apply")
    assert code == 0, err
    assert surgery_states(s3_store) == {7: True} and ParameterStore(s3_store).latest_version() == 7
    point, policy, cfg = resumed_policy(run, s3_store)
    assert point.source == "checkpoint v7" and policy.lstm_size == 32 and cfg.store.url == url
    for member in League(s3_store).read().snapshots():
        build_policy(cfg, env_spec(cfg), League(s3_store).load_snapshot(member.id).tensors)
    assert np.isfinite(policy.value_head.weight.detach().numpy()).all()

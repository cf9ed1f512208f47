"""Issue 7: the faults a long run on preemptible machines meets, each injected into real processes
(`rapid optimizer`, `rapid rollout`, `rapid train`) against the real stores (LocalStore, moto_server).

No timed asserts: every wait is a hang guard. Figures (faults injected, bytes lost) are printed with -s.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch

from rapid.errors import FormatError
from rapid.formats import codec, experience
from rapid.formats.experience import decode_experience, encode_experience
from rapid.formats.params import decode_params
from rapid.infra.s3 import S3Store
from rapid.infra.store import InvalidKey, LocalStore, open_store
from rapid.league import League
from rapid.monitoring.logs import read_jsonl
from rapid.opt.config import PPOConfig
from rapid.opt.learner import Learner
from rapid.opt.model import Policy
from rapid.optimizer.checkpoints import load_latest_checkpoint
from rapid.roles.startup import env_spec
from rapid.run.config_files import load_config, to_toml
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import params_key
from tests.helpers import RAPID, ROOT, alive, rapid, wait_for, worker_keys
from tests.s3_server import DUMMY_CREDENTIALS, free_port, start_moto_server, stop

# A recognizable secret: it must never show up in a log, a metric, a stored config or an error message.
CANARY = "CanarySecret0xDEADBEEFdoNotLeak"
CANARY_ID = "AKIACANARYKEYID12345"

SMALL = ["env.num_games=16", "model.hidden=32", "model.lstm=32", "model.encoder_layers=1",
         "rollout.bptt=8", "rollout.samples_per_segment=2", "rollout.upload_interval_s=0.5",
         "rollout.param_poll_s=0.5", "optimizer.batch_samples=32", "optimizer.buffer_samples=2048",
         "optimizer.poll_s=0.2", "optimizer.checkpoint_every=5", "optimizer.publish_every=1", "eval.interval_s=0",
         "league.snapshot_every=0", "ppo.horizon_s=50.0"]


def s3_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", **DUMMY_CREDENTIALS)
    env.update(AWS_ACCESS_KEY_ID=CANARY_ID, AWS_SECRET_ACCESS_KEY=CANARY)  # moto accepts any credentials
    env.pop("AWS_PROFILE", None)
    return env


def write_config(tmp: Path, run: Path, *extra: str) -> Path:
    cfg = load_config(None, [*SMALL, f'run.dir="{run}"', *extra])
    path = tmp / "run.toml"
    run.mkdir(parents=True, exist_ok=True)
    path.write_text(to_toml(cfg))
    return path


def spawn(args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([RAPID, *args], stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env=env or dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)


def terminate(proc: subprocess.Popen, timeout: float = 60) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(f"pid {proc.pid} ignored SIGTERM for {timeout}s")
    return proc.returncode


def scrape(run: Path, target: str) -> dict[str, float]:
    """Sums of every metric family of one process, from its /metrics (port in <run>/metrics/<target>.json)."""
    port = json.loads((run / "metrics" / f"{target}.json").read_text())["port"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split("{")[0].split(" ")[0], float(line.rsplit(" ", 1)[1])
            out[name] = out.get(name, 0.0) + value
    return out


def scrape_text(run: Path, target: str) -> str:
    port = json.loads((run / "metrics" / f"{target}.json").read_text())["port"]
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def latest(params: ParameterStore) -> int:
    v = params.latest_version()
    return -1 if v is None else v


def shape_of(cfg_path: Path) -> experience.Shape:
    cfg = load_config(cfg_path)
    spec = env_spec(cfg)
    return experience.Shape(bptt=cfg.rollout.bptt, obs_dim=spec.obs_dim, mask_dim=spec.mask_dim,
                            heads=len(spec.action_heads), lstm=cfg.model.lstm)


def assert_no_canary(*texts_or_dirs) -> None:
    for item in texts_or_dirs:
        if isinstance(item, Path):
            for path in item.rglob("*"):
                if path.is_file():
                    data = path.read_bytes()
                    assert CANARY.encode() not in data and CANARY_ID.encode() not in data, path
        else:
            assert CANARY not in item and CANARY_ID not in item


def make_bucket(endpoint: str, name: str) -> None:
    old = {k: os.environ.get(k) for k in DUMMY_CREDENTIALS}
    os.environ.update(DUMMY_CREDENTIALS)
    try:
        S3Store(f"s3://{name}/run", endpoint_url=endpoint, create_bucket=True)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def s3_reader(endpoint: str, url: str) -> S3Store:
    os.environ.update(DUMMY_CREDENTIALS)
    return S3Store(url, endpoint_url=endpoint)


# -- 1. worker killed mid-upload ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_worker_killed_mid_upload(tmp_path, backend, request):
    run = tmp_path / "run"
    env = None
    if backend == "s3":
        endpoint = request.getfixturevalue("s3_server")
        bucket = f"kill-{os.getpid()}"
        make_bucket(endpoint, bucket)
        extra = [f'store.url="s3://{bucket}/run"', f'store.endpoint_url="{endpoint}"']
        env = s3_env()
    else:
        extra = []
    cfg = write_config(tmp_path, run, *extra, "env.num_games=48", "rollout.max_backlog=4")
    store = s3_reader(endpoint, f"s3://{bucket}/run") if backend == "s3" else LocalStore(run / "store")
    params = ParameterStore(store)
    opt = spawn(["optimizer", "--config", str(cfg)], tmp_path / "optimizer.log", env)
    # A steady worker feeds the optimizer (its reuse bound stops updates without fresh data); "wk" is
    # started and SIGKILLed over and over.
    steady = spawn(["rollout", "--config", str(cfg), "--worker-id", "ws"], tmp_path / "rollout-steady.log", env)
    kills, mid_write = 0, 0
    rng = random.Random(7)
    try:
        wait_for(lambda: latest(params) >= 0, 120, "version 0")
        for i in range(5):
            before = len(worker_keys(store, "wk"))
            worker = spawn(["rollout", "--config", str(cfg), "--worker-id", "wk"], tmp_path / f"rollout-{i}.log", env)
            wait_for(lambda: len(worker_keys(store, "wk")) >= before + 2 or worker.poll() is not None, 120,
                     "the worker's uploads")
            assert worker.poll() is None, (tmp_path / f"rollout-{i}.log").read_text()
            if backend == "local":
                # Kill the moment a temp file shows up: the worker is inside store.put right now.
                folder = run / "store" / "experience" / "s0000"
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and not any(p.name.startswith(".tmp-") for p in folder.iterdir()):
                    time.sleep(0.0005)
            else:
                time.sleep(rng.uniform(0.0, 0.5))  # a random point of the 0.5 s upload cycle
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
            kills += 1
        if backend == "local":
            mid_write = len(list((run / "store" / "experience" / "s0000").glob(".tmp-*")))
        v_after_kills = latest(params)
        # The optimizer keeps training on what the dead workers left: versions keep increasing.
        wait_for(lambda: latest(params) >= v_after_kills + 2 or opt.poll() is not None, 120, "versions to go on")
        assert opt.poll() is None, (tmp_path / "optimizer.log").read_text()
        bad = scrape(run, "optimizer-0").get("rapid_bad_objects_total")
    finally:
        terminate(steady)
        code = terminate(opt)
    assert code == 0
    assert bad == 0, "the optimizer never read a partial object"
    # Every object decodes, and each incarnation's sequence numbers run 0..n-1 without a hole: the last
    # batch of a killed worker is whole (it decodes) or absent (it is not there), never half there.
    shape = shape_of(cfg)
    by_incarnation: dict[str, list[int]] = {}
    sizes = []
    for key in worker_keys(store, "wk"):
        data = store.get(key)
        batch = decode_experience(data, shape)
        sizes.append(len(data))
        _, _, incarnation, seq = key.rsplit("/", 1)[1][: -len(".rxp")].split("-")
        assert batch.seq == int(seq)
        by_incarnation.setdefault(incarnation, []).append(int(seq))
    assert len(by_incarnation) == kills == 5
    for seqs in by_incarnation.values():
        assert sorted(seqs) == list(range(len(seqs)))
    print(f"\n{backend}: {kills} SIGKILLs ({mid_write} landed inside a local write), {len(sizes)} objects of "
          f"{np.mean(sizes) / 1e3:.0f} kB on average all decode, 0 bad objects read")
    log = (tmp_path / "optimizer.log").read_text()
    assert "Traceback" not in log
    if backend == "s3":
        assert_no_canary(run, log)


# -- 2. store outage -------------------------------------------------------------------------------------


def test_store_outage_30s(tmp_path):
    """moto_server is frozen with SIGSTOP for 30 s, then SIGCONT: its socket still accepts connections but
    nothing answers, the nastiest kind of outage (requests hang instead of failing), and unlike a restart
    it loses no data, as a real S3 outage would not. Every role must ride it out."""
    moto, endpoint = start_moto_server()
    run = tmp_path / "run"
    bucket = "outage"
    try:
        make_bucket(endpoint, bucket)
        # league.refresh_s is long because the league sampler re-reads the pool on the stepping thread
        # (rapid/league/sampling.py); see docs/reliability.md, "known gaps".
        cfg = write_config(tmp_path, run, f'store.url="s3://{bucket}/run"', f'store.endpoint_url="{endpoint}"',
                           "rollout.max_backlog=3", "store.max_attempts=3", "league.refresh_s=3600",
                           "rollout.worker_id=w0")
        store = s3_reader(endpoint, f"s3://{bucket}/run")
        params = ParameterStore(store)
        env = s3_env()
        opt = spawn(["optimizer", "--config", str(cfg)], tmp_path / "optimizer.log", env)
        worker = spawn(["rollout", "--config", str(cfg), "--worker-id", "w0"], tmp_path / "rollout.log", env)
        procs = (opt, worker)
        try:
            wait_for(lambda: latest(params) >= 3 or any(p.poll() is not None for p in procs), 180, "version 3")
            assert all(p.poll() is None for p in procs)
            wait_for(lambda: (run / "metrics" / "rollout-0.json").exists(), 30, "rollout metrics")
            before = scrape(run, "rollout-0")
            v_before = latest(params)
            os.kill(moto.pid, signal.SIGSTOP)
            outage_start = time.monotonic()
            time.sleep(5)
            early = scrape(run, "rollout-0")
            backlogs = []
            while time.monotonic() - outage_start < 30:
                m = scrape(run, "rollout-0")
                backlogs.append(m["rapid_upload_backlog_objects"])
                time.sleep(1)
            during = scrape(run, "rollout-0")
            opt_metrics = scrape(run, "optimizer-0")
            assert all(p.poll() is None for p in procs), "no process crashes"
        finally:
            os.kill(moto.pid, signal.SIGCONT)
        # Rollout kept stepping all through the outage, and its backlog stayed bounded: at most
        # max_backlog waiting + the one upload in flight; the oldest were dropped and counted.
        assert during["rapid_agent_steps_total"] > early["rapid_agent_steps_total"] > before["rapid_agent_steps_total"]
        assert max(backlogs) <= 3 + 1
        assert during["rapid_upload_dropped_objects_total"] > before["rapid_upload_dropped_objects_total"]
        # After the store is back: the optimizer resumes, versions keep increasing, nothing crashed.
        wait_for(lambda: latest(params) >= max(v_before, int(opt_metrics["rapid_param_version"])) + 3
                 or any(p.poll() is not None for p in procs), 180, "versions after recovery")
        assert all(p.poll() is None for p in procs)
        after = scrape(run, "rollout-0")
        assert after["rapid_samples_uploaded_total"] > during["rapid_samples_uploaded_total"]
        text = scrape_text(run, "rollout-0") + scrape_text(run, "optimizer-0")
        assert terminate(worker) == 0 and terminate(opt) == 0
        # Bytes lost: exactly the dropped objects. What the worker says it uploaded is all in the store.
        rollout_log = (tmp_path / "rollout.log").read_text()
        final = rollout_log.rsplit("worker w0 stopped: ", 1)[1].split("\n")[0]
        uploaded_objects, uploaded_samples = int(final.split(" objects")[0]), int(final.split(", ")[1].split()[0])
        shape = shape_of(cfg)
        stored = [decode_experience(store.get(k), shape) for k in worker_keys(store, "w0")]
        assert len(stored) == uploaded_objects and sum(b.num_samples for b in stored) == uploaded_samples
        assert "upload backlog full: dropped the oldest" in rollout_log
        for log in (rollout_log, (tmp_path / "optimizer.log").read_text()):
            assert "Traceback" not in log
        assert_no_canary(run, text, rollout_log)
        print(f"\noutage: dropped {int(after['rapid_upload_dropped_objects_total'])} objects past the bound "
              f"(max backlog seen {int(max(backlogs))}); {uploaded_objects} uploaded objects all in the store")
    finally:
        stop(moto)


# -- 3. optimizer crash and restart -------------------------------------------------------------------


def test_optimizer_sigkill_then_resume(tmp_path):
    run = tmp_path / "run"
    sets = [a for s in SMALL + ["league.snapshot_every=2", "league.latest_prob=0.5", "optimizer.checkpoint_every=3"]
            for a in ("--set", s)]
    launcher = spawn(["train", "--run-dir", str(run), "--workers", "1", "--no-progress", *sets], tmp_path / "train.log")
    store = LocalStore(run / "store")
    params, league = ParameterStore(store), League(store)
    try:
        wait_for(lambda: latest(params) >= 8 and (run / "store" / "checkpoints" / "LATEST").exists()
                 and len(league.read_or_empty().snapshots()) >= 2 or launcher.poll() is not None, 240,
                 "version 8, a checkpoint and two snapshots")
        opt_pid = json.loads((run / "metrics" / "optimizer-0.json").read_text())["pid"]
        os.kill(opt_pid, signal.SIGKILL)
        os.killpg(launcher.pid, signal.SIGKILL)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    pids = [json.loads(p.read_text())["pid"] for p in (run / "metrics").glob("*.json")]
    wait_for(lambda: not any(alive(pid) for pid in pids), 60, "the orphaned workers to exit")
    last = latest(params)
    ckpt = load_latest_checkpoint(store)
    pool_before = league.read()
    assert ckpt.version <= last
    step_minus_updates = {int(s["step"]) - ckpt.updates for s in ckpt.adam["state"].values()}

    updates_target = ckpt.updates + 8
    rapid("train", "--run-dir", str(run), "--resume", "--updates", str(updates_target), "--no-progress", timeout=240)
    versions = params.versions()
    # Consecutive within the kept window (optimizer.keep_versions): none reused, none skipped.
    assert versions == list(range(versions[0], versions[-1] + 1)) and len(versions) <= 32
    assert versions[-1] > last
    first_new = decode_params(store.get(params_key(last + 1)))
    assert first_new.meta["updates"] > ckpt.updates, "continued from the checkpoint's update count"
    log = (run / "logs" / "optimizer.log").read_text()
    assert f"resumed from checkpoint v{ckpt.version} (update {ckpt.updates}); next version {last + 1}" in log
    # Adam state came back: its step count goes on from the checkpoint's, it did not restart at 0.
    final = load_latest_checkpoint(store)
    assert final.updates >= updates_target
    assert {int(s["step"]) - final.updates for s in final.adam["state"].values()} == step_minus_updates
    # League state and quality scores intact: every member is still there, its counts only grew, and a
    # quality score changed only where new games were folded in.
    pool_after = league.read()
    for m in pool_before.members.values():
        now = pool_after.member(m.id)
        assert now.version == m.version and now.games >= m.games
        assert now.quality == m.quality or now.games > m.games
        if m.kind == "snapshot":
            league.load_policy(m.id)
    print(f"\ncrash/resume: killed at v{last} (checkpoint v{ckpt.version}, update {ckpt.updates}), resumed to "
          f"v{versions[-1]}; {len(pool_before.members)} league members intact")


# -- 4 and 5. hostile, corrupt and numerically extreme objects in a live run --------------------------


class _Exploit:
    """Unpickling this would create a file: it proves nothing on the data path unpickles."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live")
    run = tmp / "run"
    cfg = write_config(tmp, run, "rollout.worker_id=w0")
    opt = spawn(["optimizer", "--config", str(cfg)], tmp / "optimizer.log")
    worker = spawn(["rollout", "--config", str(cfg), "--worker-id", "w0"], tmp / "rollout.log")
    store = LocalStore(run / "store")
    params = ParameterStore(store)
    try:
        wait_for(lambda: latest(params) >= 2 or opt.poll() is not None, 180, "version 2")
        assert opt.poll() is None, (tmp / "optimizer.log").read_text()
        yield {"run": run, "cfg": cfg, "store": store, "params": params, "opt": opt, "tmp": tmp}
    finally:
        assert terminate(worker) == 0
        assert terminate(opt) == 0
        assert "Traceback" not in (tmp / "optimizer.log").read_text()


def hostile_objects(good: bytes, shape, canary: Path) -> dict[str, bytes]:
    batch = decode_experience(good, shape)
    tree = {"worker": "w0", "seq": 1, "created": 1.0, "arrays": dict(batch.arrays), "opponents": batch.opponents,
            "episodes": [], "env_steps": 1}

    def enc(version=experience.FORMAT_VERSION, **changes):
        arrays = {**tree["arrays"], **changes.pop("arrays", {})}
        return codec.encode(experience.FORMAT, version, {**tree, "arrays": arrays, **changes})

    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0x10
    huge_bin = msgpack.packb([experience.FORMAT, 1, 0, b""])[:-1] + b"\xc6\xff\xff\xff\xf0"  # bin32 of ~4 GB
    nested = b"\x91" * 100_000 + b"\xc0"
    wide = b"\xdd\xff\xff\xff\xff"  # array32 declaring 4 billion entries
    ext_bomb = msgpack.packb(msgpack.ExtType(1, msgpack.packb(["float32", [1 << 40, 1 << 40], b""])))
    S = batch.num_samples
    return {
        "truncated": good[: len(good) // 2],
        "bitflip": bytes(flipped),
        "empty": b"",
        "garbage": os.urandom(4096),
        "wrong_format_version": enc(version=99),
        "wrong_format_name": codec.encode("rapid.params", 1, {"version": 1, "tensors": {}, "meta": {}}),
        "wrong_dtype": enc(arrays={"obs": batch.arrays["obs"].astype(np.float64)}),
        "wrong_shape": enc(arrays={"obs": np.zeros((S, shape.bptt, shape.obs_dim + 1), np.float32)}),
        "nan_obs": enc(arrays={"obs": np.full_like(batch.arrays["obs"], np.nan)}),
        "declared_4gb_bin": huge_bin,
        "declared_4g_entries": wide,
        "nesting_bomb": nested,
        "declared_2e24_array": _wrap(ext_bomb),
        "pickle_exploit": pickle.dumps(_Exploit(str(canary))),
        "pickle_in_payload": _wrap(pickle.dumps(_Exploit(str(canary)))),
    }


def _wrap(payload: bytes) -> bytes:
    """A valid envelope (name, version, checksum) around a hostile payload: the checksum is no defence."""
    import zlib

    return msgpack.packb([experience.FORMAT, experience.FORMAT_VERSION, zlib.crc32(payload), payload])


def test_hostile_objects_rejected_counted_skipped(live_run):
    run, store, params, tmp = live_run["run"], live_run["store"], live_run["params"], live_run["tmp"]
    shape = shape_of(live_run["cfg"])
    good = store.get(wait_for(lambda: worker_keys(store, "w0"), 60, "an experience object")[0])
    canary = tmp / "pwned"
    objects = hostile_objects(good, shape, canary)
    for name, data in objects.items():
        with pytest.raises(FormatError):
            decode_experience(data, shape)
        store.put(f"experience/s0000/evil-{name}.rxp", data)
    # Names the store would never write, put on disk behind its back: still counted and skipped.
    shard = run / "store" / "experience" / "s0000"  # the one shard of a one-rank run
    (shard / "evil odd name ü.rxp").write_bytes(good)
    (shard / "evil-notes.txt").write_bytes(b"not an experience object: ignored, not counted")
    (shard / "evil-zzz.rxp").write_bytes(b"\x00garbage" * 100)
    expected_bad = len(objects) + 2
    for key in ("experience/x/../../params/000000000000.rpm", "/etc/passwd", "experience/a\\b.rxp",
                "experience//x.rxp", "experience/x/%2e%2e/y"):
        with pytest.raises(InvalidKey):
            store.put(key, b"x")
    v = latest(params)
    opt = live_run["opt"]
    wait_for(lambda: scrape(run, "optimizer-0")["rapid_bad_objects_total"] >= expected_bad or opt.poll() is not None,
             60, "every hostile object counted")
    assert opt.poll() is None
    wait_for(lambda: latest(params) >= v + 2, 60, "training to go on")
    m = scrape(run, "optimizer-0")
    assert m["rapid_bad_objects_total"] == expected_bad
    assert read_jsonl(run / "logs" / "optimizer.jsonl")[-1]["bad_objects"] == expected_bad
    assert not canary.exists(), "nothing was executed"
    print(f"\nhostile: {expected_bad} bad objects rejected with FormatError, counted and skipped; training went on")


def test_numerically_extreme_experience_skips_updates_in_a_live_run(live_run):
    """Finite but extreme values pass the decoder and overflow inside the update: skipped, counted, and no
    published version ever holds a non-finite tensor."""
    run, store, params = live_run["run"], live_run["store"], live_run["params"]
    shape = shape_of(live_run["cfg"])
    batch = decode_experience(store.get(worker_keys(store, "w0")[-1]), shape)
    batch.arrays["returns"] = np.full_like(batch.arrays["returns"], 3e38)
    batch.arrays["advantages"] = np.full_like(batch.arrays["advantages"], -3e38)
    batch.arrays["version"] = np.full_like(batch.arrays["version"], latest(params))
    skipped_before = scrape(run, "optimizer-0")["rapid_nonfinite_updates_skipped_total"]
    store.put(f"experience/s0000/{int(time.time() * 1000)}-extreme-x-00000000.rxp", encode_experience(batch))
    opt = live_run["opt"]
    wait_for(lambda: scrape(run, "optimizer-0")["rapid_nonfinite_updates_skipped_total"] > skipped_before
             or opt.poll() is not None, 60, "a skipped update")
    v = latest(params)
    wait_for(lambda: latest(params) >= v + 3 or opt.poll() is not None, 90, "training to go on")
    assert opt.poll() is None
    assert max(r["skipped_updates"] for r in read_jsonl(run / "logs" / "optimizer.jsonl")) >= 1
    for version in params.versions():
        params.fetch(version)  # decode_params rejects any non-finite tensor


def test_learner_skips_nonfinite_batches_and_changes_nothing():
    torch.manual_seed(0)
    shape = experience.Shape(bptt=4, obs_dim=5, mask_dim=7, heads=1, lstm=8)
    policy = Policy(5, [7], hidden=16, encoder_layers=1, lstm=8, obs_clip=5.0)
    learner = Learner(policy, PPOConfig())
    rng = np.random.default_rng(0)

    def batch(**edit):
        out = {}
        for name, (dtype, rest) in shape.fields().items():
            full = (6, *rest)
            out[name] = (rng.normal(size=full).astype(dtype) if dtype == "float32"
                         else np.ones(full, bool) if dtype == "bool" else np.zeros(full, dtype))
        return {**out, **edit}

    good = learner.update(batch())
    assert not good["skipped"]
    cases = {"advantages_inf": {"advantages": np.full((6, 4), np.inf, np.float32)},
             "advantages_nan": {"advantages": np.full((6, 4), np.nan, np.float32)},
             "returns_3e38": {"returns": np.full((6, 4), 3e38, np.float32)},
             "obs_3e38": {"obs": np.full((6, 4, 5), 3e38, np.float32)}}
    for name, edit in cases.items():
        before = {k: v.copy() for k, v in policy.tensors().items()}
        adam_before = {k: {n: t.clone() for n, t in s.items()} for k, s in learner.adam.state.items()}
        stats = learner.update(batch(**edit))
        assert stats["skipped"] == 1.0, name
        after = policy.tensors()
        assert all(np.array_equal(before[k], after[k]) for k in before), f"{name}: parameters or normalizers changed"
        assert all(torch.equal(adam_before[p][n], t) for p, s in learner.adam.state.items() for n, t in s.items())
    assert learner.skipped == len(cases) and learner.updates == 1
    assert not learner.update(batch())["skipped"], "the next good batch trains again"
    with pytest.raises(ValueError, match="non-finite"):
        ParameterStore(open_store(str(Path("/tmp") / f"rapid-nf-{os.getpid()}"))).publish(
            0, {"w": np.array([1.0, np.inf], np.float32)})


# -- 6. bad configuration and arguments ---------------------------------------------------------------

BAD_PER_SECTION = ["run.minutes=-1", "env.num_games=0", "model.lstm=0", "ppo.clip=0", "rollout.bptt=0",
                   "optimizer.device=tpu", "league.scheme=elo", "eval.games=0", "store.max_attempts=0",
                   "metrics.base_port=70000"]


def _one_line_error(out, code=2, field=""):
    assert out.returncode == code, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert field in lines[0], (field, lines[0])


@pytest.mark.parametrize("bad", BAD_PER_SECTION)
def test_train_bad_value_per_section_exit_2_and_no_run_dir(tmp_path, bad):
    run = tmp_path / "run"
    out = rapid("train", "--run-dir", str(run), "--no-progress", "--set", bad, check=False, timeout=60)
    _one_line_error(out, 2, bad.split("=")[0])
    assert not run.exists(), "a bad config never starts a run, not even its directory"


@pytest.mark.parametrize("args, field", [
    (["optimizer", "--config", "/nonexistent.toml"], "not found"),
    (["rollout", "--set", "rollout.max_backlog=0"], "rollout.max_backlog"),
    (["rollout", "--set", "ppo.lr=fast"], "ppo.lr"),
    (["optimizer", "--set", "store.url=ftp://host/x"], "store"),
    (["optimizer", "--set", "env.name=no.such.game"], "env.name"),
    (["eval", "--run-dir", "/nonexistent-run"], "no such run directory"),
    (["train", "--workers", "-1"], "run.num_workers"),
    (["train", "--bogus-flag"], "unrecognized"),
])
def test_role_bad_arguments_exit_2(tmp_path, args, field):
    out = subprocess.run([RAPID, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    _one_line_error(out, 2, field)  # argparse errors too: one line, no usage block
    # No store and no run state; a role that got as far as its metrics exporter leaves only its scrape-target
    # file runs/<name>/metrics/*.json (known gap, docs/reliability.md).
    # (an unknown game is found after the local store folder was opened: it stays empty, see known gaps)
    assert not list(tmp_path.glob("runs/*/store/*")) and not list(tmp_path.glob("runs/*/config.toml"))


def test_unreachable_s3_store_one_line_no_secret(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    sets = ["--set", "store.url=s3://bucket-x/run", "--set", f"store.endpoint_url={dead}",
            "--set", "store.max_attempts=1", "--set", "metrics.enabled=false"]
    out = subprocess.run([RAPID, "optimizer", *sets], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=s3_env())
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if " INFO " not in line]  # role log lines aside
    assert len(errors) == 1 and errors[0].startswith("rapid: StoreError"), out.stderr
    assert "127.0.0.1" in out.stderr
    assert_no_canary(out.stderr, out.stdout)


# -- 7. secrets and keys ------------------------------------------------------------------------------

ESCAPING = ["..", "../x", "a/../../b", "/abs/path", "a//b", "a\\b", "./a", "a/.", "", "a b", "ü", "a\x00b",
            "~/x", ".hidden/..", "a/" + "x" * 600, "C:\\x"]


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_store_keys_cannot_escape_the_run_prefix(tmp_path, kind, request):
    store = request.getfixturevalue("s3_store") if kind == "s3" else LocalStore(tmp_path / "store")
    for key in ESCAPING:
        for op in (lambda k: store.put(k, b"x"), store.get, store.delete, lambda k: store.put_if_absent(k, b"x")):
            with pytest.raises(InvalidKey):
                op(key)
    assert store.list("") == []
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_stored_config_and_describe_hold_no_secret(tmp_path, s3_server):
    run = tmp_path / "run"
    cfg = write_config(tmp_path, run, 'store.url="s3://bucket-y/run"', f'store.endpoint_url="{s3_server}"')
    text = cfg.read_text()
    assert "s3://bucket-y/run" in text
    assert_no_canary(text)
    # An endpoint URL with credentials in it is shown without them.
    os.environ.update(DUMMY_CREDENTIALS)
    store = S3Store("s3://bucket-y/run", endpoint_url=f"http://{CANARY_ID}:{CANARY}@127.0.0.1:1")
    assert_no_canary(store.describe())


def test_publish_is_idempotent_and_outage_writes_are_retried(tmp_path):
    """The two optimizer-side outage fixes, narrowly: a publish retried after an ambiguous failure (the PUT
    landed, its answer was lost) succeeds without reusing the version; a write failing with StoreError is
    retried with backoff until the store is back, and raised once the role is asked to stop."""
    from rapid.infra.store import StoreError
    from rapid.roles.optimizer_loop import until_stored
    from rapid.roles.startup import StopFlag

    params = ParameterStore(LocalStore(tmp_path / "s"))
    tensors = {"w": np.ones(3, np.float32)}
    params.publish(1, tensors, {"updates": 1})
    params.publish(1, tensors, {"updates": 1})  # the retry finds its own bytes
    with pytest.raises(FileExistsError):
        params.publish(1, {"w": np.zeros(3, np.float32)}, {"updates": 1})
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise StoreError("s3 put failed: connection refused")
        return "ok"

    import logging

    stop = StopFlag(install_signals=False)
    assert until_stored("publishing v2", flaky, stop, logging.getLogger("t"), first_wait_s=0.01) == "ok"
    assert len(calls) == 3
    stop.set("test")

    def down():
        raise StoreError("down")

    with pytest.raises(StoreError):
        until_stored("publishing v3", down, stop, logging.getLogger("t"), first_wait_s=0.01)

"""Scale-out, end to end (issue 4): real ``mpiexec`` (pip's MPICH) running the real roles, a real
S3-compatible server (``moto_server``) on loopback, and the loader's listing and retention against it.

Nothing here is skipped: a missing ``mpiexec`` or ``moto_server`` fails, since these tests are the proof
that ``mpiexec -n N rapid-optimizer`` and ``mpiexec -n M rapid-rollout`` work. Timeouts are hang guards only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import numpy as np
import pytest

from rapid.formats.experience import ExperienceBatch, Shape, decode_experience, encode_experience
from rapid.infra.s3 import S3Store
from rapid.infra.store import LocalStore
from rapid.league import League
from rapid.monitoring.logs import read_jsonl
from rapid.opt.buffer import ExperienceBuffer
from rapid.optimizer.checkpoints import load_latest_checkpoint
from rapid.optimizer.loader import ExperienceLoader
from rapid.roles.startup import env_spec
from rapid.run.config_files import load_config
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import experience_key, parse_experience_shard, shard_of, shard_owner
from tests.helpers import wait_for
from tests.mpi_scripts.optimizer_ranks import digest
from tests.s3_server import DUMMY_CREDENTIALS

BIN = Path(sys.executable).parent
MPIEXEC = BIN / "mpiexec"
SCRIPTS = Path(__file__).parent / "mpi_scripts"
# Variables a surrounding launcher may have set; a child must not think it is already an MPI rank.
_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                  "PMIX_RANK", "MPI_LOCALNRANKS", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS",
                  "RAPID_RANK", "RAPID_WORLD_SIZE", "RAPID_WORKER_ID", "AWS_PROFILE", "RANK", "WORLD_SIZE",
                  "LOCAL_RANK", "LOCAL_WORLD_SIZE")
# Small enough for a 2-core machine shared with other jobs; big enough that every rank trains on its own data.
SMALL = """\
[run]
name = "scale"
dir = "{run_dir}"
updates = {updates}
[env]
name = "pettingzoo.classic.connect_four_v3"
num_games = 16
[model]
hidden = 32
lstm = 32
[rollout]
upload_interval_s = 1.0
param_poll_s = 1.0
[optimizer]
device = "cpu"           # gloo, on a GPU host too: these tests are about the CPU path
batch_samples = 32
buffer_samples = 1024
checkpoint_every = 1000
max_reuse = 4.0
balance = false          # a fixed cadence: one version per update, so versions and updates can be compared
[eval]
interval_s = 0
[metrics]
enabled = false
[store]
url = "{store_url}"
endpoint_url = "{endpoint}"
"""


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def write_config(tmp_path: Path, updates: int, store_url: str = "", endpoint: str = "") -> Path:
    path = tmp_path / "run.toml"
    path.write_text(SMALL.format(run_dir=(tmp_path / "run").as_posix(), updates=updates, store_url=store_url,
                                 endpoint=endpoint))
    return path


def mpiexec(n: int, *command: str) -> list[str]:
    assert MPIEXEC.exists(), f"no mpiexec next to {sys.executable}: pip install mpich"
    return [str(MPIEXEC), "-n", str(n), *command]


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> tuple[int, str]:
    """SIGTERM, then wait (a hang guard: the process must end by itself within ``timeout``)."""
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"{proc.args} did not end within {timeout:.0f}s of SIGTERM:\n{err[-2000:]}")
    return proc.returncode, err


def make_experience(shape: Shape, worker: str, seq: int, samples: int, version: int = 0,
                    rng: np.random.Generator | None = None) -> ExperienceBatch:
    """A valid experience object of ``samples`` samples (every action allowed, first step of each sample
    starts a game), with every sample stamped ``version``: the decoder accepts it like a rollout's."""
    rng = rng or np.random.default_rng(seq)
    S, T = samples, shape.bptt
    first = np.zeros((S, T), bool)
    first[:, 0] = True
    arrays = {
        "obs": rng.standard_normal((S, T, shape.obs_dim)).astype(np.float32),
        "mask": np.ones((S, T, shape.mask_dim), bool),
        "actions": np.zeros((S, T, shape.heads), np.int64),
        "logp": np.full((S, T), -1.9, np.float32),
        "values": rng.standard_normal((S, T)).astype(np.float32),
        "advantages": rng.standard_normal((S, T)).astype(np.float32),
        "returns": rng.standard_normal((S, T)).astype(np.float32),
        "rewards": rng.standard_normal((S, T)).astype(np.float32), "discounts": np.full((S, T), 0.99, np.float32),
        "bootstrap": rng.standard_normal(S).astype(np.float32),
        "active": np.ones((S, T), bool), "own": np.ones((S, T), bool), "first": first,
        "h0": np.zeros((S, shape.lstm), np.float32), "c0": np.zeros((S, shape.lstm), np.float32),
        "version": np.full(S, version, np.int64), "opponent": np.zeros(S, np.int32),
    }
    return ExperienceBatch(worker, seq, time.time(), arrays, ["latest"], [], env_steps=S * T)


def connect_four_shape(cfg) -> Shape:
    """The shape ``run_optimizer`` derives for this config."""
    spec = env_spec(cfg)
    return Shape(bptt=cfg.rollout.bptt, obs_dim=spec.obs_dim, mask_dim=spec.mask_dim,
                 heads=len(spec.action_heads), lstm=cfg.model.lstm)


@pytest.mark.parametrize("ranks", [2, 4])
def test_optimizer_ranks_end_the_run_with_bit_identical_parameters(tmp_path, ranks):
    config = write_config(tmp_path, updates=6)
    rollout = subprocess.Popen([str(BIN / "rapid"), "rollout", "--config", str(config), "--worker-id", "w0"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        result = subprocess.run(mpiexec(ranks, sys.executable, str(SCRIPTS / "optimizer_ranks.py"), str(config)),
                                capture_output=True, text=True, timeout=240, env=child_env())
    finally:
        rollout_code, rollout_err = stop_process(rollout)
    assert result.returncode == 0, result.stderr[-3000:]
    assert rollout_code == 0, rollout_err[-2000:]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    ranks_seen = json.loads(line[len("RESULT "):])
    assert [r["rank"] for r in ranks_seen] == list(range(ranks))
    assert all(r["exit"] == 0 and r["updates"] == 6 and r["skipped"] == 0 for r in ranks_seen), ranks_seen
    assert len({r["params"] for r in ranks_seen}) == 1, "parameters differ across ranks"
    assert len({r["adam"] for r in ranks_seen}) == 1, "Adam state differs across ranks"

    # What the ranks hold is what rank 0 published last and checkpointed at the end.
    store = LocalStore(tmp_path / "run" / "store")
    params = ParameterStore(store)
    assert params.versions() == list(range(7)) and params.latest_version() == 6
    assert digest(params.fetch(6).tensors) == ranks_seen[0]["params"]
    assert digest(params.fetch(5).tensors) != ranks_seen[0]["params"]
    ckpt = load_latest_checkpoint(store)
    assert (ckpt.version, ckpt.updates) == (6, 6) and digest(ckpt.model) == ranks_seen[0]["params"]
    log = read_jsonl(tmp_path / "run" / "logs" / "optimizer.jsonl")
    assert [r["update"] for r in log] == list(range(1, 7))


def test_a_rank_without_data_for_longer_than_the_collective_timeout_holds_the_others_back(tmp_path):
    """Rank 1's shard stays empty for three collective timeouts while rank 0 has data: rank 1 checks in with
    the others every round instead of waiting in silence while rank 0 waits in a collective (under NCCL the
    watchdog would kill the job; gloo raises), and once its data comes both ranks train in step."""
    timeout_s = 4.0
    config = write_config(tmp_path, updates=3)
    store = LocalStore(tmp_path / "run" / "store")
    shape = connect_four_shape(load_config(config))
    now_ms = int(time.time() * 1000)

    def put(shard: int, seq: int) -> None:
        key = experience_key(shard, now_ms + seq, "w0", "a", seq)
        store.put(key, encode_experience(make_experience(shape, "w0", seq, samples=64)))

    for seq in range(2):
        put(0, seq)
    ranks = subprocess.Popen(mpiexec(2, sys.executable, str(SCRIPTS / "optimizer_ranks.py"), str(config),
                                     str(timeout_s)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=child_env())
    try:
        time.sleep(3 * timeout_s)
        assert ranks.poll() is None, ranks.communicate()[1][-3000:]
        for seq in range(2, 4):
            put(1, seq)
        out, err = ranks.communicate(timeout=120)
    finally:
        if ranks.poll() is None:
            ranks.kill()
    assert ranks.returncode == 0, err[-3000:]
    (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
    seen = json.loads(line[len("RESULT "):])
    assert all(r["exit"] == 0 and r["updates"] == 3 for r in seen), seen
    assert len({r["params"] for r in seen}) == 1, "parameters differ across ranks"


def test_two_rollout_ranks_and_two_optimizer_ranks_against_s3(tmp_path, s3_server, monkeypatch):
    bucket = f"rapid-e2e-{os.getpid()}"
    boto3.client("s3", endpoint_url=s3_server, **{k.lower(): v for k, v in DUMMY_CREDENTIALS.items()
                                                    if k != "AWS_DEFAULT_REGION"},
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    config = write_config(tmp_path, updates=8, store_url=f"s3://{bucket}/run", endpoint=s3_server)
    env = child_env(**DUMMY_CREDENTIALS)
    # The two ranks share one node: under node inference one of them starts the node's server, both decide there.
    rollouts = subprocess.Popen(mpiexec(2, str(BIN / "rapid-rollout"), "--config", str(config),
                                        "--set", "rollout.inference=node", "--set", "rollout.inference_idle_s=1"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        optimizers = subprocess.run(mpiexec(2, str(BIN / "rapid-optimizer"), "--config", str(config)),
                                    capture_output=True, text=True, timeout=240, env=env)
    finally:
        rollout_code, rollout_err = stop_process(rollouts)
    assert optimizers.returncode == 0, optimizers.stderr[-3000:]
    assert rollout_code == 0, rollout_err[-3000:]
    for worker in ("w0", "w1"):  # identity from the MPI rank; each stopped cleanly on SIGTERM
        assert f"worker {worker} stopped" in rollout_err, rollout_err[-3000:]
    [server_log] = (tmp_path / "run" / "node-cache").glob("*/inference.log")  # one node, one folder
    stopped = wait_for(lambda: "inference server stopped" in server_log.read_text() and server_log.read_text(), 30,
                       "the node's server to stop once idle")
    assert stopped.count("inference server on") == 1, stopped  # a second start found the node's lock taken
    assert re.search(r"inference server stopped: [1-9][0-9]* batches", stopped), stopped

    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    store = S3Store(f"s3://{bucket}/run", endpoint_url=s3_server)
    params = ParameterStore(store)
    assert params.versions() == list(range(9)) and params.latest_version() == 8
    assert [params.fetch(v).version for v in (1, 8)] == [1, 8]
    uploaded = store.list("experience/")
    assert {key.split("/")[2].split("-")[1] for key in uploaded} == {"w0", "w1"}, uploaded
    assert {parse_experience_shard(key) for key in uploaded} == {0, 1}, uploaded  # one shard per optimizer rank
    # The games both ranks loaded were pooled at the publishes (an all-gather) and folded by rank 0: no
    # match-result objects, and no more games than the uploaded objects carry.
    shape = connect_four_shape(load_config(config))
    played = sum(len(decode_experience(store.get(k), shape).episodes) for k in uploaded)
    assert 0 < League(store).read().latest_games <= played and store.list("league/results/") == []
    assert load_latest_checkpoint(store).version == 8

    log = read_jsonl(tmp_path / "run" / "logs" / "optimizer.jsonl")
    assert [r["update"] for r in log] == list(range(1, 9))
    assert [r["version"] for r in log] == list(range(1, 9))
    for record in log:
        assert 0 <= record["staleness_mean"] <= record["staleness_max"] <= 8, record
        assert 0 < record["sample_reuse"] <= 4.0, record
    assert log[-1]["samples_consumed"] >= 8 * 32


def owner(key: str, world: int) -> int:
    return shard_owner(parse_experience_shard(key), world)


def sharded_keys(count: int, shards: int, worker=lambda i: f"w{i % 7}") -> list[str]:
    """Keys as uploaders name them in a run of ``shards`` shards, named now."""
    now_ms = int(time.time() * 1000)
    return [experience_key(shard_of(f"{worker(i)}-inc-{i}", shards), now_ms, worker(i), "inc", i)
            for i in range(count)]


def _put_experience(store, shape: Shape, count: int, shards: int = 2) -> list[str]:
    """``count`` one-sample objects; object i is stamped version i, so the buffer says which were loaded."""
    keys = sharded_keys(count, shards)

    def put(i: int) -> None:
        store.put(keys[i], encode_experience(make_experience(shape, f"w{i % 7}", i, samples=1, version=i)))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(count)))
    return keys


def _loaded_versions(buffer: ExperienceBuffer, count: int) -> set[int]:
    batch = buffer.sample(count, current_version=10**6, rng=np.random.default_rng(0))
    assert batch is not None, f"the buffer holds fewer than {count} samples"
    return set(batch[0]["version"].tolist())


TINY = Shape(bptt=2, obs_dim=3, mask_dim=2, heads=1, lstm=2)


def test_loader_lists_and_loads_more_than_1000_objects_from_s3(s3_store):
    keys = _put_experience(s3_store, TINY, 1100)
    assert len(s3_store.list("experience/")) == 1100  # past S3's 1,000-key page

    def load_share(rank: int) -> tuple[ExperienceLoader, ExperienceBuffer, int]:
        buffer = ExperienceBuffer(capacity=2000, max_staleness=10**9)
        loader = ExperienceLoader(s3_store, TINY, buffer, rank=rank, world=2, shards=2, retention_s=0)
        return loader, buffer, loader.poll_once()

    with ThreadPoolExecutor(2) as pool:  # two optimizer ranks polling the same bucket at once
        results = list(pool.map(load_share, (0, 1)))
    shares = []
    for rank, (loader, buffer, loaded) in enumerate(results):
        expected = {i for i, key in enumerate(keys) if owner(key, 2) == rank}
        assert 0 < loaded == len(expected) == loader.stats.objects and loader.stats.bad_objects == 0
        shares.append(_loaded_versions(buffer, loaded))
        assert shares[-1] == expected
        assert loader.poll_once() == 0  # nothing is loaded twice
    assert shares[0].isdisjoint(shares[1]) and shares[0] | shares[1] == set(range(1100))


def test_retention_deletes_this_ranks_loaded_objects_and_nothing_else(s3_store):
    keys = _put_experience(s3_store, TINY, 40)
    s3_store.put("experience/s0000/notes.txt", b"not an experience object")
    params = ParameterStore(s3_store)
    params.publish(0, {"w": np.zeros(3, np.float32)})
    others = {"checkpoints/000000000000.rck": b"ckpt", "checkpoints/LATEST": b"0",
              "league/pool.json": b"{}", "league/snapshots/snap-0.rpm": b"snap",
              "league/results/w0/000000000001.rmr": b"result"}
    for key, data in others.items():
        s3_store.put(key, data)
    mine = {k for k in keys if owner(k, 2) == 0}
    before = {key: s3_store.get(key) for key in s3_store.list("")}

    loader = ExperienceLoader(s3_store, TINY, ExperienceBuffer(100, 10**9), rank=0, world=2, shards=2,
                              retention_s=0.01)
    assert loader.poll_once() == len(mine) > 0
    time.sleep(0.05)  # let the tiny retention time pass; the next poll expires what was loaded
    assert loader.poll_once() == 0
    assert loader.stats.deleted == len(mine)
    after = {key: s3_store.get(key) for key in s3_store.list("")}
    assert set(after) == set(before) - mine
    assert all(after[key] == before[key] for key in after)  # the rest untouched, byte for byte
    assert params.latest_version() == 0 and params.fetch(0).version == 0


def test_retention_logs_what_it_removed(s3_store, caplog):
    keys = _put_experience(s3_store, TINY, 6, shards=1)
    loader = ExperienceLoader(s3_store, TINY, ExperienceBuffer(100, 10**9), retention_s=0.01)
    caplog.set_level("INFO", logger="rapid.optimizer.loader")
    loader.poll_once()
    time.sleep(0.05)
    loader.poll_once()
    assert s3_store.list("experience/") == [] and loader.stats.deleted == len(keys)
    # One note (at most one a minute): the first deletions are noted, the rest counted in the stats above.
    assert any(r.getMessage().startswith("retention: deleted") for r in caplog.records)


def test_a_rank_that_raises_ends_the_job_with_one_clear_line(tmp_path):
    config = write_config(tmp_path, updates=50)
    cfg = load_config(config)
    store = LocalStore(tmp_path / "run" / "store")
    shape = connect_four_shape(cfg)
    # Version-0 experience for both ranks' shares (four objects each), so no rollout is needed.
    keys = sharded_keys(100, shards=2, worker=lambda i: "w0")
    for rank in (0, 1):
        for seq, key in [(s, k) for s, k in enumerate(keys) if owner(k, 2) == rank][:4]:
            store.put(key, encode_experience(make_experience(shape, "w0", seq, 64)))

    result = subprocess.run(mpiexec(2, sys.executable, str(SCRIPTS / "optimizer_rank_fails.py"), str(config)),
                            capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode != 0
    lines = [x for x in result.stderr.splitlines() if x.startswith("rapid: rank")]
    assert lines == ["rapid: rank 1: RuntimeError: injected failure in update 2 on this rank"], result.stderr[-3000:]
    # (A traceback may follow that line: see test_a_failing_rank_runs_no_python_after_the_abort.)
    # The failure came from inside the update loop: every rank had finished update 1 together (rank 1 failed in
    # update 2, and updates are in lock step). Rank 0's record of update 1 is written by its report thread, which
    # the abort can kill first (seen once in a clean-clone run), so the log holds update 1 or nothing, never more.
    log = read_jsonl(tmp_path / "run" / "logs" / "optimizer.jsonl")
    assert [r["update"] for r in log] in ([], [1])


def test_a_failing_rank_runs_no_python_after_the_abort():
    result = subprocess.run(mpiexec(2, sys.executable, str(SCRIPTS / "abort_returns.py")),
                            capture_output=True, text=True, timeout=60, env=child_env())
    assert result.returncode != 0
    assert "rapid: rank 1: RuntimeError: rank 1 fails" in result.stderr
    assert "RAN ON AFTER ABORT" not in result.stderr, result.stderr


@pytest.mark.parametrize("kind, code", [("usage", 2), ("bug", 1)])
def test_a_rank_with_a_usage_error_ends_the_job_with_exit_code_2(kind, code):
    result = subprocess.run(mpiexec(2, sys.executable, str(SCRIPTS / "rank_raises.py"), kind),
                            capture_output=True, text=True, timeout=60, env=child_env())
    assert result.returncode == code, result.stderr[-2000:]
    assert len([x for x in result.stderr.splitlines() if x.startswith("rapid: rank 1: ")]) == 1

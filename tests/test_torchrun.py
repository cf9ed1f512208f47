"""``torchrun --nproc_per_node 2 rapid-optimizer …`` for real (torch's own launcher, which comes with torch): the
two processes take their rank from torchrun's variables, meet at torchrun's store, train the experience of their
own shards together and end at run.updates. On gloo here; on NCCL where two GPUs are (``pytest -m cuda``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rapid.formats.experience import encode_experience
from rapid.infra.store import LocalStore
from rapid.monitoring.logs import read_jsonl
from rapid.run.config_files import load_config
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import experience_key
from tests.test_distributed import clean_env
from tests.test_scale_mpi import connect_four_shape, make_experience

BIN = Path(sys.executable).parent
SETS = ["run.updates=3", "metrics.enabled=false", "model.hidden=16", "model.lstm=16", "model.encoder_layers=1",
        "rollout.bptt=4", "rollout.upload_interval_s=0.001", "optimizer.batch_samples=8",
        "optimizer.buffer_samples=256", "optimizer.decode_workers=0", "optimizer.poll_s=0.05",
        "optimizer.balance=false", "optimizer.checkpoint_every=1000", "league.snapshot_every=0", "eval.interval_s=0"]


def needs_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip(f"NCCL between two ranks needs a GPU each: {torch.cuda.device_count()} GPU here")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_torchrun_starts_two_optimizer_ranks_that_train_together(tmp_path, device):
    if device == "cuda":
        needs_two_gpus()
    sets = [f"run.dir='{tmp_path / 'run'}'", f"optimizer.device='{device}'", *SETS]
    cfg = load_config(None, sets)
    store = LocalStore(cfg.derive().store_url)
    shape = connect_four_shape(cfg)
    for seq in range(8):  # the run has one shard per rank: four objects of 16 samples in each
        store.put(experience_key(seq % 2, time.time() * 1000, "w0", "a", seq),
                  encode_experience(make_experience(shape, "w0", seq, samples=16)))
    assert (BIN / "torchrun").exists(), f"no torchrun next to {sys.executable}: it comes with torch"
    out = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "--no-python",
                          str(BIN / "rapid-optimizer"), *[arg for s in sets for arg in ("--set", s)]],
                         capture_output=True, text=True, timeout=120, env={**clean_env(), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    # Each process knew its rank (two rank-0s would have fought over the run's lease, and one would have stopped).
    assert " optimizer-0 INFO " in out.stderr and " optimizer-1 INFO " in out.stderr, out.stderr[-3000:]
    assert "experience in 2 shard(s); 1 per rank" in out.stderr, out.stderr[-3000:]
    records = read_jsonl(tmp_path / "run" / "logs" / "optimizer.jsonl")
    assert records[-1]["update"] == 3, records[-1]
    assert ParameterStore(store).latest_version() == records[-1]["version"] >= 3

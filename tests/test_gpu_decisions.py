"""GPU decisions taken without a GPU: the device facts (CUDA available, GPU count) are injected, so the logic
that picks device, backend and precision flags is checked on CPU-only machines and CI."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import torch

from rapid.infra.distributed import Identity, LayoutError, choose_device_and_backend, init_process_group
from rapid.opt.learner import allow_tf32, precision_settings
from tests.test_distributed import SCRIPTS, clean_env


@pytest.mark.parametrize("wanted, local_rank, local_ranks, cuda, gpus, expected", [
    ("cpu", 1, 2, True, 2, ("cpu", "gloo")),       # a CPU learner on a GPU host: gloo, NCCL takes no CPU tensors
    ("auto", 1, 2, True, 2, ("cuda:1", "nccl")),
    ("cuda", 3, 4, True, 8, ("cuda:3", "nccl")),
    ("auto", 0, 4, False, 0, ("cpu", "gloo")),
    ("auto", 0, 1, True, 0, ("cpu", "gloo")),      # a driver without devices counts as no CUDA
    ("auto", 5, 8, True, 1, ("cuda:0", "nccl")),   # one GPU bound to each rank (srun --gpus-per-task=1)
    ("cuda", 1, 4, True, 2, ("cuda:0", "nccl")),   # two GPUs bound to each of four ranks: the first of its own
])
def test_backend_follows_the_device(wanted, local_rank, local_ranks, cuda, gpus, expected):
    assert choose_device_and_backend(wanted, local_rank, local_ranks, cuda, gpus) == expected


def test_cuda_without_cuda_is_refused():
    with pytest.raises(LayoutError, match="CUDA is not available"):
        choose_device_and_backend("cuda", 0, 1, cuda_available=False, gpu_count=0)


def fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_cpu_learner_on_a_gpu_host_gets_gloo(monkeypatch):
    fake_gpus(monkeypatch, 2)  # torch.cuda.set_device would raise here: only gloo can pass
    with init_process_group(Identity(0, 1, 0, 1, "localhost"), device="cpu") as dist:
        assert (dist.backend, dist.device) == ("gloo", torch.device("cpu"))


def test_optimizer_ranks_on_one_gpu_are_refused_in_one_line(tmp_path):
    """Two ranks of a node that see one GPU between them (nothing bound a GPU to each): both take cuda:0, and
    the GPUs' UUIDs, compared when the ranks meet at rank 0's store (no MPI: srun --mpi=none, RAPID_*), stop
    both before NCCL would, each with one line and exit code 2 (a faked GPU: there is none behind it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = [subprocess.Popen([sys.executable, str(SCRIPTS / "one_gpu_two_ranks.py"), str(tmp_path / "run")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**clean_env(), "RAPID_RANK": str(r), "RAPID_WORLD_SIZE": "2",
                                   "RAPID_LOCAL_RANK": str(r), "RAPID_LOCAL_WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}) for r in (0, 1)]
    host = socket.gethostname()
    for rank in ranks:
        _, err = rank.communicate(timeout=120)
        assert rank.returncode == 2, err[-2000:]
        assert err.splitlines() == [f"rapid: error: ranks 0 ({host}, cuda:0) and 1 ({host}, cuda:0) would share one "
                                    "GPU (GPU-f00d): start at most one rank per GPU, give each rank its own GPU "
                                    "(srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES per rank), or set "
                                    "optimizer.device = \"cpu\""], err[-2000:]


@pytest.mark.parametrize("precision, capability, expected", [
    ("fp32", (9, 0), (False, False)),   # fp32 means fp32: no TF32, though cuDNN would allow it by default
    ("bf16", (7, 0), (True, True)),
    ("auto", (8, 0), (True, True)),      # Ampere on: bf16 units
    ("auto", (7, 5), (False, False)),
])
def test_tf32_follows_the_precision(monkeypatch, precision, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert precision_settings(precision, torch.device("cuda", 0)) == expected


def tf32_switches() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_allow_tf32_sets_both_switches():
    before = tf32_switches()
    try:
        allow_tf32(False)
        assert tf32_switches() == (False, False)
        allow_tf32(True)
        assert tf32_switches() == (True, True)
    finally:  # process-wide switches: other tests in this process keep theirs
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_a_gpu_box_keeps_cores_for_the_optimizer_side_and_says_so(monkeypatch):
    """Issue 59: on the recorded H200 box (16 cores, node inference by `auto`) the rollout workers took every core
    but one and the optimizer's intake fell behind. The launcher now keeps cores for the optimizer, its decode
    processes, the node's inference server and the evaluator; a CPU-only machine keeps its old count."""
    import os

    from rapid.roles.launcher import box_plan
    from rapid.run.config_files import load_config

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    plan = box_plan(load_config("configs/moba-5v5.toml", ["run.num_workers=0"]))
    assert plan.workers == 11 and "2 for its decode processes, 1 for the node inference server" in plan.line()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert box_plan(load_config("configs/moba-5v5.toml", ["run.num_workers=0"])).workers == 15


def test_on_a_gpu_box_each_role_runs_on_the_cores_kept_for_it(tmp_path):
    """Issue 59: cores kept on paper are kept for real. With injected machine facts (the 16-core H200 box) the
    roles' core sets are disjoint and cover the box; the optimizer is told to run the decode processes its cores
    were kept for (pinned, it would count only its own three). A real child process runs on the cores it is given."""
    import functools
    import os

    from rapid.roles.box_plan import cpu_sets, plan_box
    from rapid.roles.launcher import _die_with_parent, _processes
    from rapid.run.config_files import load_config

    plan = plan_box(cores=16, gpu=True, node_inference=True, decoders=2, evaluator=True)
    sets = cpu_sets(plan, list(range(16)))
    assert sets is not None and sum(len(s) for s in sets.values()) == 16
    assert frozenset().union(*sets.values()) == frozenset(range(16)) and len(sets["rollout"]) == plan.workers
    assert cpu_sets(plan, list(range(12))) is None, "fewer cores than planned: nothing pinned"
    assert cpu_sets(plan_box(16, False, True, 2, True), list(range(16))) is None, "a CPU-only box is not pinned"
    cfg = load_config("configs/moba-5v5.toml", ["rollout.inference=local"])
    make_optimizer, servers, rollouts, evaluator = _processes(cfg, tmp_path, 2, 0, None, sets)
    optimizer = make_optimizer("auto")
    assert optimizer.cpus == sets["optimizer"] and "optimizer.decode_workers=2" in optimizer.args
    assert all(r.cpus == sets["rollout"] for r in rollouts) and evaluator[0].cpus == sets["evaluator"]
    unpinned = _processes(cfg, tmp_path, 1, 0, None)[0](False)
    assert unpinned.cpus is None and not any("decode_workers" in a for a in unpinned.args)
    one = min(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                         capture_output=True, text=True, check=True,
                         preexec_fn=functools.partial(_die_with_parent, frozenset({one})))
    assert out.stdout.strip() == f"[{one}]"

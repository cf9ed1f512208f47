"""MPI + torch.distributed setup, with the venv's real ``mpiexec`` (pip's MPICH) and gloo on CPU (NCCL where 2 GPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from rapid.infra.distributed import Identity, abort_on_error, detect_identity, init_process_group, wait_until_pipe_read
from rapid.infra.identity import LayoutError

SCRIPTS = Path(__file__).parent / "mpi_scripts"
MPIEXEC = Path(sys.executable).parent / "mpiexec"
_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                  "PMIX_RANK", "MPI_LOCALNRANKS", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS",
                  "RAPID_RANK", "RAPID_WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}


# A pretend GPU host: torch reports CUDA and N GPUs while every real CUDA call still fails, so a rank that left
# its backend to the defaults would pick NCCL and die; one that names gloo runs as on a CPU host.
_FAKE_GPUS = ("import runpy, sys, torch; torch.cuda.is_available = lambda: True; "
              "torch.cuda.device_count = lambda: {gpus}; sys.argv = sys.argv[1:]; "
              "runpy.run_path(sys.argv[0], run_name='__main__')")


def mpiexec(n: int, script: str, timeout: float, *args: str, fake_gpus: int = 0) -> subprocess.CompletedProcess:
    assert MPIEXEC.exists(), f"no mpiexec next to {sys.executable}: pip install mpich"
    python = [sys.executable, "-c", _FAKE_GPUS.format(gpus=fake_gpus)] if fake_gpus else [sys.executable]
    return subprocess.run([str(MPIEXEC), "-n", str(n), *python, str(SCRIPTS / script), *args],
                          capture_output=True, text=True, timeout=timeout, env=clean_env())


@pytest.mark.parametrize("ranks, fake_gpus", [(2, 0), (4, 0), (2, 2)])
def test_ranks_end_with_bit_identical_parameters(ranks, fake_gpus):
    result = mpiexec(ranks, "sgd_ranks.py", 120, fake_gpus=fake_gpus)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("OK "), result.stdout + result.stderr[-2000:]


@pytest.mark.cuda
def test_nccl_ranks_end_with_bit_identical_parameters():
    if torch.cuda.device_count() < 2:
        pytest.skip(f"NCCL between ranks needs a GPU per rank: 2 ranks, {torch.cuda.device_count()} GPU")
    result = mpiexec(2, "sgd_ranks.py", 120, "nccl")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("OK "), result.stdout + result.stderr[-2000:]


def test_raising_rank_ends_the_job_with_one_clear_line():
    start = time.monotonic()
    result = mpiexec(2, "raise_on_rank.py", timeout=60)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < 10, f"the job took {elapsed:.1f}s to end"
    lines = [line for line in result.stderr.splitlines() if line.startswith("rapid: rank 1:")]
    assert lines == ["rapid: rank 1: ValueError: boom from the test second line"], result.stderr


def test_the_last_line_before_an_abort_waits_for_the_pipes_reader(tmp_path):
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"rapid: rank 1: ValueError: boom\n")
        start = time.monotonic()
        wait_until_pipe_read(write_end, timeout=0.3)  # nobody reads: gives up at the timeout
        assert time.monotonic() - start >= 0.3
        reader = threading.Timer(0.2, os.read, (read_end, 4096))
        reader.start()
        start = time.monotonic()
        wait_until_pipe_read(write_end, timeout=5.0)
        assert 0.15 <= time.monotonic() - start < 2.0  # returned once the reader took the line
        reader.join()
    finally:
        os.close(read_end)
        os.close(write_end)
    with open(tmp_path / "log", "wb") as f:  # not a pipe: nothing to wait for
        f.write(b"x")
        start = time.monotonic()
        wait_until_pipe_read(f.fileno(), timeout=5.0)
        assert time.monotonic() - start < 0.1


def test_plain_process_is_rank_0_of_1(monkeypatch):
    for name in _LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    identity = detect_identity()
    assert (identity.rank, identity.size, identity.local_rank, identity.local_size) == (0, 1, 0, 1)
    assert identity.launcher == "none" and identity.is_root and not identity.under_mpi


def test_identity_from_environment(monkeypatch):
    for name in _LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "4(x2)")  # srun sets SLURM_NTASKS_PER_NODE only if asked to
    identity = detect_identity()
    assert (identity.rank, identity.size, identity.local_rank, identity.local_size) == (5, 8, 1, 4)
    assert identity.launcher == "slurm"
    monkeypatch.setenv("RAPID_RANK", "2")  # rapid's own variables win over the scheduler's
    monkeypatch.setenv("RAPID_WORLD_SIZE", "3")
    identity = detect_identity()
    assert (identity.rank, identity.size, identity.launcher) == (2, 3, "rapid")
    monkeypatch.setenv("RAPID_RANK", "3")
    with pytest.raises(LayoutError, match="rapid says rank 3 of 3"):
        detect_identity()


def test_mpich_variables_tell_what_mpi_tells():
    """Without mpi4py, rapid reads MPICH's variables; under the real mpiexec they give what MPI itself gives."""
    code = ("import os, socket; from rapid.infra.identity import detect_identity, identity_from_env\n"
            "mpi, env = detect_identity(), identity_from_env(os.environ, socket.gethostname())\n"
            "assert mpi.launcher == 'mpi' and env.launcher == 'mpich', (mpi, env)\n"
            "assert (mpi.rank, mpi.size, mpi.local_rank, mpi.local_size) == "
            "(env.rank, env.size, env.local_rank, env.local_size), (mpi, env)\n"
            "from mpi4py import MPI\n"  # one line from rank 0: the launcher may interleave the ranks' output
            "rows = MPI.COMM_WORLD.gather(f'OK {env.rank} {env.size} {env.local_rank} {env.local_size}', root=0)\n"
            "print(' / '.join(rows) if env.rank == 0 else '', end='')\n")
    result = subprocess.run([str(MPIEXEC), "-n", "3", sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env=clean_env())
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "OK 0 3 0 3 / OK 1 3 1 3 / OK 2 3 2 3", result.stdout


def test_single_rank_collectives_are_no_ops():
    identity = Identity(0, 1, 0, 1, "localhost")
    with init_process_group(identity, backend="gloo") as dist:
        assert dist.backend == "gloo" and not torch.distributed.is_initialized()
        model = torch.nn.Linear(3, 2)
        model.weight.grad = torch.ones(2, 3)
        dist.broadcast_parameters(model)
        dist.all_reduce_gradients(model.parameters())
        assert torch.equal(model.weight.grad, torch.ones(2, 3)) and model.bias.grad is None
        assert dist.all_reduce_scalars({"loss": 1.5}) == {"loss": 1.5}
        dist.barrier()


def test_abort_on_error_outside_mpi_reraises():
    identity = Identity(0, 1, 0, 1, "localhost")

    @abort_on_error(identity)
    def entry() -> None:
        raise KeyError("k")

    with pytest.raises(KeyError):
        entry()
    with abort_on_error(identity):
        pass


def test_infra_imports_no_torch_and_nothing_above_it():
    code = ("import sys, rapid.infra.store, rapid.infra.s3, rapid.infra.distributed\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "bad = [m for m in sys.modules if m.startswith('rapid.') and not m.startswith('rapid.infra')]\n"
            "assert not bad, bad\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())
    assert result.returncode == 0, result.stderr

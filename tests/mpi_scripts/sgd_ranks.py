"""Run under ``mpiexec -n N``: a few SGD steps with all-reduced gradients must leave every rank with
bit-identical parameters, equal (to rounding) to one process training on the union of the batches.

Rank 0 prints ``OK <sha256>`` when every check holds; any failure aborts the job with one line on stderr.
Usage: ``mpiexec -n N python sgd_ranks.py [gloo|nccl]`` (gloo, on CPU, by default; nccl needs a GPU per rank).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import torch
from mpi4py import MPI

from rapid.infra.distributed import abort_on_error, detect_identity, init_process_group

STEPS = 3
BATCH = 16


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        self.extra = torch.nn.Linear(8, 4)  # used only by odd ranks: its grad is None on the others


def make_model(seed: int) -> Net:
    torch.manual_seed(seed)
    return Net()


def batch(rank: int, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 8, generator=g).to(device), torch.randn(BATCH, 4, generator=g).to(device)


def loss_of(model: Net, rank: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model.body(x)
    if rank % 2 == 1:
        out = out + model.extra(x)
    return ((out - y) ** 2).mean()


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def thread_names() -> list[str]:
    return [(task / "comm").read_text().strip() for task in Path("/proc/self/task").iterdir()]


def main(backend: str) -> None:
    identity = detect_identity()
    with abort_on_error(identity):
        with init_process_group(identity, backend=backend, timeout=60) as dist:
            assert identity.under_mpi and dist.backend == backend, (identity, dist.backend)
            device = dist.device
            model = make_model(seed=identity.rank).to(device)  # different on every rank until the broadcast
            dist.broadcast_parameters(model)
            reference = make_model(seed=0).to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
            for step in range(STEPS):
                opt.zero_grad(set_to_none=True)
                loss_of(model, identity.rank, *batch(identity.rank, step, device)).backward()
                dist.all_reduce_gradients(model.parameters())
                opt.step()
                # The reference sees every rank's batch: the mean of per-rank mean losses.
                ref_opt.zero_grad(set_to_none=True)
                ranks = range(identity.size)
                ref_loss = sum(loss_of(reference, r, *batch(r, step, device)) for r in ranks) / identity.size
                ref_loss.backward()
                ref_opt.step()
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                assert torch.allclose(p, q, atol=1e-6), f"{name} differs from the single-process reference"
            means = dist.all_reduce_scalars({"rank": float(identity.rank), "one": 1.0})
            assert means == {"rank": (identity.size - 1) / 2, "one": 1.0}, means
            gathered = dist.all_gather_bytes(b"r" * identity.rank)  # sizes differ, rank 0 sends nothing
            assert gathered == [b"r" * r for r in range(identity.size)], gathered
            digests = MPI.COMM_WORLD.gather(digest(model), root=0)
        # A gloo thread that outlives the teardown can die in std::terminate while Python exits.
        leftover = [name for name in thread_names() if "gloo" in name]
        assert not leftover, f"gloo threads outlived the process group: {leftover}"
        if identity.rank == 0:
            assert len(set(digests)) == 1, f"parameters differ across ranks: {digests}"
            print(f"OK {digests[0]}", flush=True)

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gloo")

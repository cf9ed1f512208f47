"""All-reduce time per update against model size and rank count: real ``mpiexec`` + gloo on CPU, through
``DistContext.all_reduce_gradients`` (25 MB buckets, SUM then divide, copy back).

Usage::

    python benchmarks/bench_allreduce.py                          # 1M, 5M, 20M params at 1, 2, 4 ranks
    python benchmarks/bench_allreduce.py --ranks 2 --params 1e6   # one point

The launcher starts ``<venv>/bin/mpiexec -n R python bench_allreduce.py --worker …`` per rank count; rank 0
of each job prints one Markdown table row (median and max over timed updates, slowest rank per update).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

TENSOR_PARAMS = 1_000_000  # the model is split into tensors of this size, like the layers of a real net


def worker(sizes: list[int], repeats: int) -> None:
    import torch
    from mpi4py import MPI

    from rapid.infra.distributed import abort_on_error, detect_identity, init_process_group

    identity = detect_identity()
    with abort_on_error(identity), init_process_group(identity, device="cpu") as dist:  # CPU tensors: gloo
        for n in sizes:
            shapes = [min(TENSOR_PARAMS, n - i) for i in range(0, n, TENSOR_PARAMS)]
            params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
            for p in params:
                p.grad = torch.randn(p.shape)
            times = []
            for i in range(repeats + 2):  # two warm-up updates
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce_gradients(params)
                elapsed = MPI.COMM_WORLD.allreduce(time.perf_counter() - start, op=MPI.MAX)
                if i >= 2:
                    times.append(elapsed)
            if identity.rank == 0:
                mb = n * 4 / 1e6
                median = statistics.median(times)
                # A ring all-reduce sends and receives 2 (R-1)/R of the buffer per rank.
                bus = 2 * (identity.size - 1) / identity.size * mb / median / 1e3 if identity.size > 1 else 0.0
                print(f"| {n / 1e6:g}M | {mb:.0f} | {identity.size} | {median * 1e3:.1f} | {max(times) * 1e3:.1f} "
                      f"| {bus:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, nargs="+", default=[1e6, 5e6, 20e6])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(p) for p in args.params]
    if args.worker:
        worker(sizes, args.repeats)
        return
    mpiexec = Path(sys.executable).parent / "mpiexec"
    print("| params | MB (fp32) | ranks | median ms/update | max ms/update | bus GB/s |")
    print("|---|---|---|---|---|---|")
    for ranks in args.ranks:
        command = [str(mpiexec), "-n", str(ranks), sys.executable, __file__, "--worker", "--repeats",
                   str(args.repeats), "--params", *map(str, sizes)]
        subprocess.run(command, check=True)


if __name__ == "__main__":
    main()

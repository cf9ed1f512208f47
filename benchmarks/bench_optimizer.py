"""Optimizer samples/s at 1 and 2 ranks: lock-step ``Learner.update`` (the optimizer's learner, PPO losses,
truncated BPTT) on the default connect-four model, with gradients all-reduced by ``DistContext`` (gloo).

Usage::

    python benchmarks/bench_optimizer.py                          # 1 rank, then mpiexec -n 2
    python benchmarks/bench_optimizer.py --ranks 1 2 4 --batch 256 --updates 10

Only the learner is timed: each rank trains on its own synthetic batch (per-rank batch = ``--batch``
samples of ``bptt`` steps, global batch = batch × ranks), so the figures are the update loop's ceiling,
without the loader or the store. The model and sizes come from ``configs/default.toml``. Rank 0 of each job
prints one Markdown table row: median update time (slowest rank), samples/s and timesteps/s over all
ranks, and the share of the update spent in the all-reduce.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def synthetic_batch(shape, samples: int, heads: tuple[int, ...], seed: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(seed)
    S, T = samples, shape.bptt
    first = np.zeros((S, T), bool)
    first[:, 0] = True
    actions = np.stack([rng.integers(0, n, (S, T)) for n in heads], -1).astype(np.int64)
    return {"obs": rng.standard_normal((S, T, shape.obs_dim)).astype(np.float32),
            "mask": np.ones((S, T, shape.mask_dim), bool), "actions": actions,
            "logp": np.full((S, T), -float(np.log(np.prod(heads))), np.float32),
            "values": rng.standard_normal((S, T)).astype(np.float32),
            "advantages": rng.standard_normal((S, T)).astype(np.float32),
            "returns": rng.standard_normal((S, T)).astype(np.float32),
            "active": np.ones((S, T), bool), "own": np.ones((S, T), bool), "first": first,
            "h0": np.zeros((S, shape.lstm), np.float32), "c0": np.zeros((S, shape.lstm), np.float32),
            "version": np.zeros(S, np.int64), "opponent": np.zeros(S, np.int32)}


def worker(batch: int, updates: int, microbatch: int) -> None:
    import torch

    from rapid.formats.experience import Shape
    from rapid.infra.distributed import abort_on_error, detect_identity, init_process_group
    from rapid.opt.learner import Learner
    from rapid.roles.startup import build_policy, env_spec
    from rapid.run.config_files import load_config

    identity = detect_identity()
    with abort_on_error(identity), init_process_group(identity, device="cpu") as dist:  # CPU tensors: gloo
        cfg = load_config(ROOT / "configs" / "default.toml", [f"optimizer.batch_samples={batch}",
                                                             f"optimizer.microbatch_samples={microbatch}"])
        torch.set_num_threads(cfg.optimizer.torch_threads)
        torch.manual_seed(cfg.run.seed)
        spec = env_spec(cfg)
        policy = build_policy(cfg, spec)
        dist.broadcast_parameters(policy)
        learner = Learner(policy, cfg.ppo, "cpu", microbatch_samples=cfg.optimizer.microbatch_samples,
                          all_reduce=dist.all_reduce_gradients, all_reduce_mean=dist.all_reduce_mean_,
                          world_size=dist.size)
        shape = Shape.of(spec, bptt=cfg.rollout.bptt, lstm=cfg.model.lstm)
        data = synthetic_batch(shape, batch, spec.action_heads, seed=identity.rank)
        times, reduce_share = [], []
        for i in range(updates + 2):  # two warm-up updates
            dist.barrier()
            start = time.perf_counter()
            stats = learner.update(data)
            elapsed = dist.all_reduce_scalars({"t": time.perf_counter() - start})["t"]
            if i >= 2:
                times.append(elapsed)
                reduce_share.append(stats["allreduce_s"] / stats["update_s"])
        n_params = sum(p.numel() for p in policy.parameters())
        if identity.rank == 0:
            median = statistics.median(times)
            total = batch * identity.size / median
            print(f"| {identity.size} | {n_params / 1e6:.2f}M | {batch} | {batch * identity.size} "
                  f"| {median * 1e3:.0f} | {total:,.0f} | {total * shape.bptt:,.0f} "
                  f"| {100 * statistics.median(reduce_share):.0f}% |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch", type=int, default=256, help="samples per rank per update")
    parser.add_argument("--microbatch", type=int, default=0, help="gradient accumulation chunk (0: whole batch)")
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.batch, args.updates, args.microbatch)
        return
    print("| ranks | params | batch/rank | global batch | median ms/update | samples/s | timesteps/s "
          "| all-reduce share |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    own = [__file__, "--worker", "--batch", str(args.batch), "--updates", str(args.updates),
           "--microbatch", str(args.microbatch)]
    for ranks in args.ranks:
        launcher = [] if ranks == 1 else [str(Path(sys.executable).parent / "mpiexec"), "-n", str(ranks)]
        subprocess.run([*launcher, sys.executable, *own], check=True)


if __name__ == "__main__":
    main()

"""The node inference server's batch when it holds several policies: one call for all of them (every row's inputs
over once, every answer back in one copy: today's ``decide``) against one call per policy (each its own gather,
copies and wait for the device: the server before).

    python benchmarks/bench_server_batch.py [--config configs/moba-5v5.toml] [--rows 1536] [--device cpu|cuda]

A batch of ``--rows`` rows (the recorded H200 run's server batches held ~1,557) split evenly among 1, 3 and 5
policies of the config's model; prints ms per batch (wall, best of 5 × 20; on CUDA each batch ends with its copy
back, so wall time includes the device's). On a CPU the copies are no copies: expect little there.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from rapid.roles.startup import build_policy, env_spec
from rapid.rollout.inference_batch import Part, Staging, decide
from rapid.rollout.inference_wire import SlotLayout
from rapid.run.config_files import load_config


def batch_ms(cfg, rows: int, policies: int, together: bool, device: torch.device) -> float:
    spec = env_spec(cfg)
    torch.manual_seed(0)
    nets = [build_policy(cfg, spec).to(device).eval() for _ in range(policies)]
    layout = SlotLayout(1, rows, spec.obs_dim, spec.mask_dim, len(spec.action_heads), cfg.model.lstm)
    view = layout.views(bytearray(layout.size))[0]
    view.obs[:] = np.random.default_rng(0).normal(size=view.obs.shape)
    view.mask[:] = True
    h = torch.zeros(rows, cfg.model.lstm, device=device)
    c = torch.zeros_like(h)
    staging = Staging(device)
    split = np.array_split(np.arange(rows), policies)
    groups = [(net, [Part(view, int(part[0]), part, part)]) for net, part in zip(nets, split)]
    best = float("inf")
    with torch.no_grad():
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(20):
                if together:
                    decide(groups, h, c, staging)
                else:
                    for group in groups:
                        decide([group], h, c, staging)
            best = min(best, (time.perf_counter() - start) / 20)
    return 1000 * best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/moba-5v5.toml")
    ap.add_argument("--rows", type=int, default=1536)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg, device = load_config(args.config, []), torch.device(args.device)
    print(f"{args.config}, {args.rows} rows a batch, {device}")
    print("| policies in the batch | one call per policy (ms) | one call for all (ms) |")
    print("|---:|---:|---:|")
    for policies in (1, 3, 5):
        apart = batch_ms(cfg, args.rows, policies, False, device)
        together = batch_ms(cfg, args.rows, policies, True, device)
        print(f"| {policies} | {apart:.2f} | {together:.2f} |", flush=True)


if __name__ == "__main__":
    main()

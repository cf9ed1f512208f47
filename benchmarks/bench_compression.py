"""Would compressing experience objects pay? Ratio and CPU cost of zlib on real experience objects.

    python benchmarks/bench_compression.py --config configs/moba-5v5.toml [--segments 4] [--levels 1 6]

Plays a config's env with a fresh policy (a real ``RolloutWorker``, the run's shapes), seals the segments into
one experience object as an uploader does, and prints for each zlib level: the compression ratio, the worker's
CPU seconds to compress per MB of object, the optimizer rank's CPU seconds to decompress per MB, and, beside
them, the rank's CPU seconds to decode and check the same object (``decode_experience``), which it pays anyway.
A fresh policy's experience compresses about as well as a trained one's: observations and masks come from the
game, not the policy.
"""

from __future__ import annotations

import argparse
import time
import zlib

import numpy as np
import torch

from rapid.envs.registry import make_env
from rapid.formats.experience import ExperienceBatch, Shape, decode_experience, encode_experience
from rapid.roles.startup import build_policy
from rapid.rollout.worker import RolloutSettings, RolloutWorker
from rapid.run.config_files import load_config


def cpu_seconds(fn, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/moba-5v5.toml", help="the run config whose env and shapes to use")
    parser.add_argument("--segments", type=int, default=4, help="segments sealed into the object")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 6], help="zlib levels to try")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.config)
    env = make_env(cfg.env.name, num_games=cfg.env.num_games, seed=0, options=cfg.env.options)
    policy = build_policy(cfg, env.spec)
    worker = RolloutWorker(env, policy, RolloutSettings.of(cfg, env.spec), None, seed=0)
    worker.set_params(0, policy.tensors())
    segments = [worker.collect() for _ in range(args.segments)]
    arrays = {k: np.concatenate([s.arrays[k] for s in segments]) for k in segments[0].arrays}
    data = encode_experience(ExperienceBatch("w0", 0, 0.0, arrays, ["latest"]))
    shape = Shape.of(env.spec, bptt=cfg.rollout.bptt, lstm=cfg.model.lstm)
    mb = len(data) / 1e6
    decode_s = cpu_seconds(lambda: decode_experience(data, shape))
    print(f"{args.config}: one object of {arrays['version'].shape[0]:,} samples, {mb:.1f} MB; "
          f"decode and check: {decode_s / mb * 1000:.1f} ms CPU per MB")
    print("| zlib level | ratio | compress (worker), ms CPU/MB | decompress (rank), ms CPU/MB |")
    print("|---|---|---|---|")
    for level in args.levels:
        packed = zlib.compress(data, level)
        compress_s = cpu_seconds(lambda level=level: zlib.compress(data, level), repeats=3)
        decompress_s = cpu_seconds(lambda: zlib.decompress(packed))
        print(f"| {level} | {len(data) / len(packed):.2f}× | {compress_s / mb * 1000:.1f} | "
              f"{decompress_s / mb * 1000:.1f} |")


if __name__ == "__main__":
    main()

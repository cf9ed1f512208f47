"""Experience object encode/decode throughput (``rapid.formats.experience``): what one rollout worker spends per
upload and one optimizer rank per download, in GB/s of encoded bytes.

Usage::

    python benchmarks/bench_serialization.py                      # 4096 samples × 16 steps × obs 101
    python benchmarks/bench_serialization.py --samples 1024 --obs 42 --repeats 5

The batch is realistic in size and dtypes (float32 observations, bool masks, int64 actions, LSTM states of
128); values are random, which is what the codec sees anyway (no compression). Prints one Markdown row per
operation: best and median wall time of the repeats, and the best CPU time (``time.process_time``), which a
shared machine disturbs much less than wall time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from rapid.formats.experience import ExperienceBatch, Shape, decode_experience, encode_experience


def make_batch(shape: Shape, samples: int, rng: np.random.Generator) -> ExperienceBatch:
    arrays: dict[str, np.ndarray] = {}
    for name, (dtype, rest) in shape.fields().items():
        size = (samples, *rest)
        if dtype == "float32":
            arrays[name] = rng.standard_normal(size).astype(np.float32)
        elif dtype == "bool":
            arrays[name] = np.ones(size, bool) if name == "mask" else rng.random(size) < 0.5
        else:
            arrays[name] = np.zeros(size, dtype)
    episodes = [{"learner_version": 3, "opponent": "latest", "learner_side": 0, "winner": "learner",
                 "length": 300, "learner_return": 1.0}] * 64
    return ExperienceBatch("w0", 1, time.time(), arrays, ["latest"], episodes, env_steps=samples * shape.bptt)


def timed(fn, repeats: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each call."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--bptt", type=int, default=16)
    parser.add_argument("--obs", type=int, default=101)
    parser.add_argument("--mask", type=int, default=24)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--lstm", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    shape = Shape(bptt=args.bptt, obs_dim=args.obs, mask_dim=args.mask, heads=args.heads, lstm=args.lstm)
    batch = make_batch(shape, args.samples, np.random.default_rng(0))
    data = encode_experience(batch)
    assert decode_experience(data, shape).num_samples == args.samples
    mb = len(data) / 1e6
    print(f"object: {args.samples} samples × {args.bptt} steps, obs {args.obs}, lstm {args.lstm}: {mb:.1f} MB")
    print("| operation | MB | best ms | median ms | GB/s (best) | GB/s (median) | GB/s (best CPU time) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, fn in (("encode", lambda: encode_experience(batch)),
                     ("decode + validate", lambda: decode_experience(data, shape))):
        wall, cpu = timed(fn, args.repeats)
        best, median = min(wall), statistics.median(wall)
        print(f"| {name} | {mb:.1f} | {best * 1e3:.1f} | {median * 1e3:.1f} | {mb / 1e3 / best:.2f} "
              f"| {mb / 1e3 / median:.2f} | {mb / 1e3 / max(min(cpu), 1e-9):.2f} |", flush=True)


if __name__ == "__main__":
    main()

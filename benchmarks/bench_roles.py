"""Throughput of the two roles with the real policy, one process each, one thread.

    OMP_NUM_THREADS=1 python benchmarks/bench_roles.py [--seconds 10]

Prints rollout agent-steps/s (env stepping + LSTM policy + GAE + sample cutting, no upload) for the
default Connect Four config and for moba 1v1/5v5, and optimizer samples/s (one PPO update on a batch of
256 samples × 16 steps: BPTT forward, backward, Adam) for the same models. Metrics calls are included the
way the roles make them; ``--no-metrics`` drops them to measure their cost.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from rapid.envs.registry import make_env
from rapid.monitoring.metrics import RolloutMetrics
from rapid.monitoring.optimizer_metrics import OptimizerMetrics
from rapid.opt.learner import Learner
from rapid.roles.startup import build_policy
from rapid.rollout.worker import RolloutSettings, RolloutWorker
from rapid.run.config_files import load_config

CASES = [
    ("connect_four_v3", "configs/default.toml", []),
    ("moba 1v1", "configs/default.toml", ["env.name=moba", "env.num_games=256", "env.options.heroes_per_side=1"]),
    ("moba 5v5", "configs/default.toml", ["env.name=moba", "env.num_games=64", "env.options.heroes_per_side=5"]),
]


def bench_rollout(cfg, seconds: float, with_metrics: bool) -> tuple[float, float, dict]:
    env = make_env(cfg.env.name, cfg.env.num_games, 0, cfg.env.options)
    policy = build_policy(cfg, env.spec)
    worker = RolloutWorker(env, policy, RolloutSettings.of(cfg, env.spec), seed=0)
    worker.set_params(0, policy.tensors())
    metrics = RolloutMetrics(run="bench") if with_metrics else None
    segment = worker.collect()  # warm-up
    steps, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        segment = worker.collect()
        steps += segment.env_steps
        if metrics:
            metrics.env_steps(segment.env_steps // env.spec.num_agents)
            metrics.agent_steps(segment.env_steps)
            for ep in segment.episodes:
                metrics.episode(ep["learner_return"], ep["length"])
    return steps / (time.perf_counter() - t0), steps / (time.process_time() - c0), segment.arrays


def bench_optimizer(cfg, arrays: dict, seconds: float, with_metrics: bool, batch: int = 256) -> tuple[float, float]:
    env = make_env(cfg.env.name, 1, 0, cfg.env.options)
    learner = Learner(build_policy(cfg, env.spec), cfg.ppo)
    metrics = OptimizerMetrics(run="bench") if with_metrics else None
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(arrays["version"]), batch)
    sample = {k: v[idx] for k, v in arrays.items()}
    learner.update(sample)
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        stats = learner.update(sample)
        n += batch
        if metrics:
            metrics.update(stats)
            metrics.staleness(np.zeros(batch, dtype=np.int64))
            metrics.samples_consumed(batch)
            for phase in ("forward", "backward", "allreduce", "step"):
                metrics.update_phase(phase, stats[f"{phase}_s"])
    return n / (time.perf_counter() - t0), n / (time.process_time() - c0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--no-metrics", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # Wall-clock rates, and per CPU-second (what one dedicated core would do on a shared machine).
    print(f"{'game':16} {'B':>4} {'rollout agent-steps/s':>22} {'per CPU-s':>10} {'optimizer samples/s':>20} "
          f"{'per CPU-s':>10}")
    for name, path, overrides in CASES:
        cfg = load_config(path, overrides)
        steps_s, steps_cpu, arrays = bench_rollout(cfg, args.seconds, not args.no_metrics)
        samples_s, samples_cpu = bench_optimizer(cfg, arrays, args.seconds, not args.no_metrics)
        print(f"{name:16} {cfg.env.num_games:>4} {steps_s:>22,.0f} {steps_cpu:>10,.0f} {samples_s:>20,.0f} "
              f"{samples_cpu:>10,.0f}", flush=True)


if __name__ == "__main__":
    main()

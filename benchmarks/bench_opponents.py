"""A rollout worker's agent-steps per second as the league's pool of past snapshots grows.

Every game of a worker's vector env has its own opponent, and every distinct opponent policy is one more forward
pass per step. With 64 games a worker and 80% of them against past snapshots, a pool of a few dozen snapshots
can mean dozens of small forward passes a step where self-play needs one. This measures it with the real worker,
league and opponent wiring (``rapid/rollout/opponents.py``) on a local store::

    OMP_NUM_THREADS=1 python benchmarks/bench_opponents.py [--config C] [--pools 0 4 16 48] [--slate 2]

For each pool size: agent-steps/s of one worker (one thread), and how many distinct opponent policies its games
held on average per step.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch

from rapid.envs.registry import make_env
from rapid.infra.store import LocalStore
from rapid.league import League
from rapid.roles.startup import build_policy
from rapid.rollout.opponents import LeagueOpponents
from rapid.rollout.worker import RolloutSettings, RolloutWorker
from rapid.run.config_files import load_config
from rapid.run.param_store import ParameterStore


def bench(config: str, pool: int, seconds: float, slate: int) -> tuple[float, float]:
    cfg = load_config(config, [f"league.slate_size={slate}"])
    env = make_env(cfg.env.name, num_games=cfg.env.num_games, seed=0, options=cfg.env.options)
    store = LocalStore(tempfile.mkdtemp(prefix="bench-opponents-"))
    params, league = ParameterStore(store), League(store)
    policy = build_policy(cfg, env.spec)
    for version in range(1, pool + 1):
        torch.manual_seed(version)
        params.publish(version, build_policy(cfg, env.spec).tensors())
        league.add_snapshot_from_params(version)
    source = LeagueOpponents(league, cfg, env, lambda: build_policy(cfg, env.spec))
    worker = RolloutWorker(env, policy, RolloutSettings.of(cfg, env.spec), opponents=source, seed=0)
    worker.set_params(pool + 1, policy.tensors())
    worker.collect()  # warm-up: the first games' opponents are built
    steps, distinct, started = 0, [], time.perf_counter()
    while time.perf_counter() - started < seconds:
        steps += worker.collect().env_steps
        distinct.append(len({id(o) for o in worker.game_opponent if o.policy is not None}))
    return steps / (time.perf_counter() - started), float(np.mean(distinct))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/moba-3v3.toml")
    p.add_argument("--pools", type=int, nargs="+", default=[0, 4, 16, 48])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--slate", type=int, default=2, help="league.slate_size: past policies a worker's games are "
                   "drawn from at a time")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"{args.config}, one worker on one thread, slate of {args.slate} (load {os.getloadavg()[0]:.1f})")
    print("| snapshots in the pool | agent-steps/s | distinct past opponents in play |")
    print("|---|---|---|")
    for pool in args.pools:
        rate, distinct = bench(args.config, pool, args.seconds, args.slate)
        print(f"| {pool} | {rate:,.0f} | {distinct:.1f} |", flush=True)


if __name__ == "__main__":
    main()

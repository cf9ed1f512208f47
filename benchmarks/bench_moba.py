"""Agent-steps per second of the moba game with random (mask-respecting) actions, on one core.

For 1v1 and 5v5 at B = 1, 64, 1024 games per vector env, and one game at a time through the PettingZoo
view (the way a generic PettingZoo env would be stepped). An agent-step is one hero acting once, so a
vector step of B games of 5v5 counts B * 10.

Run single-threaded::

    OMP_NUM_THREADS=1 python benchmarks/bench_moba.py [--seconds 3]
    OMP_NUM_THREADS=1 python benchmarks/bench_moba.py --config configs/moba-5v5.toml [--games 16]

With ``--config``, one line instead: the config's game options at the games of one lane of a rollout worker
(``env.num_games / rollout.inference_lanes``, or ``--games``), as microseconds of CPU time per agent-step of
``env.step`` (observation included), the figure a rollout core's budget is counted in.

Prints a markdown table: "env only" times ``env.step``; "with actions" adds drawing the random actions
(base.RandomBot) as a learner's sampler would. CPU time (process_time) is shown beside wall time because
the machine may be shared.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from rapid.envs.base import RandomBot
from rapid.envs.moba import MobaVecEnv
from rapid.envs.moba.pz import MobaParallelEnv
from rapid.run.config_files import load_config


def bench_vec(games: int, seconds: float, **options: object) -> dict[str, float]:
    env = MobaVecEnv(num_games=games, seed=0, **options)
    bot = RandomBot(env.spec, seed=0)
    step = env.reset()
    for _ in range(5):
        step = env.step(bot.act(step))
    steps = 0
    env_wall = env_cpu = 0.0
    w0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - w0 < seconds:
        actions = bot.act(step)
        a, b = time.perf_counter(), time.process_time()
        step = env.step(actions)
        env_wall += time.perf_counter() - a
        env_cpu += time.process_time() - b
        steps += 1
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    agent_steps = steps * games * env.spec.num_agents
    return {"env_wall": agent_steps / env_wall, "env_cpu": agent_steps / env_cpu,
            "all_wall": agent_steps / wall, "all_cpu": agent_steps / cpu}


def bench_pz(heroes: int, seconds: float) -> dict[str, float]:
    env = MobaParallelEnv(heroes_per_side=heroes)
    obs, _ = env.reset(seed=0)
    for agent in env.possible_agents:
        env.action_space(agent).seed(0)
    agent_steps = 0
    w0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - w0 < seconds:
        actions = {a: env.action_space(a).sample(mask=obs[a]["action_mask"]) for a in env.agents}
        obs, _, _, _, _ = env.step(actions)
        agent_steps += len(actions)
        if not env.agents:
            obs, _ = env.reset()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return {"all_wall": agent_steps / wall, "all_cpu": agent_steps / cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time per configuration")
    parser.add_argument("--config", help="one line at this config's game options instead of the table")
    parser.add_argument("--games", type=int, help="with --config: games per env (default: one lane's)")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, numpy {np.__version__}")
    if args.config:
        cfg = load_config(args.config, [])
        games = args.games or cfg.env.num_games // cfg.rollout.inference_lanes
        r = bench_vec(games, args.seconds, **cfg.env.options)
        print(f"{args.config}, {games} games: {1e6 / r['env_cpu']:.2f} us CPU per agent-step of env.step "
              f"({1e6 / r['env_wall']:.2f} wall; {1e6 / r['all_cpu']:.2f} CPU with random actions)")
        return
    print("| game | B | env only, wall | env only, CPU | with actions, wall | with actions, CPU |")
    print("|---|---:|---:|---:|---:|---:|")
    for heroes, label in ((1, "1v1"), (5, "5v5")):
        for games in (1, 64, 1024):
            r = bench_vec(games, args.seconds, heroes_per_side=heroes)
            print(f"| {label} | {games} | {r['env_wall']:,.0f} | {r['env_cpu']:,.0f} | {r['all_wall']:,.0f} "
                  f"| {r['all_cpu']:,.0f} |", flush=True)
        r = bench_pz(heroes, args.seconds)
        print(f"| {label} PettingZoo view | 1 | | | {r['all_wall']:,.0f} | {r['all_cpu']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()

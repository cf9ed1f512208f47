"""Game steps per CPU-second of any registered env through rapid's vector interface, random legal actions.

    OMP_NUM_THREADS=1 python benchmarks/bench_env.py [--env pettingzoo.classic.connect_four_v3] [--games 128]
        [--bot random]

A game step is one move of one game (in a turn-based game, the player to move). Drawing the actions (the env's
random bot, or ``--bot``: what a league game against that bot costs a worker) is included, as a policy's sampling
would be; the policy itself is not. CPU time (best
of ``--repeat`` rounds of ``--steps`` vector steps) rather than wall time, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import time

from rapid.envs.registry import make_env


def bench(env_name: str, games: int, steps: int, repeat: int, bot_name: str = "random") -> float:
    env = make_env(env_name, num_games=games, seed=0)
    bot = env.make_bot(bot_name, seed=0)
    step = env.reset(seed=0)

    def play(n: int):
        nonlocal step
        for _ in range(n):
            step = env.step(bot.act(step))

    play(50)
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        play(steps)
        best = min(best, time.process_time() - start)
    return steps * games / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="pettingzoo.classic.connect_four_v3", help="env name, as in env.name")
    parser.add_argument("--games", type=int, default=128, help="games per vector env")
    parser.add_argument("--steps", type=int, default=200, help="vector steps per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; the best is printed")
    parser.add_argument("--bot", default="random", help="the env's bot that draws the actions (e.g. lookahead)")
    args = parser.parse_args()
    env = make_env(args.env, num_games=1)
    if args.bot not in env.bot_names():
        parser.error(f"--bot: {args.env} has no bot {args.bot!r} (it has {', '.join(env.bot_names())})")
    rate = bench(args.env, args.games, args.steps, args.repeat, args.bot)
    print(f"{args.env}, {args.games} games, {args.bot} bot: {rate:,.0f} game steps per CPU-second")


if __name__ == "__main__":
    main()

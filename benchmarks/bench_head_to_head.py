"""Two runs of one game head to head: does a policy that scores well against a bot also beat another run's?

A yardstick bot can be learnt rather than the game: a policy trained against ``bot:lookahead`` may beat it and
still lose to a policy that never met it. This plays the latest (or a given) version of run A against run B's
through rapid's own match (:func:`rapid.run.matches.play_match`, half the games on each side)::

    python benchmarks/bench_head_to_head.py RUN_A RUN_B [--games 1000] [--seed 9001] [--greedy-a] [--greedy-b]

Both play sampled by default: greedy against greedy replays the same two games (one per side), since neither the
policies nor the game draw anything.
"""

from __future__ import annotations

import argparse
import sys

from rapid.api import load_policy
from rapid.errors import UsageError
from rapid.run.matches import batch_size, play_match


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_a", help="run directory of player A")
    p.add_argument("run_b", help="run directory of player B (the same game)")
    p.add_argument("--version-a", default="latest")
    p.add_argument("--version-b", default="latest")
    p.add_argument("--games", type=int, default=1000)
    p.add_argument("--seed", type=int, default=9001)
    p.add_argument("--greedy-a", action="store_true", help="A plays its most likely action")
    p.add_argument("--greedy-b", action="store_true", help="B plays its most likely action")
    args = p.parse_args(argv)
    if args.games < 1:
        p.error("--games must be at least 1")
    try:
        a = load_policy(args.run_a, args.version_a)
        b = load_policy(args.run_b, args.version_b, env=a.env_name)
    except UsageError as err:
        print(f"bench_head_to_head: {err}", file=sys.stderr)
        return 2
    env = a.make_env(num_games=batch_size(args.games), seed=args.seed)
    score = play_match(env, a.player(greedy=args.greedy_a), b.player(greedy=args.greedy_b), games=args.games,
                       seed=args.seed)
    mode = {True: "greedy", False: "sampled"}
    print(score.line(f"{args.run_a} v{a.version} ({mode[args.greedy_a]})",
                     f"{args.run_b} v{b.version} ({mode[args.greedy_b]})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Two runs of one game head to head: does a policy that scores well against a bot also beat another run's?

A yardstick bot can be learnt rather than the game: a policy trained against ``bot:lookahead`` may beat it and
still lose to a policy that never met it. This plays the latest (or a given) version of run A against run B's
through rapid's own match (:func:`rapid.run.matches.play_match`, half the games on each side)::

    python benchmarks/bench_head_to_head.py RUN_A RUN_B [--games 1000] [--seed 9001] [--greedy-a] [--greedy-b]

Either side may be a frozen reference policy file (``rapid export --format reference``, a ladder's ``ref:PATH``, e.g.
``configs/ladder/connect4-selfplay-5min.rpm``) or one of the game's bots instead (``bot:lookahead2``); two bots
need ``--env``::

    python benchmarks/bench_head_to_head.py bot:lookahead2 bot:lookahead --env pettingzoo.classic.connect_four_v3

Policies play sampled by default: greedy against greedy replays the same two games (one per side), since neither the
policies nor the game draw anything.
"""

from __future__ import annotations

import argparse
import sys

import torch

from rapid.api import TrainedPolicy, load_policy
from rapid.envs.base import VecMultiAgentEnv
from rapid.envs.registry import make_env
from rapid.errors import UsageError
from rapid.run.matches import batch_size, play_match

BOT = "bot:"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_a", help="run directory of player A, a reference policy file, or bot:NAME")
    p.add_argument("run_b", help="run directory of player B (the same game), a reference policy file, or bot:NAME")
    p.add_argument("--env", help="the game, where both players are bots (env.name)")
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
        a, b = (None if run.startswith(BOT) else load_policy(run, version)
                for run, version in ((args.run_a, args.version_a), (args.run_b, args.version_b)))
        if a is not None and b is not None and b.env_name != a.env_name:
            raise UsageError(f"{args.run_b} plays {b.env_name}, not {a.env_name}")
        if a is None and b is None and args.env is None:
            raise UsageError("two bots need --env")
        policy = a or b
        env = (policy.make_env(batch_size(args.games), args.seed) if policy is not None
               else make_env(args.env, num_games=batch_size(args.games), seed=args.seed))
        player_a, name_a = player(args.run_a, a, args.greedy_a, env, args.seed)
        player_b, name_b = player(args.run_b, b, args.greedy_b, env, args.seed + 1)
    except (UsageError, ValueError) as err:  # ValueError: an --env that is no game
        print(f"bench_head_to_head: {err}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)  # the policies sample from torch's generator: the same games on a rerun
    score = play_match(env, player_a, player_b, games=args.games, seed=args.seed)
    print(score.line(name_a, name_b))
    return 0


def player(text: str, policy: TrainedPolicy | None, greedy: bool, env: VecMultiAgentEnv, seed: int):
    """A match player and its name: the run's policy, or the env's bot that ``text`` (bot:NAME) names."""
    if policy is not None:
        return policy.player(greedy=greedy), f"{text} v{policy.version} ({'greedy' if greedy else 'sampled'})"
    name = text.removeprefix(BOT)
    if name not in env.bot_names():
        raise UsageError(f"the game has no bot {name!r} (it has {', '.join(env.bot_names())})")
    return env.make_bot(name, seed=seed), text


if __name__ == "__main__":
    sys.exit(main())

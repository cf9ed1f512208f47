"""How much a policy lag costs PPO, in decisions: one process, no clock, the lag forced exactly.

    python benchmarks/bench_lag.py                                   # connect four, no lag
    python benchmarks/bench_lag.py --lag 4                           # the worker acts 4 rounds behind
    python benchmarks/bench_lag.py --lag 4 --set ppo.proximal=first_use
    python benchmarks/bench_lag.py --lag 4 --bots                    # with the config's warm-up and bot games

rapid's own rollout worker plays (self-play, ``configs/default.toml`` without its bot games and warm-up unless
``--bots``: then against a league pool of the config's ``league.bots`` and ``league.warmup_bots`` in a temporary
local store, each version stamped as the optimizer stamps it at the schedules' start) and rapid's own learner
trains, taking turns: each round the worker collects ``--round-batches`` batches of fresh samples into a real
:class:`rapid.opt.buffer.ExperienceBuffer`, the learner draws ``reuse`` × ``round-batches`` batches from it
(least-used first, as the optimizer does; the buffer keeps the first use's log-probs for ``ppo.proximal =
"first_use"``), and the worker then takes the parameters of ``--lag`` rounds ago.

A round is ``reuse × round-batches`` updates (12 by default). A 5-minute run of the shipped config trains about
14 updates a second at a staleness of about 5 versions, some 45 updates: about ``--lag 4``.

The learner trains in ``optimizer.precision`` as the optimizer role sets it (bfloat16 where the CPU computes it
natively, with the shipped ``auto``; ``--set optimizer.precision=fp32`` for float32) and at its schedules' start
(the first minute's learning rate and entropy bonus). Every
``--eval-every`` decisions the learner's policy plays ``--games`` sampled games against the random bot (as the
evaluator does); the script stops at the first round at or above ``--target`` and prints the decisions, updates
and CPU seconds it took, or gives up after ``--max-decisions``. Each evaluation's line also shows the last
update's clip fraction (the share of steps whose ratio sits outside PPO's clip, which train nothing) and the share
of the worker's games since the evaluation before that were against bots. Decisions
are the learner's own (each player's moves), so the figure does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import deque

import numpy as np
import torch

from rapid.envs.registry import make_env
from rapid.errors import UsageError
from rapid.infra.store import LocalStore
from rapid.league import League, bot_ids, ensure_bots
from rapid.opt.buffer import ExperienceBuffer
from rapid.opt.learner import Learner, precision_settings
from rapid.roles.optimizer_settings import version_meta
from rapid.roles.startup import build_policy
from rapid.rollout.opponents import LeagueOpponents
from rapid.rollout.worker import RolloutSettings, RolloutWorker
from rapid.run.config_files import load_config
from rapid.run.matches import PolicyPlayer, play_match


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/default.toml")
    parser.add_argument("--lag", type=int, default=0, help="rounds the acting policy trails the learner's")
    parser.add_argument("--round-batches", type=int, default=4, help="batches of fresh samples collected a round")
    parser.add_argument("--reuse", type=float, default=3.0, help="batches drawn a round ÷ batches collected")
    parser.add_argument("--bots", action="store_true", help="keep the config's bot games (default: self-play only)")
    parser.add_argument("--eval-every", type=int, default=20_000, help="decisions between evaluations")
    parser.add_argument("--games", type=int, default=200)
    parser.add_argument("--target", type=float, default=0.9, help="sampled win rate against random to stop at")
    parser.add_argument("--max-decisions", type=int, default=1_500_000)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    if args.lag < 0 or args.round_batches < 1 or args.reuse <= 0 or args.eval_every < 1:
        parser.error("--lag must be ≥ 0, --round-batches ≥ 1, --reuse > 0 and --eval-every ≥ 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        self_play = ["league.bot_prob=0", "ppo.warmup_updates=0", "league.warmup_bots=[]"]
        cfg = load_config(args.config, ([] if args.bots else self_play) + args.overrides)
    except UsageError as e:
        print(f"bench_lag: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    torch.manual_seed(cfg.run.seed)
    env = make_env(cfg.env.name, num_games=cfg.env.num_games, seed=cfg.run.seed, options=cfg.env.options)
    bf16, _ = precision_settings(cfg.optimizer.precision, torch.device("cpu"))  # as the optimizer role sets it
    learner = Learner(build_policy(cfg, env.spec), cfg.ppo, bf16=bf16)
    opponents = None
    bots = bot_ids(cfg.league.bots + cfg.league.warmup_bots) if args.bots else []
    if bots:  # a pool of the config's bots, as the league keeper makes it
        league = League(LocalStore(tempfile.mkdtemp(prefix="bench_lag-")))
        league.update(lambda s: ensure_bots(s, bots, 0.0))
        opponents = LeagueOpponents(league, cfg, env, lambda: build_policy(cfg, env.spec))
    worker = RolloutWorker(env, build_policy(cfg, env.spec), RolloutSettings.of(cfg, env.spec),
                           opponents=opponents, seed=cfg.run.seed)
    judge_env = make_env(cfg.env.name, num_games=args.games, seed=cfg.run.seed + 1, options=cfg.env.options)
    batch = cfg.optimizer.batch_samples
    buffer = ExperienceBuffer(4 * args.round_batches * batch, max_staleness=10**9,
                              keep_reference=cfg.ppo.proximal == "first_use")
    rng = np.random.default_rng(cfg.run.seed)
    published: deque[tuple[dict, dict]] = deque(maxlen=args.lag + 1)
    decisions, rounds, next_eval, started = 0, 0, 0, time.process_time()
    games = {"bot": 0, "all": 0}  # the worker's finished games since the last evaluation
    stats: dict[str, float] = {}
    while decisions < args.max_decisions:
        # Stamped as the optimizer stamps a version (the warm-up, the bot share at the schedules' start).
        published.append((learner.policy.tensors(), version_meta(cfg, learner.updates, 0.0)))
        worker.set_params(rounds, *published[0])
        collected = 0
        while collected < args.round_batches * batch:
            segment = worker.collect()
            arrays = segment.arrays
            games["all"] += len(segment.episodes)
            games["bot"] += sum(str(e["opponent"]).startswith("bot:") for e in segment.episodes)
            if len(arrays["version"]):
                buffer.add(arrays)
                collected += len(arrays["version"])
                decisions += int(arrays["active"].sum())
        for _ in range(round(args.reuse * args.round_batches)):
            drawn = buffer.sample(batch, rounds, rng, cfg.optimizer.max_reuse)
            if drawn is None:
                break
            stats = learner.update(drawn[0], progress=0.0)  # the schedules' start: the first minute's settings
            buffer.remember(drawn[0], learner.reference_logp)
        rounds += 1
        if decisions >= next_eval:
            next_eval = decisions + args.eval_every
            score = play_match(judge_env, PolicyPlayer(learner.policy, env.spec, f"r{rounds}"),
                               judge_env.make_bot("random", seed=rounds), args.games, seed=rounds)
            cpu_s = time.process_time() - started
            bot_share = f"{games['bot'] / games['all']:.0%}" if games["all"] else "-"
            print(f"decisions {decisions:>9,} updates {learner.updates:>5} cpu {cpu_s:6.1f} s "
                  f"clip fraction {stats.get('clip_fraction', 0.0):.2f} "
                  f"games against bots {bot_share} "
                  f"sampled vs random {score.win_rate:.3f}",
                  flush=True)
            games = {"bot": 0, "all": 0}
            if score.win_rate >= args.target:
                print(f"reached {args.target:.0%}: {decisions:,} decisions, {learner.updates} updates, "
                      f"{cpu_s:.1f} CPU-s (lag {args.lag} rounds)")
                return 0
    print(f"not reached {args.target:.0%} in {decisions:,} decisions (lag {args.lag} rounds)")
    return 1


if __name__ == "__main__":
    sys.exit(main())

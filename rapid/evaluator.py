"""The evaluator role: every ``eval.interval_s`` it plays the newest version against the baseline and
logs the win rate, so `rapid train` can show progress against a fixed yardstick (self-play win rates
hover near 50% by construction)."""

from __future__ import annotations

import time

import torch

from rapid.config import Config
from rapid.envs.registry import make_env
from rapid.errors import FormatError
from rapid.evaluate import PolicyPlayer, batch_size, load_policy, play_match
from rapid.infra.store import StoreError
from rapid.params import ParameterStore
from rapid.runtime import JsonlLog, StopFlag, open_run_store, setup_logging


def run_evaluator(cfg: Config, stop: StopFlag | None = None) -> int:
    log = setup_logging("evaluator")
    stop = stop or StopFlag()
    torch.set_num_threads(1)
    store = open_run_store(cfg)
    params = ParameterStore(store)
    games = cfg.eval.games
    env = make_env(cfg.env.name, num_games=batch_size(games), seed=cfg.run.seed + 99991, options=cfg.env.options)
    out = JsonlLog(f"{cfg.derive().run_dir}/logs/eval.jsonl")
    last = -1
    rounds = 0
    while not stop:
        try:
            version = params.latest_version()
        except (StoreError, FormatError) as e:
            log.warning("cannot read the latest version: %s", e)
            version = None
        if version is not None and version > last:
            started = time.time()
            policy = load_policy(cfg, env.spec, params, version)
            opponent = env.make_bot(cfg.eval.opponent, seed=rounds)
            result = play_match(env, PolicyPlayer(policy, f"v{version}"), opponent, games, seed=cfg.run.seed + rounds)
            lo, hi = result.interval()
            out.write({"version": version, "opponent": cfg.eval.opponent, "games": result.games,
                       "wins": result.wins, "losses": result.losses, "draws": result.draws,
                       "win_rate": result.win_rate, "ci_low": lo, "ci_high": hi,
                       "mean_length": result.mean_length, "eval_s": time.time() - started})
            log.info(result.line(f"v{version}", cfg.eval.opponent))
            last, rounds = version, rounds + 1
        stop.wait(cfg.eval.interval_s)
    env.close()
    out.close()
    return 0

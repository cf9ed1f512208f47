"""Config variants side by side on a many-core machine: each `rapid train` on its own cores, then a judged match.

    python benchmarks/bench_variants.py --config configs/moba-1v1.toml --minutes 7 \\
        base: heal02:env.options.fountain_heal=0.02 \\
        heal02-h120:env.options.fountain_heal=0.02,ppo.horizon_s=120
    python benchmarks/bench_variants.py --judge RUN_DIR --games 200     # judge one finished run

Each variant is ``NAME:KEY=VALUE,KEY=VALUE`` (``rapid train --set`` overrides; ``NAME:`` alone is the config as
shipped). Every run is pinned with ``taskset`` to ``--cores`` cores of its own (2 by default: the 2-core
machine the configs are tuned for), so a 16-core machine compares seven variants in the time of one, each with
the CPU a laptop run has. Then the newest version of each plays ``--games`` greedy games against ``--against``
and the script prints the match, the per-game means of the env's per-side game stats (moba: structures
destroyed, kills, last hits, gold) for the learner and its opponent, and the evaluator's curve during training.
An exploration tool: the figures an issue asks for come from bench_learning.py on the machine they name.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_learning import eval_rows

RAPID = [sys.executable, "-m", "rapid.cli"]


def judge(run_dir: Path, against: str, games: int, seed: int) -> None:
    """Print the newest version's greedy match against ``against`` and its per-side game stats."""
    import numpy as np

    from rapid.envs.registry import make_env
    from rapid.infra.store import LocalStore
    from rapid.run.config_files import load_config
    from rapid.run.matches import batch_size, make_player, play_match
    from rapid.run.param_store import ParameterStore

    cfg = load_config(str(run_dir / "config.toml"), [])
    env = make_env(cfg.env.name, num_games=batch_size(games), seed=seed, options=cfg.env.options)
    params = ParameterStore(LocalStore(run_dir / "store"))
    learner = make_player("latest", cfg, env, params, greedy=True)
    opponent = make_player(against, cfg, env, params, seed=seed)
    stats: dict[str, list[tuple[float, float]]] = {}

    def count(ep, side: int) -> None:
        for key in ep.info:
            if key.endswith("_0"):
                name = key[:-2]
                stats.setdefault(name, []).append((ep.info[f"{name}_{side}"], ep.info[f"{name}_{1 - side}"]))

    score = play_match(env, learner, opponent, games, seed=seed, on_episode=count)
    print(f"{run_dir.name}: {score.line('latest', against)}")
    means = ", ".join(f"{name} {np.mean([a for a, _ in v]):.2f}/{np.mean([b for _, b in v]):.2f}"
                      for name, v in sorted(stats.items()))
    print(f"  per game, learner/{against}: {means}")


def curve(run_dir: Path, against: str, greedy: bool = False) -> str:
    """The evaluator's win rate (and wins before the time limit) at each round during training, sampled or
    (``eval.play`` greedy or both) greedy."""
    has_log = (run_dir / "logs" / "eval.jsonl").exists()
    rows = eval_rows(run_dir, against.removeprefix("bot:"), greedy) if has_log else []
    return " ".join(f"v{r['version']} {r['win_rate']:.2f} ({r.get('wins_before_limit', 0)} early)" for r in rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="*", metavar="NAME:KEY=VALUE,...", help="the variants to train")
    p.add_argument("--config", default="configs/moba-1v1.toml", help="the config every variant starts from")
    p.add_argument("--minutes", type=float, default=7.0, help="training minutes of each variant (default 7)")
    p.add_argument("--seed", type=int, default=0, help="run.seed of every variant (default 0)")
    p.add_argument("--cores", type=int, default=2, help="cores pinned to each variant (default 2)")
    p.add_argument("--against", default="bot:lane", help="the judged match's opponent (default bot:lane)")
    p.add_argument("--games", type=int, default=200, help="greedy games of the judged match (default 200)")
    p.add_argument("--out", help="directory for the runs (default: a temporary one)")
    p.add_argument("--judge", metavar="RUN_DIR", help="only judge this finished run")
    args = p.parse_args()
    if args.judge:
        judge(Path(args.judge), args.against, args.games, seed=9001)
        return 0
    variants = [v.partition(":") for v in args.variants]
    if not variants or any(not name or sep != ":" for name, sep, _ in variants):
        p.error("give variants as NAME:KEY=VALUE,... (NAME: alone for the config as shipped)")
    cores = sorted(os.sched_getaffinity(0))
    if len(variants) * args.cores > len(cores):
        p.error(f"{len(variants)} variants × {args.cores} cores need {len(variants) * args.cores} cores; "
                f"this machine gives {len(cores)}")
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-variants-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"{len(variants)} variants of {args.config}, {args.minutes:g} min each on {args.cores} cores; runs in {out}",
          flush=True)
    procs = []
    for i, (name, _, sets) in enumerate(variants):
        pin = ["taskset", "-c", ",".join(map(str, cores[i * args.cores:(i + 1) * args.cores]))]
        overrides = [f"run.seed={args.seed}", "optimizer.device=cpu", *filter(None, sets.split(","))]
        train = RAPID + ["train", "--config", args.config, "--run-dir", str(out / name), "--minutes",
                         str(args.minutes), "--no-progress"] + [x for o in overrides for x in ("--set", o)]
        then_judge = [sys.executable, __file__, "--judge", str(out / name), "--against", args.against,
                      "--games", str(args.games)]
        script = f"{subprocess.list2cmdline(pin + train)} > {out / name}.log 2>&1 && " \
                 f"{subprocess.list2cmdline(pin + then_judge)} > {out / name}.judged 2>> {out / name}.log"
        procs.append((name, subprocess.Popen(["sh", "-c", script])))
    for name, proc in procs:
        code = proc.wait()
        judged = out / f"{name}.judged"
        print(judged.read_text().strip() if code == 0 else f"{name}: failed (exit {code}); see {out / name}.log")
        print(f"  evaluator during training: {curve(out / name, args.against)}", flush=True)
        greedy = curve(out / name, args.against, greedy=True)
        if greedy:
            print(f"  greedy (eval.play): {greedy}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A population against independent runs of the same compute (issue 56; docs/pbt.md).

Arm 1: `rapid train --pbt N` for M minutes (N members, a rollout worker each). Arm 2: N independent `rapid train`
runs of the config, side by side for M minutes (a rollout worker each), seeded as the members are
(``member_seed``): the same processes on the same cores, so the same compute. Each run's and member's newest
version is then rated on the config's strength ladder (opponents training never meets) with ``--games`` games a
rung, and the time to a ladder rating of ``--threshold`` is read from the evaluators' logs.

    python benchmarks/bench_pbt.py --config configs/default.toml --members 4 --minutes 20 --seed 0 --out runs/bench-pbt

Prints a table and, with ``--json FILE``, writes the figures.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rapid.monitoring.logs import read_jsonl
from rapid.roles.pbt_launcher import member_seed

RATING = re.compile(r"ladder rating (-?[0-9.]+) ± ([0-9.]+)")


def rapid(*args: str) -> list[str]:
    return [sys.executable, "-m", "rapid.cli", *args]


def run_population(a, out: Path) -> tuple[float, list[Path]]:
    started = time.time()
    subprocess.run(rapid("train", "--config", a.config, "--pbt", str(a.members), "--minutes", str(a.minutes),
                         "--workers", str(a.members), "--run-dir", str(out / "pbt"), "--no-progress",
                         "--set", f"run.seed={a.seed}", *sum((["--set", s] for s in a.set), [])),
                   check=True, stdout=open(out / "pbt.out", "w"), stderr=subprocess.STDOUT)
    return started, [out / "pbt" / "members" / f"m{m}" for m in range(a.members)]


def run_independent(a, out: Path) -> tuple[float, list[Path]]:
    started, procs, dirs = time.time(), [], []
    for m in range(a.members):
        dirs.append(out / f"ind-{m}")
        procs.append(subprocess.Popen(
            rapid("train", "--config", a.config, "--minutes", str(a.minutes), "--workers", "1", "--run-dir",
                  str(dirs[-1]), "--no-progress", "--set", f"run.seed={member_seed(a.seed, m)}",
                  *sum((["--set", s] for s in a.set), [])),
            stdout=open(out / f"ind-{m}.out", "w"), stderr=subprocess.STDOUT))
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"an independent run failed: see {out}/ind-*.out")
    return started, dirs


def final_rating(run_dir: Path, games: int) -> tuple[float, float]:
    text = subprocess.run(rapid("eval", "--run-dir", str(run_dir), "--ladder", "--games", str(games)),
                          capture_output=True, text=True, check=True).stdout
    found = RATING.findall(text)
    if not found:
        raise SystemExit(f"no ladder rating in rapid eval's output for {run_dir}:\n{text}")
    return float(found[-1][0]), float(found[-1][1])


def minutes_to(run_dir: Path, threshold: float, started: float) -> float | None:
    for record in read_jsonl(run_dir / "logs" / "eval.jsonl"):
        if "ladder_rating" in record and record["ladder_rating"] >= threshold:
            return (record["time"] - started) / 60
    return None


def arm(name: str, started: float, dirs: list[Path], a) -> dict:
    rated = [final_rating(d, a.games) for d in dirs]
    reached = [minutes_to(d, a.threshold, started) for d in dirs]
    hit = [t for t in reached if t is not None]
    return {"arm": name, "ratings": rated, "best": max(r for r, _ in rated),
            "mean": statistics.mean(r for r, _ in rated), "minutes_to_threshold": reached,
            "first_to_threshold": min(hit) if hit else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/default.toml")
    p.add_argument("--members", type=int, default=4)
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--games", type=int, default=200, help="ladder games a rung for each final rating")
    p.add_argument("--threshold", type=float, default=400.0, help="the ladder rating timed (Elo, random at 0)")
    p.add_argument("--out", default="runs/bench-pbt")
    p.add_argument("--set", action="append", default=[], help="a config override for both arms")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args()
    out = Path(a.out) / f"seed{a.seed}"
    out.mkdir(parents=True, exist_ok=False)
    results = [arm("population", *run_population(a, out), a), arm("independent", *run_independent(a, out), a)]
    print(f"{a.members} members against {a.members} independent runs, {a.minutes:g} min each arm, seed {a.seed}, "
          f"{a.config}; final ladder ratings with {a.games} games a rung")
    for r in results:
        ratings = ", ".join(f"{x:.0f} ± {s:.0f}" for x, s in r["ratings"])
        first = "never" if r["first_to_threshold"] is None else f"{r['first_to_threshold']:.1f} min"
        print(f"  {r['arm']:<12} best {r['best']:.0f}, mean {r['mean']:.0f} ({ratings}); first to {a.threshold:g}: "
              f"{first}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

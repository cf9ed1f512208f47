"""The surgery walkthrough (docs/surgery.md), measured as a user would run it: `rapid train`, `rapid eval`,
`rapid surgery`, `rapid train --resume`, and a run from scratch in the new shape.

    python benchmarks/bench_surgery.py                     # 10 + 10 minutes, and 20 from scratch: ~45 min
    python benchmarks/bench_surgery.py --minutes 0.5 --games 40   # a smoke run of the script (~3 min)

1. moba 1v1 (configs/moba-1v1.toml) trained for M minutes;
2. evaluated against the scripted `lane` bot (greedy, the same seed every time: win rate and 95% interval);
3. surgery adding the moba game's `observe_cooldowns` observations and doubling the LSTM, then the same
   evaluation at once (the first after surgery should match the last before, within the interval);
4. M more minutes of training, evaluated;
5. a run from scratch in the new shape for 2M minutes, evaluated.

Every figure line starts with the machine's load (``uptime``): the runs share the CPU with whatever else runs.
It is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAPID = [sys.executable, "-m", "rapid.cli"]
SURGERY = [sys.executable, "-m", "rapid.surgery"]
CONFIG = "configs/moba-1v1.toml"
NEW_OBSERVATIONS = "env.options.observe_cooldowns=true"


def load() -> str:
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def run(cmd: list[str], timeout: float) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout.strip()


def train(run_dir: Path, minutes: float, seed: int, resume: bool = False, overrides: tuple[str, ...] = ()) -> None:
    start = ["--resume"] if resume else ["--config", CONFIG, "--set", f"run.seed={seed}"]
    where = ["--run-dir", str(run_dir), *start]
    run(RAPID + ["train", *where, "--minutes", str(minutes), "--no-progress",
                 *[x for o in overrides for x in ("--set", o)]], timeout=60 * minutes + 600)


def evaluate(run_dir: Path, games: int) -> str:
    return run(RAPID + ["eval", "--run-dir", str(run_dir), "--against", "lane", "--games", str(games), "--greedy",
                        "--seed", "9001"], timeout=1800)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="M: minutes before and after surgery")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--games", type=int, default=400, help="games of each evaluation against lane")
    parser.add_argument("--out", help="folder for the runs (default: a temporary one)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-surgery-"))
    carried, scratch = out / "carried", out / "scratch"
    from rapid.run.config_files import load_config

    lstm = load_config(CONFIG).model.lstm
    change = (f"model.lstm={2 * lstm}", NEW_OBSERVATIONS)
    started = time.time()
    print(f"runs in {out}; M = {args.minutes} min, seed {args.seed}, {args.games} games an evaluation", flush=True)

    train(carried, args.minutes, args.seed)
    print(f"{load()}  before surgery ({args.minutes:g} min):  {evaluate(carried, args.games)}", flush=True)
    surgery = [*SURGERY, "--run-dir", str(carried), "--seed", str(args.seed),
               *[x for c in change for x in ("--set", c)]]
    t = time.time()
    report = run(surgery + ["--apply"], timeout=1800)
    print(f"{load()}  surgery ({time.time() - t:.1f} s):\n    " + report.replace("\n", "\n    "), flush=True)
    print(f"{load()}  right after surgery:     {evaluate(carried, args.games)}", flush=True)
    train(carried, args.minutes, args.seed, resume=True)
    print(f"{load()}  after {args.minutes:g} more min:      {evaluate(carried, args.games)}", flush=True)

    train(scratch, 2 * args.minutes, args.seed, overrides=change)
    print(f"{load()}  from scratch, new shape, {2 * args.minutes:g} min: {evaluate(scratch, args.games)}", flush=True)
    print(f"total {(time.time() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())

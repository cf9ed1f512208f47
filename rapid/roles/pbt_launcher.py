"""`rapid train --pbt N`: a population of N members on this machine (docs/pbt.md).

Each member is a `rapid train` of its own (``--set pbt.member=K``: its optimizer, rollout workers and evaluator,
restarted as any run's are, and started again at once after it copies a leader), with its logs under
``RUN_DIR/members/m<K>/`` and its store under the population's. This process starts them, shows a line per
member every ``PROGRESS_S``, stops them together (Ctrl-C, or each at ``run.minutes``), then prints the population
(`rapid pbt ls`) and plots it to ``RUN_DIR/report/pbt.png``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from rapid.errors import UsageError
from rapid.infra.store import StoreError
from rapid.roles.launcher import default_workers, holds_run, prepare_run_dir
from rapid.roles.pbt_member import open_population
from rapid.roles.startup import StopFlag, setup_logging
from rapid.run.config import Config
from rapid.run.pbt_config import member_folder
from rapid.run.pbt_view import plot, table

PROGRESS_S = 30.0


MEMBER_SEED_STEP = 7919


def member_seed(seed: int, member: int) -> int:
    """Member K's run.seed: its own initial weights and games (the population's hyperparameters come from the
    population's run.seed, whichever member writes them first)."""
    return (seed + MEMBER_SEED_STEP * member) % (1 << 32)


def member_command(root: Path, member: int, workers: int, resume: bool, seed: int = 0) -> list[str]:
    """The `rapid train` of one member: resumed where its folder holds a run, else started from the population's
    config with the member's own seed."""
    folder = Path(member_folder(root.as_posix(), member))
    if resume and holds_run(folder, Path(member_folder((root / "store").as_posix(), member))):
        how = ["--resume", "--run-dir", folder.as_posix()]
    else:
        how = ["--config", (root / "config.toml").as_posix(), "--set", f"run.seed={member_seed(seed, member)}"]
    return [sys.executable, "-m", "rapid.cli", "train", *how, "--set", f"pbt.member={member}",
            "--set", f"run.num_workers={workers}", "--no-progress"]


def run_population(cfg: Config, resume: bool = False, show_progress: bool = True) -> int:
    """Every member until each stops; 0 when every member's `rapid train` ended cleanly."""
    log = setup_logging("pbt")
    n = cfg.pbt.members
    if n < 2 or cfg.pbt.member >= 0:
        raise UsageError("rapid train --pbt N: N must be at least 2 (pbt.members), and pbt.member left at -1")
    if cfg.store.url:
        raise UsageError("rapid train --pbt keeps the population's store in its run directory: leave store.url "
                         "empty (on a cluster, start each member's jobs with --set pbt.member=K: docs/pbt.md)")
    if not resume and (Path(cfg.derive().run_dir) / "store" / "pbt").is_dir():
        raise UsageError(f"{cfg.derive().run_dir} already holds a population: add --resume to continue it, or pick "
                         "another --run-dir")
    root = prepare_run_dir(cfg, resume=False) if not resume else Path(cfg.derive().run_dir)
    workers = max(1, (cfg.run.num_workers or default_workers()) // n)
    stop = StopFlag()
    children = []
    for m in range(n):
        log_path = root / "logs" / f"member-{m}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            children.append(subprocess.Popen(member_command(root, m, workers, resume, cfg.run.seed), stdout=out,
                                             stderr=subprocess.STDOUT))
    print(f"rapid train: a population of {n} members in {root}, {workers} rollout worker(s) each; each member's "
          f"output in {root / 'logs'}/member-<K>.log; Ctrl-C stops them all", flush=True)
    pops = open_population(cfg, log)
    shown = time.time()
    try:
        while any(c.poll() is None for c in children):
            if stop.wait(1.0):
                break
            if show_progress and time.time() - shown >= PROGRESS_S:
                shown = time.time()
                _show(pops)
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(2)  # SIGINT: each member stops cleanly, with its final checkpoint
        codes = [child.wait() for child in children]
    print("\nrapid train --pbt finished:", ", ".join(f"m{m} exit {c}" for m, c in enumerate(codes)))
    _show(pops)
    try:
        print(f"plots: {plot(pops, root / 'report' / 'pbt.png')}")
    except UsageError as e:
        print(f"no plots: {e}")
    return 0 if all(c in (0, -2, -15) for c in codes) else 1


def _show(pops) -> None:
    try:
        print(table(pops), flush=True)
    except (UsageError, StoreError) as e:
        print(f"pbt: {e}", flush=True)

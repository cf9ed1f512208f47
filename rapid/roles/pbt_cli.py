"""`rapid pbt`: a population's members, fitness, hyperparameters and lineage (`ls`), and their plots (`plot`)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rapid.errors import UsageError
from rapid.roles.pbt_member import open_population
from rapid.run.config import Config
from rapid.run.pbt_view import plot, table

HELP = "a population's members (rapid train --pbt): fitness, hyperparameters, lineage, plots"


def add_arguments(p: argparse.ArgumentParser, run_dir_arg) -> None:
    p.add_argument("action", choices=["ls", "plot"], help="ls: the table of members and rounds; plot: PNG plots")
    run_dir_arg(p)
    p.add_argument("--store", help="the population's store URL instead of --run-dir, e.g. s3://bucket/exp1")
    p.add_argument("--out", help="plot: the PNG to write (default RUN_DIR/report/pbt.png, or pbt.png)")


def run(args: argparse.Namespace, cfg: Config | None) -> int:
    """``cfg``: the population's config (from --run-dir), or None with --store."""
    if cfg is None and not args.store:
        raise UsageError("rapid pbt: give --run-dir (the population's run directory) or --store URL")
    cfg = cfg or Config()
    if args.store:
        cfg.store.url = args.store
    if cfg.pbt.member >= 0:
        raise UsageError("rapid pbt: give the population's run directory, not a member's")
    pops = open_population(cfg, logging.getLogger("rapid.pbt"))
    if args.action == "ls":
        print(table(pops))
        return 0
    out = Path(args.out) if args.out else (Path(cfg.derive().run_dir) / "report" / "pbt.png" if not args.store
                                           else Path("pbt.png"))
    print(f"wrote {plot(pops, out)}")
    return 0

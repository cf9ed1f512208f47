"""The learner of an earlier commit against today's, interleaved in one process on one batch (an A/B that a
shared machine's load drifts over cancels out of), in CPU seconds per update.

    python benchmarks/bench_learner_ab.py --base ce9acce --model moba-5v5 --samples 256 --rounds 10
    python benchmarks/bench_learner_ab.py --base ce9acce --model c4-bptt16 --samples 256 --microbatch 64

``opt/learner.py`` of ``--base`` is loaded from git beside today's (the rest of the code is today's, so the
base must share today's ``Learner(policy, ppo, device, microbatch_samples=…)``). Both learners start from the
same weights and must still agree at the end: an A/B of two learners that compute different updates would
measure nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parent))  # bench_learner beside this script
from bench_learner import MODELS, make_batch  # noqa: E402

from rapid.opt.learner import Learner
from rapid.roles.startup import build_policy, env_spec
from rapid.run.config_files import load_config

ROOT = Path(__file__).resolve().parents[1]


def learner_at(commit: str):
    """The ``Learner`` class of ``opt/learner.py`` at ``commit``."""
    source = subprocess.run(["git", "show", f"{commit}:opt/learner.py"], cwd=ROOT, capture_output=True, text=True)
    if source.returncode != 0:
        sys.exit(f"bench_learner_ab.py: {source.stderr.strip()}")
    path = Path(tempfile.mkdtemp()) / "base_learner.py"
    path.write_text(source.stdout)
    spec = importlib.util.spec_from_file_location("base_learner", path)
    if spec is None or spec.loader is None:
        sys.exit(f"bench_learner_ab.py: {path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Learner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit whose opt/learner.py is compared")
    parser.add_argument("--model", choices=sorted(MODELS), default="moba-5v5")
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--microbatch", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=10, help="timed updates of each learner")
    args = parser.parse_args()
    torch.set_num_threads(1)
    path, overrides, game_steps = MODELS[args.model]
    cfg = load_config(path, overrides=overrides)
    spec = env_spec(cfg)
    batch = make_batch(spec, cfg, args.samples, game_steps, np.random.default_rng(0))
    learners = {}
    for label, cls in (("base", learner_at(args.base)), ("today", Learner)):
        torch.manual_seed(0)
        learners[label] = cls(build_policy(cfg, spec), cfg.ppo, "cpu", microbatch_samples=args.microbatch)
        learners[label].update(batch)  # warm-up
    seconds: dict[str, list[float]] = {label: [] for label in learners}
    for r in range(args.rounds):
        for label in (("base", "today") if r % 2 == 0 else ("today", "base")):  # alternate who goes first
            t0 = time.process_time()
            learners[label].update(batch)
            seconds[label].append(time.process_time() - t0)
    print(f"{args.model} samples={args.samples} microbatch={args.microbatch} rounds={args.rounds} threads=1")
    for label, s in seconds.items():
        print(f"{label:<6} median {1000 * np.median(s):7.1f} ms CPU/update, min {1000 * min(s):7.1f} ms, "
              f"{args.samples / np.median(s):,.0f} samples per CPU-second")
    for a, b in zip(learners["base"].policy.parameters(), learners["today"].policy.parameters()):
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-6):
            sys.exit("bench_learner_ab.py: the two learners' weights diverged; the A/B compares different updates")
    print(f"weights agree after {args.rounds + 1} updates of each")


if __name__ == "__main__":
    main()

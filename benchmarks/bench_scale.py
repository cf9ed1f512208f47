"""The optimizer against N rollout workers, as `rapid train` runs them, for a fixed time.

    python benchmarks/bench_scale.py --config configs/default.toml --workers 1 --minutes 5 [--device cuda]
                                     [--set optimizer.target_reuse=1.0 ...] [--run-dir DIR]

Starts ``rapid train`` (the launcher: N rollout workers + the optimizer; the evaluator only with
``--with-eval``), prints the run's own summary, and reads the run's
optimizer log when it ends. Prints agent-steps/s received, samples/s received and consumed, the share of
received samples used at least once and dropped stale, staleness p50/p99, reuse against its target, the
balancer's choices, the update-time breakdown, GPU utilization when CUDA is present, and the machine's
load average at the start and the end (figures from a shared machine are only as good as its load).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from rapid.monitoring.logs import read_jsonl

RAPID = str(Path(sys.executable).parent / "rapid")
PHASES = ("wait_s", "forward_s", "backward_s", "allreduce_s", "step_s", "update_s")


def gpu_sampler(samples: list[float], stop: threading.Event, every_s: float = 2.0) -> threading.Thread | None:
    """Samples torch.cuda.utilization() (needs NVML) while the run goes on; None without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        torch.cuda.utilization()
    except Exception as e:  # no NVML: say so and go on without the figure
        print(f"GPU utilization not available: {type(e).__name__}: {e}")
        return None

    def run():
        while not stop.wait(every_s):
            samples.append(float(torch.cuda.utilization()))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def summarize(ops: list[dict], gpu: list[float]) -> list[str]:
    first, last = ops[0], ops[-1]
    span = max(last["time"] - first["time"], 1e-9)
    received, consumed = last["samples_received"], last["samples_consumed"]
    used, stale = last.get("samples_used", 0), last["samples_dropped_stale"]
    lines = [
        f"optimizer records   : {len(ops)} updates over {span:.0f} s, {last['version']} versions published",
        f"agent-steps/s       : {(last['env_steps'] - first['env_steps']) / span:,.0f} (received from rollouts)",
        f"samples/s           : {(received - first['samples_received']) / span:,.1f} received, "
        f"{(consumed - first['samples_consumed']) / span:,.1f} consumed",
        f"used at least once  : {used / max(received, 1):.1%} of {received:,} received samples",
        f"dropped stale       : {stale / max(received, 1):.1%} (evicted unused "
        f"{last.get('samples_evicted_unused', 0) / max(received, 1):.1%})",
        f"staleness           : p50 {last.get('staleness_p50', float('nan')):.0f}, "
        f"p99 {last.get('staleness_p99', float('nan')):.0f} versions",
        f"reuse               : {last['sample_reuse']:.3f} (target {last.get('balance_target_reuse', float('nan')):g})",
    ]
    if "balance_batch" in last:
        batches = [o["balance_batch"] for o in ops]
        lines.append(f"balancer            : batch {min(batches)}…{max(batches)} (last {last['balance_batch']}), "
                     f"publish every {last['balance_publish_interval_s']:g} s, capacity "
                     f"{last['balance_capacity_per_s']:,.0f} samples/s, overloaded {last['balance_overloaded']}")
    means = {p: float(np.mean([o.get(p, 0.0) for o in ops])) * 1e3 for p in PHASES}
    lines.append("update time (ms)    : " + ", ".join(f"{p[:-2]} {v:.1f}" for p, v in means.items()))
    lines.append(f"GPU utilization     : {np.mean(gpu):.0f}% mean of {len(gpu)} samples" if gpu
                 else "GPU utilization     : no CUDA device")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/default.toml")
    ap.add_argument("--workers", type=int, default=None, help="rollout workers (default: the config's)")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--run-dir", default="")
    ap.add_argument("--with-eval", action="store_true", help="keep the config's evaluator (as `rapid train` runs)")
    args = ap.parse_args()
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="bench-scale-"))
    sets = [f"run.minutes={args.minutes}", f"optimizer.device={args.device}",
            *([] if args.with_eval else ["eval.interval_s=0"]), *args.set]
    if args.workers is not None:
        sets.append(f"run.num_workers={args.workers}")
    cmd = [RAPID, "train", "--config", args.config, "--run-dir", str(run_dir), "--no-progress"]
    for s in sets:
        cmd += ["--set", s]
    print("command:", " ".join(cmd))
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    gpu: list[float] = []
    stop = threading.Event()
    gpu_sampler(gpu, stop)
    started = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=60 * args.minutes + 300)
    stop.set()
    print(f"rapid train exited {proc.returncode} after {time.time() - started:.0f} s")
    print(f"load average at end  : {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ops = read_jsonl(run_dir / "logs" / "optimizer.jsonl")
    if not ops:
        print("no optimizer records; the run's output:\n" + proc.stdout[-3000:])
        return 1
    print(proc.stdout[proc.stdout.find("rapid train finished"):].rstrip())
    print("\n".join(summarize(ops, gpu)))
    print(f"run directory: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

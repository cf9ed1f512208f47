"""Cost of rapid.monitoring calls in the rollout and optimizer loops (issue 6: < 2% throughput).

Usage::

    python benchmarks/bench_metrics.py            # prints ns per call and the per-step / per-update cost

What a loop pays: a rollout worker calls env_steps + agent_steps once per vectorized step (and episode() per
finished game); an optimizer calls update(), six update_phase(), staleness() on the minibatch and a few
counters once per update. The exporter thread is running (as in a real process) but nobody scrapes it.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from rapid.monitoring.metrics import RolloutMetrics
from rapid.monitoring.optimizer_metrics import UPDATE_PHASES, OptimizerMetrics


def per_call_ns(fn, n: int, repeats: int = 5) -> float:
    """Best of ``repeats`` runs of n/repeats calls: the machine is shared, the minimum is the call's own cost."""
    fn()  # warm: first use of a label value creates its child
    per_run = max(1, n // repeats)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(per_run):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / per_run)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per single-method measurement")
    parser.add_argument("--minibatch", type=int, default=4096, help="samples whose staleness one update observes")
    args = parser.parse_args()

    rollout, opt = RolloutMetrics("bench", 0), OptimizerMetrics("bench", 0)
    rollout.serve(port=0)
    opt.serve(port=0)
    stale = np.random.default_rng(0).integers(0, 6, args.minibatch)
    stats = {"policy_loss": -0.01, "value_loss": 0.4, "entropy": 1.1, "approx_kl": 0.01, "clip_fraction": 0.1,
             "explained_variance": 0.5, "grad_norm": 1.0, "learning_rate": 3e-4}

    def rollout_step():
        rollout.env_steps(64)
        rollout.agent_steps(640)

    def optimizer_update():
        opt.update(stats)
        for phase in UPDATE_PHASES:
            opt.update_phase(phase, 0.01)
        opt.staleness(stale)
        opt.samples_consumed(args.minibatch)
        opt.sample_reuse(1.3)
        opt.buffer_size(20_000, 32_768)
        opt.param_version(7)

    single = {
        "rollout.env_steps(n)": lambda: rollout.env_steps(64),
        "rollout.episode(ret, len)": lambda: rollout.episode(1.0, 200),
        "rollout.samples_uploaded(n, bytes, s)": lambda: rollout.samples_uploaded(1024, 1 << 20, 0.05),
        "optimizer.update(stats: 8 keys)": lambda: opt.update(stats),
        "optimizer.update_phase(phase, s)": lambda: opt.update_phase("forward", 0.01),
        f"optimizer.staleness(array[{args.minibatch}])": lambda: opt.staleness(stale),
        "optimizer.bad_object(reason)": lambda: opt.bad_object("decode"),
    }
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"{'call':42s} {'ns/call':>10s} {'calls/s':>12s}")
    for name, fn in single.items():
        calls = args.calls if "staleness" not in name else args.calls // 20
        ns = per_call_ns(fn, calls)
        print(f"{name:42s} {ns:10.0f} {1e9 / ns:12.0f}")
    step_ns = per_call_ns(rollout_step, args.calls)
    update_ns = per_call_ns(optimizer_update, args.calls // 20)
    print(f"{'rollout step (env_steps + agent_steps)':42s} {step_ns:10.0f} {1e9 / step_ns:12.0f}")
    print(f"{'optimizer update (all per-update calls)':42s} {update_ns:10.0f} {1e9 / update_ns:12.0f}")
    # What 2% of a loop iteration buys: the shortest step/update that metrics leave within budget.
    print(f"2% budget met for rollout steps >= {step_ns * 50 / 1e3:.1f} us, "
          f"optimizer updates >= {update_ns * 50 / 1e6:.2f} ms")
    rollout.close()
    opt.close()


if __name__ == "__main__":
    main()

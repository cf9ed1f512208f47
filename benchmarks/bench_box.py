"""The box model: one GPU box in simulated time, to find where a run's time goes without a GPU.

    python benchmarks/bench_box.py                         # as recorded (beside the H200 run's figures) and today
    python benchmarks/bench_box.py --setting today --set optimizer.pace_rollouts=false
    python benchmarks/bench_box.py --setting as-recorded --intake-ms-per-mb 1.9 --json out.json

What runs is rapid's own code (``benchmarks/box/box.py``): 14 (as recorded) or 11 (today, ``plan_box``) rollout
workers, each a ``RolloutLoop`` with a real ``Uploader``, taking versions from the node's inference server
(``ServerVersions``; the server's ``ParamPoller`` is rapid's); one optimizer process, an ``OptimizerLoop`` with
rapid's ``ExperienceLoader``, ``ExperienceBuffer``, ``Balancer`` (its batch ceiling, the rollouts' pace) and
``BackgroundWriter``; configs/moba-5v5.toml with ``--set`` overrides, as ``rapid train`` reads it. The processes
(the workers, the server, the optimizer, its decode processes, the evaluator) share ``--cores`` cores fairly, the
threads of each share its interpreter lock, and the learner's and the server's kernels share one GPU
(``box/cores.py``). Stand-ins (``box/parts.py``) only cost time: env steps and the server's passes (the H200
run's figures), decoding and intake per MB (bench_intake, on this machine), the learner's update (bench_learner
--loop on the H200). Every cost and where it comes from: ``box/costs.py``.

Settings. ``as-recorded``: the recorded run's code: no pace, the batch ceiling 4 × 128, intake in the optimizer's
process at ``--intake-ms-per-mb`` (default 4.5: the issue's probes put it at 2–4.5 on the box). ``today``: HEAD's:
the pace on, 11 workers, the GPU ceiling (buffer / 2), the decoders reading objects into shared memory (0.18 ms/MB
of the optimizer's CPU on this machine). Prints each measure beside the recorded run's, and names the bottleneck:
the resource busiest over the run (the cores, the optimizer's lock, the GPU, the server, the decode processes).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # benchmarks/, for box.* and fleet.*

from box.box import Box  # noqa: E402
from box.costs import as_recorded, today  # noqa: E402

RECORDED = {
    "agent_steps_per_s": 286e3,
    "trained_share": 509 / 3890,
    "stale_share": 0.657,
    "staleness_p50": 14,
    "staleness_p99": 17,
    "versions": 95,
    "updates": 3179,
    "gpu": 0.166,
    "server": 0.81,
}
"""The H200 run (BENCHMARKS.md, "On the H200 box"): 5 minutes of moba 5v5, 14 workers, node inference."""
ROWS = (
    ("agent-steps/s", "agent_steps_per_s", "{:,.0f}"),
    ("samples loaded of made", "loaded_share", "{:.1%}"),
    ("trained of loaded", "trained_share", "{:.1%}"),
    ("dropped stale of loaded", "stale_share", "{:.1%}"),
    ("staleness p50", "staleness_p50", "{:.0f}"),
    ("staleness p99", "staleness_p99", "{:.0f}"),
    ("versions", "versions", "{:,}"),
    ("updates", "updates", "{:,}"),
    ("mean batch", "mean_batch", "{:,.0f}"),
    ("batch ceiling", "ceiling", "{:,}"),
    ("pace at the end", "pace_end", "{:.2f}"),
    ("MB/s taken in", "intake_mb_per_s", "{:,.0f}"),
)
BUSY = (
    ("cores", "cores"),
    ("optimizer's lock", "optimizer"),
    ("GPU", "gpu"),
    ("node server", "server"),
    ("a decode process", "decoders"),
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=("as-recorded", "today", "both"), default="both")
    p.add_argument("--minutes", type=float, default=5.0, help="simulated minutes (the recorded run: 5)")
    p.add_argument("--cores", type=int, default=16)
    p.add_argument("--workers", type=int, default=0, help="rollout workers (0: the setting's: 14 or 11)")
    p.add_argument(
        "--intake-ms-per-mb",
        type=float,
        default=None,
        help="the optimizer's CPU per MB taken in, on the box (default: the setting's)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a config override over configs/moba-5v5.toml, as rapid train takes it (repeatable)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the figures here")
    return p.parse_args(argv)


def settings_of(a: argparse.Namespace, name: str):
    make = as_recorded if name == "as-recorded" else today
    s = make(sim_s=60 * a.minutes, cores=a.cores, seed=a.seed)
    if a.intake_ms_per_mb is not None:
        s = replace(s, costs=replace(s.costs, intake_box_s_per_mb=a.intake_ms_per_mb / 1e3))
    return replace(s, workers=a.workers or s.workers, overrides=(*s.overrides, *a.set))


def cell(fig: dict | None, key: str, fmt: str) -> str:
    if fig is None or key not in fig:
        return "—"
    return fmt.format(fig[key])


def print_table(runs: dict[str, dict], out=print) -> None:
    names = list(runs)
    cols = [
        *(f"model, {n}" for n in names[:1]),
        *(["recorded"] if "as-recorded" in runs else []),
        *(f"model, {n}" for n in names[1:]),
    ]
    out(f"{'':<26}" + "".join(f"{c:>22}" for c in cols))

    def row(label: str, values: list[str]) -> None:
        out(f"{label:<26}" + "".join(f"{v:>22}" for v in values))

    def values(key: str, fmt: str, busy: bool = False) -> list[str]:
        figs = [runs[n]["busy"] if busy else runs[n] for n in names]
        rec = [cell(RECORDED, key, fmt)] if "as-recorded" in runs else []
        return [cell(figs[0], key, fmt), *rec, *(cell(f, key, fmt) for f in figs[1:])]

    for label, key, fmt in ROWS:
        row(label, values(key, fmt))
    for label, key in BUSY:
        row(f"busy: {label}", values(key, "{:.0%}", busy=True))
    row(
        "bottleneck",
        [
            runs[names[0]]["bottleneck"],
            *(["—"] if "as-recorded" in runs else []),
            *(runs[n]["bottleneck"] for n in names[1:]),
        ],
    )
    for n in names:
        f = runs[n]
        use = ", ".join(f"{k} {v:.2f}" for k, v in sorted(f["cpu_by_use"].items(), key=lambda kv: -kv[1]))
        out(
            f"{n}: {f['workers']} workers on {f['cores']} cores, {f['cores_wanted']:.1f} processes wanting a core on "
            f"average; the bottleneck is {f['bottleneck_text']}"
            + (f" ({f['busy'][f['bottleneck']]:.0%} busy)" if f["bottleneck"] in f["busy"] else "")
            + "; "
            f"CPU seconds a second by use: {use}"
        )


def main(argv=None) -> int:
    a = parse_args(argv)
    names = ["as-recorded", "today"] if a.setting == "both" else [a.setting]
    runs = {n: Box(settings_of(a, n)).run() for n in names}
    print_table(runs)
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {"runs": runs, "recorded": RECORDED, "costs": {n: vars(settings_of(a, n).costs) for n in names}},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

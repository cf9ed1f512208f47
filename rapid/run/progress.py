"""The live progress line of `rapid train` and its end-of-run summary, both read from the run's logs."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rapid.monitoring.logs import JsonlTail, read_jsonl
from rapid.run.restart_summary import Death, restart_lines, summed

MODES = ("sampled", "greedy")
"""The ways the evaluator's policy may act against the baseline (``eval.play``), in the order a round plays them."""
_MODE_WORD = {"sampled": "", "greedy": "greedy "}
REACHED = 0.9
"""The win rate against the baseline whose first arrival the summary's first-minutes line times."""


def _fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def is_baseline(record: dict) -> bool:
    """An evaluation against the fixed baseline (the evaluator also logs games against pool members)."""
    return "ci_low" in record


def eval_mode(record: dict) -> str:
    """How the evaluated policy acted: 'greedy' or 'sampled' (records written before ``eval.play`` lack the key
    and were sampled)."""
    return "greedy" if record.get("greedy") else "sampled"


def baseline_evals(run_dir: Path, mode: str | None = None) -> list[dict]:
    """The evaluations against the baseline, oldest first; with ``mode``, only those played that way."""
    return [e for e in read_jsonl(run_dir / "logs" / "eval.jsonl")
            if is_baseline(e) and mode in (None, eval_mode(e))]


def is_ladder(record: dict) -> bool:
    """A rating on the strength ladder (``eval.ladder``)."""
    return "ladder_rating" in record


def by_mode(evals: list[dict]) -> dict[str, list[dict]]:
    """Baseline evaluations by mode, 'sampled' first, each oldest first; modes not played are left out."""
    modes = {mode: [e for e in evals if eval_mode(e) == mode] for mode in MODES}
    return {mode: rows for mode, rows in modes.items() if rows}


class RunLogs:
    """The run's logs as the launcher polls them every second, read incrementally."""

    def __init__(self, run_dir: Path):
        self._ops = JsonlTail(run_dir / "logs" / "optimizer.jsonl")
        self._evals = JsonlTail(run_dir / "logs" / "eval.jsonl")

    def refresh(self) -> None:
        self._ops.poll()
        self._evals.poll()

    @property
    def ops(self) -> list[dict]:
        return self._ops.rows

    def last_evals(self) -> dict[str, dict]:
        """The newest evaluation against the baseline in each mode played, 'sampled' first."""
        last: dict[str, dict] = {}
        for e in reversed(self._evals.rows):
            if is_baseline(e):
                last.setdefault(eval_mode(e), e)
            if len(last) == len(MODES):
                break
        return {mode: last[mode] for mode in MODES if mode in last}

    def last_ladder(self) -> dict | None:
        """The newest rating on the strength ladder."""
        return next((e for e in reversed(self._evals.rows) if is_ladder(e)), None)

    def last_eval(self, mode: str) -> dict | None:
        """The newest evaluation against the baseline played in ``mode``."""
        return self.last_evals().get(mode)


def status_line(logs: RunLogs, elapsed: float, window_s: float = 30.0) -> str:
    ops = logs.ops
    if not ops:
        return f"[{_fmt_time(elapsed)}] waiting for the first update…"
    last = ops[-1]
    recent = [o for o in ops[-2000:] if o["time"] >= last["time"] - window_s]
    span = max(last["time"] - recent[0]["time"], 1e-6)
    steps_s = (last["env_steps"] - recent[0]["env_steps"]) / span if len(recent) > 1 else 0.0
    samples_s = (last["samples_consumed"] - recent[0]["samples_consumed"]) / span if len(recent) > 1 else 0.0
    text = (f"[{_fmt_time(elapsed)}] v{last['version']} upd {last['update']} | {_fmt_rate(steps_s)} agent-steps/s "
            f"| {_fmt_rate(samples_s)} samples/s | staleness {last['staleness_mean']:.1f} | reuse "
            f"{last['sample_reuse']:.2f} | entropy {last['entropy']:.2f}")
    last = logs.last_evals()
    if last:
        text += " | " + _win_text(last)
    ladder = logs.last_ladder()
    if ladder:
        text += f" | ladder {ladder_text(ladder)}"
    return text


def ladder_text(record: dict) -> str:
    """'812 ± 41 (v30)': a ladder rating, its standard error and the version rated."""
    return f"{record['ladder_rating']:.0f} ± {record['ladder_sigma']:.0f} (v{record['version']})"


def ladder_lines(evals: list[dict]) -> list[str]:
    """The last ladder rating with its games against each rung, and the best."""
    rows = [e for e in evals if is_ladder(e)]
    if not rows:
        return []
    last, top = rows[-1], max(rows, key=lambda r: r["ladder_rating"])
    rungs = ", ".join(f"{k} {v['win_rate']:.0%}" for k, v in last["ladder"].items())
    mode = "greedy" if last.get("greedy") else "sampled"
    return [f"  ladder rating      : {ladder_text(last)}, {mode}: {rungs}",
            f"  best ladder rating : {ladder_text(top)}"]


def _win_text(last: dict[str, dict]) -> str:
    """'win vs random 66% (v8), greedy 91%': the newest rate in each mode, the version where it differs."""
    (mode, first), *others = last.items()
    text = f"win vs {first['opponent']} {_MODE_WORD[mode]}{first['win_rate']:.0%} (v{first['version']})"
    for mode, e in others:
        text += f", {_MODE_WORD[mode]}{e['win_rate']:.0%}" + (
            f" (v{e['version']})" if e["version"] != first["version"] else "")
    return text


class Progress:
    """A single rewritten line on a terminal; a plain line every 15 s when output is a file."""

    def __init__(self, logs: RunLogs, enabled: bool = True):
        self.logs, self.enabled = logs, enabled
        self.tty = sys.stdout.isatty()
        self.started = time.time()
        self.last_print = 0.0
        self.width = 0

    def update(self) -> None:
        if not self.enabled:
            return
        now = time.time()
        if not self.tty and now - self.last_print < 15:
            return
        self.last_print = now
        line = status_line(self.logs, now - self.started)
        if self.tty:
            sys.stdout.write("\r" + line.ljust(self.width))
            self.width = len(line)
        else:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def note(self, text: str) -> None:
        if self.tty and self.width:
            sys.stdout.write("\n")
            self.width = 0
        print(text, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty and self.width:
            sys.stdout.write("\n")
            sys.stdout.flush()


@dataclass(frozen=True)
class Launch:
    """This `rapid train`: when it started (``time.time()``), whether it resumed a run, and the newest version
    in the store then (None: unknown), so the summary's first minutes are of this launch."""

    started: float
    resumed: bool = False
    version: int | None = 0


def final_summary(run_dir: Path, reason: str, elapsed: float, exit_code: int | None,
                  launch: Launch | None = None, deaths: tuple[Death, ...] | list[Death] = ()) -> str:
    """``deaths``: the optimizers this launch restarted. Counters are summed over this launch's optimizers."""
    ops = read_jsonl(run_dir / "logs" / "optimizer.jsonl")
    evals = baseline_evals(run_dir)
    lines = [f"\nrapid train finished: {reason} after {_fmt_time(elapsed)}"]
    mine = [o for o in ops if launch is None or o.get("time", 0.0) >= launch.started] or ops[-1:]
    if mine:
        last = summed(mine)
        lines += [f"  versions published : {last['version']} ({last['update']} updates)",
                  f"  agent-steps        : {last['env_steps']:,}",
                  f"  samples            : {last['samples_received']:,} received, {last['samples_consumed']:,} "
                  f"consumed, {last['samples_dropped_stale']:,} went stale unused",
                  *balance_lines(last),
                  f"  skipped updates    : {last['skipped_updates']} (non-finite)   bad objects: {last['bad_objects']}"]
    lines += restart_lines(ops, list(deaths))
    if launch is not None:
        split = first_minutes(ops, evals, launch)
        if split:
            lines.append(f"  first minutes      : {split}")
    lines += evaluation_lines(evals)
    lines += ladder_lines(read_jsonl(run_dir / "logs" / "eval.jsonl"))
    report = _write_report(run_dir)
    if report:
        lines.append(f"  plots              : {report}")
    lines.append(f"  continue with      : rapid train --run-dir {run_dir} --resume")
    return "\n".join(lines)


def evaluation_lines(evals: list[dict]) -> list[str]:
    """The last and the best evaluation against the baseline in each mode played."""
    last, best = [], []
    for mode, rows in by_mode(evals).items():
        e, top = rows[-1], max(rows, key=lambda r: r["win_rate"])
        last.append(f"v{e['version']} won {e['win_rate']:.1%} of {e['games']} {mode} games vs {e['opponent']} "
                    f"(95% CI {e['ci_low']:.1%}–{e['ci_high']:.1%})")
        best.append(f"v{top['version']} {top['win_rate']:.1%} {mode}")
    if not last:
        return []
    return ([f"  last evaluation    : {last[0]}"] + [f"{'':23}{text}" for text in last[1:]]
            + [f"  best evaluation    : {', '.join(best)}"])


def first_minutes(ops: list[dict], evals: list[dict], launch: Launch) -> str:
    """Where this launch's first minutes went, in seconds since it started: until the optimizer was up
    (start-up), its first update, its first new version (queued for the store), the end of the warm-up
    (ppo.warmup_updates) if it had one and ended, the first evaluation, and the first evaluation at ``REACHED`` or
    better in each mode. Parts whose records are missing are left out."""
    ops = [o for o in ops if o.get("time", 0.0) >= launch.started]
    evals = [e for e in evals if e.get("time", 0.0) >= launch.started]
    parts = []
    if ops and "elapsed_s" in ops[0]:
        parts.append(f"start-up {_seconds(ops[0]['time'] - ops[0]['elapsed_s'] - launch.started)}")
    if ops:
        parts.append(f"first update {_seconds(ops[0]['time'] - launch.started)}")
    new = None if launch.version is None else next((o for o in ops if o["version"] > launch.version), None)
    if new:
        parts.append(f"first version {_seconds(new['time'] - launch.started)}")
    warm = [o for o in ops if o.get("warmup")]
    if warm and not ops[-1].get("warmup"):
        parts.append(f"warm-up of {warm[-1]['update']} updates to {_seconds(warm[-1]['time'] - launch.started)}")
    if evals:
        first = evals[0]
        twin = [e for e in evals if e["version"] == first["version"] and eval_mode(e) != eval_mode(first)][:1]
        rates = ", ".join(f"{_MODE_WORD[eval_mode(e)]}{e['win_rate']:.1%}" for e in [first, *twin])
        parts.append(f"first evaluation {_seconds(first['time'] - launch.started)} (v{first['version']} {rates})")
    reached = [f"{_MODE_WORD[mode]}at {_seconds(e['time'] - launch.started)} (v{e['version']})"
               for mode, rows in by_mode(evals).items()
               for e in [r for r in rows if r["win_rate"] >= REACHED][:1]]
    if reached:
        parts.append(f"first ≥ {REACHED:.0%} " + ", ".join(reached))
    text = " · ".join(parts)
    return f"this launch: {text}" if launch.resumed and text else text


def _seconds(x: float) -> str:
    return f"{x:.1f} s"


def balance_lines(last: dict) -> list[str]:
    """How well the optimizer kept up: share of samples used, share wasted, reuse against its target and
    staleness, from the last optimizer record (older logs lack some keys: those lines are left out)."""
    received = last["samples_received"]
    target = last.get("balance_target_reuse")
    reuse = f"  sample reuse       : {last['sample_reuse']:.2f}"
    if target:
        off = abs(last["sample_reuse"] - target) / target
        reuse += f" (target {target:.2f}: {'within' if off <= 0.1 else 'off by more than'} 10%)"
    lines = [reuse]
    if received and "samples_used" in last:
        lines.append(f"  used at least once : {last['samples_used'] / received:.1%} of received samples; "
                     f"{last['samples_dropped_stale'] / received:.1%} dropped stale, "
                     f"{last.get('samples_evicted_unused', 0) / received:.1%} evicted unused")
    if last.get("balance_pace", 1.0) < 1.0:
        lines.append(f"  rollout pace       : {last['balance_pace']:.0%} of full speed at the end (the optimizer "
                     "slowed the rollout workers to what it can train: optimizer.pace_rollouts)")
    if last.get("balance_buffer"):
        lines.append(f"  experience buffer  : grown to {last['balance_buffer']:,.0f} samples per rank (what arrives "
                     "while a change of pace takes to show: optimizer.max_buffer_mb)")
    if "staleness_p50" in last:
        p50, p99 = last['staleness_p50'], last['staleness_p99']
        lines.append(f"  staleness          : p50 {p50:.0f}, p99 {p99:.0f} versions")
    return lines


def _write_report(run_dir: Path) -> str:
    from rapid.monitoring.report import write_report

    written = write_report(run_dir, run_dir / "report")
    return f"{run_dir / 'report'} ({len(written)} PNG)" if written else ""

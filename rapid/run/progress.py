"""The live progress line of `rapid train` and its end-of-run summary, both read from the run's logs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rapid.monitoring.logs import JsonlTail, read_jsonl


def _fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def is_baseline(record: dict) -> bool:
    """An evaluation against the fixed baseline (the evaluator also logs games against pool members)."""
    return "ci_low" in record


def baseline_evals(run_dir: Path) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "logs" / "eval.jsonl") if is_baseline(e)]


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

    @property
    def last_eval(self) -> dict | None:
        return next((e for e in reversed(self._evals.rows) if is_baseline(e)), None)


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
    e = logs.last_eval
    if e:
        text += f" | win vs {e['opponent']} {e['win_rate']:.0%} (v{e['version']})"
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


def final_summary(run_dir: Path, reason: str, elapsed: float, exit_code: int | None) -> str:
    ops = read_jsonl(run_dir / "logs" / "optimizer.jsonl")
    evals = baseline_evals(run_dir)
    lines = [f"\nrapid train finished: {reason} after {_fmt_time(elapsed)}"]
    if ops:
        last = ops[-1]
        lines += [f"  versions published : {last['version']} ({last['update']} updates)",
                  f"  agent-steps        : {last['env_steps']:,}",
                  f"  samples            : {last['samples_received']:,} received, {last['samples_consumed']:,} "
                  f"consumed, {last['samples_dropped_stale']:,} went stale unused",
                  *balance_lines(last),
                  f"  skipped updates    : {last['skipped_updates']} (non-finite)   bad objects: {last['bad_objects']}"]
    if evals:
        best = max(evals, key=lambda e: e["win_rate"])
        e = evals[-1]
        lines += [f"  last evaluation    : v{e['version']} won {e['win_rate']:.1%} of {e['games']} games vs "
                  f"{e['opponent']} (95% CI {e['ci_low']:.1%}–{e['ci_high']:.1%})",
                  f"  best evaluation    : v{best['version']} {best['win_rate']:.1%}"]
    report = _write_report(run_dir)
    if report:
        lines.append(f"  plots              : {report}")
    lines.append(f"  continue with      : rapid train --run-dir {run_dir} --resume")
    return "\n".join(lines)


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
    if "staleness_p50" in last:
        p50, p99 = last['staleness_p50'], last['staleness_p99']
        lines.append(f"  staleness          : p50 {p50:.0f}, p99 {p99:.0f} versions")
    return lines


def _write_report(run_dir: Path) -> str:
    from rapid.monitoring.report import write_report

    written = write_report(run_dir, run_dir / "report")
    return f"{run_dir / 'report'} ({len(written)} PNG)" if written else ""

"""The summary's view of an optimizer that was restarted: its counters summed over its lives, and what each
restart cost (the time without an update, the updates redone from the checkpoint it resumed from).

An optimizer's records (``logs/optimizer.jsonl``, one per update) count from its own start: a restarted one starts
from zero again. Its lives are told apart by their start time (``time - elapsed_s``).

    >>> rows = [{"time": 10.0, "elapsed_s": 5.0, "update": 40, "samples_received": 100},
    ...         {"time": 20.0, "elapsed_s": 15.0, "update": 46, "samples_received": 300},   # killed after this
    ...         {"time": 60.0, "elapsed_s": 8.0, "update": 43, "samples_received": 50}]     # resumed at update 42
    >>> len(lives(rows)), summed(rows)["samples_received"]
    (2, 350)
    >>> restart_lines(rows, [Death(at=25.0, code=-9)])
    ['  optimizer restarts : 1', '      at update 46   : killed by SIGKILL; 40 s without an update, 4 update(s) redone']
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

COUNTERS = ("samples_received", "samples_consumed", "samples_used", "samples_dropped_stale", "samples_evicted_unused",
            "env_steps", "bad_objects", "loader_errors", "skipped_updates", "failed_updates")
"""The record's fields that count from the optimizer's start."""


def describe_exit(code: int) -> str:
    """How a process ended, in words: 'was killed by SIGKILL', 'exited with code 1'."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass(frozen=True)
class Death:
    """An optimizer the launcher found dead and restarted: when, and its exit code (negative: a signal)."""

    at: float
    code: int


def lives(rows: list[dict]) -> list[list[dict]]:
    """The records split by the optimizer process that wrote them, oldest first."""
    out: list[list[dict]] = []
    begun = None
    for row in rows:
        start = row.get("time", 0.0) - row.get("elapsed_s", 0.0)
        if begun is None or abs(start - begun) > 1.0:
            out.append([])
        begun = start
        out[-1].append(row)
    return out


def summed(rows: list[dict]) -> dict:
    """The newest record with its counters summed over every life of the optimizer."""
    parts = lives(rows)
    total = dict(parts[-1][-1])
    for key in COUNTERS:
        if key in total:
            total[key] = sum(life[-1].get(key, 0) for life in parts)
    return total


def restart_lines(rows: list[dict], deaths: list[Death]) -> list[str]:
    """One line per optimizer restart: how it died, the time from its last update to the next one's first, and
    the updates made again because they came after the checkpoint it resumed from."""
    if not deaths:
        return []
    lines = [f"  optimizer restarts : {len(deaths)}"]
    for death in deaths:
        before = [r for r in rows if r.get("time", 0.0) <= death.at]
        after = [r for r in rows if r.get("time", 0.0) > death.at]
        where = f"at update {before[-1]['update']}" if before else "before its first update"
        text = describe_exit(death.code).removeprefix("was ")
        if before and after:
            redone = before[-1]["update"] - (after[0]["update"] - 1)
            text += (f"; {after[0]['time'] - before[-1]['time']:.0f} s without an update, {max(redone, 0)} "
                     "update(s) redone")
        elif not after:
            text += "; no update after it"
        lines.append(f"      {where:<15}: {text}")
    return lines

"""Warnings and notes that repeat (every poll of a store that is down), written at most once a minute."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

QUIET_S = 60.0
"""A repeated warning or note is written at most once per this many seconds, with a count of the others."""


class QuietLog:
    """At most one line per kind per ``every_s``: a store outage must not write a warning for every poll and
    download (a 2-minute outage once wrote 208), nor retention a note for every poll. The line that is written
    says how many were held back; a kind that recovers says so once.

    >>> now = [0.0]
    >>> quiet = QuietLog(logging.getLogger("rapid.optimizer.loader"), lambda: now[0], every_s=60)
    >>> for _ in range(100):
    ...     quiet.warning("list", "listing experience failed: %s", "timeout")   # one line: the first
    ...     now[0] += 1
    >>> quiet.recovered("list", "listing experience")   # one line: "... works again after 100 failures ..."
    """

    def __init__(self, log: logging.Logger, clock: Callable[[], float] = time.monotonic, every_s: float = QUIET_S):
        self.log, self.clock, self.every_s = log, clock, every_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._failures: dict[str, int] = {}

    def warning(self, kind: str, message: str, *args) -> None:
        self._failures[kind] = self._failures.get(kind, 0) + 1
        self._emit(logging.WARNING, kind, message, args)

    def info(self, kind: str, message: str, *args) -> None:
        self._emit(logging.INFO, kind, message, args)

    def recovered(self, kind: str, what: str) -> None:
        failures = self._failures.pop(kind, 0)
        if failures:
            self._last.pop(kind, None)
            self._held.pop(kind, None)
            self.log.info("%s works again after %d failure(s)", what, failures)

    def _emit(self, level: int, kind: str, message: str, args: tuple) -> None:
        now = self.clock()
        if now - self._last.get(kind, -float("inf")) < self.every_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return
        held = self._held.pop(kind, 0)
        self._last[kind] = now
        suffix = f" ({held} more like it in the last {self.every_s:.0f}s)" if held else ""
        self.log.log(level, message + suffix, *args)

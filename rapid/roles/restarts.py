"""Whether `rapid train` restarts an optimizer that exited, and after how long: one pure decision.

The launcher asks after every optimizer exit; a restart resumes from the newest good checkpoint
(`rapid optimizer --resume auto`), while the rollout workers, the inference server and the evaluator keep running.

Usage::

    >>> policy = RestartPolicy(max_restarts=2)
    >>> policy.started(now=0.0)
    >>> policy.after_exit(0, now=100.0)              # a clean stop (run.updates reached): the run ends
    Verdict(restart=False, delay_s=0.0, line='', failure=True)
    >>> verdict = policy.after_exit(-9, now=100.0)
    >>> verdict.restart, verdict.delay_s
    (True, 1.0)
    >>> verdict.line
    'the optimizer was killed by SIGKILL; restarting it from its newest checkpoint in 1 s (restart 1 of at most 2 ...)'
    >>> policy.started(now=101.0)
    >>> policy.after_exit(1, now=130.0).delay_s      # it died again soon: the wait doubles
    2.0
    >>> policy.started(now=132.0)
    >>> policy.after_exit(-9, now=140.0).line
    'the optimizer was killed by SIGKILL (3 failures in a row); not restarting it (run.max_restarts = 2)'
    >>> policy.after_exit(2, now=0.0).line           # a usage error would only repeat
    'the optimizer refused to start or stopped on a usage error (exit code 2); not restarting it'

A restart that then trains for ``healthy_s`` (10 minutes) clears the count, as Kubernetes resets a pod's back-off:
a run that crashes once a day for a week is not stopped by its seventh crash.
"""

from __future__ import annotations

from dataclasses import dataclass

from rapid.run.restart_summary import describe_exit

HEALTHY_S = 600.0
MAX_DELAY_S = 30.0
USAGE_ERROR = 2
EXPLOITED = 75
"""A population member stopped to take a leader's state (docs/pbt.md): started again at once, not a failure."""


@dataclass(frozen=True)
class Verdict:
    restart: bool
    delay_s: float
    line: str
    """What the launcher says (empty for a clean stop)."""
    failure: bool = True
    """Whether the exit counts as a death in the run's summary (a planned restart does not)."""


class RestartPolicy:
    def __init__(self, max_restarts: int, healthy_s: float = HEALTHY_S, max_delay_s: float = MAX_DELAY_S,
                 bound: str = "run.max_restarts"):
        self.max_restarts, self.healthy_s, self.max_delay_s = max_restarts, healthy_s, max_delay_s
        self.bound = bound
        """How the bound is set, for the line that says it was reached."""
        self.in_row = 0
        self.total = 0
        self._started_at = 0.0

    def started(self, now: float) -> None:
        """An optimizer (the first, or a restarted one) started at ``now``."""
        self._started_at = now

    def after_exit(self, code: int, now: float) -> Verdict:
        """The decision for an optimizer that exited with ``code`` (a Popen return code: negative for a signal)."""
        if code == 0:
            return Verdict(False, 0.0, "")
        if code == EXPLOITED:
            return Verdict(True, 0.0, "the member stopped to copy a better member (pbt); starting it again from "
                                      "the copy", failure=False)
        if code == USAGE_ERROR:
            return Verdict(False, 0.0, f"the optimizer refused to start or stopped on a usage error (exit code "
                                       f"{code}); not restarting it")
        if now - self._started_at >= self.healthy_s:
            self.in_row = 0
        self.in_row += 1
        how = describe_exit(code)
        if self.in_row > self.max_restarts:
            return Verdict(False, 0.0, f"the optimizer {how} ({self.in_row} failures in a row); not restarting it "
                                       f"({self.bound} = {self.max_restarts})")
        self.total += 1
        delay = min(self.max_delay_s, 2.0 ** (self.in_row - 1))
        return Verdict(True, delay, f"the optimizer {how}; restarting it from its newest checkpoint in {delay:g} s "
                                    f"(restart {self.in_row} of at most {self.max_restarts} in a row)")

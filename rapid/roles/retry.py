"""`rapid retry`: run an optimizer job again when it fails, the way `rapid train` restarts its optimizer, for a
cluster where no launcher watches the ranks (the Slurm script's optimizer step; Kubernetes restarts by itself).

    rapid retry --max-restarts 3 -- mpiexec -n 2 rapid-optimizer --config run.toml --resume auto

Every rank of the job ends when one dies (MPI aborts the job; srun --kill-on-bad-exit), so the next attempt starts
every rank again, and ``--resume auto`` makes them agree on one start point: the newest good checkpoint. The same
:class:`~rapid.roles.restarts.RestartPolicy` decides: a clean exit or a usage error (exit 2) ends it, anything else
is retried after 1, 2, 4 … s, at most ``--max-restarts`` times in a row (ten healthy minutes clear the count).
SIGTERM or SIGINT reaches the command and ends the retries: a job stopped on purpose is not restarted.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time

from rapid.errors import UsageError
from rapid.roles.restarts import HEALTHY_S, RestartPolicy
from rapid.roles.startup import setup_logging


def exit_status(code: int) -> int:
    """A Popen return code as a shell's exit status: 128 + N for a process killed by signal N."""
    return 128 - code if code < 0 else code


def run_retry(command: list[str], max_restarts: int, healthy_s: float = HEALTHY_S) -> int:
    """Run ``command`` until it exits cleanly, is stopped on purpose, or fails past the bound; its last exit status."""
    if not command:
        raise UsageError("rapid retry: give the command after --, e.g. rapid retry -- mpiexec -n 2 rapid-optimizer "
                         "--config run.toml --resume auto")
    if "--resume" not in command:
        raise UsageError("rapid retry: a restarted optimizer must resume: add --resume auto to its command")
    if max_restarts < 0:
        raise UsageError(f"rapid retry: --max-restarts must be ≥ 0 (got {max_restarts})")
    log = setup_logging("retry")
    policy, stopping = RestartPolicy(max_restarts, healthy_s, bound="--max-restarts"), threading.Event()
    proc: subprocess.Popen | None = None

    def forward(signum, _frame) -> None:
        stopping.set()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    while True:
        policy.started(time.time())
        try:
            proc = subprocess.Popen(command)
        except OSError as e:
            raise UsageError(f"rapid retry: cannot run {command[0]}: {e.strerror or e}") from None
        code = proc.wait()
        if stopping.is_set():
            return exit_status(code)
        verdict = policy.after_exit(code, time.time())
        if verdict.line:
            log.warning("%s", verdict.line.replace("the optimizer", "the optimizer job", 1))
        if not verdict.restart:
            return exit_status(code)
        if stopping.wait(verdict.delay_s):
            return exit_status(code)

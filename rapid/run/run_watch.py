"""Does the run still have an optimizer? A rollout worker asks when new versions stop coming, so that workers
left running after the optimizer stopped do not keep filling the store with experience nobody loads.

The answer is the optimizer's lease (``optimizer/lease/<epoch>.json``, see :mod:`rapid.run.lease`): released at
a clean stop, expired when its holder died. Without any lease (a run of an older rapid, or parameters
published by hand) the answer is "unknown" and the worker goes on as before.

Usage::

    >>> import tempfile
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.run.lease import RunLease
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> watch = RunWatch(store, quiet_s=180.0, every_s=30.0)
    >>> watch.optimizer_gone(last_version_at=0.0, now=1000.0) is None     # no lease: unknown, go on
    True
    >>> lease = RunLease(store).acquire()
    >>> watch.optimizer_gone(last_version_at=0.0, now=2000.0) is None     # held: the run goes on
    True
    >>> lease.release()
    >>> watch.optimizer_gone(last_version_at=0.0, now=2010.0) is None     # asked again only every_s later
    True
    >>> watch.optimizer_gone(last_version_at=0.0, now=2031.0)
    'stopped (it released the run)'
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from rapid.infra.store import Store, StoreError
from rapid.run.config import Config
from rapid.run.lease import read_head

FIRST_RECHECK_S = 1.0


def quiet_s(cfg: Config) -> float:
    """How long without a new version before a role asks whether the run still has an optimizer: a few of
    the optimizer's publish intervals (it publishes about once an upload interval by default)."""
    return max(60.0, 3 * (cfg.optimizer.publish_interval_s or cfg.rollout.upload_interval_s))


class RunWatch:
    def __init__(self, store: Store, quiet_s: float, every_s: float = 30.0,
                 clock: Callable[[], float] = time.time):
        self.store, self.quiet_s, self.every_s, self.clock = store, quiet_s, every_s, clock
        self._asked_at = -float("inf")

    def optimizer_gone(self, last_version_at: float, now: float, force: bool = False) -> str | None:
        """Why the run has no optimizer (stopped, or died), or None (it has one, or nobody can tell). The
        lease is read only once no new version came for ``quiet_s`` (or when ``force``d), at most every
        ``every_s``: a healthy run costs the store nothing."""
        if not force and (now - last_version_at < self.quiet_s or now - self._asked_at < self.every_s):
            return None
        self._asked_at = now
        try:
            return self._read_lease()
        except (StoreError, ValueError):  # an unreadable lease tells nothing: keep going
            return None

    def recheck_waits(self) -> Iterator[float]:
        """The waits between asks once the run was found without an optimizer: 1 s, 2 s, 4 s, … then ``every_s``.
        A --resume starts its workers and evaluator beside its optimizer, which takes the run a moment after they
        may have read the last run's released lease: they ask again soon, then back off.

        >>> from itertools import islice
        >>> list(islice(RunWatch(None, quiet_s=60.0, every_s=30.0).recheck_waits(), 7))
        [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
        """
        wait_s = FIRST_RECHECK_S
        while True:
            yield wait_s
            wait_s = min(2.0 * wait_s, self.every_s)

    def _read_lease(self) -> str | None:
        _, holder = read_head(self.store)
        if holder is None:
            return None
        if holder.released:
            return "stopped (it released the run)"
        if holder.expires < self.clock():
            return "stopped renewing its lease (it died, or its host lost the store)"
        return None

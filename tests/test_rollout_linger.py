"""A rollout worker that finds the run without an optimizer waits for one (``rollout.linger_s``): on a
``--resume`` the launcher starts the workers and the optimizer together, so a worker often reads the last run's
released lease a moment before the new optimizer takes it. It must notice the new one within seconds, not at its
next ``RunWatch.every_s`` (30 s) check."""

from __future__ import annotations

import logging

from rapid.infra.store import LocalStore
from rapid.roles.rollout_loop import RolloutLoop
from rapid.roles.startup import StopFlag
from rapid.run.lease import RunLease
from rapid.run.run_watch import RunWatch


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


def linger(store: LocalStore, optimizer_back_at: float | None, linger_s: float = 300.0) -> tuple[bool, float, int]:
    """Drive ``RolloutLoop._linger`` in simulated time; a new optimizer takes the run at ``optimizer_back_at``.
    Returns (playing on, simulated seconds it took, lease reads)."""
    clock = FakeClock()
    watch = RunWatch(store, quiet_s=60.0)
    reads = []
    read_lease = watch._read_lease
    watch._read_lease = lambda: reads.append(clock.now) or read_lease()
    loop = RolloutLoop(None, None, None, watch, None, 2, linger_s, StopFlag(install_signals=False),
                       logging.getLogger("test"), clock=clock)
    waits, taken = loop._linger("stopped (it released the run)"), False
    try:
        request = next(waits)
        while True:
            clock.now += request.seconds
            if optimizer_back_at is not None and clock.now >= optimizer_back_at and not taken:
                taken = bool(RunLease(store).acquire())
            request = waits.send(None)
    except StopIteration as done:
        return done.value, clock.now, len(reads)


def released_run(tmp_path) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    RunLease(store).acquire().release()  # the run before the --resume stopped cleanly
    return store


def test_a_resumed_optimizer_is_noticed_within_seconds(tmp_path):
    playing, after_s, _ = linger(released_run(tmp_path), optimizer_back_at=1.5)
    assert playing and after_s <= 3.0, after_s


def test_without_an_optimizer_the_checks_back_off_to_every_30s_and_the_worker_stops(tmp_path):
    playing, after_s, reads = linger(released_run(tmp_path), optimizer_back_at=None, linger_s=300.0)
    assert not playing and after_s == 300.0
    assert reads <= 16, reads  # a few quick checks, then one per RunWatch.every_s: 300 s cost about 15 GETs

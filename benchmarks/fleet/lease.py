"""The run's lease in the scale model: rank 0 holds rapid's ``RunLease`` (``optimizer/lease/<epoch>.json``) and
renews it every ``ttl_s / 4`` on an actor of its process; the workers' ``RunWatch`` reads it through their node's
reads when versions stop coming.

``RunLease.keep`` runs that renewal on a thread that waits in real time (``threading.Event.wait``); this actor
calls the same step, ``RunLease.tick`` (renew; on losing the lease, set the stop flag with "lease lost"; a store
error is retried at the next tick), every ``ttl_s / 4`` of simulated time.

The ``lease-lost`` fault: at ``FAULT_AT_S`` another optimizer, on a host whose clock runs a TTL ahead, finds the
lease expired and takes the run (``RunLease.acquire``); rank 0's next renewal fails, it must stop, and no version
of its may be stored after the other took the run (``writes_after_lease_lost``).
"""

from __future__ import annotations

from rapid.run.lease import RunLease

from .sched import Actor

TTL_S = 60.0  # rapid.run.lease.TTL_S


class LeaseKeeping:
    def __init__(self, fleet, store):
        self.fleet, self.store = fleet, store
        clock = fleet.clock
        self.lease = RunLease(store, ttl_s=TTL_S, clock=clock.time, host="rank0-host", pid=1).acquire()
        self.taken_at: float | None = None  # when another optimizer took the run (the lease-lost fault)
        fleet.sched.start(Actor("lease", self._keep(), process="rank0"), TTL_S / 4)

    def _keep(self):
        stop = self.fleet.ranks[0].stop
        while not stop and self.lease.tick(stop):
            yield self.fleet.clock.t() + TTL_S / 4

    def take_over(self):
        """A scheduler actor: another optimizer takes the run."""
        clock = self.fleet.clock
        RunLease(self.store, ttl_s=TTL_S, clock=lambda: clock.time() + TTL_S + 1.0, host="other-host",
                 pid=2).acquire()
        self.taken_at = clock.t()
        yield None


def figures(fleet) -> dict:
    """Writes of ``params/LATEST`` stored after another optimizer took the run (versions of two holders
    interleaved); the seconds rank 0 went on after that before its loop ended."""
    keeping = fleet.lease
    if keeping.taken_at is None:
        return {"writes_after_lease_lost": 0, "lease_lost_stop_s": 0.0}
    after = sum(at > keeping.taken_at for at, _ in fleet.ledger.latest)
    ended = fleet.ranks[0].ended_at
    return {"writes_after_lease_lost": after,
            "lease_lost_stop_s": (ended - keeping.taken_at) if ended is not None else float("inf")}

"""Known faults the scale model can inject (``--fault NAME[=ARG]``), each to show that a health figure can fail.

- ``params-outage=S``: parameter PUTs answer 500 for S seconds from ``FAULT_AT_S``; moves
  ``workers_current_share`` and ``writer_wait_s``.
- ``wrong-meta``: rank 0 publishes a params object whose meta is the update count (an int); moves
  ``workers_current_share`` (readers refuse it, or the writer refuses to write it and rank 0 stops).
- ``stale-drop``: ``optimizer.max_staleness = 0``, so the buffer drops what arrives a version late; moves
  ``trained_share``.
- ``keeper-stopped``: rank 0's league keeper never runs; moves ``pool_games_share`` and ``fold_lag_p99_s``.
- ``one-shard``: every worker writes into shard 0; moves ``updates_share`` (the other ranks starve) and, at
  thousands of workers, ``list_pages_per_poll``.
- ``hung-get=S``: from ``FAULT_AT_S`` one reader a node has each ``params/LATEST`` GET hang S seconds, then time
  out; moves ``poller_failures``.
- ``experience-outage=S``: experience PUTs answer 500 for S seconds from ``FAULT_AT_S``: the uploaders' backlogs
  fill and drop their oldest objects; moves ``trained_share`` (the samples lost are named: backlog dropped).
- ``rank-stop``: at ``FAULT_AT_S`` the last rank's stop flag is set (a signal to one process): every rank must
  leave with it, together; moves ``updates_share`` (the run ends early), never ``ranks_stop_spread_s``.
- ``server-killed`` (with ``--inference node``): at ``FAULT_AT_S`` node 0's inference server dies; its workers'
  games restart (``InferenceLost``) and the next request starts a server afresh; moves ``games_restarted`` and
  ``server_wait_max_s`` (the new server takes ``server_start_s`` to answer).
- ``lease-lost``: at ``FAULT_AT_S`` another optimizer takes the run's lease (``fleet/lease.py``): rank 0 must
  stop with every rank; moves ``updates_share`` and ``lease_lost_stop_s``; ``writes_after_lease_lost`` must stay 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rapid.infra.store import Store, StoreError
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import PARAMS_LATEST

from .standins import StoreWrapper

FAULT_AT_S = 120.0
"""When the timed faults start: after the first minute, when the healthy figures are measured from."""
NAMES = ("params-outage", "wrong-meta", "stale-drop", "keeper-stopped", "one-shard", "hung-get", "experience-outage",
         "rank-stop", "server-killed", "lease-lost")
TIMED = ("params-outage", "hung-get", "experience-outage")


class UsageError(ValueError):
    """A fault named wrong on the command line."""


@dataclass
class Faults:
    params_outage_s: float = 0.0
    wrong_meta: bool = False
    stale_drop: bool = False
    keeper_stopped: bool = False
    one_shard: bool = False
    hung_get_s: float = 0.0
    experience_outage_s: float = 0.0
    rank_stop: bool = False
    server_killed: bool = False
    lease_lost: bool = False

    @classmethod
    def parse(cls, specs: list[str]) -> Faults:
        f = cls()
        for spec in specs:
            name, _, arg = spec.partition("=")
            if name not in NAMES:
                raise UsageError(f"unknown fault {name!r}; known: {', '.join(NAMES)}")
            timed = name in TIMED
            if timed != bool(arg):
                raise UsageError(f"--fault {name}" + ("=SECONDS needs a duration" if timed else " takes no value"))
            try:
                seconds = float(arg) if timed else 0.0
            except ValueError:
                raise UsageError(f"--fault {spec}: {arg!r} is not a number of seconds") from None
            if timed:
                setattr(f, {"params-outage": "params_outage_s", "hung-get": "hung_get_s",
                            "experience-outage": "experience_outage_s"}[name], seconds)
            else:
                setattr(f, name.replace("-", "_"), True)
        return f

    def names(self) -> list[str]:
        out = [f"params-outage={self.params_outage_s:g}"] if self.params_outage_s else []
        out += [n for n in ("wrong-meta", "stale-drop", "keeper-stopped", "one-shard", "rank-stop", "server-killed",
                            "lease-lost")
                if getattr(self, n.replace("-", "_"))]
        out += [f"experience-outage={self.experience_outage_s:g}"] if self.experience_outage_s else []
        return out + ([f"hung-get={self.hung_get_s:g}"] if self.hung_get_s else [])

    def apply(self, settings, store) -> None:
        """What is set before the fleet starts."""
        if self.stale_drop:
            settings.max_staleness = 0
        if self.params_outage_s:
            store.fail_puts("params/", FAULT_AT_S, FAULT_AT_S + self.params_outage_s)
        if self.experience_outage_s:
            store.fail_puts("experience/", FAULT_AT_S, FAULT_AT_S + self.experience_outage_s)

    def actors(self, fleet) -> list[tuple[str, object]]:
        """The faults that happen to a running fleet at ``FAULT_AT_S``: (name, scheduler actor) of each."""
        if self.server_killed:
            fleet.servers[0].dies_at = FAULT_AT_S  # a process's death is planned: see NodeServer.current
        out = [("rank stop", _stop_one_rank(fleet))] if self.rank_stop else []
        return out + ([("lease taken", fleet.lease.take_over())] if self.lease_lost else [])

    def params_store(self, store) -> ParameterStore:
        return WrongMeta(store) if self.wrong_meta else ParameterStore(store)

    def reads(self, store, index: int, settings) -> Store:
        """What worker ``index`` reads params through (one reader a node hangs, with ``hung-get``)."""
        every = settings.workers_per_node or 64
        return HungGets(store, self.hung_get_s) if self.hung_get_s and index % every == 0 else store


class WrongMeta(ParameterStore):
    """The scale model's old bug, as a fault: the update count passed where the meta dict belongs."""

    def publish(self, version: int, tensors: dict[str, np.ndarray], meta: dict | None = None) -> None:
        super().publish(version, tensors, (meta or {})["updates"])


class HungGets(StoreWrapper):
    """A reader whose GETs of ``params/LATEST`` hang ``seconds`` (a stopped server that accepts the connection)
    and then fail with a read timeout, from ``FAULT_AT_S`` on."""

    def __init__(self, inner, seconds: float):
        super().__init__(inner)
        self.seconds, self.clock = seconds, inner.clock

    def get(self, key: str, *args, **kwargs) -> bytes:
        if key == PARAMS_LATEST and self.clock.t() >= FAULT_AT_S:
            self.clock.charge(self.seconds)
            raise StoreError(f"get {key}: read timeout after {self.seconds:g}s")
        return self.inner.get(key, *args, **kwargs)


def _stop_one_rank(fleet):
    fleet.ranks[-1].stop.set("signal")  # one process told to stop: the agreement takes every rank with it
    yield None

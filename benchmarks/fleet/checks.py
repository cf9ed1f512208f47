"""Figures of who played whom and what the learner was given, read back from the store and the stand-ins.

- ``pool_results_off``: the games of every object a rank loaded (its episodes, as stored), opponent by opponent,
  against the pool as last committed: the learner's wins, losses and draws against each member, the games against
  the latest policy; the summed difference over the games loaded.
- ``past_share_z``: the share of games played against past snapshots once the workers could see one (a pool
  revision holding one, a worker's refresh, its node cache's and an upload interval later) against the config's share
  (``1 − latest_prob``, no bots in the model's league), in standard errors of that share.
- ``repeat_swaps``: versions a worker was handed while it already played them (a poller that takes the version
  it has as a newer one: a wasted load, and under node inference a wasted fetch).
- ``pool_reads_per_refresh``, ``latest_reads_per_poll``: the pool's pointer and ``params/LATEST`` as the workers
  ask for them (:class:`Asked`, before the node's cache), per refresh and per poll interval;
- ``trained_staleness_max``: the oldest sample an update trained, in versions behind the loop's (at most
  ``optimizer.max_staleness``, one more for a batch drawn ahead); ``reuse``: the times an update took a sample over
  the samples trained, over every rank (printed, not bounded: a rank short of fresh samples may draw up to
  ``optimizer.max_reuse`` while its peers have plenty, 1.07-1.22 in healthy small fleets).
"""

from __future__ import annotations

import math
from collections import Counter

from rapid.errors import FormatError
from rapid.infra.store import KeyNotFound, Store
from rapid.league import League
from rapid.league.sampling import LATEST
from rapid.run.store_map import PARAMS_LATEST, POOL_POINTER

from .standins import StoreWrapper

ASKED = (PARAMS_LATEST, POOL_POINTER)
"""The pointers whose reads are counted where a worker asks for them."""


class Asked(StoreWrapper):
    """A worker's reads (its node's cache, or the store) with the GETs of :data:`ASKED` counted as the worker asks,
    before any cache: a reader that asks too often costs its node a read and a parse each time, even where the
    cache spares the store."""

    def __init__(self, inner: Store, counts: Counter):
        super().__init__(inner)
        self.counts = counts

    def get(self, key: str, *args, **kwargs) -> bytes:
        if key in ASKED:
            self.counts[key] += 1
        return self.inner.get(key, *args, **kwargs)


def worker_seconds(fleet, run_s: float, polling_only: bool = False) -> float:
    """Seconds the workers ran up to ``run_s``, summed (``polling_only``: those that read parameters themselves,
    not through a node server)."""
    return sum(min(w.left_at or run_s, run_s) - min(w.started_at, run_s) for w in fleet.all_workers
               if not polling_only or w.link is None)


def pool_results(fleet, peek) -> dict:
    ledger, loads = fleet.ledger, fleet.meter.loads
    loaded: dict[str, list[int]] = {}
    for key, results in ledger.results.items():
        if not loads.get(key):
            continue
        for opponent, row in results.items():
            mine = loaded.setdefault(opponent, [0, 0, 0])
            for i, n in enumerate(row):
                mine[i] += n
    games = sum(sum(row) for row in loaded.values())
    try:
        state = League(peek).read()
    except (KeyNotFound, KeyError, FormatError):
        return {"pool_results_off": 1.0 if games else 0.0}
    off = abs(sum(loaded.get(LATEST, (0, 0, 0))) - state.latest_games)
    for member_id in {*loaded, *state.members} - {LATEST}:
        m = state.members.get(member_id)
        have = (m.wins, m.losses, m.draws) if m is not None else (0, 0, 0)
        off += sum(abs(a - b) for a, b in zip(loaded.get(member_id, (0, 0, 0)), have))
    return {"pool_results_off": off / max(1, games)}


def past_share(fleet) -> dict:
    s, ledger, visible = fleet.s, fleet.ledger, fleet.meter.visible_at
    if ledger.past_since is None:
        return {"past_share_z": 0.0, "past_share": math.nan}
    # a worker's pool copy is up to a refresh old, and its node's copy of the pointer (a cache) one more
    stale_s = fleet.cfg.league.refresh_s * (2 if s.workers_per_node else 1)
    since = ledger.past_since + stale_s + s.upload_s
    past = games = 0
    for key, results in ledger.results.items():
        if visible.get(key, -math.inf) >= since:
            for opponent, row in results.items():
                games += sum(row)
                past += sum(row) if opponent != LATEST else 0
    if not games:
        return {"past_share_z": 0.0, "past_share": math.nan}
    want = 1.0 - fleet.cfg.league.latest_prob
    share = past / games
    return {"past_share_z": abs(share - want) / math.sqrt(want * (1 - want) / games), "past_share": share}


def handed_and_trained(fleet) -> dict:
    repeats = 0
    for w in fleet.all_workers:
        versions = [v for _, v in w.source.swaps]
        repeats += sum(a == b for a, b in zip(versions, versions[1:]))
    learners = [r.learner for r in fleet.ranks]
    return {"repeat_swaps": repeats, "trained_staleness_max": max(ln.stale_max for ln in learners),
            "reuse": sum(ln.drawn for ln in learners) / max(1, sum(len(ln.trained) for ln in learners))}


def asked(fleet, reached: float) -> dict:
    """Pool reads a worker asked for per ``league.refresh_s``, and ``params/LATEST`` reads per parameter poll
    interval of the workers that poll (none under node inference: the node's server reads)."""
    s, run_s = fleet.s, min(reached, fleet.s.sim_s)
    worker_s, polling_s = worker_seconds(fleet, run_s), worker_seconds(fleet, run_s, polling_only=True)
    return {"pool_reads_per_refresh": fleet.asked[POOL_POINTER] / max(1e-9, worker_s / fleet.cfg.league.refresh_s),
            "latest_reads_per_poll": fleet.asked[PARAMS_LATEST] / max(1e-9, polling_s / s.param_poll_s)}


def figures(fleet, peek, reached: float) -> dict:
    return {**pool_results(fleet, peek), **past_share(fleet), **handed_and_trained(fleet), **asked(fleet, reached)}

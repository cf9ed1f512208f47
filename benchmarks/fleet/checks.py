"""Figures of who played whom and what the learner was given, read back from the store and the stand-ins.

- ``pool_results_off``: the games of every object a rank loaded (its episodes, as stored), opponent by opponent,
  against the pool as last committed: the learner's wins, losses and draws against each member, the games against
  the latest policy; the summed difference over the games loaded.
- ``past_share_z``: the share of games played against past snapshots once the workers could see one (a pool
  revision holding one, a worker's refresh and an upload interval later) against the config's share
  (``1 − latest_prob``, no bots in the model's league), in standard errors of that share.
- ``repeat_swaps``: versions a worker was handed while it already played them (a poller that takes the version
  it has as a newer one: a wasted load, and under node inference a wasted fetch).
- ``trained_staleness_max``: the oldest sample an update trained, in versions behind the loop's (at most
  ``optimizer.max_staleness``, one more for a batch drawn ahead); ``reuse``: the times an update took a sample over
  the samples trained, over every rank (printed, not bounded: a rank short of fresh samples may draw up to
  ``optimizer.max_reuse`` while its peers have plenty, 1.07-1.22 in healthy small fleets).
"""

from __future__ import annotations

import math

from rapid.errors import FormatError
from rapid.infra.store import KeyNotFound
from rapid.league import League
from rapid.league.sampling import LATEST


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
    since = ledger.past_since + fleet.cfg.league.refresh_s + s.upload_s
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


def figures(fleet, peek) -> dict:
    return {**pool_results(fleet, peek), **past_share(fleet), **handed_and_trained(fleet)}

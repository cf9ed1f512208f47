"""The figures read back from the store after the drain, checked against what the stand-ins produced.

A figure taken from a product counter passes whenever the counter is wrong in the same way as the code it
counts. These are taken from the :class:`~fleet.ledger.Ledger` (what each completed PUT stored), from the store
as it is at the end (read without requests, :class:`PeekStore`), and from the stand-ins (which samples each
source made and each learner trained, which version each worker played when):

- every sample made is trained or lost for a named reason (dropped from a full backlog, refused by the
  encoder, still waiting at the end, refused by the loader, stale, evicted, unused at the end, drawn by the
  last round; an object no rank loaded is not a reason): ``unaccounted_samples``;
- versions published at the configured cadence, each with the weights its meta says, LATEST moving forward
  only, and every version reaching the workers within two publish intervals;
- the games in the pool as committed equal the games played; a snapshot for every ``snapshot_every``-th
  version, each loadable with that version's weights; a checkpoint every ``checkpoint_every`` updates, each
  loadable; the ranks leaving together after the same number of updates;
- what must stay flat per node or per worker: ``params/LATEST`` GETs per node per poll interval, the GETs of
  each version per node, a worker's LISTs and its PUTs per upload interval.
"""

from __future__ import annotations

import math

import numpy as np

from rapid.errors import FormatError
from rapid.infra.store import KeyNotFound, Store
from rapid.league import League
from rapid.optimizer.checkpoints import load_checkpoint, load_latest_checkpoint
from rapid.run.store_map import CHECKPOINTS_PREFIX, parse_checkpoint_key, parse_params_key

from .checks import figures as check_figures
from .checks import worker_seconds
from .lease import figures as lease_figures
from .node import figures as node_figures
from .realworker import figures as worker_figures
from .report import MEASURE_FROM_S

STOP_SPREAD_S = 10.0
"""Ranks stop together: the last leaves at most this long after the first (two of the loop's rounds)."""


class PeekStore(Store):
    """The store as it is at the end, read by the model for its figures: no request is counted or charged."""

    def __init__(self, store):
        self.store, self.url = store, store.url

    def get(self, key: str, max_bytes: int = 1 << 62) -> bytes:
        data = self.store.peek(key)
        if data is None:
            raise KeyNotFound(key)
        return data

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        return [k for k in self.store.keys_now(prefix) if start_after is None or k > start_after]

    def exists(self, key: str) -> bool:
        return self.store.peek(key) is not None

    def put(self, key: str, data: bytes) -> None:
        raise PermissionError("the model only reads the store back")

    def put_if_absent(self, key: str, data: bytes) -> bool:
        raise PermissionError("the model only reads the store back")

    def delete(self, key: str) -> None:
        raise PermissionError("the model only reads the store back")

    def describe(self) -> str:
        return "the store, read back"


def sample_ledger(fleet) -> dict[str, int]:
    """Every sample the sources made, by where it ended: trained, or a named reason; ``unaccounted`` is what
    no reason explains (a sample lost without a count, or a count without a loss)."""
    ledger, meter = fleet.ledger, fleet.meter
    stored = set(ledger.stored_ids().tolist())
    trained: set[int] = set().union(*(r.learner.trained for r in fleet.ranks))
    out = dict.fromkeys(("made", "trained", "backlog_dropped", "encoder_refused", "unsent_at_end", "never_loaded",
                         "loader_refused", "stale", "evicted", "unused_at_end", "drawn_at_stop", "stored_twice",
                         "unaccounted"), 0)
    for w in fleet.all_workers:  # the upload side, worker by worker: what never reached the store
        made = w.source.produced
        missing = sum(1 for i in made if i not in stored)
        u = w.uploader.stats
        named = u.dropped_samples + u.refused_samples
        out["made"] += len(made)
        out["backlog_dropped"] += u.dropped_samples
        out["encoder_refused"] += u.refused_samples
        if u.backlog and missing > named:  # objects still waiting (the store down at the stop)
            out["unsent_at_end"] += missing - named
            named = missing
        out["unaccounted"] += abs(missing - named)
    loaded_by: dict[object, int] = {}
    for key, ids in ledger.samples.items():
        loads = meter.loads.get(key)
        if not loads:
            out["never_loaded"] += len(ids)
        for actor in {a for a, _ in loads or ()}:
            loaded_by[getattr(actor, "process", actor)] = loaded_by.get(getattr(actor, "process", actor), 0) + len(ids)
    named = 0  # an object no rank ever loaded, even after the drain, is lost: no reason names it
    for r in fleet.ranks:  # the load side, rank by rank: what reached the store but no update
        b = r.buffer.stats()
        refused = loaded_by.get(r.process, 0) - b.received
        if r.loader.stats.bad_objects and refused > 0:
            out["loader_refused"] += refused
            named += refused
        drawn = b.used - len(r.learner.trained)  # drawn by the last round, then the ranks left
        at_stop = min(max(drawn, 0), r.loop.batch)
        out["stale"] += b.dropped_stale
        out["evicted"] += b.evicted_unused
        out["unused_at_end"] += b.unused
        out["drawn_at_stop"] += at_stop
        named += b.dropped_stale + b.evicted_unused + b.unused + at_stop
        out["unaccounted"] += abs(drawn - at_stop)
    out["stored_twice"] = len(ledger.stored_ids()) - len(stored)  # a count without a sample of its own
    out["unaccounted"] += out["stored_twice"]
    out["trained"] = len(trained & stored)
    out["unaccounted"] += abs(len(stored - trained) - named)
    return out


def backlog_kept_older(fleet) -> int:
    """Samples an uploader kept (stored after its last drop) that are older than one it dropped: a full backlog
    must drop its oldest objects, so that nothing newer is lost."""
    ledger, visible = fleet.ledger, fleet.meter.visible_at
    stored = set(ledger.stored_ids().tolist())
    out = 0
    for w in fleet.all_workers:
        if w.last_drop_at is None:
            continue
        handed = {i: k for k, i in enumerate(w.source.produced)}  # in the order the worker handed them over
        newest_lost = max((k for i, k in handed.items() if i not in stored), default=-1)
        for key in ledger.by_worker.get(w.id, ()):
            if visible[key] > w.last_drop_at:
                out += sum(1 for i in ledger.samples[key].tolist() if handed.get(i, newest_lost) < newest_lost)
    return out


def publish_figures(fleet, reached: float) -> dict:
    """Versions per publish interval (from LATEST's writes), versions whose weights are not what their meta
    says (or not newer than the last), LATEST moving backwards, and the least share of workers a version
    reached within two publish intervals."""
    s, ledger = fleet.s, fleet.ledger
    end = min(reached, s.sim_s)
    moved = sorted({v: at for at, v in reversed(ledger.latest)}.items())  # version → first named
    counted = [v for v, at in moved if MEASURE_FROM_S <= at <= end]
    cadence = len(counted) * s.publish_s / max(end - MEASURE_FROM_S, 1e-9)
    bad = sum(b < a for (_, a), (_, b) in zip(ledger.latest, ledger.latest[1:]))  # LATEST backwards
    # a pointer to nothing (yet): LATEST must move only after the version's object is stored
    bad += sum(v not in ledger.versions or ledger.versions[v].at > at for at, v in ledger.latest)
    last_updates = -1
    for v in sorted(ledger.versions):
        ver = ledger.versions[v]
        if ver.updates is None or ver.weights != ver.updates or ver.updates <= last_updates:
            bad += 1
        last_updates = ver.updates if ver.updates is not None else last_updates
    bad += sum(w.source.wrong_weights for w in fleet.all_workers) + sum(n.wrong_weights for n in fleet.servers)
    window = 2 * s.publish_s
    reach = [_reached(fleet, v, at, at + window) for v, at in moved if MEASURE_FROM_S <= at <= end - window]
    return {"publish_cadence": cadence, "bad_versions": bad,
            "version_reach_share": min(reach, default=1.0 if end < MEASURE_FROM_S + window else 0.0)}


def _reached(fleet, version: int, at: float, by: float) -> float:
    """The share of the workers running from ``at`` to ``by`` that played ``version`` or newer by ``by``."""
    live = [w for w in fleet.all_workers if w.started_at <= at and (w.left_at is None or w.left_at > by)]
    got = sum(any(v >= version and t <= by for t, v in w.source.swaps) for w in live)
    return got / len(live) if live else 1.0


def league_figures(fleet, peek: PeekStore) -> dict:
    """Games in the pool as last committed over games played; snapshots off their cadence: a version due one
    whose snapshot is missing from the pool or unloadable with that version's weights, or a snapshot of a
    version not due one."""
    s, ledger = fleet.s, fleet.ledger
    played = sum(w.source.games for w in fleet.all_workers)
    pooled = max(ledger.pool, key=lambda p: p[1])[2] if ledger.pool else 0
    try:
        state = League(peek).read()
    except (KeyError, FormatError):
        state = None
    members = state.members if state is not None else {}
    league = League(peek)
    missing = 0
    for v in (v for v in ledger.versions if v and s.snapshot_every and v % s.snapshot_every == 0):
        member = next((m for m in members.values() if m.kind == "snapshot" and m.version == v), None)
        if member is None:
            missing += 1
        elif member.active:
            try:
                w = league.load_snapshot(member.id).tensors["w"]
                missing += int(not np.all(w == ledger.versions[v].updates))
            except (KeyNotFound, FormatError, KeyError, ValueError):
                missing += 1
    every = s.snapshot_every or math.inf
    missing += sum(1 for m in members.values() if m.kind == "snapshot" and (m.version or 0) % every != 0)
    return {"pool_games_share": pooled / played if played else 1.0, "snapshots_off_cadence": missing}


def checkpoint_figures(fleet, peek: PeekStore) -> dict:
    """The most and the fewest updates between two checkpoints (from the start; the most also to the last update)
    over ``checkpoint_every``; checkpoints that do not load, hold other weights than their updates, or that
    ``checkpoints/LATEST`` named before they were stored."""
    s, ledger = fleet.s, fleet.ledger
    updates = fleet.ranks[0].learner.updates
    marks = sorted({u for _, _, u in ledger.checkpoints})
    gaps = np.diff([0, *marks, updates]) if updates else np.zeros(1)
    stored = {v: at for at, v, _ in reversed(ledger.checkpoints)}  # version → first stored
    bad = sum(v not in stored or stored[v] > at for at, v in ledger.checkpoint_latest)
    for key in peek.list(CHECKPOINTS_PREFIX):
        version = parse_checkpoint_key(key)
        if version is None:
            continue
        try:
            ckpt = load_checkpoint(peek, version)
            bad += int(not np.all(ckpt.model["w"] == ckpt.updates) or version not in ledger.versions)
        except (KeyNotFound, FormatError, KeyError, ValueError):
            bad += 1
    if ledger.checkpoints:  # the one a resume starts from: what checkpoints/LATEST names, loadable
        try:
            bad += int(load_latest_checkpoint(peek) is None)
        except (KeyNotFound, FormatError, KeyError, ValueError):
            bad += 1
    between = np.diff([0, *marks])
    return {"checkpoint_gap": float(gaps.max()) / s.checkpoint_every, "checkpoints_bad": bad,
            "checkpoint_gap_min": float(between.min()) / s.checkpoint_every if len(between) else 1.0}


def rank_figures(fleet, reached: float) -> dict:
    """Seconds between the first and the last rank leaving (inf if one never left, or one raised); the spread
    of their update counts (ranks in lock step take every update together); updates rank 0 made that no
    version holds after the stop (a clean stop publishes them); the ranks' pooling of games (an all-gather)
    per fold interval (half a publish interval with balancing)."""
    s, ledger = fleet.s, fleet.ledger
    ends = [r.ended_at for r in fleet.ranks]
    spread = math.inf if None in ends or any(r.failure for r in fleet.ranks) else max(ends) - min(ends)
    counts = [r.learner.updates for r in fleet.ranks]
    newest = max(ledger.versions, default=None)
    held = ledger.versions[newest].updates if newest is not None else None
    # a run cut short never stopped; one whose lease another optimizer took must write nothing more
    unpublished = counts[0] - (held or 0) if reached >= s.sim_s and fleet.lease.taken_at is None else 0
    gathers = fleet.group.gathers if fleet.group else 0
    return {"ranks_stop_spread_s": spread, "rank_updates_spread": max(counts) - min(counts),
            "unpublished_updates": unpublished,
            "pools_per_fold_interval": gathers / max(1.0, (reached + s.drain_s) / (s.publish_s / 2))}


def request_figures(fleet, reached: float) -> dict:
    """``params/LATEST`` GETs per node per parameter poll interval, and GETs of each version's object per node
    (the node cache's promise: one of each a node); a worker's LISTs an hour beyond its first, and its PUTs per
    upload interval."""
    s, m = fleet.s, fleet.meter
    nodes = -(-s.workers // s.workers_per_node) if s.workers_per_node else s.workers
    run_s = min(reached, s.sim_s)
    latest = sum(m.requests["params/LATEST", "GET", h] for h in (0, 1))
    fetched = [n for key, n in m.gets_by_key.items() if parse_params_key(key) is not None]
    worker_s = worker_seconds(fleet, run_s)
    return {"latest_gets_per_node_poll": latest / max(1e-9, nodes * run_s / s.param_poll_s),
            "version_gets_per_node": sum(fetched) / max(1, nodes * len(fetched)),
            # a worker lists once as it starts (has the run an optimizer?), then only when versions stop coming
            "worker_lists_per_hour": (m.worker_requests["LIST"] - len(fleet.all_workers)) / max(1e-9, worker_s / 3600),
            "worker_puts_per_upload": m.worker_requests["PUT"] / max(1e-9, worker_s / s.upload_s)}


def readback(fleet, reached: float) -> dict:
    peek = PeekStore(fleet.store)
    fig: dict = {"samples": sample_ledger(fleet)}
    fig["unaccounted_samples"] = fig["samples"]["unaccounted"]
    fig["trained_share"] = fig["samples"]["trained"] / max(1, fig["samples"]["made"])
    for part in (publish_figures(fleet, reached), league_figures(fleet, peek), checkpoint_figures(fleet, peek),
                 rank_figures(fleet, reached), request_figures(fleet, reached)):
        fig.update(part)
    fig.update(node_figures(fleet, reached))
    fig.update(lease_figures(fleet))
    fig.update(worker_figures(fleet))
    fig.update(check_figures(fleet, peek, reached))
    fig["ahead_dropped"] = sum(r.learner.ahead_dropped for r in fleet.ranks)
    # the staleness the loop reported against each batch's as trained (the loop's version then)
    fig["staleness_misreported"] = sum(abs(r.report.stale_sum - r.learner.stale_sum) for r in fleet.ranks)
    # the share of rank 0's updates trained on the batch drawn during the update before (the draw-ahead ran)
    fig["ahead_share"] = fleet.ranks[0].learner.ahead_used / max(1, fleet.ranks[0].learner.updates)
    fig["unreadable_objects"] = len(fleet.ledger.unreadable)
    fig["backlog_kept_older"] = backlog_kept_older(fleet)
    fig["bad_objects"] = sum(r.loader.stats.bad_objects for r in fleet.ranks)  # rapid's own uploads, all valid
    return fig

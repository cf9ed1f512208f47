"""The scale model's figures: per key family request rates, bytes and live objects, and the data plane's
delays, each computed from the Meter's counts and the fleet's own records."""

from __future__ import annotations

import collections
import math

import numpy as np

from .meter import FAMILIES, OPS, PRICE_PER_1000


def pct(values, q: float) -> float:
    """The q-th percentile, an observed value (so an infinite lag, a game never folded, can be one)."""
    return float(np.percentile(values, q, method="higher")) if len(values) else math.nan


def counter_pct(counter, q: float) -> float:
    """A percentile of the values a Counter (value → occurrences) holds."""
    total = sum(counter.values())
    if not total:
        return math.nan
    seen = 0
    for value in sorted(counter):
        seen += counter[value]
        if seen >= q / 100 * total:
            return float(value)
    return float(max(counter))


def fold_lags(played: list, folded: list) -> tuple[list, int]:
    """Game-finished → folded delays, matching the n-th game played to the time the pool first counted n
    games (first in, first folded); a game never folded has an infinite lag. Also how many were never folded."""
    played = sorted(played)
    times = [t for t, _ in folded]
    counts = np.maximum.accumulate([n for _, n in folded]) if folded else np.array([])
    lags, n, unfolded = [], 0, 0
    for t, games in played:
        for _ in range(games):
            n += 1
            i = int(np.searchsorted(counts, n)) if len(counts) else 0
            if i >= len(counts):
                unfolded += 1
                lags.append(math.inf)
            else:
                lags.append(max(0.0, times[i] - t))
    return lags, unfolded


MEASURE_FROM_S = 60.0
"""Shares over time (workers on a current version, updates) are measured after the first minute: the first
uploads take an upload interval to arrive."""

BOUNDS = {
    "workers_current_share": (">=", 0.95),
    "updates_share": (">=", 0.90),
    "poller_failures": ("<=", 0),
    "trained_share": (">=", 0.95),
    "list_pages_per_poll": ("<=", 1.0),
    "writer_wait_s": ("<=", None),  # one publish interval
    "hot_key_gets_per_s": ("<=", 1000.0),
    "cost_per_hour": ("<=", 5.0),
    "discovery_p99_s": ("<=", None),  # one upload interval
    # a game sealed → the pool revision counting it: its object found (discovery, within an upload interval), the
    # ranks' next pooling (every half publish interval) and rank 0's writer (behind at most a version's job)
    "fold_lag_p99_s": ("<=", None),  # an upload interval and a publish interval
    # read back from the store and the stand-ins (readback.py)
    "unaccounted_samples": ("<=", 0),
    # versions per publish interval: a version waits for the next update and the writer after it is due, and one
    # more fits in a short run
    "publish_cadence": ("in", (0.7, 1.5)),
    "bad_versions": ("<=", 0),
    "version_reach_share": (">=", 0.95),  # of the workers, within two publish intervals
    "pool_games_share": ("in", (0.99, 1.0)),
    "snapshots_off_cadence": ("<=", 0),
    "checkpoint_gap": ("<=", 2.0),  # in checkpoint_every's
    "checkpoint_gap_min": (">=", 1.0),
    "checkpoints_bad": ("<=", 0),
    "ranks_stop_spread_s": ("<=", 10.0),
    "rank_updates_spread": ("<=", 0),
    "unpublished_updates": ("<=", 0),
    "pools_per_fold_interval": ("<=", 1.5),
    "latest_gets_per_node_poll": ("<=", 1.5),
    "version_gets_per_node": ("<=", 1.5),
    "worker_lists_per_hour": ("<=", 6.0),
    "worker_puts_per_upload": ("<=", 1.5),
    "unreadable_objects": ("<=", 0),
    "loaded_twice": ("<=", 0),
    "bad_objects": ("<=", 0),
    "backlog_kept_older": ("<=", 0),
    # the node inference servers (node.py; 0 under local inference)
    "server_busy_share": ("<=", 0.9),
    "server_wait_max_s": ("<=", None),  # one segment
    "inference_restarts": ("<=", 0),
    # rapid's RolloutWorker (realworker.py; 0 with the stand-in worker)
    "decisions_unaccounted": ("<=", 0),
    "samples_misstamped": ("<=", 0),
    "games_misplayed": ("<=", 0),  # an episode record naming an opponent or a side other than who played it
    # the learner's draw-ahead: batches drawn during an update and never trained (standins.py SimLearner)
    "ahead_dropped": ("<=", 0),
    "ahead_share": (">=", 0.25),  # of rank 0's updates on the batch drawn ahead (rollout-bound: not all find one)
    "staleness_misreported": ("<=", 0),  # samples' versions: the loop's report against the batch as trained
    # who played whom, and what the learner was given (checks.py)
    "pool_results_off": ("<=", 0.01),  # of the games loaded (as pool_games_share: a fold may be in flight)
    "past_share_z": ("<=", 4.0),  # standard errors from 1 - league.latest_prob
    "repeat_swaps": ("<=", 0),
    "pool_reads_per_refresh": ("<=", 1.5),  # asked by the workers, before the node's cache
    "latest_reads_per_poll": ("<=", 1.5),
    "trained_staleness_max": ("<=", None),  # optimizer.max_staleness, and one: a batch drawn ahead trains a version on
    # the run's lease (lease.py; 0 unless another optimizer takes the run)
    "writes_after_lease_lost": ("<=", 0),
    "lease_lost_stop_s": ("<=", 30.0),  # a renewal tick (ttl/4 = 15 s) and the ranks' agreement to stop
}
"""The bound each health figure must keep (the issue's, at the product card's shape; None: from the run's
cadence; "in": a closed range)."""


def bound_of(name: str, s) -> tuple[str, float | tuple[float, float]]:
    op, value = BOUNDS[name]
    if value is None:
        value = {"discovery_p99_s": s.upload_s, "server_wait_max_s": s.segment_s,
                 "fold_lag_p99_s": s.upload_s + s.publish_s,
                 "trained_staleness_max": s.max_staleness + 1}.get(name, s.publish_s)
    return op, value


def passes(name: str, value: float, s) -> bool:
    op, bound = bound_of(name, s)
    if isinstance(bound, tuple):
        return bound[0] <= value <= bound[1]
    return value >= bound if op == ">=" else value <= bound


def failures(fig: dict, s) -> list[str]:
    """One line per figure out of its bound."""
    out = []
    for name in BOUNDS:
        if not passes(name, fig[name], s):
            op, bound = bound_of(name, s)
            want = f"in [{_num(bound[0])}, {_num(bound[1])}]" if isinstance(bound, tuple) else f"{op} {_num(bound)}"
            out.append(f"FAIL {name} = {_num(fig[name])}, want {want}")
    return out


def writer_wait(rank0, clock) -> float:
    """The longest a version waited on rank 0's writer: from the loop's decision to its LATEST stored (the
    update loop itself never waits: a version that finds the writer full is held while training goes on); a
    version still unstored at the end counts until then."""
    stored = len(rank0.publish_lags)
    unstored = [clock.t() - at for v, at in rank0.report.version_at.items() if v > stored]
    return max([*rank0.publish_lags, *unstored], default=0.0)


def updates_share(fleet, reached: float) -> float:
    """Updates done of possible, in samples, over the run after the first minute (rank 0; every rank trains the
    same batches): what the learner trained on ÷ the least of what it could have taken, busy all the time at the
    batch sizes it chose, and what arrived at the target reuse; at most 1 (a rank short of fresh samples may
    reuse some beside peers with plenty, so it can train on more than arrived × the target). 1 when the learner
    is never idle with data waiting, whichever side (rollouts or learner) sets the pace; stalls of the lock
    step, the writer or a starved rank bring it down."""
    s, rank0 = fleet.s, fleet.ranks[0]
    learner, elapsed = rank0.learner, min(reached, s.sim_s) - MEASURE_FROM_S
    if not learner.samples or elapsed <= 0:
        return 0.0
    received_to = fleet.received_to if reached >= s.sim_s else rank0.buffer.stats().received
    by_time = elapsed * learner.samples / learner.busy_s
    by_data = (received_to - fleet.received_from) * s.target_reuse
    return min(1.0, learner.samples / max(1e-9, min(by_time, by_data)))


def pool_games(fleet) -> list[tuple[float, int]]:
    """(time, games in the pool) of each pool revision stored: the games folded, as the store holds them."""
    return [(t, games) for t, _, games in fleet.ledger.pool]


def health(fleet, fam: dict, reached: float, hot_gets: int) -> dict:
    """The flat health figures (names as in ``--json``)."""
    m, rank0 = fleet.meter, fleet.ranks[0]
    delays = [m.loads[k][0][1] - at for k, at in m.visible_at.items() if m.loads.get(k)]
    lags, _ = fold_lags(fleet.played, pool_games(fleet))
    pages = m.done["experience", "LIST"]  # pages answered (an attempt answered 500 and retried is not a page)
    return {
        "workers_current_share": float(np.mean(fleet.current)) if fleet.current else 0.0,
        "updates_share": updates_share(fleet, reached),
        "poller_failures": fleet.poller_failures,
        "list_pages_per_poll": pages / max(1, fleet.polls),
        "writer_wait_s": writer_wait(rank0, fleet.clock),
        "hot_key_gets_per_s": hot_gets / max(reached, 1e-9),
        "cost_per_hour": sum(r["$/h"] for r in fam.values()),
        "discovery_p99_s": pct(delays, 99),
        "fold_lag_p99_s": pct(lags, 99),
    }


def figures(fleet, live_half: dict, live_end: dict) -> dict:
    m, s = fleet.meter, fleet.s
    reached = fleet.reached
    first_s, second_s = min(reached, m.half_at), max(0.0, reached - m.half_at)
    h, span = (1, second_s) if second_s > 0 else (0, first_s)  # rates: the second half, if it was reached
    fam = {}
    for f in FAMILIES:
        row = {op: m.requests[f, op, h] / span for op in OPS}
        row["MB/s"] = sum(m.bytes[f, op, h] for op in OPS) / span / 1e6
        row["req/s 1st"] = sum(m.requests[f, op, 0] for op in OPS) / first_s
        row["req/s 2nd"] = sum(m.requests[f, op, 1] for op in OPS) / second_s if second_s else math.nan
        row["live half"] = live_half.get(f, (0, 0.0))[0]
        row["live end"] = live_end.get(f, (0, 0.0))[0]
        row["GB end"] = live_end.get(f, (0, 0.0))[1] / 1e9
        row["$/h"] = sum(m.requests[f, op, h] / span * 3600 * PRICE_PER_1000[op] / 1000 for op in OPS)
        if any(row[k] for k in (*OPS, "live end")):
            fam[f] = row
    lags, unfolded = fold_lags(fleet.played, pool_games(fleet))
    staleness = collections.Counter(fleet.ranks[0].report.staleness)
    hot_key, hot_gets = max(m.gets_by_key.items(), key=lambda kv: kv[1], default=("-", 0))
    rank0 = fleet.ranks[0]
    jobs: collections.Counter = collections.Counter()
    longest: dict[str, float] = {}
    for name, seconds in rank0.writer_jobs:
        jobs[name] += 1
        longest[name] = max(longest.get(name, 0.0), seconds)
    fig = health(fleet, fam, reached, hot_gets)
    group = fleet.group
    fig.update({
        "families": fam,
        "uploaded": len(m.visible_at), "never_loaded": sum(1 for k in m.visible_at if not m.loads.get(k)),
        "loaded_twice": sum(1 for k in m.visible_at if len(m.loads.get(k, ())) > 1),
        "bad": sum(r.loader.stats.bad_objects for r in fleet.ranks),
        "dropped_by_workers": sum(w.uploader.stats.dropped_objects for w in fleet.all_workers),
        "discovery_p50_s": pct([m.loads[k][0][1] - at for k, at in m.visible_at.items() if m.loads.get(k)], 50),
        "staleness_p50": counter_pct(staleness, 50), "staleness_p99": counter_pct(staleness, 99),
        "fold_lag_p50_s": pct(lags, 50), "unfolded_games": unfolded,
        "writer_jobs": dict(jobs), "writer_job_max_s": longest,
        "updates": rank0.learner.updates,
        "reached_s": reached, "complete": reached >= s.sim_s,
        "poll_s_p50": pct(fleet.poll_s, 50), "poll_s_p99": pct(fleet.poll_s, 99),
        "hot_key": hot_key,
        "collectives": group.collectives if group else 0,
        "collective_s": group.seconds if group else 0.0,
        "straggler_wait_s": group.straggler_wait_s if group else 0.0,
        "error_answers": {f"{f} {c}": n for (f, c), n in m.errors.items()},
        "errors_raised": {f"{f} {c}": n for (f, c), n in m.raised.items()},
        "list_failures": sum(r.loader.stats.store_errors for r in fleet.ranks),
        "snapshot_failures": fleet.snapshot_failures,
        "rank_failures": [r.failure for r in fleet.ranks if r.failure],
        "churned": fleet.churned,
    })
    return fig


def print_report(fig: dict, s, out=print) -> None:
    cols = [*OPS, "MB/s", "req/s 1st", "req/s 2nd", "live half", "live end", "GB end", "$/h"]
    out(f"{'family':<17}" + "".join(f"{c:>11}" for c in cols))
    for f, row in fig["families"].items():
        out(f"{f:<17}" + "".join(f"{_num(row[c]):>11}" for c in cols))
    out("  (request rates and MB/s over the second half of the run; live objects at half time and at the end)")
    if not fig["complete"]:
        out(f"  STOPPED EARLY at simulated second {fig['reached_s']:.0f} (wall-time limit): rates over what was "
            f"reached, no drain")
    out("health, each figure beside its bound:")
    for name in BOUNDS:
        op, bound = bound_of(name, s)
        verdict = "ok" if passes(name, fig[name], s) else "FAIL"
        want = f"in {_num(bound[0])}…{_num(bound[1])}" if isinstance(bound, tuple) else f"{op} {_num(bound)}"
        out(f"  {name:<26}{_num(fig[name]):>12}   want {want:<11} {verdict}")
    jobs = ", ".join(f"{k} {v} ({fig['writer_job_max_s'][k]:.1f})" for k, v in sorted(fig["writer_jobs"].items()))
    pairs = [
        ("objects uploaded / never loaded / loaded twice / bad",
         f"{fig['uploaded']} / {fig['never_loaded']} / {fig['loaded_twice']} / {fig['bad']}"),
        ("dropped by workers (backlog full)", fig["dropped_by_workers"]),
        ("samples read back (made; trained; each reason)",
         "; ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in fig["samples"].items()
                   if v or k in ("made", "trained", "unaccounted"))),
        ("discovery delay p50 (s)", f"{fig['discovery_p50_s']:.1f}"),
        ("staleness p50 / p99 (versions)", f"{fig['staleness_p50']:.0f} / {fig['staleness_p99']:.0f}"),
        ("league fold lag p50 (s); games never folded", f"{fig['fold_lag_p50_s']:.1f}; {fig['unfolded_games']}"),
        ("rank 0's writer jobs (longest, s)", jobs),
        ("updates (rank 0)", fig["updates"]),
        # no bound: a rank short of fresh samples may draw up to optimizer.max_reuse while its peers have plenty
        ("reuse (draws ÷ samples trained, every rank)", f"{fig['reuse']:.2f}"),
        ("collectives; their cost; waits for stragglers (s)",
         f"{fig['collectives']}; {fig['collective_s']:.1f}; {fig['straggler_wait_s']:.1f}"),
        ("loader poll duration p50 / p99 (simulated s)", f"{fig['poll_s_p50']:.2f} / {fig['poll_s_p99']:.2f}"),
        ("hottest key", fig["hot_key"]),
        ("error answers (retried) / raised", f"{fig['error_answers'] or 0} / {fig['errors_raised'] or 0}"),
        ("loader polls failed (store error)", fig["list_failures"]),
        ("snapshot downloads failed (workers played the latest instead)", fig["snapshot_failures"]),
        ("ranks that failed", "; ".join(fig["rank_failures"]) or 0),
    ]
    if fig["churned"]:
        pairs.append(("workers replaced", fig["churned"]))
    width = max(len(k) for k, _ in pairs)
    for k, v in pairs:
        out(f"{k:<{width}}  {v}")


def _num(x: float) -> str:
    if math.isnan(x) or math.isinf(x):
        return str(x)
    if isinstance(x, int) or float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.3f}" if abs(x) < 10 else f"{x:,.1f}" if abs(x) < 100 else f"{x:,.0f}"

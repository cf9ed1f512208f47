"""The scale model's figures: per key family request rates, bytes and live objects, and the data plane's
delays, each computed from the Meter's counts and the fleet's own records."""

from __future__ import annotations

import math

import numpy as np

from .store import FAMILIES, OPS, PRICE_PER_1000


def pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


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


def fold_lags(sealed: list, folded: list) -> tuple[list, int]:
    """Game-finished → folded delays, matching the n-th game sealed to the time the pool first counted n
    games (first in, first folded); and how many games were never folded."""
    sealed = sorted(sealed)
    times = [t for t, _ in folded]
    counts = np.maximum.accumulate([n for _, n in folded]) if folded else np.array([])
    lags, n = [], 0
    for t, games in sealed:
        for _ in range(games):
            n += 1
            i = int(np.searchsorted(counts, n)) if len(counts) else 0
            if i >= len(counts):
                return lags, sum(g for _, g in sealed) - n + 1
            lags.append(max(0.0, times[i] - t))
    return lags, 0


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
    uploaded = m.visible_at
    delays, twice, never = [], 0, 0
    for key, at in uploaded.items():
        loads = m.loads.get(key)
        if not loads:
            never += 1
            continue
        delays.append(loads[0][1] - at)
        twice += len(loads) > 1
    bad = sum(r.loader.stats.bad_objects for r in fleet.ranks)
    lags, unfolded = fold_lags(fleet.games_sealed, fleet.pool_games)
    polls = max(1, len(fleet.poll_s))
    opt = fleet.optimizer.fig
    hot_key, hot_gets = max(m.gets_by_key.items(), key=lambda kv: kv[1], default=("-", 0))
    return {
        "families": fam,
        "cost_per_h": sum(r["$/h"] for r in fam.values()),
        "uploaded": len(uploaded), "never_loaded": max(0, never - bad), "loaded_twice": twice, "bad": bad,
        "dropped_by_workers": sum(w.uploader.stats.dropped_objects for w in fleet.workers.values()),
        "discovery_p50": pct(delays, 50), "discovery_p99": pct(delays, 99),
        "staleness_p50": counter_pct(opt.staleness, 50), "staleness_p99": counter_pct(opt.staleness, 99),
        "fold_lag_p50": pct(lags, 50), "fold_lag_p99": pct(lags, 99), "unfolded_games": unfolded,
        "writer_wait_max": max(opt.writer_wait_s, default=0.0),
        "writer_jobs": dict(fleet.optimizer.writer.jobs), "writer_job_max_s": dict(fleet.optimizer.writer.job_s),
        "updates": opt.updates, "updates_ideal": int(reached / s.update_s), "reached_s": reached,
        "complete": reached >= s.sim_s,
        "list_pages_per_poll": sum(m.requests["experience", "LIST", h] for h in (0, 1)) / polls,
        "poll_cpu_ms_p50": 1e3 * pct(fleet.poll_cpu, 50), "poll_cpu_ms_p99": 1e3 * pct(fleet.poll_cpu, 99),
        "client": m.client, "poll_cpu_client_ms_p50": 1e3 * pct(fleet.poll_cpu_client, 50),
        "poll_cpu_client_ms_p99": 1e3 * pct(fleet.poll_cpu_client, 99),
        "poll_s_p50": pct(fleet.poll_s, 50), "poll_s_p99": pct(fleet.poll_s, 99),
        "hot_key": hot_key, "hot_key_gets_per_s": hot_gets / reached,
        "throttled": dict(m.throttled), "slowdown_raised": dict(m.failed),
        "list_failures": fleet.list_failures, "snapshot_failures": fleet.snapshot_failures,
        "restarts": fleet.restarts, "churned": fleet.churned,
    }


def print_report(fig: dict, out=print) -> None:
    cols = [*OPS, "MB/s", "req/s 1st", "req/s 2nd", "live half", "live end", "GB end", "$/h"]
    out(f"{'family':<17}" + "".join(f"{c:>11}" for c in cols))
    for f, row in fig["families"].items():
        out(f"{f:<17}" + "".join(f"{_num(row[c]):>11}" for c in cols))
    out("  (request rates and MB/s over the second half of the run; live objects at half time and at the end)")
    if not fig["complete"]:
        out(f"  STOPPED EARLY at simulated second {fig['reached_s']:.0f} (wall-time limit): rates over what was "
            f"reached, no drain, so 'never loaded' counts objects still in flight")
    pairs = [
        ("S3 request cost, $/h at list prices", f"{fig['cost_per_h']:.2f}"),
        ("objects uploaded", fig["uploaded"]),
        ("never loaded", fig["never_loaded"]),
        ("loaded twice", fig["loaded_twice"]),
        ("bad objects", fig["bad"]),
        ("dropped by workers (backlog full)", fig["dropped_by_workers"]),
        ("discovery delay p50 / p99 (s)", f"{fig['discovery_p50']:.1f} / {fig['discovery_p99']:.1f}"),
        ("staleness p50 / p99 (versions)", f"{fig['staleness_p50']:.0f} / {fig['staleness_p99']:.0f}"),
        ("league fold lag p50 / p99 (s)", f"{fig['fold_lag_p50']:.1f} / {fig['fold_lag_p99']:.1f}"),
        ("games never folded", fig["unfolded_games"]),
        ("longest wait of the update loop on rank 0's writer (s)", f"{fig['writer_wait_max']:.3f}"),
        ("writer jobs (longest, s)", ", ".join(f"{k} {v} ({fig['writer_job_max_s'][k]:.1f})"
                                               for k, v in fig["writer_jobs"].items())),
        ("updates done / possible", f"{fig['updates']} / {fig['updates_ideal']}"),
        ("experience LIST pages per rank per poll", f"{fig['list_pages_per_poll']:.2f}"),
        ("poll duration p50 / p99 (simulated s)", f"{fig['poll_s_p50']:.2f} / {fig['poll_s_p99']:.2f}"),
        ("CPU per poll per rank p50 / p99 (ms, rapid's code)", f"{fig['poll_cpu_ms_p50']:.2f} / "
                                                                f"{fig['poll_cpu_ms_p99']:.2f}"),
        *([(f"CPU per poll per rank p50 / p99 (ms, with {fig['client']})",
             f"{fig['poll_cpu_client_ms_p50']:.2f} / {fig['poll_cpu_client_ms_p99']:.2f}")] if fig["client"] else []),
        ("hottest key, GETs/s", f"{fig['hot_key']} {fig['hot_key_gets_per_s']:.1f}"),
        ("SlowDown answers (retried) / raised", f"{fig['throttled'] or 0} / {fig['slowdown_raised'] or 0}"),
        ("loader polls failed (store error)", fig["list_failures"]),
        ("snapshot downloads failed (workers played the latest instead)", fig["snapshot_failures"]),
    ]
    if fig["restarts"] or fig["churned"]:
        pairs.append(("optimizer restarts / workers replaced", f"{fig['restarts']} / {fig['churned']}"))
    width = max(len(k) for k, _ in pairs)
    for k, v in pairs:
        out(f"{k:<{width}}  {v}")


def _num(x: float) -> str:
    if math.isnan(x):
        return "-"
    if isinstance(x, int) or float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.2f}" if abs(x) < 100 else f"{x:,.0f}"


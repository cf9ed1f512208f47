"""Calibration of the S3 model against a real S3 server (moto_server on loopback).

    python benchmarks/bench_fleet.py --calibrate [--minutes 5]      # all four steps
    cd benchmarks && python -m fleet.calibrate [--requests 300]      # steps 1-3 only (about a minute)

1. **Latency.** :func:`measure` times every op on moto (wall clock around each ``S3Store`` call, so botocore's
   own time is in it, as a caller waits for it); :func:`fit` makes the model's per-op mean and lognormal σ
   and a LIST page's time per key from it. The same measurement through the fitted model prints beside
   moto's: mean, p50, p99, p99.9 and their ratios model/moto.
2. **A listing of 2,500 keys** (three LIST pages), whole and from ``start_after``, on both: pages and seconds.
3. **A SlowDown burst.** moto never throttles, so what is compared is the retrying, not S3's limit: one
   client PUTs a burst under one prefix past ``BURST_LIMIT`` writes/s; on moto a botocore ``before-send``
   hook answers 503 SlowDown past that rate, with the model's per-second rule, and botocore's own retry
   (standard mode, real sleeps) handles it; on the model ``Partitions`` and ``Retry`` do. Compared: attempts,
   SlowDown answers, errors raised, seconds.
4. **The fleet**, W=64, R=4, through ``run_once``: on moto each request charges the simulated clock the wall
   time it took (moto's pace); on the model, the fitted latency with no 500s or resets (moto answers none).
   Prints requests per key family and type on both and the ratio model/moto.
"""

from __future__ import annotations

import collections
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from rapid.infra.store import Store, StoreError

from .clock import SimClock
from .meter import FAMILIES, OPS, Latency, Meter
from .metered_s3 import MeteredS3
from .s3rules import THROTTLE
from .store import ModelStore

BURST, BURST_LIMIT, BURSTS = 100, 25, 3
"""PUTs in a SlowDown burst, the writes/s past which they are refused, and bursts (the waits are random)."""
LISTING = 2500
SMALL_LIST = 10  # keys a LIST of the latency measurement returns


def measure(store: Store, n: int = 300, now=time.perf_counter) -> dict[str, list[float]]:
    """Seconds each request took by ``now`` (wall clock on moto, the simulated clock on the model): ``n``
    PUTs of new 1 KB objects, ``n`` overwrites, ``n`` GETs, HEADs, LISTs of 10 keys and DELETEs."""
    took: dict[str, list[float]] = {op: [] for op in OPS}

    def timed(op, fn, *args):
        t0 = now()
        fn(*args)
        took[op].append(now() - t0)

    body = bytes(1000)
    keys = [f"calib/m/{i:05d}" for i in range(n)]
    for key in keys + keys:  # new keys, then overwrites
        timed("PUT", store.put, key, body)
    for key in keys:
        timed("GET", store.get, key)
    for key in keys:
        timed("HEAD", store.exists, key)
    for i in range(n):
        timed("LIST", store.list, f"calib/m/{(i % (n // SMALL_LIST)):04d}")
    for key in keys:
        timed("DELETE", store.delete, key)
    return took


def fit(took: dict[str, list[float]], big_list_s: float, big_pages: int) -> dict:
    """The model's settings from a measurement: mean and lognormal σ per op (σ of the log), and a LIST
    page's seconds per key from the 2,500-key listing beyond its pages' base time."""
    small = float(np.median(took["LIST"]))
    per_key = max(0.0, (big_list_s - big_pages * small) / (LISTING - big_pages * SMALL_LIST))
    mean_ms = {op: 1e3 * float(np.mean(v)) for op, v in took.items()}
    mean_ms["LIST"] = max(1e-3, mean_ms["LIST"] - 1e3 * SMALL_LIST * per_key)
    return {"latency_ms": mean_ms, "latency_sigma": {op: float(np.std(np.log(v))) for op, v in took.items()},
            "list_key_ms": 1e3 * per_key}


def _stats(v: list[float]) -> dict:
    a = 1e3 * np.asarray(v)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "p99.9": float(np.percentile(a, 99.9)), "sigma": float(np.std(np.log(a)))}


def _listing(store: Store, meter: Meter, now, writer: Store | None = None) -> tuple[int, float, float]:
    """PUT 2,500 keys (through ``writer``, 8 at a time, where given), list them whole and from near the
    end: (pages of the whole listing, its seconds, the tail listing's seconds)."""
    keys = [f"calib/big/{i:05d}" for i in range(LISTING)]
    if writer is None:
        for key in keys:
            store.put(key, b"x")
    else:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda key: writer.put(key, b"x"), keys))
    pages0 = sum(n for (_, op, _), n in meter.requests.items() if op == "LIST")
    t0 = now()
    listed = len(store.list("calib/big/"))
    whole = now() - t0
    pages = sum(n for (_, op, _), n in meter.requests.items() if op == "LIST") - pages0
    t0 = now()
    tail = store.list("calib/big/", start_after=f"calib/big/{LISTING - 3:05d}")
    tail_s = now() - t0
    if listed != LISTING or len(tail) != 2:
        raise RuntimeError(f"{store.url} listed {listed} of {LISTING} keys and {len(tail)} of 2 after start_after")
    return pages, whole, tail_s


def _burst(store: Store, now) -> dict:
    """BURSTS bursts of BURST PUTs, each under its own prefix, a second apart."""
    raised, seconds = 0, 0.0
    for b in range(BURSTS):
        t0 = now()
        for i in range(BURST):
            try:
                store.put(f"calib/burst{b}/{i:04d}", b"x")
            except StoreError:
                raised += 1
        seconds += now() - t0
    return {"raised": raised, "seconds": seconds}


class _Body:
    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **_):
        yield self.data


def _slowdown_hook(counts: collections.Counter):
    """A botocore ``before-send`` handler: past BURST_LIMIT PUTs in a wall-clock second, answer 503
    SlowDown instead of sending (the model's rule); ``counts`` gets "attempts" and "SlowDown"."""
    from botocore.awsrequest import AWSResponse

    body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"

    def before_send(request, **_):
        counts["attempts"] += 1
        second = math.floor(time.perf_counter())
        if counts[second] < BURST_LIMIT:
            counts[second] += 1
            return None
        counts[THROTTLE] += 1
        return AWSResponse(request.url, 503, {"Content-Type": "application/xml"}, _Body(body))

    return before_send


def calibrate_store(n: int = 300, out=print) -> dict:
    """Steps 1–3 (no fleet): moto measured, the model fitted to it and measured the same way."""
    sys.path.append(str(Path(__file__).resolve().parents[2]))  # tests.s3_server
    from rapid.infra.s3 import S3Store
    from tests.s3_server import start_moto_server, stop, use_dummy_credentials

    use_dummy_credentials()
    proc, endpoint = start_moto_server()
    try:
        def s3(name):
            return S3Store(f"s3://calib-{os.getpid()}-{name}/run", endpoint_url=endpoint, create_bucket=True)

        meter = Meter(SimClock(), Latency(dict.fromkeys(OPS, 0.0), 1e12, {}), math.inf, math.inf)
        moto = MeteredS3(s3("m"), meter)
        took = measure(moto, n)
        listing = _listing(moto, meter, time.perf_counter, writer=s3("m"))
        raw = s3("b")
        counts: collections.Counter = collections.Counter()
        raw.client.meta.events.register_first("before-send.s3.PutObject", _slowdown_hook(counts))
        burst = {**_burst(raw, time.perf_counter), "attempts": counts["attempts"], THROTTLE: counts[THROTTLE]}
    finally:
        stop(proc)
    fitted = fit(took, listing[1], listing[0])

    clock = SimClock()
    latency = Latency({op: ms / 1e3 for op, ms in fitted["latency_ms"].items()}, 1e12, {},
                      sigma=fitted["latency_sigma"], per_key=fitted["list_key_ms"] / 1e3, seed=1)
    meter = Meter(clock, latency, math.inf, math.inf)
    with clock.acting("calibration", 0.0):
        model_took = measure(ModelStore(meter, seed=1), n, clock.t)
        model_listing = _listing(ModelStore(meter, seed=1), meter, clock.t)
    meter = Meter(clock, latency, math.inf, math.inf)
    with clock.acting("burst", clock.t()):
        b = _burst(ModelStore(meter, write_limit=BURST_LIMIT, seed=1), clock.t)
    model_burst = {**b, "attempts": sum(meter.requests.values()), THROTTLE: sum(meter.throttled.values())}

    result = {"load": " ".join(Path("/proc/loadavg").read_text().split()[:3]), "fit": fitted,
              "moto": {op: _stats(v) for op, v in took.items()},
              "model": {op: _stats(v) for op, v in model_took.items()},
              "listing": {"moto": listing, "model": model_listing}, "burst": {"moto": burst, "model": model_burst}}
    _print_store(result, n, out)
    return result


def _print_store(r: dict, n: int, out) -> None:
    out(f"\n=== latency, ms: moto_server on loopback (wall clock) vs the model fitted to it; {n} requests an op, "
        f"{2 * n} PUTs (half overwrites), LISTs of {SMALL_LIST} keys; load {r['load']} ===")
    out(f"{'op':<8}" + "".join(f"{'moto ' + s:>12}" for s in ("mean", "p50", "p99", "p99.9", "sigma"))
        + "".join(f"{'model ' + s:>12}" for s in ("mean", "p99")) + f"{'p99/p50':>9}{'p99 m/m':>9}")
    for op in OPS:
        m, d = r["moto"][op], r["model"][op]
        out(f"{op:<8}" + "".join(f"{m[s]:>12.2f}" for s in ("mean", "p50", "p99", "p99.9", "sigma"))
            + f"{d['mean']:>12.2f}{d['p99']:>12.2f}{m['p99'] / m['p50']:>9.1f}{d['p99'] / m['p99']:>9.2f}")
    f = r["fit"]
    out("fit: --latency-ms " + ",".join(f"{op}={v:.3g}" for op, v in f["latency_ms"].items())
        + " --latency-sigma " + ",".join(f"{op}={v:.2f}" for op, v in f["latency_sigma"].items())
        + f" --list-key-ms {f['list_key_ms']:.4f}")
    (mp, mw, mt), (dp, dw, dt) = r["listing"]["moto"], r["listing"]["model"]
    out(f"\n=== a listing of {LISTING:,} keys: moto vs model ===")
    out(f"pages {mp} vs {dp}; whole listing {1e3 * mw:.0f} vs {1e3 * dw:.0f} ms (model/moto {dw / mw:.2f}); "
        f"from start_after (2 keys) {1e3 * mt:.1f} vs {1e3 * dt:.1f} ms")
    mb, db = r["burst"]["moto"], r["burst"]["model"]
    out(f"\n=== SlowDown bursts: {BURSTS} × {BURST} PUTs by one client past {BURST_LIMIT} writes/s "
        f"(moto: injected 503s, botocore's retry; model: its partitions and retry) ===")
    out(f"{'':<10}{'moto':>10}{'model':>10}{'model/moto':>12}")
    for k in ("attempts", THROTTLE, "raised", "seconds"):
        ratio = db[k] / mb[k] if mb[k] else math.nan
        out(f"{k:<10}{mb[k]:>10.4g}{db[k]:>10.4g}{ratio:>12.2f}")


def calibrate(a, run_once, out=print) -> dict:
    """The store calibration, then W=64, R=4 on moto and on the fitted model through ``run_once(a, kind)``
    (bench_fleet's, which must build the model from ``store_settings(a)``); prints per-family ratios."""
    store = calibrate_store(out=out)
    a.workers, a.ranks = 64, 4
    runs = {"moto": run_once(a, "moto")}
    for name, value in store["fit"].items():
        setattr(a, name, value)
    a.error_rate = a.reset_rate = 0.0
    runs["model"] = run_once(a, "model")
    out("\n=== requests: moto_server at its own pace vs the model fitted to it ===")
    out(f"{'family / type':<28}{'moto':>10}{'model':>10}{'model/moto':>12}")
    by_family: dict[str, list] = collections.defaultdict(lambda: [0, 0])
    for k in sorted(set(runs["moto"]["requests"]) | set(runs["model"]["requests"])):
        m, d = runs["moto"]["requests"].get(k, 0), runs["model"]["requests"].get(k, 0)
        by_family[k.split(" ")[0]][0] += m
        by_family[k.split(" ")[0]][1] += d
        out(f"{k:<28}{m:>10,}{d:>10,}{(d / m if m else math.nan):>12.3f}")
    for fam in [f for f in FAMILIES if f in by_family]:
        m, d = by_family[fam]
        out(f"{fam + ' (all)':<28}{m:>10,}{d:>10,}{(d / m if m else math.nan):>12.3f}")
    tm, td = sum(v[0] for v in by_family.values()), sum(v[1] for v in by_family.values())
    out(f"{'all':<28}{tm:>10,}{td:>10,}{td / tm:>12.3f}")
    return {"store": store, "requests": {k: dict(zip(("moto", "model"), v)) for k, v in by_family.items()}}


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Measure moto_server's latency and fit the S3 model to it.")
    p.add_argument("--requests", type=int, default=300, help="requests an op")
    a = p.parse_args(argv)
    if a.requests < 2 * SMALL_LIST:
        p.error(f"--requests must be at least {2 * SMALL_LIST}")
    calibrate_store(a.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The scale model: rapid's real data plane for W rollout workers and R optimizer ranks, in simulated time.

    python benchmarks/bench_fleet.py --workers 4096 --ranks 256 --minutes 15           # in-memory S3 model
    python benchmarks/bench_fleet.py --workers 64 --ranks 4 --store moto               # a real S3 server
    python benchmarks/bench_fleet.py --calibrate                                       # both, side by side
    python benchmarks/bench_fleet.py --cadence moba-5v5 ...                            # 5 s uploads, 2 s polls
    python benchmarks/bench_fleet.py --skew-s 30 --slow-upload-s 2 --churn 0.05 --restart-at 400   # faults

What runs is rapid's own code: each simulated worker has a real ``Uploader`` (sealing and uploading
real-format experience objects carrying finished-game records, with today's ``ResultReporter``), a real
``ParamPoller`` and a real league ``OpponentSampler``; each rank a real ``ExperienceLoader`` (``poll_once``)
and ``ExperienceBuffer``; rank 0 the real publish, league and checkpoint jobs. There is no env and no policy:
workers emit ``--samples`` samples and ``--games`` games per upload, and the learner is a stand-in that takes
``--update-s`` per update, all ranks in lock step. Nothing starts a thread per worker: a discrete-event
scheduler runs every actor's next step in order of simulated time (``benchmarks/fleet/sim.py``), so 4,096
workers and 256 ranks fit on two cores. Rates are per simulated second.

The store is either a real S3-compatible server on loopback (moto_server, ``--store moto``) or an in-memory
model of S3 (``--store model``): 1,000 keys a LIST page, objects visible once their PUT completes, 503
SlowDown past 3,500 writes/s or 5,500 reads/s on one prefix (retried like botocore, 5 attempts), and a
latency model (``--request-ms``, ``--list-ms`` a page, ``--mbps`` a stream). Objects are small in memory and
scaled to ``--object-mb`` (experience) and ``--params-mb`` (params, snapshots, checkpoints) for latency and
bytes; the scaling is printed. rapid's clock is the simulation's: ``benchmarks/fleet/clock.py`` patches the
``time`` of rapid's modules, and the output names them.

Prints, per key family: requests/s by type, MB/s, live objects at half time and at the end, S3 request cost
per hour at list prices; then discovery delay, staleness, league fold lag, the update loop's longest wait on
rank 0's writer, CPU per poll per rank, and "never loaded" (every uploaded object must be loaded by exactly
one rank or counted bad). ``--calibrate`` runs W=64, R=4 against moto and the model and prints both request
counts and their ratio.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # benchmarks/fleet; appended so PYTHONPATH's rapid wins
sys.path.append(str(Path(__file__).resolve().parent.parent))  # tests.s3_server for --store moto

from fleet import clock as sim_clock  # noqa: E402
from fleet.plane import detect  # noqa: E402
from fleet.rank0 import PARAM_TENSORS  # noqa: E402
from fleet.report import figures, print_report  # noqa: E402
from fleet.sched import OutOfTime  # noqa: E402
from fleet.sim import Fleet, Settings, sample_arrays  # noqa: E402
from fleet.store import FAMILIES, OPS, Latency, Meter, MeteredS3, ModelStore  # noqa: E402

import rapid  # noqa: E402
from rapid.formats.experience import ExperienceBatch, encode_experience  # noqa: E402
from rapid.formats.params import ParamsObject, encode_params  # noqa: E402

CADENCES = {"rapid": {"upload_s": 60.0, "param_poll_s": 5.0, "publish_s": 60.0},
            "moba-5v5": {"upload_s": 5.0, "param_poll_s": 2.0, "publish_s": 5.0}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=64, help="simulated rollout workers W")
    p.add_argument("--ranks", type=int, default=4, help="optimizer ranks R")
    p.add_argument("--minutes", type=float, default=15.0, help="simulated minutes (then a drain of --drain-s)")
    p.add_argument("--store", choices=("model", "moto"), default="model")
    p.add_argument("--calibrate", action="store_true", help="W=64, R=4 on moto and on the model, side by side")
    p.add_argument("--cadence", choices=sorted(CADENCES), default="rapid",
                   help="rapid: 60 s uploads, 5 s param polls, 60 s publishes; moba-5v5: 5 s, 2 s, 5 s")
    p.add_argument("--poll-s", type=float, default=0.5, help="optimizer.poll_s")
    p.add_argument("--retention-s", type=float, default=600.0, help="store.retention_s")
    p.add_argument("--update-s", type=float, default=1.0, help="stand-in learner: simulated seconds an update")
    p.add_argument("--samples", type=int, default=8, help="samples per experience object (in memory)")
    p.add_argument("--games", type=int, default=3, help="finished games per experience object")
    p.add_argument("--object-mb", type=float, default=32.0, help="modelled size of an experience object")
    p.add_argument("--params-mb", type=float, default=2.6, help="modelled size of a params version (moba 5v5)")
    p.add_argument("--request-ms", type=float, default=20.0, help="latency of a PUT/GET (HEAD, DELETE: half)")
    p.add_argument("--list-ms", type=float, default=100.0, help="latency of one LIST page")
    p.add_argument("--mbps", type=float, default=100.0, help="MB/s of one request stream")
    p.add_argument("--drain-s", type=float, default=120.0, help="after the run: ranks go on loading this long")
    p.add_argument("--skew-s", type=float, default=0.0, help="fault: worker clocks off by up to ± this")
    p.add_argument("--slow-upload-s", type=float, default=0.0, help="fault: extra seconds on 10%% of uploads")
    p.add_argument("--churn", type=float, default=0.0, help="fault: share of workers replaced every upload")
    p.add_argument("--restart-at", type=float, default=0.0, help="fault: optimizer restarts at this second")
    p.add_argument("--wall-limit-s", type=float, default=0.0,
                   help="end the run after this much wall time and report what was reached (today's code at "
                        "thousands of workers does not finish)")
    p.add_argument("--workers-per-node", type=int, default=0,
                   help="workers sharing a node cache for params, snapshots and the pool (rapid.node_cache; "
                        "0: every worker reads the store itself)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the figures to this file")
    return p.parse_args(argv)


def settings_of(a) -> Settings:
    return Settings(workers=a.workers, ranks=a.ranks, sim_s=60 * a.minutes, poll_s=a.poll_s,
                    retention_s=a.retention_s, update_s=a.update_s, samples_per_object=a.samples,
                    games_per_object=a.games, drain_s=a.drain_s, seed=a.seed, skew_s=a.skew_s,
                    slow_upload_s=a.slow_upload_s, churn=a.churn, restart_at=a.restart_at,
                    workers_per_node=a.workers_per_node, **CADENCES[a.cadence])


def latency_of(a) -> Latency:
    exp = len(encode_experience(ExperienceBatch("w0", 0, 0.0, sample_arrays(a.samples), ["latest"])))
    params = len(encode_params(ParamsObject(0, PARAM_TENSORS, {})))
    exp_scale, params_scale = a.object_mb * 1e6 / exp, a.params_mb * 1e6 / params
    base = {"PUT": a.request_ms / 1e3, "GET": a.request_ms / 1e3, "HEAD": a.request_ms / 2e3,
            "DELETE": a.request_ms / 2e3, "LIST": a.list_ms / 1e3}
    return Latency(base, a.mbps * 1e6, {"experience": exp_scale, "params": params_scale,
                                        "league/snapshots": params_scale, "checkpoints": params_scale})


def open_moto(meter: Meter):
    from rapid.infra.s3 import S3Store
    from tests.s3_server import start_moto_server, stop, use_dummy_credentials

    use_dummy_credentials()
    proc, endpoint = start_moto_server()
    store = S3Store(f"s3://fleet-{os.getpid()}/run", endpoint_url=endpoint, create_bucket=True)
    return MeteredS3(store, meter), lambda: stop(proc)


def run_once(a, store_kind: str, out=print) -> dict:
    s = settings_of(a)
    clock = sim_clock.SimClock()
    plane = detect()
    latency = latency_of(a)
    meter = Meter(clock, latency, s.sim_s / 2, s.sim_s)
    store, close = (open_moto(meter) if store_kind == "moto" else (ModelStore(meter, seed=a.seed), lambda: None))
    out(f"code: {Path(rapid.__file__).parent} — plane: {plane.name}")
    out(f"shape: W={s.workers} workers, R={s.ranks} ranks, {s.sim_s:.0f} s simulated (+{s.drain_s:.0f} s drain), "
        f"uploads every {s.upload_s:g} s, param polls every {s.param_poll_s:g} s, loader polls every {s.poll_s:g} s, "
        f"publish every {s.publish_s:g} s, retention {s.retention_s:g} s, update {s.update_s:g} s, "
        + (f"{s.workers_per_node} workers a node cache" if s.workers_per_node else "no node cache"))
    out(f"scaling: {s.samples_per_object} samples and {s.games_per_object} games per object in memory; "
        f"experience objects ×{latency.size_scale['experience']:,.0f} → {a.object_mb:g} MB, params ×"
        f"{latency.size_scale['params']:,.0f} → {a.params_mb:g} MB; latency {a.request_ms:g} ms a request, "
        f"{a.list_ms:g} ms a LIST page, {a.mbps:g} MB/s a stream; store: {store_kind}")
    started, cpu0 = time.perf_counter(), time.process_time()
    shown = [started]

    def progress(at: float) -> None:
        if a.wall_limit_s and time.perf_counter() - started > a.wall_limit_s:
            raise OutOfTime(at)
        if time.perf_counter() - shown[0] >= 10.0:
            shown[0] = time.perf_counter()
            print(f"  … simulated {at:7.0f} s of {s.sim_s + s.drain_s:.0f}, {fleet.sched.steps:,} steps, "
                  f"{len(meter.visible_at):,} objects up, version {fleet.version}, "
                  f"{time.perf_counter() - started:.0f} s wall", file=sys.stderr, flush=True)

    try:
        with sim_clock.installed(clock) as patched:
            out(f"clock: simulated; time.time/time.monotonic patched in {', '.join(patched)}")
            fleet = Fleet(s, store, meter, clock, plane)
            fleet.run(progress)
            fig = figures(fleet, fleet.live_half, store.live())
    finally:
        close()
    fig["wall_s"], fig["cpu_s"] = time.perf_counter() - started, time.process_time() - cpu0
    fig["requests"] = {f"{f} {op}": sum(meter.requests[f, op, h] for h in (0, 1)) for f in FAMILIES for op in OPS
                       if meter.requests[f, op, 0] + meter.requests[f, op, 1]}
    print_report(fig, out)
    out(f"model cost: {fig['wall_s']:.0f} s wall, {fig['cpu_s']:.0f} s CPU, {fleet.sched.steps:,} steps; "
        f"load {open('/proc/loadavg').read().split()[:3]}")
    return fig


def calibrate(a) -> None:
    a.workers, a.ranks = 64, 4
    runs = {}
    for kind in ("moto", "model"):
        print(f"\n=== calibration run on {kind} ===")
        runs[kind] = run_once(a, kind)
    print("\n=== request counts: moto_server vs the in-memory model (same simulated timeline) ===")
    print(f"{'family / type':<26}{'moto':>10}{'model':>10}{'model/moto':>12}")
    keys = sorted(set(runs["moto"]["requests"]) | set(runs["model"]["requests"]))
    for k in keys:
        m, n = runs["moto"]["requests"].get(k, 0), runs["model"]["requests"].get(k, 0)
        print(f"{k:<26}{m:>10,}{n:>10,}{(n / m if m else float('nan')):>12.3f}")
    tm, tn = sum(runs["moto"]["requests"].values()), sum(runs["model"]["requests"].values())
    print(f"{'all':<26}{tm:>10,}{tn:>10,}{tn / tm:>12.3f}")


def main(argv=None) -> int:
    a = parse_args(argv)
    logging.getLogger("rapid").setLevel(logging.ERROR)  # thousands of simulated roles: counted, not logged
    if a.calibrate:
        calibrate(a)
        return 0
    fig = run_once(a, a.store)
    if a.json:
        Path(a.json).write_text(json.dumps(fig, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

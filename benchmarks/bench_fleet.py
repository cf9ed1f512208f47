"""The scale model: rapid's own loops for W rollout workers and R optimizer ranks, in simulated time.

    python benchmarks/bench_fleet.py --workers 4096 --ranks 256 --minutes 12 --workers-per-node 64
    python benchmarks/bench_fleet.py --workers 64 --ranks 4 --store moto               # a real S3 server
    python benchmarks/bench_fleet.py --calibrate                                       # moto vs the model
    python benchmarks/bench_fleet.py --cadence moba-5v5 ...                            # 5 s uploads, 2 s polls
    python benchmarks/bench_fleet.py --fault params-outage=300 --json out.json         # a known fault

What runs is rapid's own code (``benchmarks/fleet/sim.py``): each simulated worker is a ``RolloutLoop`` with a
real ``Uploader``, ``ParamPoller``, league ``OpponentSampler`` and node cache, its samples made by a stand-in
source (or, for the first ``--real-workers``, by rapid's ``RolloutWorker`` on a stand-in game); each rank an
``OptimizerLoop`` with a real ``ExperienceLoader``, ``ExperienceBuffer`` and ``Balancer``, a stand-in learner
that takes ``--update-s`` (spread by stragglers) plus its gradient all-reduce and draws its next batch ahead as
rapid's learner does, and collectives that complete when every rank has asked (α–β cost); rank 0 also a real
``BackgroundWriter`` and ``LeagueKeeper``. A discrete-event scheduler runs every thread's next step in order of
simulated time, so 4,096 workers and 256 ranks fit on two cores. The CPU of decoding, listing, encoding and
the pool's JSON is charged to the process that spends it (``fleet/costs.py`` measures it here).

The store is an in-memory model of S3 (``--store model``: pages of 1,000 keys, PUTs visible when they
complete, latency with a tail, 500s and resets, SlowDown per partition; ``fleet/store.py``) or a real
S3-compatible server on loopback (moto_server, ``--store moto``; ``fleet/metered_s3.py``); both counted by
``fleet/meter.py``. Objects are small in memory and scaled to
``--object-mb`` (experience) and ``--params-mb`` (params, snapshots, checkpoints) for latency and bytes.

Prints, per key family: requests/s by type, MB/s, live objects at half time and at the end, S3 request cost
per hour at list prices; then the health figures, each beside its bound (``fleet/report.py`` ``BOUNDS``): those
of the data plane's pace (workers on a current version, updates done of possible, LIST pages per poll, the
writer's longest wait, the hottest key's GETs/s, $/h, discovery delay, fold lag) and those read back from the
store after the drain (``fleet/readback.py``: every sample made trained or lost for a named reason, versions at
cadence with their own weights and reaching the workers, the pool's games, snapshots, checkpoints, ranks
leaving together, requests per node and per worker), and the rest. It exits 1, with one ``FAIL`` line per figure
out of its bound, unless ``--no-fail``; ``--json`` writes the figures, their bounds and the failures.
``--fault`` injects a known fault (``fleet/faults.py``) that must move its figure past its bound;
``benchmarks/bench_mutants.py`` plants known bugs in a copy of rapid and says which figure caught each.
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
from fleet.calibrate import calibrate  # noqa: E402
from fleet.faults import NAMES, Faults, UsageError  # noqa: E402
from fleet.meter import FAMILIES, OPS, Meter  # noqa: E402
from fleet.metered_s3 import MeteredS3  # noqa: E402
from fleet.readback import readback  # noqa: E402
from fleet.report import BOUNDS, bound_of, failures, figures, print_report  # noqa: E402
from fleet.sched import OutOfTime  # noqa: E402
from fleet.settings import Settings, sample_arrays  # noqa: E402
from fleet.sim import Fleet  # noqa: E402
from fleet.standins import PARAM_TENSORS  # noqa: E402
from fleet.store_args import add_store_args, store_settings  # noqa: E402

import rapid  # noqa: E402
from rapid.formats.experience import ExperienceBatch, encode_experience  # noqa: E402
from rapid.formats.params import ParamsObject, encode_params  # noqa: E402

CADENCES = {"rapid": {"upload_s": 60.0, "param_poll_s": 5.0, "publish_s": 60.0},
            "moba-5v5": {"upload_s": 5.0, "param_poll_s": 2.0, "publish_s": 5.0}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=64, help="simulated rollout workers W")
    p.add_argument("--ranks", type=int, default=4, help="optimizer ranks R")
    p.add_argument("--minutes", type=float, default=12.0, help="simulated minutes (then a drain of --drain-s)")
    p.add_argument("--store", choices=("model", "moto"), default="model")
    p.add_argument("--calibrate", action="store_true", help="moto_server at its own pace vs the model fitted to it")
    p.add_argument("--cadence", choices=sorted(CADENCES), default="rapid",
                   help="rapid: 60 s uploads, 5 s param polls, 60 s publishes; moba-5v5: 5 s, 2 s, 5 s")
    p.add_argument("--topology", choices=("slurm", "k8s", "per-process"), default=None,
                   help="the node cache as shipped: slurm (a node-local /tmp folder per node) and k8s (a hostPath "
                        "per node) share one cache among --workers-per-node workers; per-process: none shared "
                        "(each process reads the store)")
    p.add_argument("--upload-s", type=float, help="rollout.upload_interval_s (default: the cadence's)")
    p.add_argument("--param-poll-s", type=float, help="rollout.param_poll_s (default: the cadence's)")
    p.add_argument("--publish-s", type=float, help="optimizer.publish_interval_s (default: the cadence's)")
    p.add_argument("--snapshot-every", type=int, default=10, help="league.snapshot_every (versions)")
    p.add_argument("--checkpoint-every", type=int, default=100, help="optimizer.checkpoint_every (updates)")
    p.add_argument("--max-backlog", type=int, default=8, help="rollout.max_backlog (objects)")
    p.add_argument("--workers-per-node", type=int, default=64, help="rollout processes on one node")
    p.add_argument("--poll-s", type=float, default=0.5, help="optimizer.poll_s")
    p.add_argument("--retention-s", type=float, default=600.0, help="store.retention_s")
    p.add_argument("--update-s", type=float, default=1.0, help="stand-in learner: simulated seconds an update")
    p.add_argument("--update-spread", type=float, default=0.03,
                   help="lognormal σ of a rank's update time (an assumption: a dedicated GPU's step time varies "
                        "by a few percent; the slowest of R ranks sets every update's pace)")
    p.add_argument("--target-reuse", type=float, default=1.0, help="optimizer.target_reuse")
    p.add_argument("--max-staleness", type=int, default=8, help="optimizer.max_staleness")
    p.add_argument("--supply", type=float, default=1.3,
                   help="samples arriving ÷ what the stand-in learner takes at its smallest batch (the balancer "
                        "grows the batch to use the rest)")
    p.add_argument("--inference", choices=("local", "node"), default="local",
                   help="rollout.inference: policy in each worker, or one server a node (fleet/node.py)")
    p.add_argument("--real-workers", type=int, default=0, metavar="N",
                   help="the first N workers are rapid's RolloutWorker on a stand-in game, every decision followed "
                        "into its sample (fleet/realworker.py; local inference; ~50 ms of CPU a segment), the rest "
                        "stand-ins")
    p.add_argument("--server-row-us", type=float, default=1.0, help="node server: µs a decision")
    p.add_argument("--server-pass-ms", type=float, default=0.5, help="node server: ms a pass (once a step)")
    p.add_argument("--segment-s", type=float, default=5.0, help="a worker's segment (versions swap between)")
    p.add_argument("--samples", type=int, default=1, help="samples per segment (in memory)")
    p.add_argument("--games", type=float, default=3.0, help="finished games per upload interval per worker")
    p.add_argument("--object-mb", type=float, default=32.0, help="modelled size of an experience object")
    p.add_argument("--params-mb", type=float, default=2.6, help="modelled size of a params version (moba 5v5)")
    p.add_argument("--request-ms", type=float, default=20.0, help="mean latency of a PUT/GET (HEAD, DELETE: half)")
    p.add_argument("--list-ms", type=float, default=100.0, help="mean latency of one LIST page")
    p.add_argument("--mbps", type=float, default=100.0, help="MB/s of one request stream")
    p.add_argument("--drain-s", type=float, default=120.0, help="after the run: ranks go on loading this long")
    p.add_argument("--skew-s", type=float, default=0.0, help="worker clocks off by up to ± this")
    p.add_argument("--slow-upload-s", type=float, default=0.0, help="extra seconds on 10%% of workers' uploads")
    p.add_argument("--churn", type=float, default=0.0, help="share of workers replaced every upload interval")
    p.add_argument("--fault", action="append", default=[], metavar="NAME[=ARG]",
                   help=f"inject a known fault (repeatable): {', '.join(NAMES)}; see benchmarks/fleet/faults.py")
    p.add_argument("--wall-limit-s", type=float, default=0.0,
                   help="end the run after this much wall time and report what was reached")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the figures, their bounds and the failures to this file")
    p.add_argument("--no-fail", action="store_true", help="exit 0 even when a figure is out of its bound")
    add_store_args(p)
    a = p.parse_args(argv)
    try:
        a.faults = Faults.parse(a.fault)
    except UsageError as e:
        p.error(str(e))
    if a.topology == "per-process":
        a.workers_per_node = 0
    if a.faults.server_killed and a.inference != "node":
        p.error("--fault server-killed needs --inference node")
    if a.real_workers and a.inference != "local":
        p.error("--real-workers plays with local inference (the node server's worker side is the stand-in's)")
    return a


def settings_of(a) -> Settings:
    cadence = dict(CADENCES[a.cadence])
    for name in cadence:
        if getattr(a, name) is not None:
            cadence[name] = getattr(a, name)
    return Settings(workers=a.workers, ranks=a.ranks, sim_s=60 * a.minutes, poll_s=a.poll_s,
                    retention_s=a.retention_s, update_s=a.update_s, update_spread=a.update_spread,
                    segment_s=a.segment_s, samples_per_segment=a.samples, games_per_upload=a.games,
                    drain_s=a.drain_s, seed=a.seed, skew_s=a.skew_s, slow_upload_s=a.slow_upload_s, churn=a.churn,
                    workers_per_node=a.workers_per_node, grad_mb=a.params_mb, target_reuse=a.target_reuse,
                    max_staleness=a.max_staleness,
                    supply=a.supply, upload_s=cadence["upload_s"], param_poll_s=cadence["param_poll_s"],
                    publish_s=cadence["publish_s"], snapshot_every=a.snapshot_every,
                    checkpoint_every=a.checkpoint_every, max_backlog=a.max_backlog, inference=a.inference,
                    server_row_s=a.server_row_us * 1e-6, server_pass_s=a.server_pass_ms * 1e-3,
                    real_workers=a.real_workers)


def size_scale(a) -> dict:
    s = settings_of(a)
    per_object = max(1, round(s.upload_s / s.segment_s)) * s.samples_per_segment
    exp = len(encode_experience(ExperienceBatch("w0", 0, 0.0, sample_arrays(per_object), ["latest"])))
    params = len(encode_params(ParamsObject(0, PARAM_TENSORS, {"updates": 0})))
    exp_scale, params_scale = a.object_mb * 1e6 / exp, a.params_mb * 1e6 / params
    return {"experience": exp_scale, "params": params_scale, "league/snapshots": params_scale,
            "checkpoints": params_scale}


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
    st = store_settings(a)
    latency = st.latency(a.mbps * 1e6, size_scale(a), a.seed)
    meter = Meter(clock, latency, s.sim_s / 2, s.sim_s)
    store, close = open_moto(meter) if store_kind == "moto" else (st.store(meter, a.seed), lambda: None)
    out(f"code: {Path(rapid.__file__).parent}")
    out(f"shape: W={s.workers} workers, R={s.ranks} ranks, {s.sim_s:.0f} s simulated (+{s.drain_s:.0f} s drain), "
        f"uploads every {s.upload_s:g} s, param polls every {s.param_poll_s:g} s, loader polls every {s.poll_s:g} s, "
        f"publish every {s.publish_s:g} s, segments of {s.segment_s:g} s, retention {s.retention_s:g} s, "
        f"update {s.update_s:g} s (σ {s.update_spread:g}), "
        + (f"{s.workers_per_node} workers a node cache" if s.workers_per_node else "no node cache")
        + (f", one inference server a node ({s.server_pass_s * 1e3:g} ms a pass, {s.server_row_s * 1e6:g} µs a "
           f"decision, {s.decisions_per_segment:,} decisions a segment)" if s.inference == "node" else "")
        + (f", {s.real_workers} of them rapid's RolloutWorker on a stand-in game" if s.real_workers else "")
        + (f"; faults: {', '.join(a.faults.names())}" if a.faults.names() else ""))
    out(f"scaling: {s.samples_per_segment} sample(s) a segment in memory; experience objects ×"
        f"{latency.size_scale['experience']:,.0f} → {a.object_mb:g} MB, params ×{latency.size_scale['params']:,.0f}"
        f" → {a.params_mb:g} MB; {a.mbps:g} MB/s a stream; store: {store_kind}")
    if store_kind == "model":
        out(st.describe())
    out(f"CPU charged: {s.costs}; collectives: {s.links}")
    started, cpu0 = time.perf_counter(), time.process_time()
    shown = [started]

    def progress(at: float) -> None:
        if a.wall_limit_s and time.perf_counter() - started > a.wall_limit_s:
            raise OutOfTime(at)
        if time.perf_counter() - shown[0] >= 10.0:
            shown[0] = time.perf_counter()
            print(f"  … simulated {at:7.0f} s of {s.sim_s + s.drain_s:.0f}, {fleet.sched.steps:,} steps, "
                  f"version {fleet.version}, {time.perf_counter() - started:.0f} s wall", file=sys.stderr, flush=True)

    made: list[Fleet] = []
    try:
        with sim_clock.installed(clock):
            fleet = Fleet(s, store, meter, clock, a.faults)
            made.append(fleet)
            fleet.run(progress)
            fig = figures(fleet, fleet.live_half, store.live())
            fig.update(readback(fleet, fleet.reached))
    finally:
        close()
        for each in made:
            each.close()
    fig["wall_s"], fig["cpu_s"] = time.perf_counter() - started, time.process_time() - cpu0
    fig["requests"] = {f"{f} {op}": sum(meter.requests[f, op, h] for h in (0, 1)) for f in FAMILIES for op in OPS
                       if meter.requests[f, op, 0] + meter.requests[f, op, 1]}
    fig["failures"] = failures(fig, s)
    fig["healthy"] = not fig["failures"]
    print_report(fig, s, out)
    out(f"model cost: {fig['wall_s']:.0f} s wall, {fig['cpu_s']:.0f} s CPU, {fleet.sched.steps:,} steps; "
        f"load {open('/proc/loadavg').read().split()[:3]}")
    return fig


def main(argv=None) -> int:
    a = parse_args(argv)
    product_log = logging.getLogger("rapid")
    level = product_log.level
    product_log.setLevel(logging.ERROR)  # thousands of simulated roles: counted, not logged
    try:
        return _main(a)
    finally:
        product_log.setLevel(level)  # a caller in the same process (a test) gets rapid's logs back


def _main(a) -> int:
    if a.calibrate:
        calibrate(a, run_once)
        return 0
    fig = run_once(a, a.store)
    if a.json:
        s = settings_of(a)
        flat = {k: v for k, v in fig.items() if not isinstance(v, dict | list)}
        flat.update(samples=fig["samples"], failures=fig["failures"],
                    bounds={name: bound_of(name, s) for name in BOUNDS})
        Path(a.json).write_text(json.dumps(flat, indent=1, default=str))
    for line in fig["failures"]:
        print(line)
    return 1 if fig["failures"] and not a.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())

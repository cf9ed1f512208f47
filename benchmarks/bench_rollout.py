"""Rollout throughput with the policy on each worker's core (``--inference local``) or on the node's inference
server (``--inference node``): agent-steps per second per rollout core, and the server's batches and waits.

    python benchmarks/bench_rollout.py --inference local --config configs/moba-5v5.toml --workers 14
    python benchmarks/bench_rollout.py --inference node --config configs/moba-5v5.toml --workers 14
    python benchmarks/bench_rollout.py --inference node --config configs/moba-5v5.toml --workers 1 --seconds 20

It makes a run in a temporary folder (its layout and one published version of a fresh policy), then starts
``--workers`` processes that each build their worker with rapid's own wiring
(:func:`rapid.roles.rollout.build_worker`, as ``rapid-rollout`` does) and call ``collect()`` for ``--warmup`` and
then ``--seconds`` seconds, counting agent-steps and CPU-seconds (no uploads: the store is not measured here). Under
``node`` the first worker starts the node's server as in production (``rapid inference``, its log in the node
folder); the server's status before and after the measured window gives its batches, mean batch (agent rows), queue
wait p50/p99 (requests of the last window) and busy share (time spent deciding over the window). A rollout core is a
worker process: "per rollout core" is the total divided by ``--workers`` (the server's own core is not counted).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from rapid.infra.store import LocalStore
from rapid.roles.rollout import build_worker
from rapid.roles.startup import build_policy, env_spec
from rapid.rollout.inference_client import NodeClient, ServerVersions, node_folder
from rapid.rollout.inference_wire import SlotLayout
from rapid.rollout.node_cache import rollout_store
from rapid.run.config import Config
from rapid.run.config_files import load_config, to_toml
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import read_run, write_layout


def _worker(config_path: str, seed: int, warmup_s: float, seconds: float, results) -> None:
    cfg = load_config(config_path)
    torch.set_num_threads(1)
    store = LocalStore(cfg.derive().store_url)
    run = read_run(store)
    assert run is not None
    reads = rollout_store(store, cfg.derive().run_dir, run[1], cfg.rollout.node_cache_dir, cfg.rollout.param_poll_s,
                          cfg.league.refresh_s)
    worker, envs, client = build_worker(cfg, seed, reads, run[1])
    if client is None:
        params = ParameterStore(reads)
        fetched = params.fetch(params.latest_version() or 0)
        worker.set_params(0, fetched.tensors, fetched.meta)
    else:
        versions, first = ServerVersions(client), None
        while first is None:
            first = versions.take()
            time.sleep(0.05)
        worker.set_params(*first)
    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        worker.collect()
    steps, cpu0, t0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        steps += worker.collect().env_steps
    results.put({"agent_steps": steps, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0})
    for env in envs:
        env.close()
    if client is not None:
        client.close()


def _server_status(cfg: Config, run_id: str) -> dict:
    spec = env_spec(cfg)
    probe = NodeClient(str(node_folder(cfg, run_id)), SlotLayout(1, 1, spec.obs_dim, spec.mask_dim,
                                                                 len(spec.action_heads), cfg.model.lstm))
    try:
        return probe.status(stats=True)
    finally:
        probe.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inference", choices=("local", "node"), default="local")
    p.add_argument("--config", default="configs/moba-5v5.toml")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config override")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    p.add_argument("--warmup", type=float, default=10.0, help="seconds before measuring (server start included)")
    p.add_argument("--seconds", type=float, default=30.0, help="seconds measured")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        cfg = load_config(args.config, [*args.set, f"run.dir={tmp}", f"rollout.inference={args.inference}",
                                        "metrics.enabled=false"])
        spec = env_spec(cfg)
        store = LocalStore(cfg.derive().store_url)
        write_layout(store, 1)
        ParameterStore(store).publish(0, build_policy(cfg, spec).tensors())
        run = read_run(store)
        assert run is not None
        config_path = Path(tmp) / "config.toml"
        config_path.write_text(to_toml(cfg))
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        procs = [context.Process(target=_worker, args=(str(config_path), 1000 + i, args.warmup, args.seconds,
                                                       results)) for i in range(args.workers)]
        for proc in procs:
            proc.start()
        before = after = None
        if args.inference == "node":
            time.sleep(args.warmup + 1.0)
            before = _server_status(cfg, str(run[1]))
            time.sleep(max(args.seconds - 2.0, 0.5))
            after = _server_status(cfg, str(run[1]))
        got = [results.get(timeout=args.warmup + args.seconds + 300) for _ in procs]
        for proc in procs:
            proc.join(60)
    per_core = sum(r["agent_steps"] / r["wall_s"] for r in got) / len(got)
    per_cpu = sum(r["agent_steps"] for r in got) / sum(r["cpu_s"] for r in got)
    print(f"config {args.config} {' '.join(args.set)}: {cfg.env.num_games} games per worker, {args.workers} workers, "
          f"torch {torch.__version__}, {os.cpu_count()} cores")
    print(f"agent-steps per worker CPU-second: {per_cpu:,.0f}")
    line = (f"inference={args.inference} workers={args.workers}: {per_core:,.0f} agent-steps/s per rollout core, "
            f"{per_core * len(got):,.0f} in all")
    if before is not None and after is not None:
        batches = after["batches"] - before["batches"]
        rows = after["rows"] - before["rows"]
        window = max(args.seconds - 2.0, 0.5)
        line += (f"; server: {batches / window:,.0f} batches/s, mean batch {rows / max(batches, 1):,.1f} rows, "
                 f"wait p50 {after['wait_p50_ms']:.2f} ms p99 {after['wait_p99_ms']:.2f} ms, busy "
                 f"{100 * (after['busy_s'] - before['busy_s']) / window:.0f}%")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

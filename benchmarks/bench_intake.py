"""The optimizer's intake on the host: store → decode → buffer, in CPU time of the optimizer process.

Usage::

    python benchmarks/bench_intake.py                              # moba 5v5 and connect four, 0 and 2 decoders
    python benchmarks/bench_intake.py --objects 40 --workers 2 --repeat 5

Experience objects of a config's real shape (its env's observation and action sizes, ``rollout.bptt``,
``model.lstm``), ``--samples`` per object, are put in a ``LocalStore``; the real ``ExperienceLoader`` (with its
``DecodePool`` of ``--workers`` processes) takes them into a real ``ExperienceBuffer`` of four objects in one
``poll_once``. A first poll of four objects starts the decode processes and fills the buffer, so neither the
processes' start nor the buffer's first touch of its memory is counted. Printed per config and
worker count: samples per optimizer-process CPU-second, ms of optimizer-process CPU per MB taken in (its every
thread: ``getrusage(RUSAGE_SELF)``, never its children's), and the decode processes' CPU per MB beside it (read
from ``/proc`` for every descendant of this process, so the forkserver's workers count). CPU time, not wall time:
other sessions share the machine. The best of ``--repeat`` runs. Last, the CPU of drawing a batch of 1,024 from
a full buffer (the host's copy of a batch), alone, then packed into a staging arena as a GPU learner packs it, and
gathered straight into that arena (``--draw-only``: these lines only).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WARM_OBJECTS = 4
"""Objects taken in before the measured poll: they start the decode processes and fill the buffer (a running
optimizer's buffer is full: its memory is mapped)."""
CONFIGS = {"moba-5v5": ("configs/moba-5v5.toml", 512), "connect-four": ("configs/default.toml", 1024)}


def experience(shape, samples: int, seed: int):
    """One object's arrays, valid under ``shape`` (every action allowed by its mask)."""
    from rapid.formats.experience import ExperienceBatch

    rng = np.random.default_rng(seed)
    arrays = {}
    for name, (dtype, dims) in shape.fields().items():
        if dtype == "float32":
            arrays[name] = rng.standard_normal((samples, *dims)).astype(np.float32)
        else:
            arrays[name] = np.zeros((samples, *dims), dtype)
    arrays["discounts"][:] = 0.99
    arrays["mask"][:] = True
    arrays["actions"][:] = rng.integers(0, min(shape.head_sizes), arrays["actions"].shape)
    arrays["active"][:] = arrays["own"][:] = True
    game = {"learner_version": 0, "opponent": "latest", "learner_side": 0, "winner": "learner", "length": 9,
            "learner_return": 1.0}
    return ExperienceBatch("w0", seed, 0.0, arrays, ["latest"], episodes=[game], env_steps=samples * shape.bptt)


def descendants_cpu_s() -> float:
    """utime + stime of every living process below this one, from /proc."""
    parent_of, cpu = {}, {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent_of[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, mine = 0.0, {os.getpid()}
    changed = True
    while changed:
        changed = False
        for pid, parent in parent_of.items():
            if parent in mine and pid not in mine:
                mine.add(pid)
                total += cpu[pid]
                changed = True
    return total


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(config: str, samples: int, objects: int, workers: int) -> dict:
    from rapid.formats.experience import Shape, encode_experience
    from rapid.infra.store import LocalStore
    from rapid.opt.buffer import ExperienceBuffer
    from rapid.optimizer.loader import ExperienceLoader
    from rapid.roles.startup import env_spec
    from rapid.run.config_files import load_config
    from rapid.run.store_map import experience_key

    cfg = load_config(ROOT / config, [])
    shape = Shape.of(env_spec(cfg), bptt=cfg.rollout.bptt, lstm=cfg.model.lstm)
    blobs = [encode_experience(experience(shape, samples, seed)) for seed in range(4)]
    with tempfile.TemporaryDirectory() as root:
        store = LocalStore(root)
        buffer = ExperienceBuffer(WARM_OBJECTS * samples, max_staleness=10**9)
        loader = ExperienceLoader(store, shape, buffer, retention_s=0, decode_workers=workers, mark_s=0)
        try:
            now_ms = int(time.time() * 1000)
            for i in range(WARM_OBJECTS):
                store.put(experience_key(0, now_ms, "warm", "a", i), blobs[i % len(blobs)])
            assert loader.poll_once() == WARM_OBJECTS
            for i in range(objects):
                store.put(experience_key(0, now_ms + 1, "w", "b", i), blobs[i % len(blobs)])
            children, mine, wall = descendants_cpu_s(), self_cpu_s(), time.perf_counter()
            loaded = loader.poll_once()
            mine, wall = self_cpu_s() - mine, time.perf_counter() - wall
            children = descendants_cpu_s() - children
        finally:
            loader.stop()
    assert loaded == objects and loader.stats.bad_objects == 0, (loaded, loader.stats)
    mb = objects * len(blobs[0]) / 1e6
    return {"mb": mb, "object_mb": len(blobs[0]) / 1e6, "samples_per_cpu_s": objects * samples / mine,
            "ms_per_mb": 1000 * mine / mb, "decoders_ms_per_mb": 1000 * children / mb, "wall_s": wall}


def draw_ms(config: str, batch: int = 1024, capacity: int = 8192, how: str = "drawn") -> float:
    """CPU ms of one ``ExperienceBuffer.sample(batch)`` from a full buffer of ``capacity`` (best of 5 × 20); with
    ``how`` "drawn+packed" also packed into a staging arena as a GPU learner does (``Pipeline.stage``, on the CPU,
    the device copy left out), with "gathered" taken straight into that arena (``Pipeline.gather``)."""
    import torch

    from rapid.formats.experience import Shape
    from rapid.opt.buffer import ExperienceBuffer
    from rapid.opt.pipeline import Pipeline
    from rapid.roles.startup import env_spec
    from rapid.run.config_files import load_config

    cfg = load_config(ROOT / config, [])
    shape = Shape.of(env_spec(cfg), bptt=cfg.rollout.bptt, lstm=cfg.model.lstm)
    buffer, rng = ExperienceBuffer(capacity, max_staleness=10**9), np.random.default_rng(0)
    buffer.add(experience(shape, capacity, 0).arrays)
    pipeline = Pipeline(torch.device("cpu"), staging=True, copier=lambda dst, src: None)

    def once() -> None:
        if how == "gathered":
            buffer.sample(batch, 0, rng, into=lambda arrays, rows: pipeline.gather(arrays, rows, 0))
            return
        drawn = buffer.sample(batch, 0, rng)
        if how == "drawn+packed" and drawn is not None:
            pipeline.stage(drawn[0], 0)

    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(20):
            once()
        best = min(best, (time.process_time() - start) / 20)
    return 1000 * best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--workers", nargs="+", type=int, default=[0, 2])
    ap.add_argument("--samples", type=int, default=0, help="samples per object (0: 512 moba, 1024 connect four)")
    ap.add_argument("--objects", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--draw-only", action="store_true", help="only the CPU of drawing (and packing) a batch")
    args = ap.parse_args()
    print("| config | object | decode processes | samples / optimizer CPU-s | optimizer CPU ms / MB "
          "| decoders' CPU ms / MB | wall s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.configs if not args.draw_only else ():
        config, default_samples = CONFIGS[name]
        samples = args.samples or default_samples
        for workers in args.workers:
            runs = [run(config, samples, args.objects, workers) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["ms_per_mb"])
            print(f"| {name} | {samples} samples, {best['object_mb']:.1f} MB | {workers} "
                  f"| {best['samples_per_cpu_s']:,.0f} | {best['ms_per_mb']:.2f} | {best['decoders_ms_per_mb']:.2f} "
                  f"| {best['wall_s']:.2f} |", flush=True)
    for name in args.configs:
        ms = {how: draw_ms(CONFIGS[name][0], how=how) for how in ("drawn", "drawn+packed", "gathered")}
        print(f"{name}: ExperienceBuffer.sample(1024) from a full 8,192-sample buffer: {ms['drawn']:.2f} ms of CPU; "
              f"drawn, then packed for a GPU: {ms['drawn+packed']:.2f}; gathered into the arena: {ms['gathered']:.2f}")


if __name__ == "__main__":
    main()

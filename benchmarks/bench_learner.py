"""The learner's update against a fused reference at the same shapes.

    python benchmarks/bench_learner.py --device cuda                    # both models, 8,192 samples × 16 steps
    python benchmarks/bench_learner.py --device cpu --samples 512 --repeat 3
    python benchmarks/bench_learner.py --device cpu --models c4-bptt16 c4-bptt8 --samples 256 --threads 1
    python benchmarks/bench_learner.py --device cpu --memory --samples 1024 --microbatch 128   # peak memory
    python benchmarks/bench_learner.py --loop            # the optimizer loop's own path, 128 … 8,192 samples
    python benchmarks/bench_learner.py --loop --device cpu --models c4-bptt8 --sizes 16 32 --repeat 3

For each model (moba 5v5 with the 256-unit encoder and LSTM configs/moba-5v5.toml had until issue 22 — a cluster's
size; the shipped config now trains a 64-unit one on two cores —, the same with a 1,024-unit encoder and
LSTM, and on request connect four's from configs/default.toml with samples of 16 or 8 decisions) it times
``Learner.update`` (PPO losses, BPTT from each sample's stored state with the game starts inside samples, Adam;
the batch handed over as numpy arrays, as the optimizer does) and the reference: encoder + one cuDNN/ATen
``nn.LSTM`` call over the whole [S, T] batch + heads, forward, backward and Adam (without the convolutions of
a board model). Prints samples/s and decisions/s of both and their ratio.

``--loop`` times instead the optimizer loop's own path: the real :class:`rapid.roles.optimizer_loop.OptimizerLoop`
(one rank, batch size fixed, nothing published) drawing from a real ``ExperienceBuffer`` filled with synthetic
samples, so the learner draws and stages batch k + 1 while update k trains exactly as in a run, with
``optimizer.precision`` and TF32 set as ``run_optimizer`` sets them (``precision_settings``). For each model
and batch size (by default both models at 128, 256, 512, 1,024 and 8,192 samples: under a minute on one H100
or H200) it prints the loop's samples/s between its first and last timed update, and the mean ``update_s``.

``--memory`` prints instead the peak memory one update allocates on the device beyond what it held before
(weights, Adam's moments), for the whole batch at once and for ``--microbatch`` chunks: the figure
``docs/cluster.md`` states per sample. On CUDA it is the caching allocator's peak; on the CPU the peak of the
allocations torch's profiler records (the batch itself is numpy memory handed over without a copy there).
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
import torch
from torch import nn

from rapid.league import Tally
from rapid.opt.buffer import ExperienceBuffer
from rapid.opt.learner import Learner, allow_tf32, precision_settings
from rapid.roles.optimizer_loop import OptimizerLoop, Timing
from rapid.roles.optimizer_parts import Parts
from rapid.roles.startup import StopFlag, build_policy, env_spec
from rapid.roles.steps import drive
from rapid.run.config_files import load_config

# name: (config, overrides, mean game length in decisions of one agent: how often a game starts in a sample)
MODELS = {"moba-5v5": ("configs/moba-5v5.toml", ["model.hidden=256", "model.lstm=256"], 1200),
          "lstm-1024": ("configs/moba-5v5.toml", ["model.hidden=1024", "model.lstm=1024"], 1200),
          "c4-bptt16": ("configs/default.toml", ["rollout.bptt=16"], 11),
          "c4-bptt8": ("configs/default.toml", ["rollout.bptt=8"], 11)}
DEFAULT_MODELS = ["moba-5v5", "lstm-1024"]


class Reference(nn.Module):
    """The same layers as the policy, run the fastest way PyTorch offers: one fused LSTM call."""

    def __init__(self, obs_dim: int, mask_dim: int, hidden: int, layers: int, lstm: int):
        super().__init__()
        sizes = [obs_dim] + [hidden] * layers
        self.encoder = nn.Sequential(*[m for a, b in zip(sizes, sizes[1:]) for m in (nn.Linear(a, b), nn.ReLU())])
        self.lstm = nn.LSTM(sizes[-1], lstm, batch_first=True)
        self.logits = nn.Linear(lstm, mask_dim)
        self.value = nn.Linear(lstm, 1)

    def loss(self, obs: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(self.encoder(obs), (h0[None], c0[None]))
        return self.logits(y).logsumexp(-1).mean() + self.value(y).square().mean()


def make_batch(spec, cfg, samples: int, game_steps: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random experience of the right shapes; a game starts at any step with probability 1 / game_steps."""
    S, T, L = samples, cfg.rollout.bptt, cfg.model.lstm
    mask = np.ones((S, T, spec.mask_dim), bool)
    first = rng.random((S, T)) < 1.0 / game_steps
    return {"obs": rng.normal(size=(S, T, spec.obs_dim)).astype(np.float32), "mask": mask,
            "actions": np.stack([rng.integers(0, n, (S, T)) for n in spec.action_heads], -1),
            "logp": np.full((S, T), -2.0, np.float32), "values": rng.normal(size=(S, T)).astype(np.float32),
            "advantages": rng.normal(size=(S, T)).astype(np.float32),
            "returns": rng.normal(size=(S, T)).astype(np.float32), "active": np.ones((S, T), bool),
            "own": np.ones((S, T), bool),
            "first": first, "h0": rng.normal(size=(S, L)).astype(np.float32) * 0.1,
            "c0": rng.normal(size=(S, L)).astype(np.float32) * 0.1,
            # what ppo.off_policy = "vtrace" trains from: nothing is bootstrapped across a game's end
            "rewards": rng.normal(size=(S, T)).astype(np.float32),
            "discounts": np.where(np.roll(first, -1, axis=1), 0.0, 0.99).astype(np.float32),
            "bootstrap": rng.normal(size=S).astype(np.float32)}


def timed(step, device: torch.device, repeat: int) -> tuple[float, float]:
    """Seconds per call: wall clock, and this process's CPU time (steadier on a shared machine)."""
    step()  # warm-up: allocator, cuDNN plans
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(repeat):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeat, (time.process_time() - c0) / repeat


def bench(name: str, device: torch.device, samples: int, repeat: int, game_steps: int, bf16: bool,
          extra: list[str]) -> tuple[dict[str, tuple[float, float]], int]:
    """(wall, CPU) seconds per update of: the learner handed numpy arrays, the learner handed a batch staged
    on the device ahead (as a loop that prefetches would), and the reference (its data already there).
    ``extra``: config overrides on top of the model's (``--set``)."""
    path, overrides, own_game_steps = MODELS[name]
    cfg = load_config(path, overrides=[*overrides, *extra])
    spec = env_spec(cfg)
    batch = make_batch(spec, cfg, samples, game_steps or own_game_steps, np.random.default_rng(0))
    learner = Learner(build_policy(cfg, spec), cfg.ppo, device, bf16=bf16)
    t_learner = timed(lambda: learner.update(batch), device, repeat)
    staged = learner.stage(batch)
    t_staged = timed(lambda: learner.update(staged), device, repeat)

    m = cfg.model
    ref = Reference(spec.obs_dim, spec.mask_dim, m.hidden, m.encoder_layers, m.lstm).to(device)
    adam = torch.optim.Adam(ref.parameters(), lr=cfg.ppo.lr)
    obs, h0, c0 = (torch.from_numpy(batch[k]).to(device) for k in ("obs", "h0", "c0"))

    def ref_step():
        adam.zero_grad(set_to_none=True)
        ref.loss(obs, h0, c0).backward()
        adam.step()

    times = {"numpy batch": t_learner, "staged batch": t_staged, "reference": timed(ref_step, device, repeat)}
    return times, cfg.rollout.bptt


def peak_bytes(step, device: torch.device) -> int:
    """The most bytes ``step`` holds allocated at once on ``device``, beyond what was allocated before."""
    step()  # warm-up: Adam's moments and the allocator's pools exist before the measured call
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    now = peak = 0
    for e in events:  # allocations positive, frees negative
        now += e.nbytes()
        peak = max(peak, now)
    return peak


def memory(name: str, device: torch.device, samples: int, microbatch: int, extra: list[str]) -> None:
    path, overrides, game_steps = MODELS[name]
    cfg = load_config(path, overrides=[*overrides, *extra])
    spec = env_spec(cfg)
    batch = make_batch(spec, cfg, samples, game_steps, np.random.default_rng(0))
    obs_mb = batch["obs"].nbytes / 2**20
    for chunk in (0, microbatch):
        learner = Learner(build_policy(cfg, spec), cfg.ppo, device, microbatch_samples=chunk)
        peak = peak_bytes(lambda: learner.update(batch), device)
        print(f"{name:<10} microbatch {chunk or samples:>6}: peak {peak / 2**20:>9,.1f} MiB "
              f"({peak / 2**10 / (chunk or samples):>7,.1f} KiB per sample of the chunk; observations of the "
              f"whole batch {obs_mb:,.1f} MiB)", flush=True)


LOOP_SIZES = [128, 256, 512, 1024, 8192]


class LoopReport:
    """The loop's report part: the time of each update and its ``update_s``."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.update_s: list[float] = []

    def update(self, updates, version, stats, staleness, decision, wait_s) -> None:
        self.times.append(time.perf_counter())
        self.update_s.append(stats["update_s"])

    def version(self, version: int) -> None: ...

    def skipped_nonfinite(self, total: int) -> None: ...

    def update_failed(self, error: BaseException) -> None:
        raise error

    def loader_failed(self, failure: str) -> None: ...


class NoLoader:
    """No experience arrives: the buffer was filled before the loop started."""

    failure = None

    class stats:
        objects = 0

    @staticmethod
    def take_tally() -> Tally:
        return Tally()

    @staticmethod
    def mark_soon() -> None:
        """Nothing was loaded: nothing to note at a checkpoint."""


class NoStore:
    @staticmethod
    def describe() -> str:
        return "no store"


def loop_bench(name: str, device: torch.device, samples: int, repeat: int, extra: list[str]) -> tuple[float, float]:
    """(samples/s of the loop over ``repeat`` updates after two warm-up ones, mean update_s)."""
    path, overrides, game_steps = MODELS[name]
    updates = repeat + 2
    cfg = load_config(path, overrides=[*overrides, *extra, "optimizer.balance=false",
                                       f"optimizer.batch_samples={samples}",
                                       f"optimizer.buffer_samples={2 * samples}", "optimizer.max_reuse=1e9",
                                       "optimizer.target_reuse=1e9", f"run.updates={updates}"])
    spec = env_spec(cfg)
    bf16, tf32 = precision_settings(cfg.optimizer.precision, device)
    allow_tf32(tf32)
    learner = Learner(build_policy(cfg, spec), cfg.ppo, device, microbatch_samples=cfg.optimizer.microbatch_samples,
                      bf16=bf16)
    buffer = ExperienceBuffer(2 * samples, cfg.optimizer.max_staleness)
    arrays = make_batch(spec, cfg, 2 * samples, game_steps, np.random.default_rng(0))
    buffer.add({**arrays, "version": np.zeros(2 * samples, np.int64)})
    report = LoopReport()
    # Rank 1 of one (lead=False): nothing is published or checkpointed, so no writer, store or league is needed.
    parts = Parts(learner, buffer, NoLoader(), None, None, None, report, dict, None,  # type: ignore[arg-type]
                  NoStore())  # type: ignore[arg-type]
    loop = OptimizerLoop(cfg, parts, Timing(round_s=5.0, sample_wait_s=0.0), StopFlag(install_signals=False),
                         logging.getLogger("bench_learner"), lead=False, grouped=False, version=0,
                         rng=np.random.default_rng(0))
    if drive(loop.run()) != 0 or len(report.times) != updates:
        raise SystemExit(f"bench_learner.py: the loop ended after {len(report.times)} of {updates} updates")
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = report.times[-1] - report.times[1]
    return repeat * samples / seconds, float(np.mean(report.update_s[2:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--samples", type=int, default=8192, help="samples of bptt decisions per update")
    parser.add_argument("--repeat", type=int, default=10, help="timed updates per measurement")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=DEFAULT_MODELS)
    parser.add_argument("--game-steps", type=int, default=0, help="mean game length in decisions: sets how many "
                        "samples hold a game start inside (0: the model's game, moba 5v5 1,200, connect four 11)")
    parser.add_argument("--bf16", action="store_true",
                        help="the learner under bfloat16 autocast (CUDA, or a CPU with bfloat16 units)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--memory", action="store_true", help="print the peak memory of one update instead")
    parser.add_argument("--microbatch", type=int, default=256, help="chunk size compared with --memory")
    parser.add_argument("--loop", action="store_true", help="time the optimizer loop's own path instead")
    parser.add_argument("--sizes", type=int, nargs="+", default=LOOP_SIZES, help="batch sizes timed with --loop")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every model, e.g. --set ppo.off_policy=vtrace (repeatable)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "bench_learner.py: --device cuda but CUDA is not available\n")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.memory:
        for name in args.models:
            memory(name, device, args.samples, args.microbatch, args.extra)
        return
    if args.loop:
        print(f"device={device} repeat={args.repeat} threads={torch.get_num_threads()} (the optimizer loop's path)")
        print(f"{'model':<10} {'samples':>8} {'samples/s':>10} {'update_s':>9}")
        for name in args.models:
            for n in args.sizes:
                rate, update_s = loop_bench(name, device, n, args.repeat, args.extra)
                print(f"{name:<10} {n:>8,} {rate:>10,.0f} {update_s:>9.4f}", flush=True)
        return
    print(f"device={device} samples={args.samples} repeat={args.repeat} bf16={args.bf16} "
          f"threads={torch.get_num_threads()} {' '.join(args.extra)}")
    print(f"{'model':<10} {'':<14} {'samples/s':>10} {'decisions/s':>12} {'ratio':>6}   {'per CPU-second':>14} "
          f"{'ratio':>6}")
    n = args.samples
    for name in args.models:
        times, bptt = bench(name, device, n, args.repeat, args.game_steps, args.bf16, args.extra)
        ref_wall, ref_cpu = times["reference"]
        for kind, (wall, cpu) in times.items():
            print(f"{name:<10} {kind:<14} {n / wall:>10,.0f} {n * bptt / wall:>12,.0f} {ref_wall / wall:>6.2f}   "
                  f"{n / cpu:>14,.0f} {ref_cpu / cpu:>6.2f}", flush=True)


if __name__ == "__main__":
    main()

"""What the box model charges, where each figure comes from, and the two settings it runs.

Every cost is a measured figure from BENCHMARKS.md (its section named beside it) or an assumption, said so.
Figures measured on the 2-core VM are multiplied by ``host_factor``: a core of the recorded H200 box did less work
than one of the VM under the box's load (16 vCPUs, every one busy). The factor is not fitted to the run: it is the
ratio of the same code's per-process speed on the two machines, ``bench_rollout --inference node`` with the 64-unit
moba 5v5 model: 81,507 agent-steps/s for a lone worker on the VM, 47,073 per worker with 14 on the H200 box.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from pathlib import Path

from rapid.run.config import Config
from rapid.run.config_files import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "moba-5v5.toml"
MB = 1e6
REAL_SAMPLE_BYTES = 8.9e6 / 512
"""An encoded moba 5v5 sample (16 steps): 512 samples make an 8.9 MB object (§ Optimizer intake)."""
AGENT_STEPS_PER_SEGMENT = 16 * 2 * 32 * 10
"""configs/moba-5v5.toml: a segment is bptt × samples_per_segment steps of 32 games of 10 heroes."""
LOOP_UPDATE_S = ((128, 0.0120), (256, 0.0125), (512, 0.0147), (1024, 0.0210), (8192, 0.1304))
"""``bench_learner.py --loop`` on the H200 box, moba 5v5 (§ The learner): samples per update → the loop's seconds
per update, host-bound (launches, drawing and packing the next batch)."""


def loop_update_s(samples: float) -> float:
    """Seconds of the optimizer process per update of ``samples``: the H200 loop figures, linear between them (and
    beyond the last, at its slope)."""
    sizes = [s for s, _ in LOOP_UPDATE_S]
    i = min(max(1, bisect.bisect_left(sizes, samples)), len(sizes) - 1)
    (s0, t0), (s1, t1) = LOOP_UPDATE_S[i - 1], LOOP_UPDATE_S[i]
    return max(t0 if samples < s0 else 0.0, t0 + (t1 - t0) * (samples - s0) / (s1 - s0))


@dataclass
class BoxCosts:
    host_factor: float = 81_507 / 47_073
    """VM → H200-box per-core work (module docstring); applies to the VM-measured costs below."""
    worker_s_per_agent_step: float = 1 / 47_073
    """A worker process's CPU per agent-step under node inference on the H200 box (env, bookkeeping, the client;
    § The rollout worker and node inference), measured with 14 workers and the server on its 16 vCPUs."""
    server_s_per_row: float = 0.81 * 300 / (60_803 * 1_557)
    """The node server's seconds per decision in the recorded run: busy 81% of 300 s over 60,803 batches of 1,557
    rows (2.57 µs; 3–5 policies a batch). ``bench_rollout``'s single-policy batches cost 1.35 µs a row."""
    server_gpu_s_per_row: float = 0.26e-6
    """ASSUMED (not measured): the GPU's kernel time of a server batch, ~0.1 ms a policy's forward at 4 policies
    over 1,557 rows; the rest of a pass is the host launching them."""
    learner_gpu_fixed_s: float = 3e-3
    """ASSUMED: the GPU's kernel time of one update whatever its size (cuDNN's LSTM over 16 steps, forward and
    backward, Adam); the loop's 12 ms at 128 samples is the host's launches."""
    learner_gpu_s_per_sample: float = 16e-3 / 8192
    """The GPU's time per sample: an H100 update of 8,192 staged samples in 16 ms (§ The learner, 508k/s)."""
    intake_s_per_mb: float = 1.08e-3
    """The optimizer process's CPU per MB taken in, VM (§ Optimizer intake): 1.08 with bytes pickled to 2 decode
    processes (the recorded run's code), 0.18 with the decoders reading the object and shared memory (today's)."""
    intake_box_s_per_mb: float | None = None
    """The optimizer's CPU per MB on the box itself, where it was probed there (not scaled by ``host_factor``):
    the issue's code review of the recorded run put the old intake at 2–4.5 ms/MB on the H200 box."""
    decode_s_per_mb: float = 2.65e-3
    """A decode process's CPU per MB, VM (§ Optimizer intake: 2.4–2.9 before, 2.4 after)."""
    encode_s_per_mb: float = 1.5e-3
    """A worker's CPU to encode its experience, VM (§ Serialization: 0.63–0.70 GB/s for an 8.8 MB object)."""
    evaluator_core_share: float = 0.35
    """configs/moba-5v5.toml eval.core_share: the evaluator's most of one core."""

    def vm(self, seconds: float) -> float:
        """A cost measured on the VM, as the H200 box's loaded core pays it."""
        return seconds * self.host_factor

    def intake(self) -> float:
        """The optimizer's CPU per MB taken in, on the box."""
        return self.vm(self.intake_s_per_mb) if self.intake_box_s_per_mb is None else self.intake_box_s_per_mb


@dataclass
class BoxSettings:
    """One box and the run on it. ``scale`` real samples are one simulated sample (a batch of 128 is 8 of 16):
    the loop, buffer and balancer see counts ÷ scale; every cost and figure is per real sample."""

    name: str = "as-recorded"
    cores: int = 16
    workers: int = 14
    decoders: int = 2
    sim_s: float = 300.0
    scale: int = 16
    gpu_ceiling: bool = False
    """The balancer's GPU ceiling (buffer / 2, HEAD's ``balance_settings(cfg, gpu=True)``); False: the recorded
    run's 4 × batch_samples."""
    overrides: tuple[str, ...] = ()
    """``--set``-style config overrides over configs/moba-5v5.toml (real sample counts: divided by ``scale``)."""
    costs: BoxCosts = field(default_factory=BoxCosts)
    seed: int = 0

    def config(self) -> Config:
        cfg = load_config(CONFIG, ["optimizer.device=cuda", *self.overrides])
        o = cfg.optimizer

        def scaled(n: int) -> int:
            return max(1, n // self.scale) if n else 0

        o = replace(
            o,
            batch_samples=scaled(o.batch_samples),
            buffer_samples=scaled(o.buffer_samples),
            max_batch_samples=scaled(o.max_batch_samples),
            microbatch_samples=scaled(o.microbatch_samples),
        )
        return replace(cfg, optimizer=o)


RECORDED_INTAKE_S_PER_MB = 4.5e-3
"""The recorded run's intake on the box: the top of the issue's 2–4.5 ms/MB (bench_intake's 1.08 on the VM is 1.9
at ``host_factor``); see BENCHMARKS for the run at each."""


def as_recorded(**kw) -> BoxSettings:
    """The recorded H200 run's code and settings: no pace, the batch ceiling 4 × 128, intake in the optimizer's
    process (bytes pickled to 2 decode processes), 14 workers."""
    costs = kw.pop("costs", BoxCosts(intake_box_s_per_mb=RECORDED_INTAKE_S_PER_MB))
    return BoxSettings(
        **{
            "name": "as-recorded",
            "workers": 14,
            "gpu_ceiling": False,
            "costs": costs,
            "overrides": ("optimizer.pace_rollouts=false",),
            **kw,
        }
    )


def today(**kw) -> BoxSettings:
    """HEAD's code on the same box: the pace on, 11 workers (``plan_box``), the GPU ceiling, shared-memory
    intake (0.18 ms/MB in the optimizer, 2.4 in a decoder)."""
    from rapid.roles.box_plan import plan_box

    plan = plan_box(cores=16, gpu=True, node_inference=True, decoders=2, evaluator=True)
    costs = kw.pop("costs", BoxCosts(intake_s_per_mb=0.18e-3, decode_s_per_mb=2.4e-3))
    return BoxSettings(**{"name": "today", "workers": plan.workers, "gpu_ceiling": True, "costs": costs, **kw})

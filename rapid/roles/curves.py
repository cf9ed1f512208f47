"""Training curves for TensorBoard and Weights & Biases, beside the Prometheus metrics.

The evaluator (win rates and ratings, by version) and an optimizer report given curves (rank 0's: losses, KL,
entropy, throughput, staleness, reuse, game results, by update) hand their figures to a ``Curves``, which writes them
through the libraries themselves: ``torch.utils.tensorboard`` event files under ``RUN_DIR/logs/tb/`` (one
TensorBoard run per run directory: ``tensorboard --logdir RUN_DIR/logs/tb``), and ``wandb`` in offline or
online mode, one W&B run per role, grouped by the run.

>>> import os, tempfile
>>> run_dir = tempfile.mkdtemp()
>>> curves = open_curves(run_dir, "evaluator", run_name="demo", tensorboard=True, wandb="")
>>> curves.scalars({"eval/win_rate_vs_random": 0.75, "eval/rating": 27.1}, step=3)
>>> curves.close()
>>> [name.startswith("events.out.tfevents.") for name in os.listdir(os.path.join(run_dir, "logs", "tb"))]
[True]
>>> open_curves(run_dir, "evaluator", run_name="demo", tensorboard=False, wandb="") is None
True
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Protocol

WANDB_MODES = ("", "offline", "online")


class Sink(Protocol):
    def scalars(self, values: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    def __init__(self, log_dir: Path, role: str):
        from torch.utils.tensorboard import SummaryWriter

        # Every role writes into the same folder, so TensorBoard shows one run per run directory; the suffix
        # tells the roles' files apart.
        self.writer = SummaryWriter(log_dir=str(log_dir), flush_secs=10, filename_suffix=f".{role}")

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, log_dir: Path, role: str, run_name: str, mode: str):
        import wandb

        # The same W&B run ids for the same run directory: a resumed run goes on with its curves.
        run_key = hashlib.sha256(str(log_dir.resolve()).encode()).hexdigest()[:8]
        log_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "rapid"), dir=str(log_dir),
                              # metrics.wandb is checked to be one of the two when the config loads
                              mode="offline" if mode == "offline" else "online",
                              group=f"{run_name}-{run_key}", job_type=role, name=f"{run_name}-{role}",
                              id=f"{run_name}-{run_key}-{role}", resume="allow", reinit="create_new",
                              settings=wandb.Settings(silent=True, console="off"))
        self.run.define_metric("*", step_metric="step")  # charts by update (optimizer) or version (evaluator)

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log({**values, "step": step})

    def close(self) -> None:
        self.run.finish()


class Curves:
    """Scalars by step to every sink; a sink that fails is reported by the caller, never stops training."""

    def __init__(self, sinks: list[Sink]):
        self.sinks = sinks

    def scalars(self, values: dict[str, float], step: int) -> None:
        values = {k: float(v) for k, v in values.items() if v is not None}
        for sink in self.sinks:
            sink.scalars(values, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_curves(run_dir: str | os.PathLike, role: str, run_name: str, tensorboard: bool, wandb: str) -> Curves | None:
    """The role's curves as the run's ``metrics.tensorboard`` and ``metrics.wandb`` ask; None when neither does."""
    logs = Path(run_dir) / "logs"
    sinks: list[Sink] = []
    if tensorboard:
        sinks.append(TensorBoardSink(logs / "tb", role))
    if wandb:
        sinks.append(WandbSink(logs, role, run_name, wandb))
    return Curves(sinks) if sinks else None

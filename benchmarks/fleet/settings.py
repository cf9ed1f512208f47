"""The scale model's settings: the shape of a fleet and the run config its roles read, and the samples it makes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rapid.formats.experience import Shape
from rapid.run.config import Config, LeagueConfig, ModelConfig, OptimizerConfig, RolloutConfig, RunConfig

from .drive import Links
from .standins import Costs

SHAPE = Shape(bptt=16, obs_dim=8, mask_dim=4, heads=1, lstm=8)
"""A small sample (~1 KB encoded): object sizes are scaled up to the target in the latency model."""
REAL_GAMES = 2
"""Games a real worker plays at once (two agents each): up to one sample a row a segment."""


def sample_arrays(n: int) -> dict[str, np.ndarray]:
    """Arrays of ``n`` valid samples of SHAPE (as rapid/optimizer/loader.py's docstring builds them)."""
    arrays = {name: np.zeros((n, *dims), dtype) for name, (dtype, dims) in SHAPE.fields().items()}
    arrays["mask"][:] = True
    arrays["active"][:] = True
    return arrays


@dataclass
class Settings:
    workers: int = 64
    ranks: int = 4
    sim_s: float = 900.0
    upload_s: float = 60.0
    param_poll_s: float = 5.0
    poll_s: float = 0.5
    publish_s: float = 60.0
    update_s: float = 1.0
    update_spread: float = 0.03  # lognormal σ of a rank's update time (stragglers): an assumption, see bench_fleet
    segment_s: float = 5.0  # a worker's segment: its version is swapped only between segments
    retention_s: float = 600.0
    max_backlog: int = 8
    samples_per_segment: int = 1
    games_per_upload: float = 3.0
    snapshot_every: int = 10
    refresh_s: float = 30.0
    checkpoint_every: int = 100
    max_staleness: int = 8
    target_reuse: float = 1.0
    supply: float = 1.3  # samples arriving ÷ what the learner takes at its smallest batch
    drain_s: float = 120.0
    seed: int = 0
    skew_s: float = 0.0  # fault: worker clocks off by up to ± this
    slow_upload_s: float = 0.0  # fault: this much extra on each experience PUT of 10% of the workers
    churn: float = 0.0  # fault: this share of the workers leaves (and is replaced) every upload interval
    shards: int = 0  # experience shards (0: one per rank, as store.experience_shards)
    workers_per_node: int = 0  # workers sharing a node cache (0: none, every worker reads the store)
    inference: str = "local"  # or "node": one inference server a node (fleet/node.py)
    real_workers: int = 0  # the first this many workers are rapid's RolloutWorker on a stand-in game (realworker.py)
    decisions_per_segment: int = 235_000  # a moba 5v5 worker's agent-steps in 5 s (47k/s: bench_rollout, H200)
    steps_per_segment: int = 735  # its env steps in those 5 s (32 games × 10 agents a step)
    server_pass_s: float = 0.5e-3  # a node server's pass, paid once a step whatever the batch (assumed split)
    server_row_s: float = 1.0e-6  # and per decision: ~1.9 ms a pass of ~1,410 rows (bench_rollout, H200)
    server_start_s: float = 20.0  # a node server process started afresh until it answers (torch, its policy)
    grad_mb: float = 2.6  # bytes all-reduced per update (the moba 5v5 model's gradients)
    links: Links = field(default_factory=Links)
    costs: Costs = field(default_factory=Costs)

    def config(self) -> Config:
        """The run's config as the roles would read it (the loops take their settings from it). The smallest
        batch is what arrives at a rank in ``update_s`` times the target reuse, over ``supply``: with more
        arriving than that, the balancer grows the batch (an update of a bigger batch moves more samples a
        second) until the learner uses what comes."""
        stand_ins = self.workers - min(self.real_workers, self.workers)
        samples = stand_ins * self.samples_per_segment + (self.workers - stand_ins) * REAL_GAMES * 2  # a sample a row
        per_rank = samples / self.segment_s / self.ranks
        batch = max(1, round(per_rank * self.update_s * self.target_reuse / self.supply))
        return Config(
            run=RunConfig(name="fleet"),
            # a real worker's segment: one sample of SHAPE.bptt decisions a row, from a policy of SHAPE's memory
            model=ModelConfig(hidden=16, encoder_layers=1, lstm=SHAPE.lstm),
            rollout=RolloutConfig(bptt=SHAPE.bptt, samples_per_segment=1, upload_interval_s=self.upload_s,
                                  param_poll_s=self.param_poll_s),
            optimizer=OptimizerConfig(batch_samples=batch, max_batch_samples=8 * batch,
                                      buffer_samples=max(64, int(8 * per_rank * self.upload_s)),
                                      max_staleness=self.max_staleness, target_reuse=self.target_reuse,
                                      publish_interval_s=self.publish_s, checkpoint_every=self.checkpoint_every,
                                      poll_s=self.poll_s, decode_workers=0),
            league=LeagueConfig(snapshot_every=self.snapshot_every, refresh_s=self.refresh_s))

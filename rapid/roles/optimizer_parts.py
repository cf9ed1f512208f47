"""What an optimizer rank's loop (:class:`rapid.roles.optimizer_loop.OptimizerLoop`) is given: its
:class:`Parts`. The scale model (``benchmarks/fleet``) stands in for two of them, the learner and the report,
so these two are interfaces (:class:`LearnerPart`, :class:`ReportPart`); every other part is the product's own
class."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from rapid.formats.checkpoint import Checkpoint
from rapid.infra.store import Store
from rapid.opt.buffer import ExperienceBuffer
from rapid.optimizer.balance import Decision
from rapid.optimizer.loader import ExperienceLoader
from rapid.optimizer.publisher import BackgroundWriter
from rapid.roles.league_keeper import LeagueKeeper
from rapid.run.param_store import ParameterStore


class LearnerPart(Protocol):
    """:class:`rapid.opt.learner.Learner`, or the scale model's stand-in whose update takes simulated time."""

    updates: int
    """Updates applied (the same count on every rank)."""
    skipped: int
    """Updates skipped for non-finite losses or gradients."""
    reference_logp: np.ndarray | None
    """The last update's reference log-probs for the buffer to keep (``ppo.proximal = "first_use"``), or None."""

    def update(self, batch: dict[str, np.ndarray], progress: float) -> dict[str, float]:
        """One update on ``batch``; ``progress`` (0 to 1 of the run's budget) drives the schedules. The stats
        hold ``skipped`` (1.0 when this update was skipped)."""
        ...


@runtime_checkable
class Prefetching(Protocol):
    """A learner that draws its next batch during an update (:meth:`rapid.opt.learner.Learner.prefetch`): the
    host draws and stages batch k + 1 while the device trains update k. The scale model's stand-in learner draws
    ahead the same way (it has no device to stage on), so the loop's draw-ahead runs there too."""

    def prefetch(self, draw: Callable[[], dict[str, np.ndarray] | None]) -> None:
        """``draw()`` is called once during the next update; an update handed what it returned uses it staged."""
        ...


@runtime_checkable
class Gathering(Protocol):
    """A learner that takes a drawn batch out of the buffer itself (:meth:`rapid.opt.learner.Learner.gather`): where
    it stages batches, straight into its pinned arena, one host copy instead of two."""

    def gather(self, arrays: dict[str, np.ndarray], chosen: np.ndarray) -> dict[str, np.ndarray]: ...


class ReportPart(Protocol):
    """:class:`rapid.roles.optimizer_report.OptimizerReport` (metrics, the JSONL log, curves), or the scale
    model's tally."""

    def update(self, updates: int, version: int, stats: dict[str, float], staleness: np.ndarray,
               decision: Decision, wait_s: float) -> None: ...

    def version(self, version: int) -> None: ...

    def skipped_nonfinite(self, total: int) -> None: ...

    def update_failed(self, error: BaseException) -> None: ...

    def loader_failed(self, failure: str) -> None: ...


@dataclass
class Parts:
    """What the loop works with. ``tensors()`` is a copy of the live weights to publish; ``checkpoint(version)``
    a host copy of weights and optimizer state; ``league`` is rank 0's :class:`LeagueKeeper` (None elsewhere);
    ``writer`` is used on rank 0 only (the scale model gives the other ranks None)."""

    learner: LearnerPart
    buffer: ExperienceBuffer
    loader: ExperienceLoader
    writer: BackgroundWriter | None
    params: ParameterStore
    league: LeagueKeeper | None
    report: ReportPart
    tensors: Callable[[], dict[str, np.ndarray]]
    checkpoint: Callable[[int], Checkpoint]
    store: Store

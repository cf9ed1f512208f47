"""The tiny PettingZoo env of ``tests.pz_tiny_parallel``, declaring its options type to rapid."""

from __future__ import annotations

from dataclasses import dataclass

from tests.pz_tiny_parallel import TinyParallel


@dataclass
class TinyOptions:
    max_steps: int = 5
    """Steps before the game is truncated."""
    die_at: int = 2
    """Step at which blue_1 leaves the game."""

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be ≥ 1, got {self.max_steps}")


rapid_options = TinyOptions


def parallel_env(**options) -> TinyParallel:
    return TinyParallel(**options)

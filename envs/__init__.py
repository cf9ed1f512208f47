"""Environments: the vectorized multi-agent interface, games and adapters.

Importing this package must stay cheap (no torch): rollout workers, tests and tools import it alone.
"""

from rapid.envs.base import EnvSpec, EpisodeStats, StepResult, VecMultiAgentEnv

__all__ = ["EnvSpec", "EpisodeStats", "StepResult", "VecMultiAgentEnv"]

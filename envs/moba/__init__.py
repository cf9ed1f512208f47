"""The Dota-style ``moba`` game: a lane battle of 1–5 heroes a side, vectorized over B games.

Recommended options (keyword arguments of ``MobaVecEnv`` / the ``[env.options]`` table of a config):

- 1v1 (fast learning): ``heroes_per_side = 1, lanes = 1, max_seconds = 240, seconds_per_step = 0.5``
- 3v3: ``heroes_per_side = 3, lanes = 1, max_seconds = 360, seconds_per_step = 0.5``
- 5v5: ``heroes_per_side = 5, lanes = 3, max_seconds = 600, seconds_per_step = 0.5``

Every other :class:`MobaConfig` field (reward weights ``reward_win``, ``reward_kill``, ``reward_death``,
``reward_last_hit``, ``reward_deny``, ``reward_tower_damage``, ``reward_tower_kill``, ``reward_gold``,
``reward_xp``; unit stats; wave timing) is an option too. Scripted bots: ``random``, ``idle``, ``lane``.
"""

from rapid.envs.moba.config import MobaConfig
from rapid.envs.moba.env import MobaVecEnv

__all__ = ["MobaConfig", "MobaVecEnv"]

"""The Dota-style ``moba`` game: a lane battle of 1–5 heroes a side, vectorized over B games.

Recommended options (keyword arguments of ``MobaVecEnv`` / the ``[env.options]`` table of a config):

- 1v1 (fast learning): ``heroes_per_side = 1, lanes = 1, max_seconds = 240, seconds_per_step = 0.5``
- 3v3: ``heroes_per_side = 3, lanes = 1, max_seconds = 360, seconds_per_step = 0.5``
- 5v5: ``heroes_per_side = 5, lanes = 3, max_seconds = 600, seconds_per_step = 0.5``

Shapes (default ``k_creeps = 4``), as ``obs_dim`` and ``action_heads``: 1v1 one lane 101, (6, 8, 13); 3v3 one
lane 137, (6, 8, 17); 5v5 one lane 173, (6, 8, 21); 5v5 three lanes 197, (6, 8, 25). ``observe_cooldowns`` adds 8
per hero of a side; ``observe_team`` 5 per structure of a side and 1 per hero of a side (5v5 three lanes: 40).
Heads: action type (noop, move, attack, nuke, stun, heal), move direction (8, mirrored like the map), target slot
(enemy heroes, nearest enemy creeps, enemy structures, allied heroes, nearest allied creeps; see
:mod:`rapid.envs.moba.observe`). ``seconds_per_step`` is ``spec.seconds_per_step``.

Also here: ``rapid.envs.moba.pz.MobaParallelEnv`` (PettingZoo view of one game) and
``rapid.envs.moba.render`` (``render_frame``, ``write_gif``).

Every other :class:`MobaConfig` field (reward weights ``reward_win``, ``reward_kill``, ``reward_death``,
``reward_last_hit``, ``reward_deny``, ``reward_tower_damage``, ``reward_tower_kill``, ``reward_structure_hp``,
``reward_gold``, ``reward_xp``; unit stats; wave timing) is an option too.
Scripted bots (``make_bot``): ``random``, ``idle``, ``lane`` (:mod:`rapid.envs.moba.bots`) and the team strategies
``focus`` and ``push`` (:mod:`rapid.envs.moba.strategies`), a ladder: ``push`` beats ``focus`` beats ``lane``.
"""

from rapid.envs.moba.config import MobaConfig
from rapid.envs.moba.env import MobaVecEnv

__all__ = ["MobaConfig", "MobaVecEnv"]

"""Team strategies for moba, stronger than ``lane``: a ladder of scripted opponents nobody trains against.

- ``focus``: lanes like ``lane``, but sieges and fights as a team: a structure in reach comes before any creep,
  and it fights an enemy hero only where its side has at least as many heroes near that enemy as the enemy has
  there, it is ahead as ``lane`` judges it, and the enemy stands out of its towers' reach; every hero in reach
  then hits, nukes and stuns the same (weakest) one.
- ``push``: ``focus`` with all heroes on the middle lane: they walk together just behind its creep wave (or wait
  at their outer tower for the next), fight together, hit its towers together while the creeps tank, and each
  falls back to the fountain when low as ``lane`` does. With one hero a side and one lane it plays as ``focus``.

Built from the parts of :mod:`rapid.envs.moba.bots` (:class:`~rapid.envs.moba.bots.Plan`); vectorized over games,
deterministic (they draw nothing), for any heroes a side and lanes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from rapid.envs.base import ScriptedBot, StepResult
from rapid.envs.moba.bots import LaneBot, Plan

if TYPE_CHECKING:
    from rapid.envs.moba.env import MobaVecEnv


class FocusBot(LaneBot):
    """Lanes like ``lane``, structures first; fights enemy heroes as a team, all on the weakest, where it has the
    numbers and no tower shoots back."""

    name = "focus"
    reach = 12.0
    """Heroes within this of an enemy hero count for the numbers there."""

    def engage(self) -> np.ndarray:
        """[B, H, n]: the enemy heroes (by index in their team) each hero may fight: alive, out of their towers'
        reach, and where its side has at least as many heroes near them as theirs."""
        env = self.env
        st, lay, cfg, d2 = env.state, env.layout, env.cfg, env.observer.dh
        E, A, r2 = lay.enemy_heroes, lay.ally_heroes, self.reach ** 2
        enemy_alive = st.alive[:, E]  # [B, H, n]
        allies = ((d2[:, E[:, :, None], A[:, None, :]] <= r2) & st.alive[:, A][:, :, None, :]).sum(axis=3)
        enemies = ((d2[:, E[:, :, None], E[:, None, :]] <= r2) & enemy_alive[:, :, None, :]).sum(axis=3)
        towers = lay.enemy_structs  # [H, S_side]: the enemy's towers and ancient
        tx, ty = lay.struct_x[towers - lay.H][:, None, :], lay.struct_y[towers - lay.H][:, None, :]
        covered = (st.x[:, E, None] - tx) ** 2 + (st.y[:, E, None] - ty) ** 2 <= cfg.tower_range ** 2
        guarded = (covered & st.alive[:, towers][:, :, None, :]).any(axis=3)
        return enemy_alive & (allies >= enemies) & ~guarded

    def team_fight(self, plan: Plan) -> None:
        """Hit, nuke and stun the weakest enemy hero in reach that ``engage`` allows, when ahead."""
        allowed = np.zeros(plan.t_hp.shape, bool)
        allowed[:, :, self.env.observer.eh] = self.engage()
        plan.fight(allowed & plan.ahead(), -plan.t_hp)

    def act(self, step: StepResult) -> np.ndarray:
        plan = Plan(self.env)
        self.follow_wave(plan)
        plan.chores(siege=True)
        self.team_fight(plan)
        plan.avoid_towers()
        plan.retreat()
        return plan.actions()


class PushBot(FocusBot):
    """``focus`` with every hero on the middle lane: the team walks with one wave and hits its towers together."""

    name = "push"

    def __init__(self, env: MobaVecEnv):
        super().__init__(env, np.zeros(env.layout.H, np.int64))


STRATEGIES: dict[str, Callable[[MobaVecEnv], ScriptedBot]] = {"focus": FocusBot, "push": PushBot}
"""The strategies by name, weakest first (``make_bot`` builds them with the env)."""

"""Scripted moba players, vectorized like the game: they read the env's state arrays, not observations.

- ``idle``: every hero does nothing, all game.
- ``lane``: a sensible laner. In priority order: retreat to the fountain when low (healing itself on the
  way), step out of an enemy tower's reach when no allied creep is there to tank, fight an enemy hero when
  ahead (stun, nuke, hit), last-hit, deny, hit a structure in reach, hit the weakest enemy creep, and
  otherwise walk just behind its creep wave (or wait at its outer tower).

Each bot returns actions for every hero of every game; the caller keeps the rows of the side it plays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rapid.envs.base import RandomBot, ScriptedBot, StepResult
from rapid.envs.moba.config import ATTACK, HEAL, MOVE, NOOP, NUKE, NUM_DIRS, STUN

if TYPE_CHECKING:
    from rapid.envs.moba.env import MobaVecEnv

BACK = NUM_DIRS // 2
"""Move direction towards the own base (in the hero's mirrored frame)."""


class IdleBot(ScriptedBot):
    """Does nothing: the weakest possible opponent that still lets creeps fight."""

    name = "idle"

    def __init__(self, env: MobaVecEnv):
        self.shape = (env.num_games, env.spec.num_agents, len(env.spec.action_heads))

    def act(self, step: StepResult) -> np.ndarray:
        return np.zeros(self.shape, np.int64)


class LaneBot(ScriptedBot):
    """Follows its creeps, last-hits, denies, retreats when low, fights heroes when ahead, casts spells."""

    name = "lane"

    def __init__(self, env: MobaVecEnv):
        self.env = env
        lay, ob = env.layout, env.observer
        self.sign = lay.side_sign
        # Every hero is given a lane; its wave is the allied creeps of that lane.
        self.hero_lane = lay.hero_lane
        self.lane_y = lay.own_lane_y
        creep_lane = lay.lane[lay.creeps]
        creep_team = lay.team[lay.creeps]
        self.own_wave = ((creep_lane[None, :] == self.hero_lane[:, None])
                         & (creep_team[None, :] == lay.hero_side[:, None]))
        self.enemy_towers = lay.enemy_structs - lay.H
        self.self_slot = np.argmax(ob.is_self, axis=1)

    def _front(self, fx_creeps: np.ndarray, alive_creeps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mirrored x of each hero's frontmost allied creep in its lane, and whether there is one."""
        ok = alive_creeps[:, None, :] & self.own_wave[None]
        front = np.where(ok, fx_creeps[:, None, :], -np.inf)
        best = front.max(axis=2)
        return best, np.isfinite(best)

    def act(self, step: StepResult) -> np.ndarray:
        env = self.env
        st, lay, cfg, ob = env.state, env.layout, env.cfg, env.observer
        H = lay.H
        x, y = st.x[:, :H], st.y[:, :H]
        own_edge = np.where(lay.hero_side == 0, 0.0, cfg.map_length)
        fx = (x - own_edge) * self.sign  # distance from the own base edge
        hpf = st.hp[:, :H] / st.max_hp[:, :H]
        tv, tm, tgt = ob.target_valid, ob.type_mask, ob.tgt_units
        flat = tgt + (np.arange(env.num_games) * lay.U)[:, None, None]
        t_hp = np.take(st.hp, flat)
        damage = st.damage[:, :H, None]

        atype = np.full(x.shape, MOVE, np.int64)
        slot = np.zeros(x.shape, np.int64)
        # Default: walk to just behind the own creep front, or to the own outer tower.
        fx_creeps = (st.x[:, lay.cs] - np.where(lay.team[lay.creeps] == 0, 0.0, cfg.map_length)) \
            * np.where(lay.team[lay.creeps] == 0, 1.0, -1.0)
        front, has_front = self._front(fx_creeps, st.alive[:, lay.cs])
        goal_fx = np.where(has_front, front - 2.0, cfg.tower_x[0] - 2.0)
        mdx = goal_fx - fx
        mdy = self.lane_y - y
        direction = np.round(np.arctan2(mdy, mdx) / (2 * np.pi / NUM_DIRS)).astype(np.int64) % NUM_DIRS
        atype[np.hypot(mdx, mdy) < 1.0] = NOOP

        def choose(t: int, score: np.ndarray, allowed: np.ndarray) -> None:
            """Where ``allowed`` has a slot valid for action type t, take t at the best-scoring slot."""
            valid = tv[t] & allowed & tm[:, :, t, None]
            use = valid.any(axis=2)
            best = np.where(valid, score, -np.inf).argmax(axis=2)
            atype[use] = t
            slot[use] = best[use]

        # Lowest priority first: later choices override earlier ones.
        creep_slot = ob.ec[None, None, :]
        choose(ATTACK, -t_hp, creep_slot)
        choose(ATTACK, np.zeros_like(t_hp), ob.es[None, None, :])
        choose(ATTACK, -t_hp, ob.ac[None, None, :] & (t_hp <= damage))
        choose(ATTACK, -t_hp, creep_slot & (t_hp <= damage * 0.95))
        enemy_hp = np.where(ob.eh[None, None, :], t_hp, np.inf)
        ahead = (st.hp[:, :H, None] >= enemy_hp) | (enemy_hp < 0.35 * st.max_hp[:, :H, None])
        fight = ob.eh[None, None, :] & ahead & (hpf[:, :, None] > 0.5)
        choose(ATTACK, -t_hp, fight)
        choose(NUKE, -t_hp, fight)
        choose(STUN, -t_hp, fight)

        # Step out of an enemy tower's reach when no allied creep stands under it.
        tx, ty = lay.struct_x[self.enemy_towers], lay.struct_y[self.enemy_towers]
        near = (x[:, :, None] - tx) ** 2 + (y[:, :, None] - ty) ** 2 <= (cfg.tower_range + 1.5) ** 2
        creep_near = ((st.x[:, None, None, lay.cs] - tx[None, :, :, None]) ** 2
                      + (st.y[:, None, None, lay.cs] - ty[None, :, :, None]) ** 2 <= cfg.tower_range ** 2)
        creep_near &= (st.alive[:, None, lay.cs] & ~lay.enemy_pair[:H, lay.cs][None])[:, :, None, :]
        exposed = near & st.alive[:, lay.enemy_structs] & ~creep_near.any(axis=3)
        danger = exposed.any(axis=2)
        atype[danger] = MOVE
        direction[danger] = BACK

        # Retreat when low; heal self if possible; rest at the fountain until nearly full.
        at_home = fx <= cfg.ancient_x
        retreat = (hpf < 0.35) | (at_home & (hpf < 0.9))
        atype[retreat] = np.where(at_home, NOOP, MOVE)[retreat]
        direction[retreat] = BACK
        heal_self = retreat & (hpf < 0.6) & tm[:, :, HEAL] & np.take_along_axis(
            tv[HEAL], self.self_slot[None, :, None], axis=2)[..., 0]
        atype[heal_self] = HEAL
        slot[heal_self] = np.broadcast_to(self.self_slot, slot.shape)[heal_self]
        atype[~st.alive[:, :H]] = NOOP
        return np.stack([atype, direction, slot], axis=-1)


def make_bot(env: MobaVecEnv, name: str, seed: int = 0) -> ScriptedBot:
    """A moba bot by name (``random``, ``idle``, ``lane``); KeyError for any other name."""
    if name == "random":
        return RandomBot(env.spec, seed)
    if name == "idle":
        return IdleBot(env)
    if name == "lane":
        return LaneBot(env)
    raise KeyError(name)

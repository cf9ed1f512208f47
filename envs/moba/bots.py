"""Scripted moba players, vectorized like the game: they read the env's state arrays, not observations.

- ``idle``: every hero does nothing, all game.
- ``lane``: a sensible laner. In priority order: retreat to the fountain when low (healing itself on the
  way), step out of an enemy tower's reach when no allied creep is there to tank, fight an enemy hero when
  ahead (stun, nuke, hit), last-hit, deny, hit a structure in reach, hit the weakest enemy creep, and
  otherwise walk just behind its creep wave (or wait at its outer tower).
- ``focus``, ``push`` (:mod:`rapid.envs.moba.strategies`): team strategies built from the same parts, both
  stronger than ``lane``.

Each bot returns actions for every hero of every game; the caller keeps the rows of the side it plays.
:class:`Plan` holds one step's decisions and the parts the bots share (walking, the laning chores, fighting,
keeping out of tower fire, retreating), so a strategy only says which of them to use and where to go.
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


class Plan:
    """One step's actions for every hero of every game ([B, H] type, direction, slot), filled by the bots'
    shared parts. Later parts override earlier ones: call them lowest priority first."""

    def __init__(self, env: MobaVecEnv):
        st, lay, cfg, ob = env.state, env.layout, env.cfg, env.observer
        self.env, self.H = env, lay.H
        H = lay.H
        self.x, self.y = st.x[:, :H], st.y[:, :H]
        self.own_edge = np.where(lay.hero_side == 0, 0.0, cfg.map_length)
        self.fx = (self.x - self.own_edge) * lay.side_sign
        """Each hero's distance from its own base edge."""
        self.hpf = st.hp[:, :H] / st.max_hp[:, :H]
        self.tgt = ob.tgt_units
        self.t_hp = np.take(st.hp, self.tgt + (np.arange(env.num_games) * lay.U)[:, None, None])
        """HP of the unit in every target slot [B, H, T]."""
        self.atype = np.full(self.x.shape, MOVE, np.int64)
        self.direction = np.zeros(self.x.shape, np.int64)
        self.slot = np.zeros(self.x.shape, np.int64)

    def walk(self, goal_fx: np.ndarray, goal_y: np.ndarray | float, where: np.ndarray | None = None,
             near: float = 1.0) -> None:
        """Heroes (all, or ``where``) walk towards (goal_fx, goal_y) in their own frame; wait within ``near``."""
        mdx, mdy = goal_fx - self.fx, goal_y - self.y
        direction = np.round(np.arctan2(mdy, mdx) / (2 * np.pi / NUM_DIRS)).astype(np.int64) % NUM_DIRS
        atype = np.where(np.hypot(mdx, mdy) < near, NOOP, MOVE)
        sel = np.ones(self.x.shape, bool) if where is None else where
        self.direction[sel] = direction[sel]
        self.atype[sel] = atype[sel]

    def choose(self, t: int, score: np.ndarray, allowed: np.ndarray) -> None:
        """Where ``allowed [.., T]`` has a slot valid for action type t, take t at the best-scoring slot."""
        ob = self.env.observer
        valid = ob.target_valid[t] & allowed & ob.type_mask[:, :, t, None]
        use = valid.any(axis=2)
        best = np.where(valid, score, -np.inf).argmax(axis=2)
        self.atype[use] = t
        self.slot[use] = best[use]

    def chores(self, siege: bool = False) -> None:
        """The laning chores, in rising priority: hit the weakest enemy creep, a structure, deny, last-hit; with
        ``siege``, a structure in reach comes first of all."""
        ob, t_hp = self.env.observer, self.t_hp
        damage = self.env.state.damage[:, :self.H, None]
        creep_slot = ob.ec[None, None, :]
        structure = (ATTACK, np.zeros_like(t_hp), ob.es[None, None, :])
        self.choose(ATTACK, -t_hp, creep_slot)
        if not siege:
            self.choose(*structure)
        self.choose(ATTACK, -t_hp, ob.ac[None, None, :] & (t_hp <= damage))
        self.choose(ATTACK, -t_hp, creep_slot & (t_hp <= damage * 0.95))
        if siege:
            self.choose(*structure)

    def fight(self, allowed: np.ndarray, score: np.ndarray) -> None:
        """Hit, nuke and stun (rising priority) the best-scoring enemy hero slot ``allowed`` [B, H, T]."""
        allowed = allowed & self.env.observer.eh[None, None, :]
        self.choose(ATTACK, score, allowed)
        self.choose(NUKE, score, allowed)
        self.choose(STUN, score, allowed)

    def ahead(self) -> np.ndarray:
        """[B, H, T]: enemy hero slots that ``lane`` fights: its HP at most ours (or low), ours above half."""
        st, H = self.env.state, self.H
        enemy_hp = np.where(self.env.observer.eh[None, None, :], self.t_hp, np.inf)
        ahead = (st.hp[:, :H, None] >= enemy_hp) | (enemy_hp < 0.35 * st.max_hp[:, :H, None])
        return ahead & (self.hpf[:, :, None] > 0.5)

    def avoid_towers(self, margin: float = 1.5) -> None:
        """Step out of an enemy tower's reach (plus ``margin``) when no allied creep stands under it."""
        env = self.env
        st, lay, cfg = env.state, env.layout, env.cfg
        towers = lay.enemy_structs - lay.H
        x, y, cs = self.x, self.y, lay.cs
        tx, ty = lay.struct_x[towers], lay.struct_y[towers]
        near = (x[:, :, None] - tx) ** 2 + (y[:, :, None] - ty) ** 2 <= (cfg.tower_range + margin) ** 2
        creep_near = ((st.x[:, None, None, cs] - tx[None, :, :, None]) ** 2
                      + (st.y[:, None, None, cs] - ty[None, :, :, None]) ** 2 <= cfg.tower_range ** 2)
        creep_near &= (st.alive[:, None, cs] & ~lay.enemy_pair[:lay.H, cs][None])[:, :, None, :]
        exposed = near & st.alive[:, lay.enemy_structs] & ~creep_near.any(axis=3)
        danger = exposed.any(axis=2)
        self.atype[danger] = MOVE
        self.direction[danger] = BACK

    def retreat(self, low: float = 0.35, full: float = 0.9, heal_below: float = 0.6) -> np.ndarray:
        """Heroes below ``low`` HP walk home (healing themselves below ``heal_below``) and rest at the fountain
        until ``full``; returns who retreats."""
        env = self.env
        ob, cfg = env.observer, env.cfg
        at_home = self.fx <= cfg.ancient_x
        retreat = (self.hpf < low) | (at_home & (self.hpf < full))
        self.atype[retreat] = np.where(at_home, NOOP, MOVE)[retreat]
        self.direction[retreat] = BACK
        self_slot = np.argmax(ob.is_self, axis=1)
        heal_self = retreat & (self.hpf < heal_below) & ob.type_mask[:, :, HEAL] & np.take_along_axis(
            ob.target_valid[HEAL], self_slot[None, :, None], axis=2)[..., 0]
        self.atype[heal_self] = HEAL
        self.slot[heal_self] = np.broadcast_to(self_slot, self.slot.shape)[heal_self]
        return retreat

    def actions(self) -> np.ndarray:
        """[B, H, 3] actions; the dead and the stunned do nothing (their masks allow nothing else)."""
        self.atype[~self.env.observer.type_mask[:, :, MOVE]] = NOOP
        return np.stack([self.atype, self.direction, self.slot], axis=-1)


class LaneBot(ScriptedBot):
    """Follows its creeps, last-hits, denies, retreats when low, fights heroes when ahead, casts spells."""

    name = "lane"

    def __init__(self, env: MobaVecEnv, hero_lane: np.ndarray | None = None):
        self.env = env
        lay = env.layout
        # Every hero is given a lane (by default its own: its index in its team, mod the lanes); its wave is
        # the allied creeps of that lane.
        self.hero_lane = lay.hero_lane if hero_lane is None else hero_lane
        self.lane_y = env.cfg.lane_y()[self.hero_lane]
        creep_lane = lay.lane[lay.creeps]
        creep_team = lay.team[lay.creeps]
        self.own_wave = ((creep_lane[None, :] == self.hero_lane[:, None])
                         & (creep_team[None, :] == lay.hero_side[:, None]))
        self.creep_edge = np.where(creep_team == 0, 0.0, env.cfg.map_length)
        self.creep_sign = np.where(creep_team == 0, 1.0, -1.0)

    def front(self) -> tuple[np.ndarray, np.ndarray]:
        """[B, H]: distance from its own base edge of each hero's frontmost allied creep in its lane, and whether
        there is one."""
        st, lay = self.env.state, self.env.layout
        fx_creeps = (st.x[:, lay.cs] - self.creep_edge) * self.creep_sign
        ok = st.alive[:, None, lay.cs] & self.own_wave[None]
        best = np.where(ok, fx_creeps[:, None, :], -np.inf).max(axis=2)
        return best, np.isfinite(best)

    def follow_wave(self, plan: Plan, behind: float = 2.0) -> None:
        """Walk to just behind the own creep front, or to the own outer tower."""
        front, has_front = self.front()
        tower = self.env.cfg.tower_x[0]
        plan.walk(np.where(has_front, front - behind, tower - behind), self.lane_y)

    def act(self, step: StepResult) -> np.ndarray:
        plan = Plan(self.env)
        self.follow_wave(plan)
        plan.chores()
        plan.fight(plan.ahead(), -plan.t_hp)
        plan.avoid_towers()
        plan.retreat()
        return plan.actions()


def make_bot(env: MobaVecEnv, name: str, seed: int = 0) -> ScriptedBot:
    """A moba bot by name (``random``, ``idle``, ``lane``, ``focus``, ``push``); KeyError for any other name."""
    from rapid.envs.moba.strategies import STRATEGIES

    if name == "random":
        return RandomBot(env.spec, seed)
    if name == "idle":
        return IdleBot(env)
    if name == "lane":
        return LaneBot(env)
    if name in STRATEGIES:
        return STRATEGIES[name](env)
    raise KeyError(name)

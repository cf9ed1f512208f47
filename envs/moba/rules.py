"""One game tick for B games at once: hero actions, creep and tower AI, deaths, gold/XP, respawns, waves.

Order inside a tick (all games in lockstep, no loop over games or units):

1. heroes' attacks and abilities land (validated against the masks the heroes saw), so a hero's blow that
   takes a unit to 0 HP is a last hit (or a deny on an allied creep);
2. creeps and structures pick targets by distance (creeps prefer creeps and structures to heroes; towers
   prefer creeps, but switch to an enemy hero that hit an allied hero under the tower) and strike;
3. heroes and creeps move; the dead drop out, gold and XP are shared, timers run, waves spawn.

Distances come from the observation of the previous tick (``de``, ``dh``), so the targets a hero was allowed to
pick are exactly the ones in range when its action lands.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rapid.envs.moba.config import ATTACK, HEAL, MOVE, NUKE, NUM_DIRS, STUN, MobaConfig
from rapid.envs.moba.state import Layout, State

_ANGLES = np.arange(NUM_DIRS) * (2 * np.pi / NUM_DIRS)
DIRS = np.stack([np.cos(_ANGLES), np.sin(_ANGLES)], axis=1).astype(np.float32)
"""Unit vector of each move direction in the hero's own (mirrored) frame: 0 = towards the enemy base."""


_FAR = np.float32(1e9)
"""Added to the score of an invalid target: larger than any squared distance or priority offset."""


@dataclass
class Events:
    """What each hero gained this tick ([B, H] arrays), and structures destroyed by each side ([B, 2])."""

    gold: np.ndarray
    xp: np.ndarray
    kills: np.ndarray
    deaths: np.ndarray
    last_hits: np.ndarray
    denies: np.ndarray
    tower_damage: np.ndarray
    """Damage dealt to enemy structures, in units of the structure's max HP."""
    structures_destroyed: np.ndarray


def _scatter_add(index: np.ndarray, weights: np.ndarray, size: int) -> np.ndarray:
    """Sum ``weights`` into ``size`` flat bins (np.bincount: much faster than np.add.at)."""
    return np.bincount(index.ravel(), weights.ravel(), minlength=size)[:size].astype(np.float32)


class Rules:
    """The game's mechanics, bound to one layout and config."""

    def __init__(self, cfg: MobaConfig, layout: Layout, num_games: int):
        self.cfg, self.lay, self.B = cfg, layout, num_games
        lay = layout
        self.row_u = (np.arange(num_games) * lay.U)[:, None]
        self.row_h = (np.arange(num_games) * lay.H)[:, None]
        S, C = lay.S_side, lay.C_side
        enemy_hero = np.arange(lay.n + S + C) < lay.n
        # Per row of a side (structures, then creeps) and enemy column: added to the squared distance (creeps and
        # towers prefer anything over a hero), and the reach a target must be within (strictly: a tower's
        # "at most its range" is "below the next float").
        self.penalty = np.where(enemy_hero, np.array([[1e4]] * S + [[60.0]] * C), 0.0).astype(np.float32)
        tower_reach = np.nextafter(np.float32(cfg.tower_range ** 2), np.float32(np.inf))
        self.reach2 = np.array([tower_reach] * S + [cfg.creep_aggro ** 2] * C, np.float32)[:, None]
        # Per row of a side (structures, then creeps): the reach to strike, cooldown, and which half of the
        # damage scatter (structures' and creeps' damage is summed apart).
        row = np.arange(S + C)
        self.strike2 = np.where(row < S, cfg.tower_range ** 2, cfg.creep_range ** 2).astype(np.float32)
        self.cooldown = np.where(row < S, cfg.tower_cooldown, cfg.creep_cooldown).astype(np.float32)
        self.scatter_part = np.where(row < S, num_games * lay.U, 0)
        self.lane_y = np.zeros(lay.U, np.float32)
        self.lane_y[lay.creeps] = layout.creep_lane_y
        """Each creep's lane."""
        self.creep_dir = np.array([[10.0], [-10.0]], np.float32)
        """Each side's creeps' walk (down the lane towards the enemy)."""
        self.y_limit = float(cfg.lane_y().max() + 8.0)
        nw = cfg.creep_slots // cfg.wave_size
        spread = (np.arange(cfg.wave_size) - (cfg.wave_size - 1) / 2) * 1.5
        # Unit index of every creep of wave slot w: [waves, 2 * lanes * wave_size].
        base = lay.H + lay.S
        self.wave_units = np.array([[base + s * lay.C_side + l_ * cfg.creep_slots + w * cfg.wave_size + k
                                     for s in range(2) for l_ in range(lay.lanes) for k in range(cfg.wave_size)]
                                    for w in range(nw)], dtype=np.int64)
        sides = np.repeat(np.arange(2), lay.lanes * cfg.wave_size)
        self.wave_x = np.where(sides == 0, cfg.ancient_x + 4.0, cfg.map_length - cfg.ancient_x - 4.0)
        self.wave_y = np.tile(np.repeat(cfg.lane_y(), cfg.wave_size) + np.tile(spread, lay.lanes), 2)
        self.xp_worth = np.where(lay.is_hero, cfg.kill_xp, cfg.creep_xp).astype(np.float32)
        self.home_edge = np.where(lay.hero_side == 0, 0.0, cfg.map_length)
        self.fountain_x = np.where(lay.hero_side == 0, cfg.fountain_x, cfg.map_length - cfg.fountain_x)
        self.period_steps = max(1, int(round(cfg.wave_period / cfg.seconds_per_step)))

    # ------------------------------------------------------------------ phase 1: heroes act
    def heroes_act(self, st: State, etype: np.ndarray, tgt: np.ndarray,
                   jitter: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Apply validated hero actions (``etype`` already NOOP where invalid; ``tgt`` unit index [B, H]).

        Returns (units killed by heroes [B, U], the hero credited for each unit [B, U] or -1, damage each
        hero dealt to structures in units of their max HP [B, H]).
        """
        cfg, lay, H, U = self.cfg, self.lay, self.lay.H, self.lay.U
        attack, nuke, stun, heal = etype == ATTACK, etype == NUKE, etype == STUN, etype == HEAL
        lvl = st.level.astype(np.float32)
        dmg = np.where(attack, st.damage[:, :H] * jitter[:, :H], 0.0)
        dmg += np.where(nuke, cfg.nuke_damage + cfg.nuke_damage_per_level * (lvl - 1), 0.0)
        dmg += np.where(stun, cfg.stun_damage, 0.0)
        hits = dmg > 0
        flat_t = tgt + self.row_u
        st.atk_cd[:, :H][attack] = cfg.hero_cooldown
        st.mana -= np.where(nuke, cfg.nuke_mana, 0.0) + np.where(stun, cfg.stun_mana, 0.0) \
            + np.where(heal, cfg.heal_mana, 0.0)
        st.ability_cd[:, :, 0][nuke] = cfg.nuke_cooldown
        st.ability_cd[:, :, 1][stun] = cfg.stun_cooldown
        st.ability_cd[:, :, 2][heal] = cfg.heal_cooldown
        # Stun and heal only ever target heroes (the masks see to that), so tgt < H there.
        st.stun.ravel()[(tgt + self.row_h)[stun]] = cfg.stun_seconds
        healed = _scatter_add(flat_t[heal], np.full(int(heal.sum()), cfg.heal_amount), self.B * U)
        st.hp += healed.reshape(self.B, U)
        np.minimum(st.hp, st.max_hp, out=st.hp)
        hit_hero = hits & (tgt < H)
        st.aggro[hit_hero] = 2.0
        st.victim[hit_hero] = tgt[hit_hero]
        taken = _scatter_add(flat_t[hits], dmg[hits], self.B * U).reshape(self.B, U)
        is_struct_t = lay.is_struct[tgt]
        tower_damage = np.where(hits & is_struct_t, dmg / np.take(st.max_hp, flat_t), 0.0).astype(np.float32)
        killer = np.full(self.B * U, -1, np.int64)
        hb, hh = np.nonzero(hits)
        killer[flat_t[hb, hh]] = hh  # several heroes on one unit: one of them, deterministically
        st.hp -= taken
        died = st.alive & (st.hp <= 0)
        return died, killer.reshape(self.B, U), tower_damage

    # ------------------------------------------------------------------ phase 2: creeps and structures act
    def units_act(self, st: State, de: np.ndarray, rows: np.ndarray, vulnerable: np.ndarray,
                  jitter: np.ndarray) -> np.ndarray:
        """Creeps and structures strike their chosen targets (``de``, ``rows``: the observer's enemy distances
        and side rows); creeps walk. Returns who died this phase."""
        cfg, lay = self.cfg, self.lay
        n, S, B = lay.n, lay.S_side, self.B
        R = rows.shape[2] - n
        dt = cfg.seconds_per_step
        living = st.alive & (st.hp > 0)
        # Rows: each side's structures and creeps; columns: the other side's units, in unit order, so argmin
        # breaks ties as it did over all units. Creeps take the nearest enemy within aggro range, heroes last;
        # structures creeps first, heroes next, a hero that hit an allied hero under the tower first of all.
        enemies = rows[:, ::-1]
        dr = de[:, :, n:, :]
        valid = np.less(dr, self.reach2[:R])
        valid &= np.take(living & vulnerable, enemies)[:, :, None, :]
        score = np.add(dr, self.penalty[:R, :rows.shape[2]])
        # [B, 2, S_side, n]: from each structure to the allied hero each enemy hero last hit.
        vx = np.take_along_axis(st.x, st.victim, axis=1).reshape(B, 2, 1, n)[:, ::-1]
        vy = np.take_along_axis(st.y, st.victim, axis=1).reshape(B, 2, 1, n)[:, ::-1]
        victim_d2 = (st.x[:, lay.ss].reshape(B, 2, -1, 1) - vx) ** 2 + (st.y[:, lay.ss].reshape(B, 2, -1, 1) - vy) ** 2
        punish = (st.aggro > 0).reshape(B, 2, 1, n)[:, ::-1] & (victim_d2 <= cfg.tower_range ** 2)
        score[:, :, :S, :n] -= np.where(punish, np.float32(2e4), np.float32(0.0))
        score = np.where(valid, score, np.float32(np.inf))  # rows with no valid target are ignored
        # What each structure and creep chose ([B, 2, R]), whether it exists, how far it is.
        col = score.argmin(axis=3)
        P, bs, r = rows.shape[2], np.arange(B * 2).reshape(B, 2, 1), np.arange(R)
        actor = rows[:, :, n:]
        has = np.take(score, (bs * R + r) * P + col) < np.inf
        has &= np.take(living, actor)
        in_range = has & (np.take(de, (bs * P + n + r) * P + col) <= self.strike2[:R])
        tgt = np.take_along_axis(enemies, col, axis=2)
        strike = in_range & (np.take(st.atk_cd, actor) <= 0)
        # Creeps' and structures' damage summed apart, then added, as two scatters in unit order did.
        damage = np.take(st.damage, actor) * np.take(jitter, actor)
        taken = _scatter_add((tgt + self.scatter_part[:R])[strike], damage[strike], 2 * B * lay.U)
        taken = taken.reshape(2, B, lay.U)
        np.put(st.atk_cd, actor[strike], np.broadcast_to(self.cooldown[:R], strike.shape)[strike])
        st.hp -= taken[0] + taken[1]
        # Creeps move: towards a target out of reach, else down their lane (drifting back onto it).
        c = slice(S, R)
        creeps, in_range = actor[:, :, c], in_range[:, :, c]
        cx, cy = np.take(st.x, creeps), np.take(st.y, creeps)
        tx, ty = np.take(st.x, tgt[:, :, c]), np.take(st.y, tgt[:, :, c])
        chase = has[:, :, c] & ~in_range
        vx = np.where(chase, tx - cx, self.creep_dir)
        vy = np.where(chase, ty - cy, np.take(self.lane_y, creeps % lay.U) - cy)
        norm = np.sqrt(vx * vx + vy * vy) + 1e-6
        step = np.minimum(cfg.creep_speed * dt, norm) / norm
        walking = np.take(living, creeps) & ~in_range
        step *= walking
        cx += vx * step
        cy += vy * step
        np.put(st.x, creeps, cx)
        np.put(st.y, creeps, cy)
        return st.alive & (st.hp <= 0)

    # ------------------------------------------------------------------ phase 3: movement, deaths, timers
    def move_heroes(self, st: State, etype: np.ndarray, dirs: np.ndarray) -> None:
        lay, cfg = self.lay, self.cfg
        moving = etype == MOVE
        speed = cfg.hero_speed * cfg.seconds_per_step
        d = DIRS[dirs]
        st.x[:, :lay.H] += np.where(moving, d[..., 0] * lay.side_sign * speed, 0.0)
        st.y[:, :lay.H] += np.where(moving, d[..., 1] * speed, 0.0)
        np.clip(st.x[:, :lay.H], 0.0, cfg.map_length, out=st.x[:, :lay.H])
        np.clip(st.y[:, :lay.H], -self.y_limit, self.y_limit, out=st.y[:, :lay.H])

    def settle_deaths(self, st: State, died: np.ndarray, by_hero: np.ndarray, killer: np.ndarray,
                      tower_damage: np.ndarray, dh: np.ndarray) -> Events:
        """Remove the dead; pay last hits, denies, kills, XP (``dh``: the observer's hero distances) and
        structure bounties."""
        cfg, lay, B, H = self.cfg, self.lay, self.B, self.lay.H
        credited = by_hero & (killer >= 0)
        kteam = lay.team[np.maximum(killer, 0)]
        enemy_kill = credited & (kteam != lay.team)
        deny = credited & (kteam == lay.team) & lay.is_creep
        flat_k = killer + self.row_h
        lh = enemy_kill & lay.is_creep
        hk = enemy_kill & lay.is_hero
        size = B * H

        counted = lh | deny | hk  # three disjoint kinds, counted per hero in one bincount
        bins = (flat_k + np.where(lh, 0, np.where(deny, size, 2 * size)))[counted]
        last_hits, denies, kills = np.bincount(bins, minlength=3 * size).astype(np.float32).reshape(3, B, H)
        gold = last_hits * cfg.creep_gold + kills * cfg.kill_gold
        # XP to heroes near an enemy creep or hero that died (not for denied creeps).
        xp_src = died & ~deny & (lay.is_creep | lay.is_hero)
        near = (dh <= cfg.xp_radius ** 2) & lay.enemy_pair[:H][None] & xp_src[:, None, :]
        near &= st.alive[:, :H, None]
        xp = (near * self.xp_worth).sum(axis=2, dtype=np.float32)
        # Structures: bounty to every hero of the side that destroyed it.
        sdead = died[:, lay.structs].reshape(B, 2, lay.S_side).sum(axis=2).astype(np.float32)
        destroyed = sdead[:, ::-1].copy()
        gold += destroyed[:, lay.hero_side] * cfg.tower_gold
        deaths = died[:, :H].astype(np.float32)
        st.respawn[:, :H] = np.where(died[:, :H], cfg.respawn_base + cfg.respawn_per_level * st.level, st.respawn)
        st.alive &= ~died
        st.hp[died] = 0.0
        st.gold += gold
        st.xp += xp
        return Events(gold, xp, kills, deaths, last_hits, denies, tower_damage, destroyed)

    def tick_timers(self, st: State) -> None:
        """Regeneration, fountain, cooldowns, respawns, levels."""
        cfg, lay, H = self.cfg, self.lay, self.lay.H
        dt = cfg.seconds_per_step
        alive = st.alive[:, :H]
        at_home = np.abs(st.x[:, :H] - self.home_edge) <= cfg.ancient_x
        boost = np.where(at_home, cfg.fountain_heal * dt, 0.0)
        st.hp[:, :H] += np.where(alive, cfg.hero_hp_regen * dt + boost * st.max_hp[:, :H], 0.0)
        st.mana += np.where(alive, cfg.hero_mana_regen * dt + boost * st.max_mana, 0.0)
        st.timers -= dt
        np.maximum(st.timers, 0.0, out=st.timers)
        back = ~alive & (st.respawn <= 0)
        st.alive[:, :H] |= back
        st.x[:, :H] = np.where(back, self.fountain_x, st.x[:, :H])
        st.y[:, :H] = np.where(back, lay.spawn_y, st.y[:, :H])
        reached = np.floor((1 + np.sqrt(1 + 8 * st.xp / cfg.xp_per_level)) / 2)  # inverts l (l - 1) / 2
        level = np.minimum(cfg.max_level, reached).astype(np.int64)
        lv = (level - 1).astype(np.float32)
        new_max = cfg.hero_hp + cfg.hero_hp_per_level * lv
        st.hp[:, :H] += np.where(alive, new_max - st.max_hp[:, :H], 0.0)
        st.max_hp[:, :H] = new_max
        st.max_mana[:] = cfg.hero_mana + cfg.hero_mana_per_level * lv
        st.level[:] = level
        bonus = np.minimum(cfg.hero_damage_per_gold * st.gold, cfg.hero_damage_gold_cap)
        st.damage[:, :H] = cfg.hero_damage + cfg.hero_damage_per_level * lv + bonus
        st.hp[:, :H] = np.where(back, st.max_hp[:, :H], np.minimum(st.hp[:, :H], st.max_hp[:, :H]))
        st.mana[:] = np.where(back, st.max_mana, np.minimum(st.mana, st.max_mana))

    def spawn_waves(self, st: State) -> None:
        """Every ``wave_period`` seconds each side sends ``wave_size`` creeps down every lane."""
        due = np.flatnonzero(st.step_count % self.period_steps == 0)
        if due.size == 0:
            return
        units = self.wave_units[st.waves[due] % len(self.wave_units)]
        rows = due[:, None]
        st.alive[rows, units] = True
        st.hp[rows, units] = self.cfg.creep_hp
        st.max_hp[rows, units] = self.cfg.creep_hp
        st.x[rows, units] = self.wave_x
        st.y[rows, units] = self.wave_y
        st.atk_cd[rows, units] = 0.0
        st.waves[due] += 1

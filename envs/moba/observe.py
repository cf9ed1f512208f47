"""Observations, target slots and action masks of every hero of B games.

A hero sees the game in its own frame: side 1's x axis is flipped, so both sides "attack to the right" and
one policy can play either. Every feature is scaled to roughly [-1, 1] (never beyond ±1.5).

Target slots (the third action head), in this order: enemy heroes (by index), the nearest ``k_creeps``
visible enemy creeps, the enemy structures (per lane outer, inner tower, then the ancient), allied heroes
(self included, by index), the nearest ``k_creeps`` allied creeps. The observation describes the same slots
in the same order, so a slot's features and its target are the same unit.

Fog of war: enemy heroes and creeps are present in a hero's view only while some unit of its side sees
them (within that unit's sight radius). Structures are always known.

Layout of the observation: the hero's own features, the slots' features (feature-major), level, stun and mana
of the hero slots, the clock; with ``observe_cooldowns``, the attack, nuke, stun and heal cooldowns of the hero
slots; with ``observe_team``, the hero's own structures and its index in its team; with ``observe_lane``, its own
lane last. Option groups are appended after everything a run without them sees, so the columns of an older run
keep their meaning and surgery only adds columns.
"""

from __future__ import annotations

import numpy as np

from rapid.envs.moba.config import ATTACK, MOVE, NOOP, NUKE, NUM_DIRS, NUM_TYPES, MobaConfig
from rapid.envs.moba.state import Layout, State

SELF_FEATURES = 15
SLOT_FEATURES = 6
HERO_EXTRA = 3
TIME_FEATURES = 2
COOLDOWN_FEATURES = 4
"""Per hero slot with ``observe_cooldowns``: attack, nuke, stun and heal cooldown, each as a fraction of its full
length."""
OWN_STRUCT_FEATURES = 5
"""Per allied structure with ``observe_team``: standing, HP fraction, x and y from the hero (in its frame, over the
map's length), and the enemy units the structure sees (over ``THREAT_SCALE``, at most 1.5)."""
THREAT_SCALE = 8.0


def layout_dims(cfg: MobaConfig, lay: Layout) -> tuple[int, tuple[int, int, int]]:
    """(obs_dim, action_heads) of a config."""
    T = 2 * lay.n + 2 * cfg.k_creeps + lay.S_side
    obs_dim = SELF_FEATURES + T * SLOT_FEATURES + 2 * lay.n * HERO_EXTRA + TIME_FEATURES
    if cfg.observe_cooldowns:
        obs_dim += 2 * lay.n * COOLDOWN_FEATURES
    if cfg.observe_team:
        obs_dim += lay.S_side * OWN_STRUCT_FEATURES + lay.n
    if cfg.observe_lane:
        obs_dim += lay.lanes + 1
    return obs_dim, (NUM_TYPES, NUM_DIRS, T)


class Observer:
    """Computes distances, visibility, target tables, masks and observation vectors after each tick."""

    def __init__(self, cfg: MobaConfig, lay: Layout, num_games: int):
        self.cfg, self.lay, self.B = cfg, lay, num_games
        n, K, H = lay.n, cfg.k_creeps, lay.H
        self.obs_dim, self.heads = layout_dims(cfg, lay)
        T = self.heads[2]
        self.T = T
        cat = np.array([0] * n + [1] * K + [2] * lay.S_side + [3] * n + [4] * K)
        self.eh, self.ec, self.es, self.ah, self.ac = (cat == c for c in range(5))
        self.enemy_slot = self.eh | self.ec | self.es
        self.slot_scale = np.where(self.es, cfg.map_length / 2, cfg.hero_sight).astype(np.float32)
        self.row_u = (np.arange(num_games) * lay.U)[:, None, None]
        # Static part of the target table (heroes and structures); creep slots are filled every tick.
        self.static_units = np.zeros((H, T), np.int64)
        self.static_units[:, self.eh] = lay.enemy_heroes
        self.static_units[:, self.es] = lay.enemy_structs
        self.static_units[:, self.ah] = lay.ally_heroes
        self.is_self = (self.static_units == np.arange(H)[:, None]) & self.ah
        # Attack, nuke, stun and heal (the types with a target, in order): reach and the slots each may use.
        self.ranges2 = np.array([cfg.hero_range, cfg.nuke_range, cfg.stun_range, cfg.heal_range], np.float32) ** 2
        self.type_slots = np.stack([self.enemy_slot | self.ac, self.eh | self.ec, self.eh, self.ah])
        self.ability_cost = np.array([cfg.nuke_mana, cfg.stun_mana, cfg.heal_mana], np.float32)
        self.row_dh = (np.arange(num_games * H) * lay.U).reshape(num_games, H, 1)
        # Each hero's candidate creeps [H, 2, C] (enemy, then allied) and flat offsets into ``dh`` and into
        # ``present_of`` (is a unit present to a hero: seen for enemies, alive for allies; [B, 2, U]).
        C = lay.C_side
        self.creep_units = np.stack([lay.enemy_creeps, lay.ally_creeps], axis=1)
        self.at_creep_d = self.row_dh[:, :, :, None] + self.creep_units
        games = np.arange(num_games)[:, None, None, None]
        self.at_creep_present = games * 2 * lay.U + np.array([0, lay.U])[:, None] + self.creep_units
        self.row_creep = (np.arange(H * 2) * C).reshape(H, 2, 1)
        self.row_present = (np.arange(num_games) * 2 * lay.U)[:, None, None] + np.where(self.ah | self.ac, lay.U, 0)
        self.present_of = np.zeros((num_games, 2, lay.U), bool)
        self.k_slots = (slice(n, n + K), slice(T - K, T))
        """The enemy and allied creep slots."""
        self.hero_units = np.concatenate([lay.enemy_heroes, lay.ally_heroes], axis=1)
        self.eh_ah = np.concatenate([np.flatnonzero(self.eh), np.flatnonzero(self.ah)])
        self.ability_cooldowns = np.array([cfg.nuke_cooldown, cfg.stun_cooldown, cfg.heal_cooldown], np.float32)
        self.slot_xscale = (lay.side_sign[:, None] / self.slot_scale).astype(np.float32)
        self.slot_yscale = (1.0 / self.slot_scale).astype(np.float32)
        self._htmp = np.zeros((num_games, H, lay.U), np.float32)
        self.first_creep = (lay.H + lay.S + np.arange(2) * lay.C_side)[:, None]
        self.team_index = np.eye(n, dtype=np.float32)[np.arange(H) % n]  # [H, n]: which hero of its team
        self.own_lane = np.eye(lay.lanes, dtype=np.float32)[lay.hero_lane]  # [H, lanes]
        own = lay.ally_structs - H  # [H, S_side]: structures never move, so their positions are fixed per hero
        self.own_struct_xy = (lay.struct_x[own], lay.struct_y[own])
        self.mask = np.zeros((num_games, H, sum(self.heads)), bool)
        self.mask[:, :, NOOP] = True
        self.mask[:, :, NUM_TYPES] = True
        # Filled by observe():
        self.side_rows = np.zeros((num_games, 2, 0), np.int64)
        """[B, 2, P]: flat ([B, U]) ids of each side's heroes, structures and living creeps (in unit order, padded
        with dead ones to the most any side has: about a third of the creep slots live, so this cuts the
        creeps' and towers' work about threefold)."""
        self.de = np.zeros((num_games, 2, 0, 0), np.float32)
        """Squared distances between enemies: ``de[b, s, i, j]`` from unit ``side_rows[b, s, i]`` to unit
        ``side_rows[b, 1 - s, j]`` (so ``de[:, 1]`` is ``de[:, 0]`` transposed)."""
        self.dh = np.zeros((num_games, H, lay.U), np.float32)
        """Squared distances from every hero to every unit."""
        self.vulnerable = np.zeros((num_games, lay.U), bool)
        self.tgt_units = np.zeros((num_games, H, T), np.int64)
        self.type_mask = np.zeros((num_games, H, NUM_TYPES), bool)
        self.type_mask[:, :, NOOP] = True
        self.target_valid = np.zeros((NUM_TYPES, num_games, H, T), bool)
        """Per action type (first axis: contiguous per type), which target slots it may use (none for noop
        and move)."""
        self.tm_targeted = self.type_mask[:, :, ATTACK:].transpose(2, 0, 1)[..., None]
        """[4, B, H, 1] view of ``type_mask``: whether attack, nuke, stun, heal are allowed."""

    def _distances(self, st: State) -> tuple[np.ndarray, np.ndarray]:
        """Fill ``side_rows``, ``de`` and ``dh``; returns (sees [B, 2, P, P]: unit ``side_rows[b, s, i]`` sees the
        enemy ``side_rows[b, 1 - s, j]`` (a dead unit sees nothing), alive [B, 2, P])."""
        lay, H, B = self.lay, self.lay.H, self.B
        x, y = st.x, st.y
        creeps = st.alive[:, lay.cs].reshape(B, 2, lay.C_side)
        width = int(creeps.sum(axis=2).max())
        living = np.argsort(~creeps, axis=2, kind="stable")[:, :, :width] + self.first_creep
        rows = np.concatenate([np.broadcast_to(lay.side_fixed, (B, 2, lay.side_fixed.shape[1])), living], axis=2)
        rows += self.row_u
        self.side_rows = rows
        P = rows.shape[2]
        xs, ys = np.take(x, rows), np.take(y, rows)  # [B, 2, P]
        self.de = np.empty((B, 2, P, P), np.float32)
        e, tmp = self.de[:, 0], np.empty((B, P, P), np.float32)
        np.subtract(xs[:, 0, :, None], xs[:, 1, None, :], out=tmp)
        np.multiply(tmp, tmp, out=e)
        np.subtract(ys[:, 0, :, None], ys[:, 1, None, :], out=tmp)
        np.multiply(tmp, tmp, out=tmp)
        e += tmp
        self.de[:, 1] = e.transpose(0, 2, 1)  # (a - b)² is (b - a)² to the bit
        dh, tmp = self.dh, self._htmp
        np.subtract(x[:, :H, None], x[:, None, :], out=tmp)
        np.multiply(tmp, tmp, out=dh)
        np.subtract(y[:, :H, None], y[:, None, :], out=tmp)
        np.multiply(tmp, tmp, out=tmp)
        dh += tmp
        alive = np.take(st.alive, rows)
        sight2 = np.where(alive, np.take(lay.sight2, rows % lay.U), -np.inf)
        return np.less(self.de, sight2[..., None]), alive

    def observe(self, st: State) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(obs [B, H, obs_dim], action_mask [B, H, sum(heads)], active [B, H]) for the current state."""
        cfg, lay, H, B, T = self.cfg, self.lay, self.lay.H, self.B, self.T
        x, y = st.x, st.y
        sees, alive = self._distances(st)
        visible = np.zeros((B, lay.U), bool)
        np.put(visible, self.side_rows[:, ::-1], np.any(sees, axis=2))  # seen by a unit of the other side
        visible |= lay.is_struct
        visible &= st.alive
        vul = st.vulnerable()
        self.vulnerable = vul
        dh = self.dh

        self.present_of[:, 0] = visible
        self.present_of[:, 1] = st.alive
        # The K nearest present enemy and allied creeps of each hero (the absent last, in unit order).
        key = np.where(np.take(self.present_of, self.at_creep_present), np.take(dh, self.at_creep_d),
                       np.float32(np.inf))
        order = np.argsort(key, axis=3, kind="stable")[..., :cfg.k_creeps]
        nearest = np.take(self.creep_units, order + self.row_creep)  # [B, H, 2, K]
        tgt = self.tgt_units
        tgt[:] = self.static_units
        tgt[:, :, self.k_slots[0]] = nearest[:, :, 0]
        tgt[:, :, self.k_slots[1]] = nearest[:, :, 1]
        flat = tgt + self.row_u
        present = np.take(self.present_of, tgt + self.row_present)
        dist2 = np.take(dh, tgt + self.row_dh)
        hp = np.take(st.hp, flat)
        hpf = hp / np.take(st.max_hp, flat)
        tvul = np.take(vul, flat)

        # Masks.
        can_act = st.alive[:, :H] & (st.stun <= 0)
        tv = self.target_valid[ATTACK:]  # rows of noop and move stay False
        np.less_equal(dist2, self.ranges2[:, None, None, None], out=tv)
        tv &= present
        tv &= self.type_slots[:, None, None, :]
        deniable = hpf < cfg.deny_fraction
        hittable = np.where(self.ac, deniable, tvul)  # an allied creep only to deny it
        tv[0] &= hittable
        tm = self.type_mask
        tm[:, :, MOVE] = can_act
        tm[:, :, ATTACK:] = np.any(tv, axis=3).transpose(1, 2, 0)
        tm[:, :, ATTACK] &= st.atk_cd[:, :H] <= 0
        tm[:, :, NUKE:] &= st.ability_cd <= 0
        tm[:, :, NUKE:] &= st.mana[:, :, None] >= self.ability_cost
        tm[:, :, ATTACK:] &= can_act[:, :, None]
        mask = self.mask
        allowed = np.any(tv & self.tm_targeted, axis=0)
        allowed[:, :, 0] |= ~allowed.any(axis=2)
        mask[:, :, NUM_TYPES + NUM_DIRS:] = allowed
        mask[:, :, :NUM_TYPES] = tm
        mask[:, :, NUM_TYPES + 1:NUM_TYPES + NUM_DIRS] = can_act[:, :, None]

        # Observation.
        obs = np.empty((B, H, self.obs_dim), np.float32)
        half = cfg.map_length / 2
        o = obs[:, :, :SELF_FEATURES]
        o[..., 0] = st.alive[:, :H]
        o[..., 1] = st.hp[:, :H] / st.max_hp[:, :H]
        o[..., 2] = st.max_hp[:, :H] / 1000.0
        o[..., 3] = st.mana / st.max_mana
        o[..., 4] = st.level / cfg.max_level
        o[..., 5] = st.gold / (st.gold + 1000.0)
        o[..., 6] = (x[:, :H] - half) / half * lay.side_sign
        o[..., 7] = y[:, :H] / half
        o[..., 8] = st.atk_cd[:, :H] / cfg.hero_cooldown
        o[..., 9:12] = st.ability_cd / self.ability_cooldowns
        o[..., 12] = st.stun / cfg.stun_seconds
        o[..., 13] = st.respawn / 30.0
        o[..., 14] = st.damage[:, :H] / 100.0
        # Slot features, feature-major (all slots' feature 0, then all slots' feature 1…): contiguous writes.
        base = SELF_FEATURES
        f = [obs[:, :, base + k * T:base + (k + 1) * T] for k in range(SLOT_FEATURES)]
        pres = present.astype(np.float32)
        f[0][:] = pres
        np.multiply(hpf, pres, out=f[1])
        rel = np.take(x, flat) - x[:, :H, None]
        rel *= self.slot_xscale
        np.clip(rel, -1.5, 1.5, out=rel)
        np.multiply(rel, pres, out=f[2])
        rel = np.take(y, flat) - y[:, :H, None]
        rel *= self.slot_yscale
        np.clip(rel, -1.5, 1.5, out=rel)
        np.multiply(rel, pres, out=f[3])
        f[4][:] = tv[0]
        extra = np.where(self.ec, hp <= st.damage[:, :H, None], hittable)
        np.logical_and(extra, present, out=extra)
        f[5][:] = extra
        # Level, stun and mana of the hero slots (enemies, then allies), zero when not visible; feature-major.
        base += T * SLOT_FEATURES
        n = lay.n
        level = st.level.astype(np.float32) / cfg.max_level
        per_hero = np.stack([level, st.stun / cfg.stun_seconds, st.mana / st.max_mana], axis=1)  # [B, 3, H]
        block = obs[:, :, base:base + 2 * n * HERO_EXTRA].reshape(B, H, HERO_EXTRA, 2 * n)
        hv = pres[:, :, None, self.eh_ah]
        for side in range(2):  # the heroes of one side all list the heroes in the same order
            rows = slice(side * n, (side + 1) * n)
            np.multiply(per_hero[:, None, :, self.hero_units[side * n]], hv[:, rows], out=block[:, rows])
        base += 2 * n * HERO_EXTRA
        steps = st.step_count[:, None].astype(np.float32)
        period = cfg.wave_period / cfg.seconds_per_step
        obs[:, :, base] = steps / cfg.max_steps
        obs[:, :, base + 1] = 1.0 - (steps % period) / period
        base += TIME_FEATURES
        if cfg.observe_cooldowns:
            cooldowns = np.concatenate([st.atk_cd[:, None, :H] / cfg.hero_cooldown,
                                        (st.ability_cd / self.ability_cooldowns).transpose(0, 2, 1)], axis=1)
            block = obs[:, :, base:base + 2 * n * COOLDOWN_FEATURES].reshape(B, H, COOLDOWN_FEATURES, 2 * n)
            for side in range(2):
                rows = slice(side * n, (side + 1) * n)
                np.multiply(cooldowns[:, None, :, self.hero_units[side * n]], hv[:, rows], out=block[:, rows])
            base += 2 * n * COOLDOWN_FEATURES
        if cfg.observe_team:
            width = lay.S_side * OWN_STRUCT_FEATURES + n
            self._observe_team(st, sees, alive, obs[:, :, base:base + width])
            base += width
        if cfg.observe_lane:
            obs[:, :, base:base + lay.lanes] = self.own_lane
            np.clip((lay.own_lane_y - y[:, :H]) / cfg.lane_spacing, -1.5, 1.5, out=obs[:, :, base + lay.lanes])
        return obs, mask.copy(), can_act

    def _observe_team(self, st: State, sees: np.ndarray, alive: np.ndarray, out: np.ndarray) -> None:
        """Write the ``observe_team`` group into ``out [B, H, S_side * 5 + n]``: the hero's own structures
        (feature-major), then its one-hot index in its team."""
        lay, H, S = self.lay, self.lay.H, self.lay.S_side
        units = lay.ally_structs[None] + self.row_u  # [B, H, S] flat unit ids
        standing = np.take(st.alive, units).astype(np.float32)
        f = [out[:, :, k * S:(k + 1) * S] for k in range(OWN_STRUCT_FEATURES)]
        f[0][:] = standing
        np.multiply(np.take(st.hp, units) / np.take(st.max_hp, units), standing, out=f[1])
        length, (sx, sy) = self.cfg.map_length, self.own_struct_xy
        f[2][:] = (sx - st.x[:, :H, None]) * (lay.side_sign[:, None] / length)
        f[3][:] = (sy - st.y[:, :H, None]) / length
        # [B, S]: the living enemies each structure sees (a dead unit keeps its last position).
        threats = (sees[:, :, lay.ps, :] & alive[:, ::-1, None, :]).sum(axis=3, dtype=np.float32)
        threats = threats.reshape(-1, lay.S)
        np.minimum(threats[:, lay.ally_structs - H] / THREAT_SCALE, 1.5, out=f[4])
        out[:, :, OWN_STRUCT_FEATURES * S:] = self.team_index

"""Unit layout and the structure-of-arrays game state of B games.

Every game has the same ``U`` unit slots, in this order: heroes (side 0, then side 1), structures (per side:
for each lane the outer and inner tower, then the ancient), creeps (per side, per lane, ``creep_slots``
each). Static facts about a slot (team, kind, lane, stats) live in :class:`Layout` as ``[U]`` arrays; what
changes lives in :class:`State` as ``[B, U]`` (or ``[B, heroes]``) arrays, so every rule is a numpy
operation over all games and units at once.
"""

from __future__ import annotations

import numpy as np

from rapid.envs.moba.config import ANCIENT, CREEP, HERO, TOWER, MobaConfig


class Layout:
    """Which unit slot is what: static ``[U]`` arrays and per-hero index tables."""

    def __init__(self, cfg: MobaConfig):
        n, L, cs = cfg.heroes_per_side, cfg.lanes, cfg.creep_slots
        self.n, self.H, self.lanes = n, 2 * n, L
        self.lane_spacing = cfg.lane_spacing
        self.S_side = 2 * L + 1
        self.S = 2 * self.S_side
        self.C_side = L * cs
        self.U = self.H + self.S + 2 * self.C_side
        self.heroes = np.arange(self.H)
        self.structs = np.arange(self.H, self.H + self.S)
        self.creeps = np.arange(self.H + self.S, self.U)
        # The same three groups as slices: indexing with them gives views, not copies (speed).
        self.hs = slice(0, self.H)
        self.ss = slice(self.H, self.H + self.S)
        self.cs = slice(self.H + self.S, self.U)

        lane_y = cfg.lane_y()
        team, kind, lane = [], [], []
        sx, sy = [], []
        for s in range(2):
            team += [s] * n
            kind += [HERO] * n
            lane += [-1] * n
        for s in range(2):
            for l_ in range(L):
                for t in range(2):
                    team += [s]
                    kind += [TOWER]
                    lane += [l_]
                    sx += [self.mirror_x(cfg.tower_x[t], s, cfg)]
                    sy += [lane_y[l_]]
            team += [s]
            kind += [ANCIENT]
            lane += [-1]
            sx += [self.mirror_x(cfg.ancient_x, s, cfg)]
            sy += [0.0]
        for s in range(2):
            for l_ in range(L):
                team += [s] * cs
                kind += [CREEP] * cs
                lane += [l_] * cs
        self.team = np.array(team, dtype=np.int64)
        self.kind = np.array(kind, dtype=np.int64)
        self.lane = np.array(lane, dtype=np.int64)
        self.struct_x = np.array(sx, dtype=np.float32)
        self.struct_y = np.array(sy, dtype=np.float32)
        self.is_hero = self.kind == HERO
        self.is_struct = (self.kind == TOWER) | (self.kind == ANCIENT)
        self.is_creep = self.kind == CREEP
        self.creep_lane_y = lane_y[self.lane[self.creeps]]

        def per_kind(hero: float, tower: float, ancient: float, creep: float) -> np.ndarray:
            return np.array([hero, tower, ancient, creep], dtype=np.float32)[self.kind]

        self.sight2 = per_kind(cfg.hero_sight, cfg.tower_sight, cfg.tower_sight, cfg.creep_sight) ** 2
        self.range = per_kind(cfg.hero_range, cfg.tower_range, cfg.tower_range, cfg.creep_range)
        self.cooldown = per_kind(cfg.hero_cooldown, cfg.tower_cooldown, cfg.tower_cooldown, cfg.creep_cooldown)
        self.base_hp = per_kind(cfg.hero_hp, cfg.tower_hp, cfg.ancient_hp, cfg.creep_hp)
        self.base_damage = per_kind(cfg.hero_damage, cfg.tower_damage, cfg.tower_damage, cfg.creep_damage)
        self.enemy_pair = self.team[:, None] != self.team[None, :]

        # Per-hero tables (rows: heroes), each in the hero's own frame: allies first means its own side.
        hero_side = self.team[: self.H]
        self.hero_side = hero_side
        self.side_sign = np.where(hero_side == 0, 1.0, -1.0).astype(np.float32)
        self.hero_lane = np.arange(self.H) % n % L
        """Each hero's own lane (its index in its team, mod the lanes): where the ``lane`` bot sends it."""
        self.own_lane_y = lane_y[self.hero_lane].astype(np.float32)
        self.spawn_y = (self.own_lane_y if cfg.spawn_in_lanes else np.zeros(self.H)).astype(np.float32)
        """Where each hero (re)spawns across the map: the middle, or with ``spawn_in_lanes`` its lane."""
        side_heroes = np.arange(self.H).reshape(2, n)
        side_structs = self.structs.reshape(2, self.S_side)
        side_creeps = self.creeps.reshape(2, self.C_side)
        # Each side's units in one row, in unit order (heroes, structures, then its living creeps, see
        # Observer): distances are only ever taken between enemies, or from a hero, so the game keeps side
        # against side tables, not [U, U].
        self.side_fixed = np.concatenate([side_heroes, side_structs], axis=1)
        """[2, n + S_side]: the heroes and structures of each side's row."""
        self.ps = slice(n, n + self.S_side)
        """The structures of a side row."""
        self.ally_heroes = side_heroes[hero_side]
        self.enemy_heroes = side_heroes[1 - hero_side]
        self.ally_structs = side_structs[hero_side]
        self.enemy_structs = side_structs[1 - hero_side]
        self.ally_creeps = side_creeps[hero_side]
        self.enemy_creeps = side_creeps[1 - hero_side]
        self.ancients = np.array([self.H + self.S_side - 1, self.H + self.S - 1], dtype=np.int64)

    def away_from_own_lane(self, hero_y: np.ndarray) -> np.ndarray:
        """[B, H]: which heroes (at ``hero_y``) stand nearer another lane than their own."""
        return np.abs(hero_y - self.own_lane_y) > self.lane_spacing / 2

    @staticmethod
    def mirror_x(x_from_own_edge: float, side: int, cfg: MobaConfig) -> float:
        return x_from_own_edge if side == 0 else cfg.map_length - x_from_own_edge


class State:
    """Everything that changes during B games, as flat numpy arrays (no per-game objects)."""

    def __init__(self, cfg: MobaConfig, layout: Layout, num_games: int):
        B, U, H = num_games, layout.U, layout.H
        f32 = np.float32
        self.x = np.zeros((B, U), f32)
        self.y = np.zeros((B, U), f32)
        self.hp = np.zeros((B, U), f32)
        self.max_hp = np.zeros((B, U), f32)
        self.alive = np.zeros((B, U), bool)
        # The timers that run down every tick, as contiguous views of one buffer: a tick is one subtraction and
        # one clamp for all of them.
        self.timers = np.zeros(B * U + 6 * B * H, f32)
        self.atk_cd = self.timers[:B * U].reshape(B, U)
        self.ability_cd = self.timers[B * U:B * (U + 3 * H)].reshape(B, H, 3)
        """Remaining cooldown of nuke, stun, heal."""
        self.stun, self.aggro, self.respawn = self.timers[B * (U + 3 * H):].reshape(3, B, H)
        """Remaining stun; seconds left during which towers punish this hero for hitting an enemy hero; time to
        respawn."""
        self.damage = np.zeros((B, U), f32)
        self.mana = np.zeros((B, H), f32)
        self.max_mana = np.zeros((B, H), f32)
        self.level = np.ones((B, H), np.int64)
        self.xp = np.zeros((B, H), f32)
        self.gold = np.zeros((B, H), f32)
        self.victim = np.zeros((B, H), np.int64)
        self.step_count = np.zeros(B, np.int64)
        self.waves = np.zeros(B, np.int64)
        # Episode accumulators for EpisodeStats.
        self.returns = np.zeros((B, H), np.float64)
        self.kills = np.zeros((B, H), f32)
        self.deaths = np.zeros((B, H), f32)
        self.last_hits = np.zeros((B, H), f32)
        self.denies = np.zeros((B, H), f32)
        self.towers_destroyed = np.zeros((B, 2), f32)
        """Structures each side destroyed."""
        self.cfg, self.layout = cfg, layout

    def reset_games(self, games: np.ndarray, rng: np.random.Generator) -> None:
        """Put the games selected by bool ``games [B]`` at their start (heroes at the fountain, no creeps)."""
        cfg, lay = self.cfg, self.layout
        k = int(games.sum())
        if k == 0:
            return
        H = lay.H
        side_x = np.where(lay.hero_side == 0, cfg.fountain_x, cfg.map_length - cfg.fountain_x)
        self.x[games, :H] = side_x + rng.uniform(0.0, 2.0, (k, H)) * lay.side_sign
        self.y[games, :H] = lay.spawn_y + rng.uniform(-3.0, 3.0, (k, H))
        self.x[games, H:H + lay.S] = lay.struct_x
        self.y[games, H:H + lay.S] = lay.struct_y
        self.x[games, H + lay.S:] = 0.0
        self.y[games, H + lay.S:] = 0.0
        self.max_hp[games] = lay.base_hp
        self.hp[games] = lay.base_hp
        self.alive[games] = ~lay.is_creep
        self.atk_cd[games] = 0.0
        self.damage[games] = lay.base_damage
        for arr in (self.stun, self.xp, self.gold, self.ability_cd, self.respawn, self.aggro, self.returns,
                    self.kills, self.deaths, self.last_hits, self.denies, self.towers_destroyed):
            arr[games] = 0
        self.victim[games] = 0
        self.level[games] = 1
        self.max_mana[games] = cfg.hero_mana
        self.mana[games] = cfg.hero_mana
        self.step_count[games] = 0
        self.waves[games] = 0

    def vulnerable(self) -> np.ndarray:
        """bool [B, U]: the unit can be damaged now (structures only once the ones in front are down)."""
        lay, L = self.layout, self.layout.lanes
        vul = self.alive.copy()
        # [B, 2, S_side]: per side, each lane's outer and inner tower, then the ancient.
        structs = self.alive[:, lay.ss].reshape(-1, 2, lay.S_side)
        outer, inner = structs[:, :, 0:2 * L:2], structs[:, :, 1:2 * L:2]
        open_ = structs.copy()
        open_[:, :, 1:2 * L:2] &= ~outer
        open_[:, :, 2 * L] &= ~(inner | outer).all(axis=2)
        vul[:, lay.ss] = open_.reshape(-1, lay.S)
        return vul

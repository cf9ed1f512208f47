"""Every number of the moba game in one frozen dataclass, so a config table can override any of them.

Constructor options of :class:`~rapid.envs.moba.env.MobaVecEnv` are exactly these fields: plain scalars, so
they can live in a TOML table. Units: map units, seconds, hit points.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

NUM_TYPES = 6
"""Action types: noop, move, attack, nuke, stun, heal."""
NOOP, MOVE, ATTACK, NUKE, STUN, HEAL = range(NUM_TYPES)
NUM_DIRS = 8

HERO, TOWER, ANCIENT, CREEP = range(4)
"""Unit kinds."""


@dataclass(frozen=True)
class MobaConfig:
    """Options and constants of one moba game (the same for all B games of a vector env)."""

    # --- match shape
    heroes_per_side: int = 1
    lanes: int = 1
    max_seconds: float = 300.0
    seconds_per_step: float = 0.5
    k_creeps: int = 4
    """Nearest creeps of each side in a hero's observation and target slots."""

    # --- raw reward weights (team spirit and zero-sum mixing happen in the rollout worker)
    reward_win: float = 1.0
    """Added for a win, subtracted for a loss; nothing for a draw."""
    reward_kill: float = 0.2
    reward_death: float = -0.2
    reward_last_hit: float = 0.04
    reward_deny: float = 0.02
    reward_tower_damage: float = 0.5
    """Per full structure's worth of HP this hero dealt to enemy towers/ancient."""
    reward_tower_kill: float = 0.3
    """To every hero of the side that destroyed a tower."""
    reward_structure_hp: float = 0.0
    """Per full structure's worth of HP the enemy side lost this tick to anyone (creeps too), to every hero of
    the side: the time-limit win condition as a dense signal."""
    reward_gold: float = 0.0
    reward_xp: float = 0.0

    # --- map
    map_length: float = 100.0
    lane_spacing: float = 25.0
    tower_x: tuple[float, float] = (30.0, 16.0)
    """Distance from the own base edge of the outer (tier 1) and inner (tier 2) tower."""
    ancient_x: float = 6.0
    fountain_x: float = 1.0
    fountain_heal: float = 0.1
    """Fraction of max HP and mana regained per second within ``ancient_x`` of the own edge."""

    # --- heroes
    hero_hp: float = 500.0
    hero_hp_per_level: float = 60.0
    hero_mana: float = 200.0
    hero_mana_per_level: float = 20.0
    hero_hp_regen: float = 2.0
    hero_mana_regen: float = 2.0
    hero_damage: float = 36.0
    hero_damage_per_level: float = 4.0
    hero_damage_per_gold: float = 0.02
    """Items, abstracted: gold raises attack damage…"""
    hero_damage_gold_cap: float = 40.0
    """…by at most this much."""
    hero_range: float = 6.0
    hero_cooldown: float = 1.0
    hero_speed: float = 6.0
    hero_sight: float = 20.0
    max_level: int = 10
    xp_per_level: float = 120.0
    """Level l needs ``xp_per_level * l * (l - 1) / 2`` XP in total."""
    respawn_base: float = 4.0
    respawn_per_level: float = 2.0
    xp_radius: float = 16.0

    # --- abilities: nuke (damage an enemy), stun (damage and stun an enemy hero), heal (an ally hero)
    nuke_damage: float = 90.0
    nuke_damage_per_level: float = 15.0
    nuke_range: float = 9.0
    nuke_mana: float = 60.0
    nuke_cooldown: float = 8.0
    stun_damage: float = 40.0
    stun_seconds: float = 1.5
    stun_range: float = 7.0
    stun_mana: float = 80.0
    stun_cooldown: float = 12.0
    heal_amount: float = 150.0
    heal_range: float = 8.0
    heal_mana: float = 70.0
    heal_cooldown: float = 14.0

    # --- creeps
    wave_period: float = 30.0
    wave_size: int = 3
    creep_slots: int = 9
    """Creep slots per lane and side; a new wave reuses the oldest wave's slots."""
    creep_hp: float = 300.0
    creep_damage: float = 16.0
    creep_range: float = 2.0
    creep_cooldown: float = 1.0
    creep_speed: float = 4.0
    creep_sight: float = 12.0
    creep_aggro: float = 9.0
    creep_gold: float = 40.0
    creep_xp: float = 40.0
    deny_fraction: float = 0.5
    """An allied creep below this HP fraction may be denied."""

    # --- structures
    tower_hp: float = 1400.0
    tower_damage: float = 60.0
    tower_range: float = 10.0
    tower_cooldown: float = 1.0
    tower_sight: float = 15.0
    tower_gold: float = 150.0
    ancient_hp: float = 2500.0
    kill_gold: float = 150.0
    kill_xp: float = 100.0
    damage_jitter: float = 0.1
    """Attack damage varies uniformly by ± this fraction (the game's only randomness after reset)."""

    def __post_init__(self) -> None:
        if not 1 <= self.heroes_per_side <= 5:
            raise ValueError(f"moba: heroes_per_side must be 1..5, got {self.heroes_per_side}")
        if not 1 <= self.lanes <= 3:
            raise ValueError(f"moba: lanes must be 1..3, got {self.lanes}")
        if self.max_seconds <= 0 or self.seconds_per_step <= 0:
            raise ValueError("moba: max_seconds and seconds_per_step must be positive")
        if self.creep_slots % self.wave_size:
            raise ValueError("moba: creep_slots must be a multiple of wave_size")

    @classmethod
    def from_options(cls, **options: object) -> MobaConfig:
        """Build from keyword options, with a one-line error naming any unknown option."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"moba: unknown option(s) {', '.join(unknown)}")
        if "tower_x" in options:
            options["tower_x"] = tuple(options["tower_x"])  # type: ignore[arg-type]
        return cls(**options)  # type: ignore[arg-type]

    @property
    def max_steps(self) -> int:
        return int(round(self.max_seconds / self.seconds_per_step))

    def lane_y(self) -> np.ndarray:
        """Y coordinate of each lane: middle first, then top and bottom."""
        return np.array([0.0, self.lane_spacing, -self.lane_spacing][: self.lanes], dtype=np.float32)

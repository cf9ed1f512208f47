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
    """Heroes on each side (1..5); each hero is one agent."""
    lanes: int = 1
    """Lanes (1..3), each with its own towers and creep waves."""
    max_seconds: float = 300.0
    """Game time limit; a game cut there is won by the side whose structures keep more HP."""
    seconds_per_step: float = 0.5
    """Game time one env step covers (the env spec's seconds_per_step)."""
    k_creeps: int = 4
    """Nearest creeps of each side in a hero's observation and target slots."""
    observe_cooldowns: bool = False
    """Each hero also sees the attack and ability cooldowns of every hero it sees (enemies while visible, allies
    while alive): 4 features per hero slot, appended at the end of the observation so a run can be carried
    over by surgery (``rapid surgery``: the new columns start with zero weights)."""
    observe_team: bool = False
    """Each hero also sees its own side: per allied structure (lane towers, then the ancient) whether it stands,
    its HP, where it is and how many enemies it sees; and which hero of its team it is (one-hot). With three
    lanes a hero sees no other lane, so without these it cannot tell that its base is under attack, and heroes
    that start alike have no role to split the lanes by. Appended after every other group (surgery adds it)."""
    observe_lane: bool = False
    """Each hero also sees its own lane (hero i of a team: lane i mod ``lanes``, where the ``lane`` bot sends it and
    ``reward_off_lane`` holds it): one-hot, then how far across the map that lane lies from the hero (over
    ``lane_spacing``, at most ±1.5). Appended after every other group (surgery adds it)."""
    spawn_in_lanes: bool = False
    """Heroes start and respawn at their fountain in front of their own lane (hero i of a team: lane i mod
    ``lanes``, the lanes the ``lane`` bot gives them) instead of together in the middle. Heroes that start alike
    and act greedily (their most likely action) all walk the same way; apart, one deterministic policy can hold
    every lane."""

    # --- raw reward weights (team spirit and zero-sum mixing happen in the rollout worker)
    reward_win: float = 1.0
    """Added for a win, subtracted for a loss; nothing for a draw."""
    limit_win_share: float = 1.0
    """The share of ``reward_win`` a game decided at the time limit (on structure HP) pays and charges: below 1,
    destroying the enemy ancient is worth more than a lead when the clock runs out."""
    reward_kill: float = 0.2
    """For killing an enemy hero (last hit)."""
    reward_death: float = -0.2
    """For dying."""
    reward_last_hit: float = 0.04
    """For the last hit on an enemy creep."""
    reward_deny: float = 0.02
    """For the last hit on an allied creep (a deny)."""
    reward_tower_damage: float = 0.5
    """Per full structure's worth of HP this hero dealt to enemy towers/ancient."""
    reward_tower_kill: float = 0.3
    """To every hero of the side that destroyed a tower."""
    reward_structure_hp: float = 0.0
    """Per full structure's worth of HP the enemy side lost this tick to anyone (creeps too), to every hero of
    the side: the time-limit win condition as a dense signal."""
    reward_gold: float = 0.0
    """Per gold earned."""
    reward_xp: float = 0.0
    """Per XP earned."""
    reward_off_lane: float = 0.0
    """Per second a living hero spends away from its own lane (hero i of a team: lane i mod ``lanes``; away: nearer
    another lane) in the first ``lane_phase_s`` seconds of a game; negative, a penalty. OpenAI Five assigned its
    heroes to lanes the same way early in the game: heroes that share one policy split the lanes by their index
    instead of all walking the way the policy's most likely action leads."""
    lane_phase_s: float = 120.0
    """How long into a game ``reward_off_lane`` applies."""

    # --- map
    map_length: float = 100.0
    """Length of a lane, from one side's base edge to the other's."""
    lane_spacing: float = 25.0
    """Distance between neighbouring lanes."""
    tower_x: tuple[float, float] = (30.0, 16.0)
    """Distance from the own base edge of the outer (tier 1) and inner (tier 2) tower."""
    ancient_x: float = 6.0
    """Distance of the ancient from the own base edge; the fountain heals within it."""
    fountain_x: float = 1.0
    """Distance from the own base edge where heroes spawn and respawn."""
    fountain_heal: float = 0.1
    """Fraction of max HP and mana regained per second within ``ancient_x`` of the own edge."""

    # --- heroes
    hero_hp: float = 500.0
    """Hero max HP at level 1…"""
    hero_hp_per_level: float = 60.0
    """…plus this per level above 1."""
    hero_mana: float = 200.0
    """Hero max mana at level 1…"""
    hero_mana_per_level: float = 20.0
    """…plus this per level above 1."""
    hero_hp_regen: float = 2.0
    """HP regained per second."""
    hero_mana_regen: float = 2.0
    """Mana regained per second."""
    hero_damage: float = 36.0
    """Hero attack damage at level 1…"""
    hero_damage_per_level: float = 4.0
    """…plus this per level above 1."""
    hero_damage_per_gold: float = 0.02
    """Items, abstracted: gold raises attack damage…"""
    hero_damage_gold_cap: float = 40.0
    """…by at most this much."""
    hero_range: float = 6.0
    """Hero attack range."""
    hero_cooldown: float = 1.0
    """Seconds between a hero's attacks."""
    hero_speed: float = 6.0
    """Hero move speed, map units per second."""
    hero_sight: float = 20.0
    """How far a hero sees (units beyond are hidden from its side)."""
    max_level: int = 10
    """Highest hero level."""
    xp_per_level: float = 120.0
    """Level l needs ``xp_per_level * l * (l - 1) / 2`` XP in total."""
    respawn_base: float = 4.0
    """Seconds a dead hero waits to respawn…"""
    respawn_per_level: float = 2.0
    """…plus this per level."""
    xp_radius: float = 16.0
    """Heroes within this distance of a dying enemy unit share its XP."""

    # --- abilities: nuke (damage an enemy), stun (damage and stun an enemy hero), heal (an ally hero)
    nuke_damage: float = 90.0
    """Nuke damage at level 1…"""
    nuke_damage_per_level: float = 15.0
    """…plus this per level above 1."""
    nuke_range: float = 9.0
    """Nuke cast range."""
    nuke_mana: float = 60.0
    """Nuke mana cost."""
    nuke_cooldown: float = 8.0
    """Seconds before the nuke can be cast again."""
    stun_damage: float = 40.0
    """Stun damage."""
    stun_seconds: float = 1.5
    """How long a stunned hero cannot act."""
    stun_range: float = 7.0
    """Stun cast range."""
    stun_mana: float = 80.0
    """Stun mana cost."""
    stun_cooldown: float = 12.0
    """Seconds before the stun can be cast again."""
    heal_amount: float = 150.0
    """HP a heal restores."""
    heal_range: float = 8.0
    """Heal cast range."""
    heal_mana: float = 70.0
    """Heal mana cost."""
    heal_cooldown: float = 14.0
    """Seconds before the heal can be cast again."""

    # --- creeps
    wave_period: float = 30.0
    """Seconds between creep waves."""
    wave_size: int = 3
    """Creeps per wave, per lane and side."""
    creep_slots: int = 9
    """Creep slots per lane and side; a new wave reuses the oldest wave's slots."""
    creep_hp: float = 300.0
    """Creep max HP."""
    creep_damage: float = 16.0
    """Creep attack damage."""
    creep_range: float = 2.0
    """Creep attack range."""
    creep_cooldown: float = 1.0
    """Seconds between a creep's attacks."""
    creep_speed: float = 4.0
    """Creep move speed, map units per second."""
    creep_sight: float = 12.0
    """How far a creep sees."""
    creep_aggro: float = 9.0
    """Creeps attack the nearest enemy within this distance, heroes last."""
    creep_gold: float = 40.0
    """Gold for the last hit on an enemy creep."""
    creep_xp: float = 40.0
    """XP an enemy creep's death gives the heroes near it."""
    deny_fraction: float = 0.5
    """An allied creep below this HP fraction may be denied."""

    # --- structures
    tower_hp: float = 1400.0
    """Tower max HP."""
    tower_damage: float = 60.0
    """Tower attack damage."""
    tower_range: float = 10.0
    """Tower attack range."""
    tower_cooldown: float = 1.0
    """Seconds between a tower's attacks."""
    tower_sight: float = 15.0
    """How far a tower (and the ancient) sees."""
    tower_gold: float = 150.0
    """Gold to every hero of the side that destroys a structure."""
    ancient_hp: float = 2500.0
    """Ancient max HP; the game ends when an ancient falls."""
    kill_gold: float = 150.0
    """Gold for killing an enemy hero."""
    kill_xp: float = 100.0
    """XP an enemy hero's death gives the heroes near it."""
    damage_jitter: float = 0.1
    """Attack damage varies uniformly by ± this fraction (the game's only randomness after reset)."""

    def __post_init__(self) -> None:
        if not 1 <= self.heroes_per_side <= 5:
            raise ValueError(f"moba: heroes_per_side must be 1..5, got {self.heroes_per_side}")
        if not 1 <= self.lanes <= 3:
            raise ValueError(f"moba: lanes must be 1..3, got {self.lanes}")
        if self.max_seconds <= 0 or self.seconds_per_step <= 0:
            raise ValueError("moba: max_seconds and seconds_per_step must be positive")
        if not 0.0 <= self.limit_win_share <= 1.0:
            raise ValueError(f"moba: limit_win_share must be in [0, 1], got {self.limit_win_share}")
        if self.reward_off_lane > 0.0:
            raise ValueError(f"moba: reward_off_lane is a penalty: zero or negative, got {self.reward_off_lane}")
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

    def in_lane_phase(self, step_count: np.ndarray) -> np.ndarray:
        """Which games ([B] steps played) are still in their first ``lane_phase_s`` seconds."""
        return step_count * self.seconds_per_step <= self.lane_phase_s

    def lane_y(self) -> np.ndarray:
        """Y coordinate of each lane: middle first, then top and bottom."""
        return np.array([0.0, self.lane_spacing, -self.lane_spacing][: self.lanes], dtype=np.float32)

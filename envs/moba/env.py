"""``MobaVecEnv``: B moba games stepped together through the vectorized multi-agent interface."""

from __future__ import annotations

import numpy as np

from rapid.envs.base import EnvSpec, EpisodeStats, ScriptedBot, StepResult, VecMultiAgentEnv
from rapid.envs.moba.bots import make_bot
from rapid.envs.moba.config import MOVE, NOOP, MobaConfig
from rapid.envs.moba.observe import Observer
from rapid.envs.moba.rules import Events, Rules
from rapid.envs.moba.state import Layout, State


class MobaVecEnv(VecMultiAgentEnv):
    """A Dota-style lane battle, ``num_games`` at once; options are :class:`MobaConfig` fields.

    Agents are the heroes: ``0..n-1`` play side 0, ``n..2n-1`` side 1. Actions are ``[type, direction,
    target slot]`` per hero (see :mod:`rapid.envs.moba.observe` for the slots). A game ends when an ancient
    falls (terminated) or at ``max_seconds`` (truncated; the side whose structures keep more HP wins, equal
    is a draw); it then resets on the same step.
    """

    def __init__(self, num_games: int = 1, seed: int = 0, **options: object):
        self.cfg = MobaConfig.from_options(**options)
        self.num_games = int(num_games)
        self.layout = Layout(self.cfg)
        self.state = State(self.cfg, self.layout, self.num_games)
        self.rules = Rules(self.cfg, self.layout, self.num_games)
        self.observer = Observer(self.cfg, self.layout, self.num_games)
        n = self.cfg.heroes_per_side
        self.spec = EnvSpec(
            name="moba",
            num_agents=2 * n,
            obs_dim=self.observer.obs_dim,
            action_heads=self.observer.heads,
            side_of_agent=tuple([0] * n + [1] * n),
            agent_names=tuple(f"side{s}_hero{i}" for s in range(2) for i in range(n)),
            seconds_per_step=self.cfg.seconds_per_step,
            clock_in_obs=True,  # the time-limit win is part of the game, and the observation shows the time
        )
        self._seed = seed
        self.rng = np.random.default_rng(seed)
        self._last = np.array(self.observer.heads) - 1
        self._row = np.arange(self.num_games * 2 * n).reshape(self.num_games, 2 * n)

    # ------------------------------------------------------------------ interface
    def reset(self, seed: int | None = None) -> StepResult:
        if seed is not None:
            self._seed = seed
        self.rng = np.random.default_rng(self._seed)
        self.state.reset_games(np.ones(self.num_games, bool), self.rng)
        self.rules.spawn_waves(self.state)
        zeros = np.zeros(self.num_games, bool)
        return self._result(np.zeros((self.num_games, self.layout.H), np.float32), zeros, zeros, [])

    def step(self, actions: np.ndarray) -> StepResult:
        cfg, st, lay, ob, ru = self.cfg, self.state, self.layout, self.observer, self.rules
        B, H = self.num_games, lay.H
        actions = np.minimum(np.maximum(np.asarray(actions, dtype=np.int64).reshape(B, H, 3), 0), self._last)
        atype, adir, aslot = actions[..., 0], actions[..., 1], actions[..., 2]
        # Validate against what the hero was allowed when it chose; anything else is a no-op.
        row = self._row
        ok = np.take(ob.type_mask, row * ob.heads[0] + atype)
        slot_ok = np.take(ob.target_valid, (atype * (B * H) + row) * ob.heads[2] + aslot)
        ok &= (atype <= MOVE) | slot_ok
        etype = np.where(ok, atype, NOOP)
        tgt = np.take(ob.tgt_units, row * ob.heads[2] + aslot)
        before = self._structure_hp() if cfg.reward_structure_hp else None
        jitter = 1.0 + cfg.damage_jitter * (2.0 * self.rng.random((B, lay.U), dtype=np.float32) - 1.0)

        died_h, killer, tower_dmg = ru.heroes_act(st, etype, tgt, jitter)
        died = ru.units_act(st, ob.de, ob.side_rows, ob.vulnerable, jitter)
        ru.move_heroes(st, etype, adir)
        ev = ru.settle_deaths(st, died, died_h, killer, tower_dmg, ob.dh)
        ru.tick_timers(st)
        st.step_count += 1

        rewards = self._rewards(ev)
        if before is not None:
            # Structure HP the enemy side lost this tick (to anyone: heroes, creeps), to every hero of a side.
            lost = before - self._structure_hp()
            rewards += cfg.reward_structure_hp * lost[:, 1 - lay.hero_side]
        anc_alive = st.alive[:, lay.ancients]
        terminated = ~np.all(anc_alive, axis=1)
        truncated = ~terminated & (st.step_count >= cfg.max_steps)
        done = terminated | truncated
        winner = np.full(B, -1, np.int64)
        if done.any():
            winner = self._winner(anc_alive, terminated)
            won = (winner[:, None] == lay.hero_side) & done[:, None]
            lost = (winner[:, None] == 1 - lay.hero_side) & done[:, None]
            pay = cfg.reward_win * np.where(truncated, cfg.limit_win_share, 1.0).astype(np.float32)[:, None]
            rewards += pay * (won.astype(np.float32) - lost.astype(np.float32))
        st.returns += rewards
        episodes = self._finish(done, winner, truncated) if done.any() else []
        st.reset_games(done, self.rng)
        ru.spawn_waves(st)
        return self._result(rewards, terminated, truncated, episodes)

    def bot_names(self) -> tuple[str, ...]:
        return ("random", "idle", "lane", "focus", "push")

    def make_bot(self, name: str, seed: int = 0) -> ScriptedBot:
        return make_bot(self, name, seed)

    def observe_now(self) -> StepResult:
        """Recompute observations and masks after the state arrays were edited by hand (tests, scenarios)."""
        zeros = np.zeros(self.num_games, bool)
        return self._result(np.zeros((self.num_games, self.layout.H), np.float32), zeros, zeros, [])

    # ------------------------------------------------------------------ helpers
    def _result(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                episodes: list[EpisodeStats]) -> StepResult:
        obs, mask, active = self.observer.observe(self.state)
        return StepResult(obs, mask, rewards.astype(np.float32), terminated, truncated, active, episodes)

    def _rewards(self, ev: Events) -> np.ndarray:
        cfg, side = self.cfg, self.layout.hero_side
        r = (cfg.reward_kill * ev.kills + cfg.reward_death * ev.deaths + cfg.reward_last_hit * ev.last_hits
             + cfg.reward_deny * ev.denies + cfg.reward_tower_damage * ev.tower_damage
             + cfg.reward_tower_kill * ev.structures_destroyed[:, side] + cfg.reward_gold * ev.gold
             + cfg.reward_xp * ev.xp)
        st = self.state
        if cfg.reward_off_lane:
            H = self.layout.H
            charged = cfg.in_lane_phase(st.step_count)[:, None] & self.layout.away_from_own_lane(st.y[:, :H])
            r += cfg.reward_off_lane * cfg.seconds_per_step * (charged & st.alive[:, :H])
        st.kills += ev.kills
        st.deaths += ev.deaths
        st.last_hits += ev.last_hits
        st.denies += ev.denies
        st.towers_destroyed += ev.structures_destroyed
        return r.astype(np.float32)

    def _structure_hp(self) -> np.ndarray:
        """[B, 2]: each side's structure HP as a sum of fractions (what decides a game at the time limit)."""
        st, lay = self.state, self.layout
        frac = np.where(st.alive[:, lay.ss], st.hp[:, lay.ss] / st.max_hp[:, lay.ss], 0.0)
        return frac.reshape(self.num_games, 2, lay.S_side).sum(axis=2)

    def _winner(self, anc_alive: np.ndarray, terminated: np.ndarray) -> np.ndarray:
        """Winner per game: the side with the standing ancient, else more structure HP (ties draw)."""
        st, lay = self.state, self.layout
        frac = np.where(st.alive[:, lay.structs], st.hp[:, lay.structs] / st.max_hp[:, lay.structs], 0.0)
        score = frac.reshape(self.num_games, 2, lay.S_side).sum(axis=2)
        by_hp = np.where(score[:, 0] > score[:, 1] + 1e-6, 0, np.where(score[:, 1] > score[:, 0] + 1e-6, 1, -1))
        only0, only1 = anc_alive[:, 0] & ~anc_alive[:, 1], anc_alive[:, 1] & ~anc_alive[:, 0]
        by_ancient = np.where(only0, 0, np.where(only1, 1, -1))
        return np.where(terminated, by_ancient, by_hp)

    def _finish(self, done: np.ndarray, winner: np.ndarray, truncated: np.ndarray) -> list[EpisodeStats]:
        """EpisodeStats of the games that ended (a loop over finished games only, not over all)."""
        st, n = self.state, self.cfg.heroes_per_side
        out = []
        for b in np.flatnonzero(done):
            ret = st.returns[b].reshape(2, n).sum(axis=1)
            info: dict[str, float] = {"seconds": float(st.step_count[b] * self.cfg.seconds_per_step)}
            for name, arr in (("kills", st.kills), ("deaths", st.deaths), ("last_hits", st.last_hits),
                              ("denies", st.denies)):
                per_side = arr[b].reshape(2, n).sum(axis=1)
                info[f"{name}_0"], info[f"{name}_1"] = float(per_side[0]), float(per_side[1])
            info["towers_destroyed_0"] = float(st.towers_destroyed[b, 0])
            info["towers_destroyed_1"] = float(st.towers_destroyed[b, 1])
            info["gold_0"], info["gold_1"] = (float(v) for v in st.gold[b].reshape(2, n).sum(axis=1))
            out.append(EpisodeStats(game=int(b), winner=int(winner[b]), length=int(st.step_count[b]),
                                    side_returns=(float(ret[0]), float(ret[1])), truncated=bool(truncated[b]),
                                    info=info))
        return out

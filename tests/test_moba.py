"""The moba game: rules (scenarios built by editing state arrays), masks, determinism, auto-reset,
PettingZoo API, bot strength ordering, rendering."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test
from PIL import Image

from rapid.agents.replay import write_replay
from rapid.envs.base import head_offsets
from rapid.envs.moba import MobaVecEnv
from rapid.envs.moba.config import ATTACK, HEAL, NOOP, NUKE, STUN
from rapid.envs.moba.pz import MobaParallelEnv
from rapid.envs.moba.render import render_frame, write_gif
from rapid.run.config_files import load_config
from rapid.run.matches import play_match
from tests.helpers import rapid


def empty_lane(env: MobaVecEnv) -> None:
    """No creeps anywhere, heroes at full HP: a blank board for a scenario."""
    st, lay = env.state, env.layout
    st.alive[:, lay.cs] = False
    st.hp[:, lay.cs] = 0.0
    st.step_count[:] = 1  # away from a wave spawn tick


def slot_of(env: MobaVecEnv, game: int, hero: int, unit: int) -> int:
    slots = np.flatnonzero(env.observer.tgt_units[game, hero] == unit)
    assert slots.size, f"unit {unit} is in no target slot of hero {hero}"
    return int(slots[0])


def act(env: MobaVecEnv, **per_hero: tuple[int, int, int]) -> np.ndarray:
    """Actions with every hero idle except ``h<i>=(type, dir, slot)``."""
    a = np.zeros((env.num_games, env.spec.num_agents, 3), np.int64)
    for key, triple in per_hero.items():
        a[:, int(key[1:])] = triple
    return a


def make(**options: object) -> MobaVecEnv:
    env = MobaVecEnv(num_games=1, seed=0, damage_jitter=0.0, **options)
    env.reset()
    empty_lane(env)
    return env


def test_spec_and_options() -> None:
    env = MobaVecEnv(num_games=2, seed=0, heroes_per_side=5)
    assert env.spec.num_agents == 10 and env.spec.side_of_agent == (0,) * 5 + (1,) * 5
    assert env.spec.seconds_per_step == 0.5 and env.spec.action_heads[:2] == (6, 8)
    assert env.spec.clock_in_obs, "the time limit decides a moba game, and its observation shows the time"
    step = env.reset()
    assert step.obs.shape == (2, 10, env.spec.obs_dim) and step.obs.dtype == np.float32
    assert step.action_mask.shape == (2, 10, env.spec.mask_dim)
    assert np.abs(step.obs).max() <= 1.5
    with pytest.raises(ValueError, match="unknown option"):
        MobaVecEnv(num_games=1, bogus=1)
    with pytest.raises(ValueError, match="heroes_per_side"):
        MobaVecEnv(num_games=1, heroes_per_side=6)


def test_last_hit_gives_gold() -> None:
    env = make()
    st, lay = env.state, env.layout
    creep = lay.creeps[lay.team[lay.creeps] == 1][0]
    st.x[0, 0], st.y[0, 0] = 50.0, 0.0
    st.alive[0, creep], st.hp[0, creep], st.x[0, creep], st.y[0, creep] = True, 10.0, 54.0, 0.0
    env.observe_now()
    step = env.step(act(env, h0=(ATTACK, 0, slot_of(env, 0, 0, creep))))
    assert not st.alive[0, creep]
    assert st.gold[0, 0] == env.cfg.creep_gold and st.last_hits[0, 0] == 1
    assert step.rewards[0, 0] == pytest.approx(env.cfg.reward_last_hit)


def test_deny_gives_no_gold() -> None:
    env = make()
    st, lay = env.state, env.layout
    creep = lay.creeps[lay.team[lay.creeps] == 0][0]
    st.x[0, 0] = 50.0
    st.alive[0, creep], st.hp[0, creep], st.x[0, creep], st.y[0, creep] = True, 10.0, 53.0, 0.0
    env.observe_now()
    env.step(act(env, h0=(ATTACK, 0, slot_of(env, 0, 0, creep))))
    assert not st.alive[0, creep] and st.denies[0, 0] == 1 and st.gold[0, 0] == 0


@pytest.mark.parametrize("hero_attacks", [False, True])
def test_tower_switches_to_hero_attacking_an_allied_hero(hero_attacks: bool) -> None:
    env = make()
    st, lay, cfg = env.state, env.layout, env.cfg
    tower = lay.ally_structs[0][0]  # side 0's outer tower
    creep = lay.creeps[lay.team[lay.creeps] == 1][0]
    st.x[0, 0], st.x[0, 1] = st.x[0, tower] - 2, st.x[0, tower] + 3  # victim and attacker under the tower
    st.y[0, :2] = 0.0
    st.alive[0, creep], st.hp[0, creep], st.x[0, creep], st.y[0, creep] = True, 300.0, st.x[0, tower] + 5, 4.0
    env.observe_now()
    a = act(env, h1=(ATTACK, 0, slot_of(env, 0, 1, 0))) if hero_attacks else act(env)
    env.step(a)
    hit_hero = st.hp[0, 1] < cfg.hero_hp
    assert hit_hero == hero_attacks
    assert (st.hp[0, creep] == cfg.creep_hp) == hero_attacks  # otherwise the tower prefers the creep


def test_dead_hero_respawns_after_timer() -> None:
    env = make()
    st, lay, cfg = env.state, env.layout, env.cfg
    tower = lay.enemy_structs[0][0]
    st.x[0, 0], st.y[0, 0], st.hp[0, 0] = st.x[0, tower] - 3, 0.0, 1.0
    env.observe_now()
    step = env.step(act(env))
    assert not step.active[0, 0] and not st.alive[0, 0] and st.deaths[0, 0] == 1
    assert step.rewards[0, 0] == pytest.approx(cfg.reward_death)
    assert step.action_mask[0, 0, head_offsets(env.spec.action_heads)[0] + NOOP]
    wait = int(np.ceil((cfg.respawn_base + cfg.respawn_per_level) / cfg.seconds_per_step))
    for _ in range(wait - 2):
        step = env.step(act(env))
        assert not step.active[0, 0]
    for _ in range(2):
        step = env.step(act(env))
    assert step.active[0, 0] and st.hp[0, 0] == st.max_hp[0, 0]
    assert abs(st.x[0, 0] - cfg.fountain_x) < 1.0


def test_game_ends_when_ancient_falls() -> None:
    env = make()
    st, lay = env.state, env.layout
    enemy = lay.enemy_structs[0]
    st.alive[0, enemy[:-1]], st.hp[0, enemy[:-1]] = False, 0.0
    ancient = enemy[-1]
    st.hp[0, ancient] = 5.0
    st.x[0, 0], st.y[0, 0] = st.x[0, ancient] - 4, 0.0
    env.observe_now()
    step = env.step(act(env, h0=(ATTACK, 0, slot_of(env, 0, 0, ancient))))
    assert step.terminated[0] and not step.truncated[0]
    (ep,) = step.episodes
    assert ep.winner == 0 and ep.info["towers_destroyed_0"] == 1.0  # the towers were removed by hand
    assert step.rewards[0, 0] > 0.9 and step.rewards[0, 1] < -0.9
    assert st.alive[0, ancient] and st.step_count[0] == 0  # reset on the same step


def test_masks_only_allow_targets_in_range() -> None:
    env = MobaVecEnv(num_games=16, seed=3, heroes_per_side=3)
    cfg, lay, ob = env.cfg, env.layout, env.observer
    step = env.reset()
    bot = env.make_bot("random", 0)
    off = head_offsets(env.spec.action_heads)
    reach = {ATTACK: cfg.hero_range, NUKE: cfg.nuke_range, STUN: cfg.stun_range, HEAL: cfg.heal_range}
    allowed_any = 0
    for _ in range(120):
        st = env.state
        tgt = ob.tgt_units
        dist = np.hypot(np.take_along_axis(st.x, tgt.reshape(16, -1), 1).reshape(tgt.shape) - st.x[:, :lay.H, None],
                        np.take_along_axis(st.y, tgt.reshape(16, -1), 1).reshape(tgt.shape) - st.y[:, :lay.H, None])
        type_mask = step.action_mask[:, :, off[0]:off[1]]
        target_mask = step.action_mask[:, :, off[2]:]
        within = np.zeros_like(target_mask)
        for t, r in reach.items():
            ok = ob.target_valid[t] & type_mask[:, :, t, None]
            assert (dist[ok] <= r + 1e-4).all(), f"type {t} allows a target out of range"
            within |= ok
        real = target_mask & type_mask[:, :, ATTACK:HEAL + 1].any(axis=2)[..., None]
        assert (real <= within).all()
        assert all(step.action_mask[:, :, o:o + n].any(axis=2).all() for o, n in zip(off, env.spec.action_heads))
        allowed_any += int(within.sum())
        step = env.step(bot.act(step))
    assert allowed_any > 0


@pytest.mark.parametrize("heroes,lanes", [(1, 1), (3, 3)])
def test_sides_see_mirrored_views(heroes: int, lanes: int) -> None:
    """A mirror-symmetric game gives both sides identical observations and masks, and stays symmetric."""
    env = MobaVecEnv(num_games=1, seed=0, heroes_per_side=heroes, lanes=lanes, damage_jitter=0.0)
    env.reset()
    st, n = env.state, heroes
    st.x[0, :n] = 20.0 + 7.0 * np.arange(n)
    st.x[0, n:2 * n] = env.cfg.map_length - st.x[0, :n]
    st.y[0, :2 * n] = np.tile(2.0 * np.arange(n), 2)
    step = env.observe_now()
    bot = env.make_bot("lane")
    for _ in range(150):
        np.testing.assert_allclose(step.obs[0, :n], step.obs[0, n:], atol=1e-4)  # x and L - x round apart
        assert np.array_equal(step.action_mask[0, :n], step.action_mask[0, n:])
        step = env.step(bot.act(step))


def test_deterministic_under_seed() -> None:
    def run(seed: int) -> tuple[np.ndarray, np.ndarray]:
        env = MobaVecEnv(num_games=4, seed=seed, heroes_per_side=2)
        step, bot = env.reset(), env.make_bot("random", 7)
        obs, rew = [], []
        for _ in range(80):
            step = env.step(bot.act(step))
            obs.append(step.obs)
            rew.append(step.rewards)
        return np.stack(obs), np.stack(rew)

    a, b, c = run(1), run(1), run(2)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


def test_a_win_at_the_time_limit_pays_its_share_of_reward_win() -> None:
    zero = dict(reward_kill=0.0, reward_death=0.0, reward_last_hit=0.0, reward_deny=0.0, reward_tower_damage=0.0,
                reward_tower_kill=0.0)
    env = MobaVecEnv(num_games=2, seed=0, max_seconds=5.0, reward_win=2.0, limit_win_share=0.25, **zero)
    env.reset()
    st, lay = env.state, env.layout
    st.alive[0, lay.ancients[1]] = False  # game 0: side 0 destroys the enemy ancient on the next step
    step = env.step(act(env))
    assert step.terminated[0] and step.rewards[0].tolist() == [2.0, -2.0]
    tower = lay.enemy_structs[0][0]
    st.hp[1, tower] = 1.0  # game 1: side 0 leads on structure HP when the clock runs out
    for _ in range(env.cfg.max_steps - 1):
        step = env.step(act(env))
    assert step.truncated[1] and step.episodes[0].winner == 0
    assert step.rewards[1].tolist() == [0.5, -0.5]
    with pytest.raises(ValueError, match="limit_win_share"):
        MobaVecEnv(limit_win_share=1.5)


def test_auto_reset_only_finished_games() -> None:
    env = MobaVecEnv(num_games=3, seed=0, max_seconds=5.0)
    step = env.reset()
    st, lay = env.state, env.layout
    st.alive[1, lay.ancients[1]] = False  # game 1 ends on the next step
    step = env.step(act(env))
    assert step.terminated.tolist() == [False, True, False]
    assert [e.game for e in step.episodes] == [1]
    assert st.step_count.tolist() == [1, 0, 1] and st.alive[1, lay.ancients[1]]
    for _ in range(env.cfg.max_steps - 1):
        step = env.step(act(env))
    assert step.truncated.tolist() == [True, False, True]
    assert sorted(e.game for e in step.episodes) == [0, 2]
    assert all(e.truncated and e.length == env.cfg.max_steps for e in step.episodes)
    assert all(isinstance(v, float) for e in step.episodes for v in e.info.values())


def test_pettingzoo_api_and_seed() -> None:
    parallel_api_test(MobaParallelEnv(heroes_per_side=2, max_seconds=60.0), num_cycles=300)
    parallel_seed_test(lambda: MobaParallelEnv(heroes_per_side=1, max_seconds=30.0), num_cycles=100)


def win_rate(name0: str, name1: str, games: int, seed: int = 0) -> float:
    """Fraction of games side 0 (bot name0) wins against name1, one game per slot."""
    env = MobaVecEnv(num_games=games, seed=seed)
    step = env.reset()
    p0, p1 = env.make_bot(name0, 1), env.make_bot(name1, 2)
    side0 = (np.asarray(env.spec.side_of_agent) == 0)[None, :, None]
    winners: dict[int, int] = {}
    while len(winners) < games:
        step = env.step(np.where(side0, p0.act(step), p1.act(step)))
        for ep in step.episodes:
            winners.setdefault(ep.game, ep.winner)
    return float(np.mean([w == 0 for w in winners.values()]))


def test_bot_strength_ordering() -> None:
    env = MobaVecEnv(num_games=1)
    assert env.bot_names() == ("random", "idle", "lane", "focus", "push")
    with pytest.raises(KeyError):
        env.make_bot("nope")
    assert win_rate("lane", "random", 100) >= 0.95
    assert win_rate("lane", "idle", 40, seed=1) >= 0.95


def test_render_image_gif_and_replay(tmp_path) -> None:
    env = MobaVecEnv(num_games=2, seed=0, heroes_per_side=2, lanes=3)
    step = env.reset()
    bot = env.make_bot("lane")
    frames = []
    for _ in range(5):
        step = env.step(bot.act(step))
        frames.append(render_frame(env, 1))
    img = frames[-1]
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3 and img.std() > 0
    path = write_gif(frames, tmp_path / "a.gif")
    assert Image.open(path).n_frames == 5
    class Idle:
        def act(self, step):
            return np.zeros(step.action_mask.shape[:2] + (3,), np.int64)

    stats = write_replay({"heroes_per_side": 1}, ("lane", Idle()), tmp_path / "r.gif", seed=1, max_steps=20)
    assert stats is None and Image.open(tmp_path / "r.gif").n_frames > 1
    pz = MobaParallelEnv(render_mode="rgb_array")
    pz.reset(seed=0)
    assert pz.render().shape[2] == 3


def test_heal_and_stun_masks() -> None:
    env = make()
    st = env.state
    st.mana[0, 0] = 0.0
    step = env.observe_now()
    assert not step.action_mask[0, 0, HEAL] and not step.action_mask[0, 0, STUN]
    st.mana[0, 0] = 200.0
    st.hp[0, 0] = 100.0
    step = env.observe_now()
    assert step.action_mask[0, 0, HEAL]
    env.step(act(env, h0=(HEAL, 0, slot_of(env, 0, 0, 0))))
    assert st.hp[0, 0] > 100.0 + env.cfg.heal_amount - 1


def test_a_match_counts_games_cut_at_the_time_limit_and_wins_before_it() -> None:
    """Three laners against idle heroes destroy the base in about two minutes; in 30 s nobody can."""
    short = MobaVecEnv(num_games=6, seed=0, max_seconds=30.0)
    cut = play_match(short, short.make_bot("lane"), short.make_bot("idle"), 6)
    assert (cut.at_limit, cut.wins_before_limit) == (6, 0) and "6 reached the time limit" in cut.line("a", "b")
    long = MobaVecEnv(num_games=6, seed=0, heroes_per_side=3, max_seconds=360.0)
    pushed = play_match(long, long.make_bot("lane"), long.make_bot("idle"), 6)
    assert (pushed.wins, pushed.at_limit, pushed.wins_before_limit) == (6, 0, 6)
    assert "time limit" not in pushed.line("a", "b")


def test_a_match_hands_each_counted_game_to_on_episode_with_the_side_a_played() -> None:
    """Three laners against idle heroes: on whichever side A played, A's towers_destroyed is the larger, and
    A plays each side in half the games."""
    env = MobaVecEnv(num_games=4, seed=0, heroes_per_side=3, max_seconds=360.0)
    seen = []
    play_match(env, env.make_bot("lane"), env.make_bot("idle"), 6,
               on_episode=lambda ep, side: seen.append((side, ep.info["towers_destroyed_0"],
                                                        ep.info["towers_destroyed_1"])))
    assert sorted(side for side, _, _ in seen) == [0, 0, 0, 1, 1, 1]
    for side, destroyed_0, destroyed_1 in seen:
        a, b = (destroyed_0, destroyed_1) if side == 0 else (destroyed_1, destroyed_0)
        assert a >= 3 and b == 0


def test_the_shipped_1v1_game_can_be_won_by_destroying_the_base() -> None:
    """A lone hero can bring down the structures of configs/moba-1v1.toml within its time limit: `lane` against
    an idle hero destroys the base in every game, so a trained policy can too (at the game's default structure
    HP it was cut at the limit in nearly every game)."""
    options = load_config("configs/moba-1v1.toml", []).env.options
    env = MobaVecEnv(num_games=8, seed=0, **options)
    score = play_match(env, env.make_bot("lane"), env.make_bot("idle"), 8)
    assert (score.wins, score.wins_before_limit) == (8, 8), score.line("lane", "idle")


def test_replay_command_draws_every_kth_step_and_says_how_the_game_ended(tmp_path) -> None:
    """`rapid replay` keeps a long game's GIF small with --frame-every and reports a time-limit win as such."""
    out = tmp_path / "lane-vs-idle.gif"
    said = rapid("replay", "lane", "idle", "--out", str(out), "--frame-every", "50", "--fps", "4").stdout
    frames = Image.open(out).n_frames
    limit = MobaVecEnv(num_games=1).cfg.max_steps  # the default game: its structures outlast a lone pusher
    assert "won by lane at the time limit" in said and f"after {limit} steps" in said, said
    # The first picture, every 50th step, then the outcome (its repeats merge into one longer GIF frame).
    assert frames == 1 + (limit - 1) // 50 + 1, frames

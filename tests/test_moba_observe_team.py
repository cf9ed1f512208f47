"""Issue 22: the moba game's ``observe_team`` option shows each hero its own side (its structures, and which hero
of its team it is), appended after every other column, and changes nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from rapid.envs.moba import MobaVecEnv
from rapid.envs.moba.observe import OWN_STRUCT_FEATURES, THREAT_SCALE


@pytest.mark.parametrize(("heroes", "lanes", "cooldowns"), [(1, 1, False), (5, 3, False), (3, 1, True)])
def test_the_option_appends_columns_and_leaves_the_game_and_the_old_columns_alone(heroes, lanes, cooldowns):
    plain = MobaVecEnv(num_games=6, seed=3, heroes_per_side=heroes, lanes=lanes, observe_cooldowns=cooldowns)
    seeing = MobaVecEnv(num_games=6, seed=3, heroes_per_side=heroes, lanes=lanes, observe_cooldowns=cooldowns,
                        observe_team=True)
    old_dim, structs = plain.spec.obs_dim, 2 * lanes + 1
    assert seeing.spec.obs_dim == old_dim + structs * OWN_STRUCT_FEATURES + heroes
    assert seeing.spec.action_heads == plain.spec.action_heads
    a, b = plain.reset(), seeing.reset()
    bot = plain.make_bot("lane")
    hp_seen = np.ones(structs)
    for _ in range(600):
        np.testing.assert_array_equal(b.obs[..., :old_dim], a.obs)
        np.testing.assert_array_equal(b.action_mask, a.action_mask)
        extra = b.obs[..., old_dim:]
        assert np.abs(extra).max() <= 1.5
        hp_seen = np.minimum(hp_seen, extra[..., structs:2 * structs].min(axis=(0, 1)))
        actions = bot.act(a)
        a, b = plain.step(actions), seeing.step(actions)
        np.testing.assert_array_equal(a.rewards, b.rewards)
    assert hp_seen[0] < 1.0  # some outer tower was hit, and its side saw it


def test_a_hero_sees_its_own_structures_in_its_own_frame_with_the_enemies_near_them():
    env = MobaVecEnv(num_games=1, seed=0, heroes_per_side=2, lanes=3, observe_team=True)
    env.reset()
    st, lay, cfg = env.state, env.layout, env.cfg
    S, H = lay.S_side, lay.H
    outer_top = lay.ally_structs[0, 2]  # side 0's lanes: middle, top, bottom; outer tower first
    st.hp[0, outer_top] = st.max_hp[0, outer_top] / 4
    st.alive[0, lay.ally_structs[0, 1]] = False  # side 0's inner middle tower is down
    enemy = lay.enemy_heroes[0, 0]  # put an enemy hero beside that outer tower: it sees him
    st.x[0, enemy], st.y[0, enemy] = st.x[0, outer_top] + 3.0, st.y[0, outer_top]
    step = env.observe_now()
    width = S * OWN_STRUCT_FEATURES + lay.n
    team = step.obs[0, :, -width:]
    feat = team[:, :S * OWN_STRUCT_FEATURES].reshape(H, OWN_STRUCT_FEATURES, S)
    for hero in range(H):
        side = lay.hero_side[hero]
        assert team[hero, -lay.n:].tolist() == [float(hero % lay.n == i) for i in range(lay.n)]
        # Standing and HP, for side 0's heroes only.
        assert feat[hero, 0, 1] == float(side == 1)
        assert feat[hero, 1, 2] == pytest.approx(0.25 if side == 0 else 1.0)
        # The outer middle tower stands 29 units ahead of a hero at the fountain, whichever its side.
        if hero != enemy:
            ahead = (cfg.tower_x[0] - cfg.fountain_x) / cfg.map_length
            assert feat[hero, 2, 0] == pytest.approx(ahead, abs=2.0 / cfg.map_length)
        assert feat[hero, 4, 2] == pytest.approx(1 / THREAT_SCALE if side == 0 else 0.0)
    st.alive[0, enemy] = False  # the dead are no threat, wherever they lie
    feat = env.observe_now().obs[0, :, -width:-lay.n].reshape(H, OWN_STRUCT_FEATURES, S)
    assert not feat[:, 4].any()


def test_spawn_in_lanes_starts_and_respawns_each_hero_in_front_of_its_lane():
    env = MobaVecEnv(num_games=4, seed=1, heroes_per_side=5, lanes=3, spawn_in_lanes=True)
    env.reset()
    st, lay, cfg = env.state, env.layout, env.cfg
    own_lane_y = cfg.lane_y()[np.arange(lay.H) % 5 % 3]
    assert np.abs(st.y[:, :lay.H] - own_lane_y).max() <= 3.0
    assert set(np.unique(own_lane_y)) == {0.0, 25.0, -25.0}
    st.alive[:, :lay.H] = False  # every hero dead, its respawn timer run out: back at its lane's fountain
    st.respawn[:, :lay.H] = 0.0
    env.step(np.zeros((4, lay.H, len(env.spec.action_heads)), np.int64))
    assert st.alive[:, :lay.H].all()
    np.testing.assert_allclose(st.y[:, :lay.H], np.broadcast_to(own_lane_y, (4, lay.H)), atol=cfg.hero_speed)
    plain = MobaVecEnv(num_games=4, seed=1, heroes_per_side=5, lanes=3)
    plain.reset()
    assert np.abs(plain.state.y[:, :lay.H]).max() <= 3.0  # the default: all heroes start in the middle


def test_reward_off_lane_charges_a_living_hero_away_from_its_lane_only_early_in_the_game():
    kw = dict(num_games=3, seed=2, heroes_per_side=5, lanes=3, spawn_in_lanes=True, lane_phase_s=10.0)
    env = MobaVecEnv(**kw, reward_off_lane=-0.5)
    plain = MobaVecEnv(**kw)
    noop = np.zeros((3, 10, len(env.spec.action_heads)), np.int64)
    lay, dt = env.layout, env.cfg.seconds_per_step
    for e in (env, plain):
        e.reset()
        e.state.x[:, : lay.H] = 50.0  # mid-map, out of reach of fountains and towers: no other reward moves
        e.state.y[:, : lay.H] = lay.own_lane_y
        e.state.y[0, 1] = 0.0  # game 0: a top-lane hero in the middle lane
        e.state.y[1, 6] = -13.0  # game 1: a top-lane hero of side 1 nearer the bottom lane
        e.state.alive[2, 3] = False  # game 2: a mid hero, dead, far from its lane
        e.state.y[2, 3] = 25.0
        e.state.respawn[2, 3] = 100.0
    extra = env.step(noop).rewards - plain.step(noop).rewards
    expected = np.zeros((3, 10), np.float32)
    expected[0, 1] = expected[1, 6] = -0.5 * dt
    np.testing.assert_allclose(extra, expected, atol=1e-6)
    for e in (env, plain):
        e.state.step_count[:] = int(10.0 / dt)  # past lane_phase_s: no charge any more
    assert np.abs(env.step(noop).rewards - plain.step(noop).rewards).max() < 1e-6
    with pytest.raises(ValueError, match="penalty"):
        MobaVecEnv(num_games=1, reward_off_lane=0.1)


def test_observe_lane_appends_each_heros_own_lane_and_how_far_across_it_lies():
    kw = dict(num_games=2, seed=4, heroes_per_side=5, lanes=3, observe_team=True)
    plain, seeing = MobaVecEnv(**kw), MobaVecEnv(**kw, observe_lane=True)
    assert seeing.spec.obs_dim == plain.spec.obs_dim + 3 + 1
    before, after = plain.reset().obs, seeing.reset().obs
    np.testing.assert_array_equal(after[..., : plain.spec.obs_dim], before)  # the columns before keep their meaning
    lay = seeing.layout
    seeing.state.y[:, : lay.H] = 0.0
    seeing.state.y[1, 6] = 30.0  # side 1's second hero (top lane, y 25), 5 units above it
    lane = seeing.observe_now().obs[..., -4:]
    np.testing.assert_array_equal(lane[0, :, :3], np.eye(3)[[0, 1, 2, 0, 1] * 2])
    np.testing.assert_allclose(lane[0, :, 3], np.array([0, 1, -1, 0, 1] * 2))  # from the middle: 25 up or down
    assert lane[1, 6, 3] == pytest.approx(-5 / 25)
    seeing.state.y[0, 2] = 40.0  # the bottom hero at the very top: 65 units away, clipped
    assert seeing.observe_now().obs[0, 2, -1] == pytest.approx(-1.5)

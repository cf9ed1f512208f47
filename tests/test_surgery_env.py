"""Issue 21, step 2: the moba game's ``observe_cooldowns`` option appends an observation group (the cooldowns
of the heroes a hero sees) after every column a run without it sees, and changes nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from rapid.envs.moba import MobaVecEnv
from rapid.envs.moba.config import NUKE
from rapid.envs.moba.observe import COOLDOWN_FEATURES


@pytest.mark.parametrize("heroes", [1, 3])
def test_the_option_appends_columns_and_leaves_the_game_and_the_old_columns_alone(heroes):
    plain = MobaVecEnv(num_games=6, seed=3, heroes_per_side=heroes)
    seeing = MobaVecEnv(num_games=6, seed=3, heroes_per_side=heroes, observe_cooldowns=True)
    old_dim = plain.spec.obs_dim
    assert seeing.spec.obs_dim == old_dim + 2 * heroes * COOLDOWN_FEATURES
    assert seeing.spec.action_heads == plain.spec.action_heads
    a, b = plain.reset(), seeing.reset()
    bot = plain.make_bot("random", seed=1)
    seen_cooldown = False
    for _ in range(300):
        np.testing.assert_array_equal(b.obs[..., :old_dim], a.obs)
        np.testing.assert_array_equal(b.action_mask, a.action_mask)
        extra = b.obs[..., old_dim:]
        assert extra.min() >= 0.0 and extra.max() <= 1.0 + 1e-6
        seen_cooldown |= bool(extra.any())
        actions = bot.act(a)
        a, b = plain.step(actions), seeing.step(actions)
        np.testing.assert_array_equal(a.rewards, b.rewards)
    assert seen_cooldown


def test_a_heroes_own_nuke_cooldown_shows_in_its_ally_slot_and_hidden_enemies_show_nothing():
    env = MobaVecEnv(num_games=1, seed=0, observe_cooldowns=True)
    env.reset()
    st, cfg = env.state, env.cfg
    st.ability_cd[0, 0, NUKE - 3] = cfg.nuke_cooldown / 2     # hero 0's nuke half way
    st.atk_cd[0, 1] = cfg.hero_cooldown                      # hero 1 just attacked
    step = env.observe_now()
    n = 1
    block = step.obs[0, :, -2 * n * COOLDOWN_FEATURES:].reshape(2, COOLDOWN_FEATURES, 2 * n)  # [hero, feature, slot]
    # Hero 0's slots: the enemy (hero 1) first, then itself; the heroes start at their fountains, out of sight.
    assert block[0, 1, 1] == pytest.approx(0.5) and not block[0, :, 0].any()
    assert block[1, 0, 1] == pytest.approx(1.0) and not block[1, :, 0].any()

"""moba learns: a short `rapid train` of the shipped 1v1 config, through its real processes, beats `random`.

The full target (≥ 70% against the `lane` bot within 20 minutes) is a benchmark, recorded in BENCHMARKS.md
(`## Learning: moba 1v1`); this is the cheap version for the test suite: a minute of training, then an
independent `rapid eval` of the newest version over 100 games with its own seed. (On the 2-core VM, with nothing
else running, the newest version won 100 of 100 after 90 s (v38) and after 60 s (v24) on 2026-11-26, and after
60 s (v25) on 2026-11-27; the test took 70 s, against 98 s with 90 s of training.)
"""

from __future__ import annotations

from tests.helpers import rapid

# The shipped config, minus the evaluator (it would take CPU from the training) and with one
# rollout worker, as on a machine where other tests run at the same time.
QUICK = ["--set", "eval.interval_s=0", "--set", "run.num_workers=1"]


def test_moba_1v1_beats_random_after_a_minute(tmp_path):
    run = tmp_path / "moba"
    rapid("train", "--config", "configs/moba-1v1.toml", "--run-dir", str(run), "--minutes", "1", "--no-progress",
          *QUICK, timeout=420)
    out = rapid("eval", "--run-dir", str(run), "--version", "latest", "--against", "random", "--games", "100",
                "--seed", "4242", timeout=420)
    print(out.stdout)
    win_rate = float(out.stdout.split("win rate ")[1].split()[0])
    assert win_rate >= 0.8, out.stdout
    # Its rating on the config's ladder (bots it never met; random at 0) stands clear of random's.
    rated = rapid("eval", "--run-dir", str(run), "--ladder", "--games", "40", "--seed", "4242", timeout=420)
    print(rated.stdout)
    rating, sigma = (float(x) for x in rated.stdout.split("ladder rating ")[1].split()[::2][:2])
    assert "vs focus: won" in rated.stdout and rating - 2 * sigma > 0, rated.stdout


def test_structure_hp_reward_tracks_the_time_limit_win_condition():
    """``reward_structure_hp`` pays a side for every bit of enemy structure HP lost, whoever dealt it."""
    import numpy as np

    from rapid.envs.moba import MobaVecEnv

    zero = {k: 0.0 for k in ("reward_win", "reward_kill", "reward_death", "reward_last_hit", "reward_deny",
                             "reward_tower_damage", "reward_tower_kill", "reward_gold", "reward_xp")}
    env = MobaVecEnv(num_games=16, seed=3, heroes_per_side=1, max_seconds=240.0, reward_structure_hp=2.0, **zero)
    lane, idle = env.make_bot("lane"), env.make_bot("idle")
    step = env.reset()
    start = env._structure_hp().copy()
    total = np.zeros((16, 2))
    for _ in range(env.cfg.max_steps - 1):  # stop before the game ends and resets
        actions = lane.act(step)
        actions[:, 1] = idle.act(step)[:, 1]
        step = env.step(actions)
        total += step.rewards
    lost = start - env._structure_hp()
    assert lost[:, 1].sum() > 0.5  # the laner pushed
    np.testing.assert_allclose(total[:, 0], 2.0 * lost[:, 1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(total[:, 1], 2.0 * lost[:, 0], rtol=1e-4, atol=1e-4)

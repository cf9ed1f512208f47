"""The moba game, bit for bit: digests of everything ``step`` returns over seeded games, recorded before the engine
was optimized, so a speed-up that changes any observation, mask, reward, end or episode statistic (or the state
behind them) fails here.

Each case plays seeded games with scripted bots (``lane``, ``focus``, ``push``, mask-respecting ``random``) and raw
random integers (most of them invalid actions, some outside the heads: the validation path) and hashes every
step's result and the final state. Regenerate the digests only for a deliberate change of the game:
``python tests/test_moba_golden.py`` prints them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from rapid.envs.base import StepResult
from rapid.envs.moba import MobaVecEnv
from rapid.run.config_files import load_config

STATE_FIELDS = ("x", "y", "hp", "max_hp", "alive", "atk_cd", "damage", "stun", "mana", "max_mana", "level", "xp",
                "gold", "ability_cd", "respawn", "aggro", "victim", "step_count", "waves", "returns", "kills",
                "deaths", "last_hits", "denies", "towers_destroyed")

# name: (config file or None for the defaults, option overrides, games, seed, steps, side 0 player, side 1 player)
CASES: dict[str, tuple[str | None, dict[str, Any], int, int, int, str, str]] = {
    "5v5-lane-random": ("configs/moba-5v5.toml", {}, 16, 0, 300, "lane", "random"),
    "5v5-focus-push-short": ("configs/moba-5v5.toml", {"max_seconds": 60.0}, 8, 1, 300, "focus", "push"),
    "5v5-push-raw": ("configs/moba-5v5.toml", {}, 4, 2, 700, "push", "raw"),
    "1v1-lane-raw": ("configs/moba-1v1.toml", {"max_seconds": 100.0}, 16, 3, 300, "lane", "raw"),
    "3v3-push-focus": ("configs/moba-3v3.toml", {}, 8, 4, 300, "push", "focus"),
    "5v5-defaults-random": (None, {"heroes_per_side": 5, "observe_cooldowns": True}, 8, 5, 300, "random", "raw"),
}


def digest(config: str | None, overrides: dict[str, Any], games: int, seed: int, steps: int, side0: str,
           side1: str) -> str:
    options = dict(load_config(config, []).env.options) if config else {}
    options.update(overrides)
    env = MobaVecEnv(num_games=games, seed=seed, **options)
    n = env.cfg.heroes_per_side
    heads = np.array(env.spec.action_heads)
    raw_rng = np.random.default_rng(seed + 100)
    bots = {name: env.make_bot(name, seed=seed + i) for i, name in enumerate(sorted({side0, side1} - {"raw"}))}

    def actions(name: str, step: StepResult) -> np.ndarray:
        if name == "raw":
            return raw_rng.integers(-1, heads + 1, (games, 2 * n, len(heads)))
        return bots[name].act(step)

    h = hashlib.sha256()
    step = env.reset()
    for _ in range(steps):
        for arr in (step.obs, step.action_mask, step.rewards, step.terminated, step.truncated, step.active):
            h.update(np.ascontiguousarray(arr).tobytes())
        h.update(repr(step.episodes).encode())
        a0, a1 = actions(side0, step), actions(side1, step)
        step = env.step(np.concatenate([a0[:, :n], a1[:, n:]], axis=1))
    for name in STATE_FIELDS:
        h.update(np.ascontiguousarray(getattr(env.state, name)).tobytes())
    return h.hexdigest()[:32]


GOLDEN = {
    '5v5-lane-random': '59fc1e1cb12908ca3ef3f5c8fca35c4e',
    '5v5-focus-push-short': '25a8ccbae50b9354b85641dbc006c1f5',
    '5v5-push-raw': '3674621c9ff31b53740fea105c5b15e5',
    '1v1-lane-raw': 'ed24268081a92ee271e93a508792dd8e',
    '3v3-push-focus': '1c85e530e79e0f5e3dfa3f25d8ab2ae0',
    '5v5-defaults-random': '37cfc8d9cd8f699f39bb43780a1464ac',
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_game_unchanged(case: str) -> None:
    assert digest(*CASES[case]) == GOLDEN[case], f"{case}: the game's results changed"


if __name__ == "__main__":
    for name in CASES:
        print(f"    {name!r}: {digest(*CASES[name])!r},")

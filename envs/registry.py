"""Env names to constructors: built-in games by short name, anything else as a PettingZoo import path."""

from __future__ import annotations

from typing import Any

from rapid.envs.base import VecMultiAgentEnv

BUILTIN = ("moba",)


def options_type(name: str) -> type | None:
    """The dataclass that types env ``name``'s options, which the config checks at load; None when the env
    declares none (its options then go unchecked to its constructor). A PettingZoo module declares one as a
    module attribute ``rapid_options``. ValueError when ``name`` names no env."""
    if name == "moba":
        from rapid.envs.moba.config import MobaConfig

        return MobaConfig
    from rapid.envs.pettingzoo_adapter import load_pettingzoo_module

    return getattr(load_pettingzoo_module(name), "rapid_options", None)


def make_env(name: str, num_games: int, seed: int = 0, options: dict[str, Any] | None = None) -> VecMultiAgentEnv:
    """Build ``num_games`` games of env ``name``, seeded with ``seed``.

    ``name`` is a built-in game (``moba``) or a PettingZoo module path such as
    ``pettingzoo.classic.connect_four_v3``; ``options`` go to the game's constructor.
    """
    options = dict(options or {})
    if name == "moba":
        from rapid.envs.moba import MobaVecEnv

        return MobaVecEnv(num_games=num_games, seed=seed, **options)
    from rapid.envs.pettingzoo_adapter import PettingZooVecEnv

    return PettingZooVecEnv(name, num_games=num_games, seed=seed, options=options)

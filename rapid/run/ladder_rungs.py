"""The strength ladder's rungs as named in a config (``eval.ladder``), and the frozen reference policy files, without
torch: `rapid train` checks a ladder here before it starts anything (:func:`check_ladder`).

A rung is a scripted bot of the env (``lookahead``, ``lane``…; ``bot:lookahead`` too) or ``ref:PATH``, a frozen
reference policy: a params object (:mod:`rapid.formats.params`, no pickle) whose meta names the game and the model
it needs, written by ``rapid export --format reference`` (:func:`write_reference`). A relative PATH is taken from
the working directory, as ``--config`` is.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

from rapid.errors import FormatError, UsageError
from rapid.formats.params import ParamsObject, decode_params, encode_params
from rapid.run.config import Config, ModelConfig

REF = "ref:"
"""The prefix of a frozen reference policy's rung."""
REFERENCE_KIND = "rapid.reference"
ANCHOR = "random"
"""The rung held at 0: every ladder's scale is anchored on the uniformly random player."""


def rung_name(key: str) -> str:
    """A rung's short name: a bot's name, or ``ref:`` and the reference file's stem.

    >>> rung_name("bot:lookahead"), rung_name("ref:configs/ladder/connect4-selfplay.rpm")
    ('lookahead', 'ref:connect4-selfplay')
    """
    if key.startswith(REF):
        return REF + Path(key[len(REF):]).stem
    return key.removeprefix("bot:")


def write_reference(path: str | Path, tensors: Mapping, cfg: Config, version: int, note: str = "") -> Path:
    """A frozen reference policy file: the version's weights, with the game and the model they need."""
    meta = {"kind": REFERENCE_KIND, "env": cfg.env.name, "env_options": dict(cfg.env.options),
            "model": dataclasses.asdict(cfg.model), "obs_clip": cfg.ppo.obs_clip, "run": cfg.run.name,
            "note": note}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(encode_params(ParamsObject(version, dict(tensors), meta)))
    return out


def read_reference(path: str | Path, cfg: Config) -> tuple[ParamsObject, Config]:
    """A reference file's weights, and ``cfg`` with the model they were trained with; UsageError for a missing,
    corrupt or foreign file, or one of another game."""
    try:
        obj = decode_params(Path(path).read_bytes())
    except OSError as e:
        raise UsageError(f"ladder reference {path}: cannot read it ({e.strerror or e})") from None
    except FormatError as e:
        raise UsageError(f"ladder reference {path}: not a reference policy file ({e})") from None
    meta = obj.meta
    if meta.get("kind") != REFERENCE_KIND or not isinstance(meta.get("model"), dict):
        raise UsageError(f"ladder reference {path}: not a reference policy file (write one with rapid export "
                         "--format reference)")
    if meta.get("env") != cfg.env.name:
        raise UsageError(f"ladder reference {path} plays {meta.get('env')}, not this run's {cfg.env.name}")
    if meta.get("env_options", {}) != dict(cfg.env.options):
        raise UsageError(f"ladder reference {path} was trained with other env.options than this run's")
    try:
        model = ModelConfig(**meta["model"])
        obs_clip = float(meta["obs_clip"])
    except (TypeError, ValueError, KeyError) as e:
        raise UsageError(f"ladder reference {path}: its model settings are unreadable ({e})") from None
    return obj, dataclasses.replace(cfg, model=model, ppo=dataclasses.replace(cfg.ppo, obs_clip=obs_clip))


def reference_config(path: str | Path) -> tuple[ParamsObject, Config]:
    """A reference file's weights and a config of its own game and model (for a reference on its own, as
    ``rapid.load_policy`` and bench_head_to_head play it)."""
    from rapid.run.config_files import load_config

    try:
        meta = decode_params(Path(path).read_bytes()).meta
    except (OSError, FormatError) as e:
        raise UsageError(f"{path}: not a reference policy file ({e})") from None
    if meta.get("kind") != REFERENCE_KIND or not isinstance(meta.get("env"), str):
        raise UsageError(f"{path}: not a reference policy file (write one with rapid export --format reference)")
    cfg = load_config(None, [f"env.name={json.dumps(meta['env'])}"])
    cfg.env.options = dict(meta.get("env_options", {}))
    return read_reference(path, cfg)


def check_ladder(cfg: Config) -> None:
    """UsageError naming every rung at fault: a bot the env lacks, a reference that cannot be read or plays
    another game. (Whether a reference's weights fit the observations is known when the evaluator loads it.)"""
    if not cfg.eval.ladder:
        return
    from rapid.envs.registry import make_env

    env = make_env(cfg.env.name, num_games=1, options=cfg.env.options)
    try:
        bots = env.bot_names()
    finally:
        env.close()
    errors = []
    for key in cfg.eval.ladder:
        if key.startswith(REF):
            try:
                read_reference(key[len(REF):], cfg)
            except UsageError as e:
                errors.append(str(e))
        elif rung_name(key) not in bots:
            errors.append(f"eval.ladder: {rung_name(key)!r} is not a bot of {cfg.env.name} ({', '.join(bots)})")
    if errors:
        raise UsageError("; ".join(errors))

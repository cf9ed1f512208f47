"""A run config's files: loaded from TOML and ``section.key=value`` overrides, validated once at start-up with every
error reported together (the env's options included, against the options type the env declares), and written back
as TOML. The sections themselves are :mod:`rapid.run.config`.

>>> cfg = load_config(None, overrides=["ppo.lr=3e-4", "ppo.horizon_s=50"])   # or a TOML file first
>>> cfg.ppo.lr, cfg.derive(seconds_per_step=1.0).gamma
(0.0003, 0.98)
>>> load_config(None, ["env.name=moba", "env.options.heros_per_side=2"])
Traceback (most recent call last):
rapid.errors.UsageError: invalid config: env.options.heros_per_side: unknown option of moba
>>> "[ppo]" in to_toml(cfg)
True
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tomllib
import typing
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import tomli_w

from rapid.errors import UsageError
from rapid.run.config import Config
from rapid.run.config_schema import convert, env_options
from rapid.run.config_validate import validate

SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


def _parse_override(text: str) -> tuple[str, str, Any]:
    if "=" not in text:
        raise UsageError(f"override {text!r} is not of the form section.key=value")
    path, raw = text.split("=", 1)
    parts = path.strip().split(".")
    if len(parts) < 2:
        raise UsageError(f"override {text!r}: key must be section.key")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word is a string: --set env.name=moba
    if len(parts) > 2:  # env.options.heroes_per_side=3
        value = _nest(parts[2:], value)
    return parts[0], parts[1], value


def _nest(keys: list[str], value: Any) -> dict:
    for key in reversed(keys):
        value = {key: value}
    return value


RETIRED = {("ppo", "entropy_anneal_updates"): "the schedules follow the run's budget (ppo.entropy_final)"}
"""Keys earlier versions wrote into run dirs' config.toml: those runs still resume and evaluate."""


def build_config(data: dict[str, Any]) -> Config:
    """A Config from a plain dict (TOML shape), listing every unknown key and bad type at once."""
    errors: list[str] = []
    sections = {}
    for name, cls in SECTIONS.items():
        cls = typing.get_type_hints(Config)[name]
        given = data.get(name, {})
        if not isinstance(given, dict):
            errors.append(f"[{name}] must be a table")
            given = {}
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for key, value in given.items():
            if (name, key) in RETIRED:
                logging.getLogger(__name__).warning("%s.%s is ignored: %s", name, key, RETIRED[name, key])
                continue
            if key not in hints:
                errors.append(f"{name}.{key}: unknown key")
                continue
            try:
                kwargs[key] = convert(value, hints[key])
            except TypeError as e:
                errors.append(f"{name}.{key}: {e}")
        sections[name] = cls(**kwargs)
    for name in data:
        if name not in SECTIONS:
            errors.append(f"[{name}]: unknown section")
    cfg = Config(**sections)
    errors += validate(cfg)
    if cfg.env.name and isinstance(cfg.env.options, dict):
        cfg.env.options, option_errors = env_options(cfg.env.name, cfg.env.options)
        errors += option_errors
    if errors:
        raise UsageError("invalid config: " + "; ".join(errors))
    return cfg


def _merge(base: dict, extra: dict) -> dict:
    """``extra`` over ``base``, tables merged key by key; an empty table clears one (``--set eval.ladder={}``)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and value and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults ← TOML file ← ``section.key=value`` overrides, then validated."""
    data: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:  # bounded: a config is small, /dev/zero is not
                raw = f.read(MAX_CONFIG_BYTES + 1)
            if len(raw) > MAX_CONFIG_BYTES:
                raise UsageError(f"config file {path} is over {MAX_CONFIG_BYTES} bytes")
            data = tomllib.loads(raw.decode())
        except FileNotFoundError:
            raise UsageError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"config file {path} is not valid TOML: {e}") from None
        except UnicodeDecodeError as e:
            raise UsageError(f"config file {path} is not UTF-8 text (byte {e.start})") from None
        except OSError as e:  # a folder, no permission, a device
            raise UsageError(f"cannot read config file {path}: {e.strerror or e}") from None
    for text in overrides:
        section, key, value = _parse_override(text)
        data = _merge(data, {section: {key: value}})
    return build_config(data)


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def to_toml(cfg: Config) -> str:
    """The config as TOML, as `rapid config show` prints it and a run directory keeps it: a password in
    ``store.endpoint_url`` is replaced by ``***`` (credentials belong in the environment, never in a file)."""
    data = to_dict(cfg)
    data["store"]["endpoint_url"] = redact_url(data["store"]["endpoint_url"])
    return tomli_w.dumps(data)


def redact_url(url: str) -> str:
    """``url`` with the password of its user-info replaced by ``***``.

    >>> redact_url("http://user:s3cret@minio:9000/x"), redact_url("http://minio:9000")
    ('http://user:***@minio:9000/x', 'http://minio:9000')
    """
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


MAX_CONFIG_BYTES = 4 << 20

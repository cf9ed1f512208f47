"""What the config's dataclasses say about themselves: each field's type, default and doc, values converted by
type hint, and the env's options checked against the options type the env declares.

A field's doc is the string literal right below it in the class body (an attribute docstring); it is read
from the source, so the dataclasses stay the one place where a field is declared, defaulted and explained.

>>> from rapid.run.config import RolloutConfig
>>> field_docs(RolloutConfig)["bptt"]
'Decisions of one agent per sample (truncated BPTT length): in a turn-based game its own turns.'
>>> convert(3, float), convert([1, 2], tuple[float, float])
(3.0, (1.0, 2.0))
>>> from rapid.envs.moba import MobaConfig
>>> check_options(MobaConfig, {"max_seconds": 120, "heros_per_side": 2}, "moba")
({'max_seconds': 120.0, 'heros_per_side': 2}, ['env.options.heros_per_side: unknown option of moba'])
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from typing import Any


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstring of every field of dataclass ``cls`` that has one, by field name."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # defined where no source is kept (an interactive session)
        return {}
    definition = ast.parse(source).body[0]
    body = definition.body if isinstance(definition, ast.ClassDef) else []
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def type_name(hint: Any) -> str:
    """``float``, ``list[str]``, ``tuple[float, float]``: a type hint as a config file writer reads it."""
    args = typing.get_args(hint)
    if args:
        return f"{typing.get_origin(hint).__name__}[{', '.join(type_name(a) for a in args)}]"
    return getattr(hint, "__name__", str(hint))


def convert(value: Any, hint: Any) -> Any:
    """``value`` converted to ``hint`` if that is lossless (an int for a float, a list for a tuple), else
    TypeError."""
    origin = typing.get_origin(hint)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin is list:
        (item,) = typing.get_args(hint)
        if isinstance(value, list):
            return [convert(v, item) for v in value]
    elif origin is tuple:
        items = typing.get_args(hint)
        if isinstance(value, (list, tuple)):
            if len(items) == 2 and items[1] is Ellipsis:
                items = (items[0],) * len(value)
            if len(items) == len(value):
                return tuple(convert(v, t) for v, t in zip(value, items))
    elif origin is dict:
        if isinstance(value, dict):
            key_type, value_type = typing.get_args(hint) or (str, Any)
            if value_type is Any:
                return dict(value)
            return {convert(k, key_type): convert(v, value_type) for k, v in value.items()}
    raise TypeError(f"expected {type_name(hint)}, got {type(value).__name__} {value!r}")


def check_options(options_type: type, options: dict[str, Any], env_name: str) -> tuple[dict[str, Any], list[str]]:
    """``options`` converted to the fields of dataclass ``options_type``, and one error line per unknown
    name, wrong type or value the type itself rejects (its ``__post_init__``)."""
    hints = typing.get_type_hints(options_type)
    names = {f.name for f in dataclasses.fields(options_type)}
    out, errors = dict(options), []
    for key, value in options.items():
        if key not in names:
            errors.append(f"env.options.{key}: unknown option of {env_name}")
            continue
        try:
            typed = convert(value, hints[key])
        except TypeError as e:
            errors.append(f"env.options.{key}: {e}")
            continue
        out[key] = list(typed) if isinstance(typed, tuple) else typed  # TOML has no tuples
    if not errors:
        try:
            options_type(**{k: convert(v, hints[k]) for k, v in out.items()})
        except (ValueError, TypeError) as e:
            errors.append(f"env.options: {e}")
    return out, errors


def env_options(env_name: str, options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The env's options checked against the options type that env ``env_name`` declares (see
    ``rapid.envs.registry.options_type``); an env that declares none gets its options unchecked."""
    from rapid.envs.registry import options_type

    try:
        cls = options_type(env_name)
    except ValueError as e:
        return options, [f"env.name: {e}"]
    if cls is None:
        return options, []
    return check_options(cls, options, env_name)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _rows(obj: Any, prefix: str) -> list[str]:
    """One entry per field of dataclass instance ``obj``: name, type, value (and default where it differs),
    then its doc."""
    cls: type = type(obj)  # as type[Any], mypy takes it for unhashable (field_docs is cached by class)
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    lines = []
    for f in dataclasses.fields(obj):
        value, default = getattr(obj, f.name), _default(f)
        text = f"{prefix}{f.name}: {type_name(hints[f.name])} = {value!r}"
        if value != default:
            text += f"  (default {default!r})"
        lines += [text, f"    {docs.get(f.name, '(no doc)')}"]
    return lines


def describe(cfg: Any) -> str:
    """Every field of config ``cfg`` (a ``rapid.run.config.Config``) with its type, value, default and doc, section by
    section, then the env's options as its declared options type defines them."""
    from rapid.envs.registry import options_type

    lines = []
    for section in dataclasses.fields(cfg):
        lines += [f"[{section.name}]", *_rows(getattr(cfg, section.name), f"{section.name}.")]
    try:
        cls = options_type(cfg.env.name)
    except ValueError:
        cls = None
    if cls is None:
        lines.append(f"[env.options]  {cfg.env.name} declares no options type: its options go unchecked to its "
                     "constructor")
    else:
        hints = typing.get_type_hints(cls)
        given = {k: convert(v, hints[k]) for k, v in cfg.env.options.items()}
        lines += [f"[env.options]  {cls.__module__}.{cls.__name__}", *_rows(cls(**given), "env.options.")]
    return "\n".join(lines) + "\n"

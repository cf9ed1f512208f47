"""Grow a policy's tensors and Adam's moments along a plan (``rapid.surgery.shapes.plan_growth``).

Pure functions of numpy arrays. For a weight ``W`` of a layer with old rows (units) R and old columns
(inputs) C placed at their new indices::

    W'[R, C] = W            the old units compute what they did from the old inputs
    W'[R, new columns] = 0  … and ignore every new input (feature, encoder unit, LSTM unit)
    W'[new rows, :] ~ U(-k, k), k = init_scale / sqrt(fan_in)    new units of a layer (not of a head)
    b'[R] = b, b'[new] = fill    (0; a new logit's very negative bias; a new feature's normalizer moments)

Adam's first and second moments are placed the same way with zeros everywhere new; its step count stays.

    >>> from rapid.surgery.shapes import PolicyShape, plan_growth
    >>> plan = plan_growth(PolicyShape(2, (2,), 3, 1, 2), PolicyShape(3, (2,), 3, 1, 2))
    >>> w = {g.name: np.ones(g.old_shape, np.float32) for g in plan}
    >>> grow_tensors(w, plan, np.random.default_rng(0))["encoder.0.weight"]
    array([[1., 1., 0.],
           [1., 1., 0.],
           [1., 1., 0.]], dtype=float32)
"""

from __future__ import annotations

import math

import numpy as np

from rapid.opt.model import Policy
from rapid.surgery.shapes import Growth, PolicyShape, plan_growth


def grow(old: np.ndarray, g: Growth, rng: np.random.Generator, init_scale: float = 1.0) -> np.ndarray:
    """One tensor grown along ``g``: old values at their new places, new rows random or zero, the rest ``fill``."""
    old = np.asarray(old)
    if tuple(old.shape) != g.old_shape:
        raise ValueError(f"{g.name} has shape {list(old.shape)}, the plan expects {list(g.old_shape)}")
    if not g.grows:
        return old.copy()
    new = np.full(g.new_shape, g.fill, dtype=old.dtype)
    new[np.ix_(*g.maps)] = old
    if g.new_rows == "random":
        rows = g.new_row_indices()
        bound = init_scale / math.sqrt(g.new_shape[1])
        new[rows] = rng.uniform(-bound, bound, (len(rows), *g.new_shape[1:])).astype(old.dtype)
    return new


def embed(old: np.ndarray, g: Growth) -> np.ndarray:
    """``old`` at its new places, zeros everywhere new: Adam's moments of a grown tensor."""
    old = np.asarray(old)
    if tuple(old.shape) != g.old_shape:
        raise ValueError(f"Adam moment of {g.name} has shape {list(old.shape)}, the plan expects "
                         f"{list(g.old_shape)}")
    new = np.zeros(g.new_shape, dtype=old.dtype)
    new[np.ix_(*g.maps)] = old
    return new


def grow_tensors(tensors: dict[str, np.ndarray], plan: list[Growth], rng: np.random.Generator,
                 init_scale: float = 1.0, new_obs_mean: np.ndarray | None = None,
                 new_obs_var: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every tensor of a policy's state dict grown along ``plan``. ``new_obs_mean``/``new_obs_var``: the
    normalizer's moments of the new observation features, in their new order (default 0 and 1: a z-score
    of the raw value; either way it meets only zero weights of old units)."""
    if set(tensors) != {g.name for g in plan}:
        missing, extra = sorted({g.name for g in plan} - set(tensors)), sorted(set(tensors) - {g.name for g in plan})
        raise ValueError(f"tensors do not match the plan (missing {missing[:3]}, unexpected {extra[:3]})")
    out = {g.name: grow(tensors[g.name], g, rng, init_scale) for g in plan}
    for name, values in (("obs_norm.mean", new_obs_mean), ("obs_norm.var", new_obs_var)):
        if values is not None:
            g = next(g for g in plan if g.name == name)
            new = g.new_row_indices()
            if np.shape(values) != (len(new),):
                raise ValueError(f"{name}: {len(new)} new features, {np.shape(values)} values given")
            out[name][new] = values
    return out


def grow_policy(policy: Policy, new: PolicyShape, rng: np.random.Generator, init_scale: float = 1.0,
                new_action_bias: float = -30.0, new_obs_mean: np.ndarray | None = None,
                new_obs_var: np.ndarray | None = None) -> Policy:
    """A policy of shape ``new`` computing what ``policy`` computes (SurgeryRefused if no such one is made)."""
    plan = plan_growth(PolicyShape.of(policy), new, new_action_bias)
    grown = new.build()
    grown.load_tensors(grow_tensors(policy.tensors(), plan, rng, init_scale, new_obs_mean, new_obs_var))
    return grown.eval()


def parameter_names(shape: PolicyShape) -> list[str]:
    """The policy's parameters in the order torch (and so Adam's state) numbers them."""
    return [name for name, _ in shape.build().named_parameters()]


def grow_adam(adam: dict, plan: list[Growth], names: list[str]) -> dict:
    """Adam's state (``Checkpoint.adam``: numpy moments keyed by parameter index) grown along ``plan``: each
    moment placed like its weight, zeros where the weight is new, ``step`` and the parameter groups kept.
    ``names``: :func:`parameter_names` (the same for the old and the new shape)."""
    by_name = {g.name: g for g in plan}
    state = {}
    for index, entry in adam["state"].items():
        if not 0 <= int(index) < len(names):
            raise ValueError(f"Adam state for parameter {index}, the policy has {len(names)}")
        g = by_name[names[int(index)]]
        state[int(index)] = {key: (embed(value, g) if key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
                                   else value) for key, value in entry.items()}
    return {"state": state, "param_groups": adam["param_groups"]}

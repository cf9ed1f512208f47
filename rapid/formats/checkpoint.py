"""Checkpoint objects: model, normalizers, Adam state and counters, in the msgpack codec (no pickle).
Encode and decode only; :mod:`rapid.optimizer.checkpoints` saves and loads them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rapid.errors import FormatError
from rapid.formats import codec

FORMAT = "rapid.checkpoint"
FORMAT_VERSION = 1
LIMITS = codec.Limits(max_bytes=4 << 30, max_array_bytes=1 << 30, max_elements=100_000)


@dataclass
class Checkpoint:
    version: int
    updates: int
    model: dict[str, np.ndarray]
    adam: dict[str, Any]
    meta: dict = field(default_factory=dict)

    @staticmethod
    def from_torch(version: int, updates: int, model: dict[str, np.ndarray], adam_state: dict, meta=None):
        state = {int(k): {name: (v.detach().cpu().numpy() if torch.is_tensor(v) else v) for name, v in s.items()}
                 for k, s in adam_state["state"].items()}
        return Checkpoint(version, updates, model, {"state": state, "param_groups": adam_state["param_groups"]},
                          meta or {})

    def adam_state(self) -> dict:
        state = {int(k): {name: (torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v)
                          for name, v in s.items()} for k, s in self.adam["state"].items()}
        groups = [{**g, "betas": tuple(g["betas"])} for g in self.adam["param_groups"]]
        return {"state": state, "param_groups": groups}


def encode_checkpoint(ckpt: Checkpoint) -> bytes:
    """The checkpoint's bytes; FormatError (and no bytes) for one that :func:`decode_checkpoint` would refuse."""
    return codec.encode_checked(FORMAT, FORMAT_VERSION, _tree(ckpt), LIMITS, _checkpoint)


def decode_checkpoint(data: bytes) -> Checkpoint:
    """The checkpoint in ``data``; FormatError unless it is well formed, every number in it is finite and its
    Adam state is consistent (whether it fits a model is the loader's check)."""
    return _checkpoint(codec.decode(data, FORMAT, (FORMAT_VERSION,), LIMITS))


def check_checkpoint(ckpt: Checkpoint) -> None:
    """FormatError unless a reader would accept ``ckpt``, without encoding it."""
    _checkpoint(codec.reader_view(_tree(ckpt), FORMAT, LIMITS))


def _tree(ckpt: Checkpoint) -> dict:
    return {"version": ckpt.version, "updates": ckpt.updates, "model": ckpt.model, "adam": ckpt.adam,
            "meta": ckpt.meta}


def _checkpoint(tree) -> Checkpoint:
    """The reader's rules, which the writer runs too (on ``codec.reader_view``)."""
    where = "checkpoint"
    version = codec.require(tree, "version", int, where)
    updates = codec.require(tree, "updates", int, where)
    model = codec.require(tree, "model", dict, where)
    adam = codec.require(tree, "adam", dict, where)
    codec.require(adam, "state", dict, where)
    codec.require(adam, "param_groups", list, where)
    meta = codec.require(tree, "meta", dict, where)
    if version < 0 or updates < 0:
        raise FormatError(f"{where}: negative version or update count")
    where = f"checkpoint v{version}"
    if not all(isinstance(k, str) and isinstance(v, np.ndarray) for k, v in model.items()):
        raise FormatError(f"{where}: model tensors malformed")
    for name, value in model.items():
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise FormatError(f"{where}: weight {name!r} has non-finite values")
    _check_adam(adam, where)
    return Checkpoint(version, updates, model, adam, meta)


def _check_adam(adam: dict, where: str) -> None:
    """The optimizer state's shape and numbers, so a bad one fails here as FormatError, not later inside torch
    or as NaN weights after the first step."""
    claimed: set[int] = set()
    for group in adam["param_groups"]:
        ok = (isinstance(group, dict) and isinstance(group.get("params"), list)
              and all(isinstance(p, int) for p in group["params"])
              and isinstance(group.get("betas"), list) and len(group["betas"]) == 2
              and isinstance(group.get("lr"), (int, float))
              and all(isinstance(group.get(key, 0.0), (int, float)) for key in ("eps", "weight_decay")))
        if not ok:
            raise FormatError(f"{where}: Adam parameter group malformed")
        params = group["params"]
        if claimed & set(params) or len(set(params)) != len(params):
            raise FormatError(f"{where}: a parameter is in two Adam groups")
        claimed |= set(params)
        for key in ("lr", "eps", "weight_decay"):
            if not math.isfinite(group.get(key, 0.0)):
                raise FormatError(f"{where}: Adam {key} is not finite")
    for index, entry in adam["state"].items():
        if not isinstance(index, int) or not isinstance(entry, dict):
            raise FormatError(f"{where}: Adam state entry {index!r} malformed")
        if not all(isinstance(v, (np.ndarray, int, float)) and not isinstance(v, bool) for v in entry.values()):
            raise FormatError(f"{where}: Adam state entry {index!r} holds non-numeric values")
        if index not in claimed:
            raise FormatError(f"{where}: Adam state for parameter {index} in no group")
        for name, value in entry.items():
            value = np.asarray(value)
            if value.dtype.kind in "fiu" and not np.isfinite(value).all():
                raise FormatError(f"{where}: Adam {name} of parameter {index} is not finite")
            if name in ("step", "exp_avg_sq") and (value < 0).any():
                raise FormatError(f"{where}: Adam {name} of parameter {index} is negative")
        if len({np.shape(v) for k, v in entry.items() if k != "step"}) > 1:
            raise FormatError(f"{where}: Adam moments of parameter {index} differ in shape")

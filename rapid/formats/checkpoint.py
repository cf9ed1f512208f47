"""Checkpoint objects: model, normalizers, Adam state and counters, in the msgpack codec (no pickle).
Encode and decode only; :mod:`rapid.checkpoints` saves and loads them."""

from __future__ import annotations

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
    return codec.encode(FORMAT, FORMAT_VERSION, {"version": ckpt.version, "updates": ckpt.updates,
                                                 "model": ckpt.model, "adam": ckpt.adam, "meta": ckpt.meta})


def decode_checkpoint(data: bytes) -> Checkpoint:
    tree = codec.decode(data, FORMAT, (FORMAT_VERSION,), LIMITS)
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
    if not all(isinstance(k, str) and isinstance(v, np.ndarray) for k, v in model.items()):
        raise FormatError(f"{where}: model tensors malformed")
    for name, value in model.items():
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise FormatError(f"{where}: tensor {name!r} has non-finite values")
    _check_adam(adam, where)
    return Checkpoint(version, updates, model, adam, meta)


def _check_adam(adam: dict, where: str) -> None:
    """The optimizer state's shape, so a bad one fails here as FormatError, not later inside torch."""
    for key, entry in adam["state"].items():
        if not isinstance(key, int) or not isinstance(entry, dict):
            raise FormatError(f"{where}: Adam state entry {key!r} malformed")
        if not all(isinstance(v, (np.ndarray, int, float)) and not isinstance(v, bool) for v in entry.values()):
            raise FormatError(f"{where}: Adam state entry {key!r} holds non-numeric values")
    for group in adam["param_groups"]:
        ok = (isinstance(group, dict) and isinstance(group.get("params"), list)
              and all(isinstance(p, int) for p in group["params"])
              and isinstance(group.get("betas"), list) and len(group["betas"]) == 2
              and isinstance(group.get("lr"), (int, float))
              and isinstance(group.get("eps", 0.0), (int, float)))
        if not ok:
            raise FormatError(f"{where}: Adam parameter group malformed")

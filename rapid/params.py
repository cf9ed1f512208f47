"""Parameter objects and the parameter store (SPEC §4–5).

A parameter object holds one immutable published version of the policy's weights (and its normalizer
statistics, which are buffers of the model). Usage::

    params = ParameterStore(store)
    params.publish(7, state, meta={"updates": 70})     # params/000000000007.rpm, then params/LATEST
    v = params.latest_version()                         # 7, or None before the first publish
    obj = params.fetch(v)                               # ParamsObject(version, tensors, meta)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rapid import codec
from rapid.errors import FormatError
from rapid.infra.store import KeyNotFound, Store

FORMAT = "rapid.params"
FORMAT_VERSION = 1
LATEST_KEY = "params/LATEST"
LIMITS = codec.Limits(max_bytes=2 << 30, max_array_bytes=1 << 30, max_elements=10_000)


def params_key(version: int) -> str:
    return f"params/{version:012d}.rpm"


@dataclass
class ParamsObject:
    version: int
    tensors: dict[str, np.ndarray]
    meta: dict = field(default_factory=dict)


def encode_params(obj: ParamsObject) -> bytes:
    return codec.encode(FORMAT, FORMAT_VERSION, {
        "version": int(obj.version),
        "tensors": {k: np.asarray(v) for k, v in obj.tensors.items()},
        "meta": obj.meta,
    })


def decode_params(data: bytes) -> ParamsObject:
    tree = codec.decode(data, FORMAT, (FORMAT_VERSION,), LIMITS)
    where = "params object"
    if not isinstance(tree, dict):
        raise FormatError(f"{where}: payload is not a map")
    version = codec.require(tree, "version", int, where)
    if version < 0:
        raise FormatError(f"{where}: negative version")
    tensors = codec.require(tree, "tensors", dict, where)
    for name, value in tensors.items():
        if not isinstance(name, str) or not isinstance(value, np.ndarray):
            raise FormatError(f"{where}: tensor {name!r} is not a named array")
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise FormatError(f"{where}: tensor {name!r} has non-finite values")
    meta = codec.require(tree, "meta", dict, where)
    return ParamsObject(version, tensors, meta)


class ParameterStore:
    """Published parameter versions in a store. Versions are immutable; LATEST moves forward only."""

    def __init__(self, store: Store):
        self.store = store

    def publish(self, version: int, tensors: dict[str, np.ndarray], meta: dict | None = None) -> None:
        for name, value in tensors.items():  # readers would reject it: never publish it
            if np.asarray(value).dtype.kind == "f" and not np.isfinite(value).all():
                raise ValueError(f"refusing to publish v{version}: tensor {name!r} has non-finite values")
        data = encode_params(ParamsObject(version, tensors, meta or {}))
        if not self.store.put_if_absent(params_key(version), data):
            # A retry after an ambiguous failure (the PUT landed, its answer was lost) finds its own bytes:
            # that is this publish succeeding, not a reused version.
            if self._existing(version) != data:
                raise FileExistsError(f"parameter version {version} is already published")
        # LATEST only after the version object exists, so a reader never follows a dangling pointer.
        codec.write_version_pointer(self.store, LATEST_KEY, version)

    def _existing(self, version: int) -> bytes | None:
        try:
            return self.store.get(params_key(version))
        except KeyNotFound:
            return None

    def latest_version(self) -> int | None:
        return codec.read_version_pointer(self.store, LATEST_KEY)

    def fetch(self, version: int) -> ParamsObject:
        obj = decode_params(self.store.get(params_key(version)))
        if obj.version != version:
            raise FormatError(f"{params_key(version)} holds version {obj.version}")
        return obj

    def versions(self) -> list[int]:
        out = []
        for key in self.store.list("params/"):
            name = key.rsplit("/", 1)[-1]
            if name.endswith(".rpm") and name[:-4].isdigit():
                out.append(int(name[:-4]))
        return out

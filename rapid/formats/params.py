"""Parameter objects: one immutable published version of the policy's weights (and its normalizer
statistics, which are buffers of the model). Encode and decode only; :mod:`rapid.run.param_store` stores them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rapid.errors import FormatError
from rapid.formats import codec

FORMAT = "rapid.params"
FORMAT_VERSION = 1
LIMITS = codec.Limits(max_bytes=2 << 30, max_array_bytes=1 << 30, max_elements=10_000)


@dataclass
class ParamsObject:
    version: int
    tensors: dict[str, np.ndarray]
    meta: dict = field(default_factory=dict)


def encode_params(obj: ParamsObject) -> bytes:
    """The object's bytes; FormatError (and no bytes) for one that :func:`decode_params` would refuse."""
    return codec.encode_checked(FORMAT, FORMAT_VERSION, {
        "version": int(obj.version),
        "tensors": {k: np.asarray(v) for k, v in obj.tensors.items()},
        "meta": obj.meta,
    }, LIMITS, _params_object)


def decode_params(data: bytes) -> ParamsObject:
    return _params_object(codec.decode(data, FORMAT, (FORMAT_VERSION,), LIMITS))


def _params_object(tree) -> ParamsObject:
    """The reader's rules, which the writer runs too (on ``codec.reader_view``)."""
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

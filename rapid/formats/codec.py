"""msgpack documents with numpy arrays as raw buffers, a format name/version and a checksum (SPEC §5).

An encoded object is a msgpack array ``[format_name, format_version, crc32, payload]``; ``payload`` is
the msgpack of a tree of dicts, lists, scalars and arrays. An array is an ExtType holding
``[dtype, shape, raw bytes]``. Decoding checks every limit before it allocates, accepts only plain
numeric dtypes, and raises :class:`FormatError` for anything wrong. No pickle: a hostile object can
waste at most the declared limits, never run code.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from rapid.errors import FormatError

ARRAY_EXT = 1
ALLOWED_DTYPES = frozenset(
    ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64"]
)


@dataclass(frozen=True)
class Limits:
    """Upper bounds a decoder enforces before it allocates anything."""

    max_bytes: int = 256 << 20
    max_array_bytes: int = 128 << 20
    max_elements: int = 100_000
    """Most entries in any one msgpack array or map."""
    max_ndim: int = 6


def _pack_array(a: np.ndarray) -> msgpack.ExtType:
    a = np.require(a, requirements="C")  # unlike ascontiguousarray, keeps 0-d arrays 0-d
    if a.dtype.name not in ALLOWED_DTYPES:
        raise TypeError(f"cannot encode arrays of dtype {a.dtype}")
    body = msgpack.packb([a.dtype.name, list(a.shape), a.tobytes()], use_bin_type=True)
    return msgpack.ExtType(ARRAY_EXT, body)


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _pack_array(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__}")


def encode(format_name: str, format_version: int, tree: Any) -> bytes:
    payload = msgpack.packb(tree, default=_default, use_bin_type=True)
    return msgpack.packb([format_name, format_version, zlib.crc32(payload), payload], use_bin_type=True)


def _unpack_array(data: bytes, limits: Limits) -> np.ndarray:
    try:
        dtype_name, shape, raw = msgpack.unpackb(
            data, raw=False, max_array_len=limits.max_ndim + 3, max_map_len=0,
            max_bin_len=limits.max_array_bytes, max_str_len=16, max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise FormatError(f"malformed array: {e}") from e
    if dtype_name not in ALLOWED_DTYPES:
        raise FormatError(f"array dtype {dtype_name!r} not allowed")
    if (not isinstance(shape, list) or len(shape) > limits.max_ndim
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d for d in shape)):
        raise FormatError(f"bad array shape {shape!r}")
    if not isinstance(raw, bytes):
        raise FormatError("array data is not bytes")
    dtype = np.dtype(dtype_name)
    count = 1
    for d in shape:
        count *= d
    if count * dtype.itemsize != len(raw):
        raise FormatError(f"array data is {len(raw)} bytes, shape {shape} of {dtype_name} needs "
                          f"{count * dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def decode(data: bytes, format_name: str, accepted_versions: tuple[int, ...], limits: Limits = Limits()) -> Any:
    """The tree inside an encoded object, after checking format, version, checksum and limits."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise FormatError("object is not bytes")
    if len(data) > limits.max_bytes:
        raise FormatError(f"object is {len(data)} bytes, limit {limits.max_bytes}")
    try:
        envelope = msgpack.unpackb(bytes(data), raw=False, max_array_len=4, max_map_len=0,
                                   max_str_len=64, max_bin_len=limits.max_bytes, max_ext_len=0)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise FormatError(f"not a {format_name} object: {e}") from e
    if not (isinstance(envelope, list) and len(envelope) == 4):
        raise FormatError(f"not a {format_name} object")
    name, version, crc, payload = envelope
    if name != format_name:
        raise FormatError(f"expected format {format_name!r}, got {name!r}")
    if type(version) is not int or version not in accepted_versions:
        raise FormatError(f"{format_name} version {version!r} not supported (accepted: {accepted_versions})")
    if not isinstance(payload, bytes) or not isinstance(crc, int) or zlib.crc32(payload) != crc:
        raise FormatError(f"{format_name} checksum mismatch")

    def ext_hook(code: int, body: bytes) -> np.ndarray:
        if code != ARRAY_EXT:
            raise FormatError(f"unknown ext type {code}")
        return _unpack_array(body, limits)

    try:
        return msgpack.unpackb(
            payload, raw=False, ext_hook=ext_hook, strict_map_key=False,
            max_array_len=limits.max_elements, max_map_len=limits.max_elements,
            max_str_len=1 << 20, max_bin_len=limits.max_array_bytes, max_ext_len=limits.max_array_bytes + 64,
            timestamp=3,  # msgpack's Timestamp ext becomes a plain number, not an object
        )
    except FormatError:
        raise
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as e:
        raise FormatError(f"malformed {format_name} payload: {e}") from e


def require(tree: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``tree[key]`` if it exists and has the right type, else FormatError."""
    if not isinstance(tree, dict) or key not in tree:
        raise FormatError(f"{where}: missing {key!r}")
    value = tree[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        raise FormatError(f"{where}: {key!r} has type {type(value).__name__}")
    return value


def _as_tuple(kind):
    return kind if isinstance(kind, tuple) else (kind,)


def require_array(tree: dict, key: str, dtype: str, shape: tuple[int | None, ...], where: str) -> np.ndarray:
    """``tree[key]`` as an array of exactly ``dtype`` and ``shape`` (None matches any length)."""
    a = require(tree, key, np.ndarray, where)
    if a.dtype.name != dtype:
        raise FormatError(f"{where}: {key!r} has dtype {a.dtype.name}, expected {dtype}")
    if a.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, a.shape)):
        raise FormatError(f"{where}: {key!r} has shape {a.shape}, expected {shape}")
    return a

"""msgpack documents with numpy arrays as raw buffers, a format name/version and a checksum.

An encoded object is a msgpack array ``[format_name, format_version, crc32, payload]``; ``payload`` is
the msgpack of a tree of dicts, lists, scalars and arrays. An array is an ExtType holding
``[dtype, shape, raw bytes]``. Decoding checks every limit before it allocates (a scan of the msgpack
headers counts every item and the nesting depth first, so nested empty containers, ~72x bigger decoded
than encoded, are refused before any is built), accepts only plain numeric dtypes, and raises
:class:`FormatError` for anything wrong. No pickle: a hostile object can waste at most the declared
limits, never run code.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from rapid.errors import FormatError

ARRAY_EXT = 1
_REFERENCE_EXT = 127
"""In :func:`reader_view` only, never written: an array by its index in the tree."""
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
    max_items: int = 1_000_000
    """Most msgpack items (container entries) in the whole payload: bounds the decoded size."""
    max_depth: int = 16
    """Deepest nesting of arrays and maps."""


def _stored_array(a: np.ndarray) -> np.ndarray:
    """``a`` as it is written: C order and native byte order (a decoder reads the bytes as native: a big-endian
    array's dtype is still named ``float32``), copied only if it is not already so."""
    if a.dtype.name not in ALLOWED_DTYPES:
        raise TypeError(f"cannot encode arrays of dtype {a.dtype}")
    # unlike ascontiguousarray, keeps 0-d arrays 0-d
    return np.require(a, dtype=a.dtype.newbyteorder("="), requirements="C")


def _pack_array(a: np.ndarray) -> msgpack.ExtType:
    a = _stored_array(a)
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


# Bytes after the type byte that hold a length (str/bin/ext) or a count (array/map), by type byte.
_LEN_BYTES = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}
_EXT_LEN_BYTES = {0xC7: 1, 0xC8: 2, 0xC9: 4}
_FIXED = {0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3,
          0xD2: 5, 0xD3: 9, 0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18}
_COUNT = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # (count bytes, children per entry)
_UINT = {1: ">B", 2: ">H", 4: ">I"}


def scan(data: bytes, limits: Limits) -> None:
    """Walk the msgpack headers of ``data`` without building anything: FormatError if it is truncated,
    has trailing bytes, nests deeper than ``max_depth`` or holds more than ``max_items`` items."""
    end, pos, items = len(data), 0, 0
    pending = [1]  # objects still to read at each open nesting level
    try:
        while pending:
            if pending[-1] == 0:
                pending.pop()
                continue
            pending[-1] -= 1
            b = data[pos]
            children = 0
            if b <= 0x7F or b >= 0xE0:
                size = 1
            elif b <= 0x8F:
                size, children = 1, 2 * (b & 0x0F)
            elif b <= 0x9F:
                size, children = 1, b & 0x0F
            elif b <= 0xBF:
                size = 1 + (b & 0x1F)
            elif b in _FIXED:
                size = _FIXED[b]
            elif b in _LEN_BYTES:
                n = _LEN_BYTES[b]
                size = 1 + n + struct.unpack_from(_UINT[n], data, pos + 1)[0]
            elif b in _EXT_LEN_BYTES:
                n = _EXT_LEN_BYTES[b]
                size = 2 + n + struct.unpack_from(_UINT[n], data, pos + 1)[0]
            elif b in _COUNT:
                n, per = _COUNT[b]
                size, children = 1 + n, per * struct.unpack_from(_UINT[n], data, pos + 1)[0]
            else:
                raise FormatError(f"invalid msgpack type byte 0x{b:02x}")
            pos += size
            if pos > end:
                raise FormatError("truncated msgpack data")
            if children:
                items += children
                if items > limits.max_items:
                    raise FormatError(f"more than {limits.max_items} items")
                if len(pending) >= limits.max_depth:
                    raise FormatError(f"nested deeper than {limits.max_depth}")
                pending.append(children)
    except (IndexError, struct.error) as e:
        raise FormatError("truncated msgpack data") from e
    if pos != end:
        raise FormatError(f"{end - pos} bytes after the msgpack data")


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

    return _unpack_payload(payload, format_name, limits, ext_hook)


def _unpack_payload(payload: bytes, format_name: str, limits: Limits, ext_hook) -> Any:
    scan(payload, limits)
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


def reader_view(tree: Any, format_name: str, limits: Limits) -> Any:
    """``tree`` as :func:`decode` returns it from ``encode(format_name, …, tree)``, built without copying an
    array: msgpack's own conversions (tuples become lists, numpy scalars Python numbers, the same limits), with
    each array the caller's own, in the order and dtype it is written in. A writer runs its reader's checks on
    this (:func:`encode_checked`) for about the cost of those checks: no checksum, no copy of array bytes."""
    arrays: list[np.ndarray] = []

    def by_reference(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            arrays.append(_stored_array(obj))
            if arrays[-1].nbytes > limits.max_array_bytes:
                raise FormatError(f"{format_name}: an array of {arrays[-1].nbytes} bytes, limit "
                                  f"{limits.max_array_bytes}")
            return msgpack.ExtType(_REFERENCE_EXT, struct.pack(">I", len(arrays) - 1))
        return _default(obj)

    def ext_hook(code: int, body: bytes) -> np.ndarray:
        if code == _REFERENCE_EXT:
            return arrays[struct.unpack(">I", body)[0]]
        if code != ARRAY_EXT:  # an ExtType the tree itself holds: what decode would make of it
            raise FormatError(f"unknown ext type {code}")
        return _unpack_array(body, limits)

    try:
        skeleton = msgpack.packb(tree, default=by_reference, use_bin_type=True)
    except FormatError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise FormatError(f"{format_name}: {e}") from e
    return _unpack_payload(skeleton, format_name, limits, ext_hook)


def encode_checked(format_name: str, format_version: int, tree: Any, limits: Limits, check) -> bytes:
    """:func:`encode`, after ``check`` (the format's reader: raises FormatError for what it refuses) accepted
    :func:`reader_view` of the tree: a writer never stores what every reader refuses."""
    check(reader_view(tree, format_name, limits))
    data = encode(format_name, format_version, tree)
    if len(data) > limits.max_bytes:
        raise FormatError(f"{format_name} object is {len(data)} bytes, limit {limits.max_bytes}")
    return data


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

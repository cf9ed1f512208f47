"""What a rollout worker and its node's inference server share: a shared-memory block of fixed slots per worker
(the arrays of every request and answer, never pickled or copied through the socket) and a UNIX socket that
carries short msgpack messages (which slots hold a request, which are answered).

A worker's block holds one region per lane of ``rows`` rows each::

    request:  obs f32 [rows, obs_dim] · mask u8 [rows, mask_dim] · uniforms f32 [rows, heads] · rows i64 [rows]
    answer:   actions i64 [rows, heads] · logp f32 [rows] · value f32 [rows] · h, c f32 [rows, lstm]

A request message names its lane, the rows it asks for (written to the lane's ``rows`` slot, grouped by
controller: ``groups`` gives each controller's key and count) and the rows whose games restarted (``resets``).
Every message carries an ``id`` that its answer repeats.

    >>> layout = SlotLayout(lanes=2, rows=3, obs_dim=4, mask_dim=2, heads=1, lstm=5)
    >>> buffer = bytearray(layout.size)
    >>> lane = layout.views(buffer)[1]
    >>> lane.obs.shape, lane.mask.dtype, lane.h.shape
    ((3, 4), dtype('bool'), (3, 5))
    >>> frames = Frames()
    >>> frames.feed(frame({"op": "status", "id": 1}) + frame({"op": "act", "id": 2})[:5])
    [{'op': 'status', 'id': 1}]
"""

from __future__ import annotations

import hashlib
import mmap
import os
import secrets
import socket
import struct
import tempfile
from dataclasses import dataclass

import msgpack
import numpy as np

HEADER = struct.Struct("<I")
MAX_MESSAGE = 1 << 20
"""A message is a few hundred bytes; a longer one is not from a worker of this node."""
SOCKET_NAME = "inference.sock"
LOCK_NAME = "inference.lock"
MAX_UNIX_PATH = 107


@dataclass(frozen=True)
class LaneViews:
    obs: np.ndarray
    mask: np.ndarray
    uniforms: np.ndarray
    rows: np.ndarray
    actions: np.ndarray
    logp: np.ndarray
    value: np.ndarray
    h: np.ndarray
    c: np.ndarray


@dataclass(frozen=True)
class SlotLayout:
    lanes: int
    rows: int
    obs_dim: int
    mask_dim: int
    heads: int
    lstm: int

    def _fields(self) -> list[tuple[str, type, tuple[int, ...]]]:
        r = self.rows
        return [("obs", np.float32, (r, self.obs_dim)), ("mask", np.bool_, (r, self.mask_dim)),
                ("uniforms", np.float32, (r, self.heads)), ("rows", np.int64, (r,)),
                ("actions", np.int64, (r, self.heads)), ("logp", np.float32, (r,)), ("value", np.float32, (r,)),
                ("h", np.float32, (r, self.lstm)), ("c", np.float32, (r, self.lstm))]

    @property
    def lane_bytes(self) -> int:
        return sum(_aligned(int(np.prod(shape)) * np.dtype(dtype).itemsize) for _, dtype, shape in self._fields())

    @property
    def size(self) -> int:
        return self.lanes * self.lane_bytes

    def views(self, buffer) -> list[LaneViews]:
        """Numpy views of every lane's slots in ``buffer`` (a shared-memory block's ``buf``)."""
        lanes = []
        for lane in range(self.lanes):
            offset, arrays = lane * self.lane_bytes, {}
            for name, dtype, shape in self._fields():
                count = int(np.prod(shape))
                arrays[name] = np.ndarray(shape, dtype, buffer=buffer, offset=offset)
                offset += _aligned(count * np.dtype(dtype).itemsize)
            lanes.append(LaneViews(**arrays))
        return lanes

    def to_message(self) -> dict:
        return {"lanes": self.lanes, "rows": self.rows, "obs_dim": self.obs_dim, "mask_dim": self.mask_dim,
                "heads": self.heads, "lstm": self.lstm}


class SharedBlock:
    """A worker's block of slots: a file in ``/dev/shm`` (RAM; the temp folder where there is none) mapped by the
    worker and by its node's server. The server removes the file's name as soon as it has mapped it, so the memory
    goes with the last of the two processes, whichever ends how, and nothing is left behind. (Python's
    ``multiprocessing.shared_memory`` would start a resource-tracker process in every worker and unlink a block
    when a server that attached to it exits.)"""

    def __init__(self, path: str, size: int, create: bool):
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self.size = os.fstat(fd).st_size
            self.buf = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.path = path

    @classmethod
    def create(cls, size: int) -> SharedBlock:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        return cls(os.path.join(folder, f"rapid-slots-{os.getpid()}-{secrets.token_hex(6)}"), max(size, 1), True)

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        try:
            self.buf.close()
        except BufferError:  # a view of it is still referenced: the mapping goes when that view does
            pass


def _aligned(n: int, to: int = 64) -> int:
    return -(-n // to) * to


def frame(message: dict) -> bytes:
    data = msgpack.packb(message, use_bin_type=True)
    return HEADER.pack(len(data)) + data


class BadMessage(ValueError):
    """Bytes on the socket that are no message of this protocol."""


class Frames:
    """Messages out of a byte stream that arrives in pieces."""

    def __init__(self):
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[dict]:
        self._buffer += data
        out = []
        while len(self._buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer)
            if size > MAX_MESSAGE:
                raise BadMessage(f"a message of {size} bytes")
            if len(self._buffer) < HEADER.size + size:
                break
            body = bytes(self._buffer[HEADER.size:HEADER.size + size])
            del self._buffer[:HEADER.size + size]
            try:
                message = msgpack.unpackb(body, raw=False, strict_map_key=True)
            except (ValueError, msgpack.UnpackException) as e:
                raise BadMessage(f"not msgpack: {e}") from e
            if not isinstance(message, dict):
                raise BadMessage(f"a {type(message).__name__}, not a map")
            out.append(message)
        return out


def socket_address(folder: str) -> str:
    """The server's address in the node's folder: the socket file, or (for a folder whose path is too long for a
    UNIX socket) an abstract name derived from it, which the node's processes share as long as they share a
    network namespace."""
    path = os.path.join(folder, SOCKET_NAME)
    if len(path.encode()) <= MAX_UNIX_PATH:
        return path
    return "\0rapid-inference-" + hashlib.sha1(path.encode()).hexdigest()[:20]


def connect(address: str, timeout: float | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    return sock

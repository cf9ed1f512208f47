"""Decoded arrays handed from a decode process to the optimizer through shared memory, never through a pipe.

A decode process writes an object's arrays into a slot: a file of the pool's private folder in ``/dev/shm``
(tmpfs: memory, not disk), and sends back only where each array lies (:class:`Field`). The optimizer maps the
slot and copies the arrays into its buffer: the one copy it makes of a sample. Nothing is pickled or read
through a pipe, so the optimizer's interpreter lock is held for that copy alone. A slot is written again only
once the optimizer's arrays of it are gone (:meth:`Slot.free`), and keeps its memory and the optimizer's mapping
between objects, so no side pays to allocate, map or free pages for each object (about 0.1 ms of CPU per MB each).

Where there is no ``/dev/shm`` (macOS) :func:`make_folder` returns None, and a slot that cannot be written
(tmpfs full) raises OSError: the decode pool then sends that object's arrays the old way, pickled.

Usage::

    >>> folder = make_folder()
    >>> slot = Slot(f"{folder}/0")
    >>> fields = write(slot.path, {"x": np.arange(3.0), "v": np.array([[1, 2]])})   # in a decode process
    >>> arrays = slot.take(fields)                                                   # in the optimizer
    >>> arrays["x"].tolist(), arrays["v"].shape
    ([0.0, 1.0, 2.0], (1, 2))
    >>> x = arrays.pop("x")[1:]
    >>> del arrays
    >>> slot.free()                       # False: an array (a part of one, even) still views the slot
    False
    >>> del x
    >>> slot.free()                       # it may be written again
    True
    >>> remove_folder(folder)
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass

import numpy as np

SHARED_MEMORY = "/dev/shm"
ALIGN = 64
"""Each array starts on a cache line, so the optimizer's views are aligned for every dtype."""
KEEP_BYTES = 64 << 20
"""A slot keeps at most this much memory between objects; one grown past it for a rare large object shrinks back."""


@dataclass(frozen=True)
class Field:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    end: int


def make_folder() -> str | None:
    """A new folder only this user can enter, in shared memory; None where there is none."""
    if not os.path.isdir(SHARED_MEMORY) or not os.access(SHARED_MEMORY, os.W_OK):
        return None
    return tempfile.mkdtemp(prefix=f"rapid-decode-{os.getpid()}-", dir=SHARED_MEMORY)


def remove_folder(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write(path: str, arrays: dict[str, np.ndarray]) -> list[Field]:
    """Write ``arrays`` into the slot at ``path`` (made if new); OSError (and the slot removed) if it cannot be."""
    fields, offset = [], 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        for name, array in arrays.items():
            array = np.ascontiguousarray(array)
            offset += -offset % ALIGN
            fields.append(Field(name, array.dtype.str, array.shape, offset, offset + array.nbytes))
            view = memoryview(array.reshape(-1).view(np.uint8).data)
            while view.nbytes:
                written = os.pwrite(fd, view, offset)
                view, offset = view[written:], offset + written
        if os.fstat(fd).st_size > max(offset, KEEP_BYTES):
            os.ftruncate(fd, offset)
    except BaseException:
        remove(path)
        raise
    finally:
        os.close(fd)
    return fields


class _Lease:
    """What every array handed out from a slot views (numpy keeps it as their base): while it lives, an array
    of the slot is in use. Read-only, and it keeps the mapping alive even after the slot's own is replaced."""

    def __init__(self, base: np.ndarray, size: int):
        self.base = base
        self.__array_interface__ = {"data": (base.ctypes.data, True), "shape": (size,), "typestr": "|u1",
                                    "version": 3}


class Slot:
    """The optimizer's side of one slot: mapped once (again only when the slot grows past the mapping), so an
    object costs neither a mapping nor page faults."""

    def __init__(self, path: str):
        self.path = path
        self._base: np.ndarray | None = None
        self._lease: weakref.ref[_Lease] | None = None

    def free(self) -> bool:
        """Whether no array taken from the slot lives: it may be written again."""
        return self._lease is None or self._lease() is None

    def take(self, fields: list[Field]) -> dict[str, np.ndarray]:
        """The arrays a worker wrote to the slot (read-only views); OSError if the slot is gone, ValueError if it
        is shorter than ``fields`` say."""
        size = max((f.end for f in fields), default=0)
        if not size:
            return {f.name: np.empty(f.shape, f.dtype) for f in fields}
        if self._base is None or self._base.size < size:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                # MAP_POPULATE maps every page at once: one call, not a page fault per 4 KiB on the first read.
                memory = mmap.mmap(fd, max(size, os.fstat(fd).st_size), prot=mmap.PROT_READ,
                                   flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
            finally:
                os.close(fd)
            self._base = np.frombuffer(memory, np.uint8)
        lease = _Lease(self._base, size)
        self._lease = weakref.ref(lease)
        whole = np.asarray(lease)
        return {f.name: whole[f.offset:f.end].view(f.dtype).reshape(f.shape) for f in fields}

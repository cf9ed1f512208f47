r"""Reading a run's JSON-lines logs (``logs/optimizer.jsonl``, ``logs/eval.jsonl``): all at once for reports,
or incrementally for a live display that polls every second.

Usage::

    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = Path(tmp.name) / "eval.jsonl"
    >>> read_jsonl(path)                                   # [] when the file does not exist yet
    []
    >>> tail = JsonlTail(path)
    >>> _ = path.write_text('{"version": 1}\n{"version": 2}\n{"vers')   # the last line is being written
    >>> tail.poll()                                        # only the complete lines written since the last poll
    [{'version': 1}, {'version': 2}]
    >>> with open(path, "a") as f:
    ...     _ = f.write('ion": 3}\n')
    >>> tail.poll(), len(tail.rows), len(read_jsonl(path))
    ([{'version': 3}], 3, 3)
    >>> tmp.cleanup()
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _parse(line: bytes | str) -> dict | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every complete object of a JSON-lines file; unparsable lines (one being written) are skipped."""
    try:
        with open(path, "rb") as f:
            return [obj for line in f if (obj := _parse(line)) is not None]
    except FileNotFoundError:
        return []


class JsonlTail:
    """Reads a growing JSON-lines file from where it stopped: polling costs the new lines, not the file."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.rows: list[dict] = []
        self._offset = 0

    def poll(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a half-written last line waits for the next poll
        self._offset += len(complete)
        new = [obj for line in complete.splitlines() if (obj := _parse(line)) is not None]
        self.rows.extend(new)
        return new

"""Reading a run's JSON-lines logs (``logs/optimizer.jsonl``, ``logs/eval.jsonl``): all at once for reports,
or incrementally for a live display that polls every second.

Usage::

    rows = read_jsonl(run_dir / "logs" / "eval.jsonl")     # [] when the file does not exist yet
    tail = JsonlTail(run_dir / "logs" / "optimizer.jsonl")
    while running:
        new = tail.poll()                                  # only the lines written since the last poll
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

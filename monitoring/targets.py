"""File-based discovery of a run's metrics exporters, and Prometheus file_sd target lists.

Usage::

    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> run_dir = Path(tmp.name)
    >>> _ = register_process(run_dir, "optimizer", 0, 9100)    # each process, once its exporter listens
    >>> _ = register_process(run_dir, "rollout", 3, 9101)
    >>> targets = collect_targets(run_dir)
    >>> [(t["role"], t["rank"], t["port"]) for t in targets]
    [('optimizer', 0, 9100), ('rollout', 3, 9101)]
    >>> path = write_file_sd(targets, run_dir / "metrics" / "targets.json", run="demo")   # what Prometheus reads
    >>> json.loads(path.read_text())[1]
    {'targets': ['127.0.0.1:9101'], 'labels': {'role': 'rollout', 'rank': '3', 'run': 'demo'}}
    >>> tmp.cleanup()

Each process owns ``<run_dir>/metrics/<role>-<rank>.json``; a restarted process overwrites its own entry. One
that stops cleanly removes it (``unregister_process``); one that dies stays listed on purpose, so Prometheus
reports it as ``up == 0`` (the rank-down alert). A registration names the process's ``run.name``: its target
is labelled with it, as the process labels its own series (the dashboard's run selector and ``up{run=…}``
then agree, whatever the run directory is called).
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

log = logging.getLogger(__name__)

_ROLE = re.compile(r"^[a-z][a-z0-9_]*$")
_TARGET_FILE = re.compile(r"^([a-z][a-z0-9_]*)-(\d+)\.json$")


def _write_json_atomic(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)  # Prometheus' file watcher must never see a half-written list
    except BaseException:
        os.unlink(tmp)
        raise


def register_process(run_dir: str | os.PathLike, role: str, rank: int, port: int, host: str = "127.0.0.1",
                     run: str = "") -> Path:
    """Write ``<run_dir>/metrics/<role>-<rank>.json`` so collect_targets() finds this process' exporter."""
    if not _ROLE.match(role):
        raise ValueError(f"role must be lower-case letters, digits and '_', got {role!r}")
    path = Path(run_dir) / "metrics" / f"{role}-{int(rank)}.json"
    entry = {"role": role, "rank": int(rank), "host": host, "port": int(port), "pid": os.getpid()}
    _write_json_atomic(path, {**entry, "run": run} if run else entry)
    return path


def unregister_process(path: Path, port: int) -> None:
    """Remove this process's registration at a clean stop, unless a successor has replaced it since."""
    try:
        entry = json.loads(path.read_text())
        if entry.get("pid") == os.getpid() and entry.get("port") == port:
            path.unlink()
    except (OSError, ValueError) as exc:
        log.warning("metrics registration %s not removed: %s", path, exc)


def collect_targets(run_dir: str | os.PathLike) -> list[dict]:
    """All registered processes of a run, sorted by role then rank. Unreadable entries are logged and skipped."""
    folder = Path(run_dir) / "metrics"
    targets = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        if not _TARGET_FILE.match(path.name):
            continue  # targets.json and other files that share the folder
        try:
            entry = json.loads(path.read_text())
            targets.append({"role": str(entry["role"]), "rank": int(entry["rank"]), "host": str(entry["host"]),
                            "port": int(entry["port"]), "pid": int(entry.get("pid", 0)),
                            "run": str(entry.get("run", ""))})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("skipping metrics target %s: %s", path, exc)
    return sorted(targets, key=lambda t: (t["role"], t["rank"]))


def write_file_sd(targets: Iterable[Mapping], path: str | os.PathLike, run: str) -> Path:
    """Write a Prometheus file_sd JSON list: one group per process, labelled role/rank/run (atomic replace); the
    run label is the one the process registered with, else ``run``."""
    groups = [{"targets": [f"{t['host']}:{int(t['port'])}"],
               "labels": {"role": str(t["role"]), "rank": str(int(t["rank"])), "run": str(t.get("run") or run)}}
              for t in targets]
    path = Path(path)
    _write_json_atomic(path, groups)
    return path


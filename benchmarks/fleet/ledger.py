"""What the store was given: every completed PUT the fleet made, decoded as a reader would, with its time.

A product counter can be wrong (a keeper that counts games it never commits, an uploader that drops a sample
before counting it), so the figures that say whether the data plane did its job are read back from the store
instead: the sample ids inside each experience object, each parameter version's weights and meta, where
``params/LATEST`` pointed and when, each checkpoint's update count, the games in each pool revision and the
snapshots stored. The store calls :meth:`Ledger.stored` once a PUT has completed (``Meter.put_done``); objects
that no reader would accept are counted in ``unreadable``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rapid.errors import FormatError
from rapid.formats.checkpoint import decode_checkpoint
from rapid.formats.experience import Shape, decode_experience
from rapid.formats.params import decode_params
from rapid.league.state import load_pool
from rapid.run.store_map import (
    CHECKPOINTS_LATEST,
    PARAMS_LATEST,
    SNAPSHOTS_PREFIX,
    parse_checkpoint_key,
    parse_params_key,
    parse_pool_revision_key,
)

from .standins import SAMPLE_ID

OUTCOMES = {"learner": 0, "opponent": 1, "draw": 2}
"""An episode's winner → its place in a member's (wins, losses, draws) of the learner."""


@dataclass
class Version:
    at: float  # when its object was stored
    updates: int | None  # its meta's update count
    weights: float  # the stand-in's weights hold one value: the update count they were taken at (nan: mixed)


@dataclass
class Ledger:
    shape: Shape
    samples: dict[str, np.ndarray] = field(default_factory=dict)  # experience key → the sample ids it holds
    games: dict[str, int] = field(default_factory=dict)  # experience key → the finished games it carries
    # experience key → opponent → the learner's [wins, losses, draws] in the games it carries
    results: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    by_worker: dict[str, list[str]] = field(default_factory=dict)  # uploader's worker name → its experience keys
    versions: dict[int, Version] = field(default_factory=dict)
    latest: list[tuple[float, int]] = field(default_factory=list)  # (time, version) of each LATEST write
    checkpoints: list[tuple[float, int, int]] = field(default_factory=list)  # (time, version, updates)
    checkpoint_latest: list[tuple[float, int]] = field(default_factory=list)  # (time, version) of its pointer
    pool: list[tuple[float, int, int]] = field(default_factory=list)  # (time, revision, games in the pool)
    past_since: float | None = None  # when a pool revision first held an active snapshot
    snapshots: dict[str, float] = field(default_factory=dict)  # snapshot id → when stored
    unreadable: list[str] = field(default_factory=list)

    def stored(self, key: str, data: bytes, at: float) -> None:
        try:
            self._read(key, data, at)
        except (FormatError, ValueError, KeyError, TypeError) as e:
            self.unreadable.append(f"{key}: {e}")

    def _read(self, key: str, data: bytes, at: float) -> None:
        if key.startswith("experience/") and key.endswith(".rxp"):
            batch = decode_experience(data, self.shape)
            self.samples[key] = batch.arrays["obs"][SAMPLE_ID].astype(np.int64)
            self.games[key] = len(batch.episodes)
            results: dict[str, list[int]] = {}
            for ep in batch.episodes:
                results.setdefault(ep["opponent"], [0, 0, 0])[OUTCOMES[ep["winner"]]] += 1
            self.results[key] = results
            self.by_worker.setdefault(batch.worker, []).append(key)
        elif key == PARAMS_LATEST:
            self.latest.append((at, int(data.decode("ascii"))))
        elif key == CHECKPOINTS_LATEST:
            self.checkpoint_latest.append((at, int(data.decode("ascii"))))
        elif (version := parse_params_key(key)) is not None:
            obj = decode_params(data)
            w = obj.tensors.get("w", np.zeros(0))
            uniform = w.size > 0 and bool(np.all(w == w.flat[0]))
            self.versions[version] = Version(at, obj.meta.get("updates"), float(w.flat[0]) if uniform else math.nan)
        elif (version := parse_checkpoint_key(key)) is not None:
            self.checkpoints.append((at, version, decode_checkpoint(data).updates))
        elif (revision := parse_pool_revision_key(key)) is not None:
            state = load_pool(data, key)
            self.pool.append((at, revision, state.latest_games + sum(m.games for m in state.members.values())))
            if self.past_since is None and state.snapshots():
                self.past_since = at
        elif key.startswith(SNAPSHOTS_PREFIX):
            decode_params(data)
            self.snapshots[key[len(SNAPSHOTS_PREFIX):].removesuffix(".rpm")] = at

    def newest_at(self, t: float) -> int | None:
        """The version ``params/LATEST`` named at time ``t`` (the last one written by then)."""
        named = [v for at, v in self.latest if at <= t]
        return named[-1] if named else None

    def stored_ids(self) -> np.ndarray:
        return np.concatenate(list(self.samples.values())) if self.samples else np.zeros(0, np.int64)

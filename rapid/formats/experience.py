"""Experience objects: a batch of samples of ``bptt`` steps from one rollout worker (SPEC §5).

Every sample carries the LSTM state at its start, the policy version that produced it and the opponent
it played. Usage::

    data = encode_experience(batch)                 # bytes for store.put
    batch = decode_experience(data, expect)         # FormatError on anything wrong
    batch.arrays["obs"]                             # float32 [S, T, obs_dim]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rapid.errors import FormatError
from rapid.formats import codec

FORMAT = "rapid.experience"
FORMAT_VERSION = 1
LIMITS = codec.Limits(max_bytes=512 << 20, max_array_bytes=256 << 20, max_elements=200_000)
MAX_SAMPLES = 1 << 20
MAX_STEPS = 4096


@dataclass(frozen=True)
class Shape:
    """The sizes a consumer expects; decoding checks every array against them."""

    bptt: int
    obs_dim: int
    mask_dim: int
    heads: int
    lstm: int

    def fields(self) -> dict[str, tuple[str, tuple]]:
        """Array name → (dtype, shape after the leading [S]) for every experience array."""
        T = self.bptt
        return {
            "obs": ("float32", (T, self.obs_dim)),
            "mask": ("bool", (T, self.mask_dim)),
            "actions": ("int64", (T, self.heads)),
            "logp": ("float32", (T,)),
            "values": ("float32", (T,)),
            "advantages": ("float32", (T,)),
            "returns": ("float32", (T,)),
            "active": ("bool", (T,)),
            "own": ("bool", (T,)),
            "first": ("bool", (T,)),
            "h0": ("float32", (self.lstm,)),
            "c0": ("float32", (self.lstm,)),
            "version": ("int64", ()),
            "opponent": ("int32", ()),
        }


@dataclass
class ExperienceBatch:
    worker: str
    seq: int
    created: float
    arrays: dict[str, np.ndarray]
    """Per-sample arrays, each with leading dimension S (see Shape.fields)."""
    opponents: list[str]
    """Opponent ids; ``arrays['opponent']`` indexes this list."""
    episodes: list[dict] = field(default_factory=list)
    """Finished games: learner_version, opponent, learner_side, winner ('learner'|'opponent'|'draw'),
    length, learner_return."""
    env_steps: int = 0
    """Agent-steps the worker took while producing this batch."""

    @property
    def num_samples(self) -> int:
        return int(self.arrays["version"].shape[0])


def encode_experience(batch: ExperienceBatch) -> bytes:
    return codec.encode(FORMAT, FORMAT_VERSION, {
        "worker": batch.worker, "seq": batch.seq, "created": float(batch.created),
        "arrays": batch.arrays, "opponents": batch.opponents, "episodes": batch.episodes,
        "env_steps": int(batch.env_steps),
    })


_EPISODE_KEYS = {"learner_version": int, "opponent": str, "learner_side": int, "winner": str, "length": int,
                 "learner_return": (int, float)}


def _check_episode(ep, where: str) -> dict:
    if not isinstance(ep, dict):
        raise FormatError(f"{where}: episode record is not a map")
    for key, kind in _EPISODE_KEYS.items():
        codec.require(ep, key, kind, where)
    if not math.isfinite(ep["learner_return"]):
        raise FormatError(f"{where}: non-finite learner_return")
    if ep["winner"] not in ("learner", "opponent", "draw"):
        raise FormatError(f"{where}: bad winner {ep['winner']!r}")
    return ep


def decode_experience(data: bytes, shape: Shape) -> ExperienceBatch:
    tree = codec.decode(data, FORMAT, (FORMAT_VERSION,), LIMITS)
    where = "experience object"
    if not isinstance(tree, dict):
        raise FormatError(f"{where}: payload is not a map")
    worker = codec.require(tree, "worker", str, where)
    seq = codec.require(tree, "seq", int, where)
    created = codec.require(tree, "created", (int, float), where)
    arrays = codec.require(tree, "arrays", dict, where)
    opponents = codec.require(tree, "opponents", list, where)
    episodes = codec.require(tree, "episodes", list, where)
    env_steps = codec.require(tree, "env_steps", int, where)
    if not math.isfinite(created):
        raise FormatError(f"{where}: non-finite creation time")
    expected = shape.fields()
    if not all(isinstance(k, str) for k in arrays) or set(arrays) != set(expected):
        raise FormatError(f"{where}: arrays {sorted(map(str, arrays))} differ from {sorted(expected)}")
    num = arrays["version"].shape[0] if isinstance(arrays["version"], np.ndarray) and arrays["version"].ndim else -1
    if not 0 < num <= MAX_SAMPLES:
        raise FormatError(f"{where}: bad sample count")
    for name, (dtype, rest) in expected.items():
        codec.require_array(arrays, name, dtype, (num, *rest), where)
    if not all(isinstance(o, str) for o in opponents):
        raise FormatError(f"{where}: opponent ids must be strings")
    opp = arrays["opponent"]
    if opp.size and (opp.min() < 0 or opp.max() >= len(opponents)):
        raise FormatError(f"{where}: opponent index out of range")
    if (arrays["version"] < 0).any():
        raise FormatError(f"{where}: negative policy version")
    for name in ("obs", "logp", "values", "advantages", "returns", "h0", "c0"):
        if not np.isfinite(arrays[name]).all():
            raise FormatError(f"{where}: {name} has non-finite values")
    if not arrays["mask"].any(-1).all():
        raise FormatError(f"{where}: a step with an all-forbidden action mask")
    return ExperienceBatch(worker, seq, float(created), arrays, opponents,
                           [_check_episode(ep, where) for ep in episodes], env_steps)

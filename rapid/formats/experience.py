"""Experience objects: a batch of samples of ``bptt`` steps from one rollout worker.

Every sample carries the LSTM state at its start, the policy version that produced it and the opponent
it played; the worker's GAE advantages and returns, and what they were computed from (each step's rewards and
discounts, the value after the sample's last step), so that a learner may compute its own (V-trace). Format
version 2 added those three fields: an object of version 1 is refused like any bad object. Usage::

    >>> shape = Shape(bptt=4, obs_dim=3, mask_dim=2, heads=1, lstm=8)   # or Shape.of(env.spec, bptt=16, lstm=256)
    >>> arrays = {name: np.zeros((2, *dims), dtype) for name, (dtype, dims) in shape.fields().items()}   # S = 2
    >>> arrays["mask"][:], arrays["version"][:] = True, 7
    >>> data = encode_experience(ExperienceBatch("w0", seq=1, created=0.0, arrays=arrays, opponents=["latest"]))
    >>> batch = decode_experience(data, shape, max_version=7)      # bytes from store.get, checked
    >>> batch.num_samples, batch.arrays["obs"].dtype, batch.arrays["obs"].shape   # float32 [S, T, obs_dim]
    (2, dtype('float32'), (2, 4, 3))
    >>> decode_experience(data, shape, max_version=6)               # FormatError on anything wrong
    Traceback (most recent call last):
    rapid.errors.FormatError: experience object: policy version newer than v6, the newest published
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rapid.errors import FormatError
from rapid.formats import codec

FORMAT = "rapid.experience"
FORMAT_VERSION = 2
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
    head_sizes: tuple[int, ...] = ()
    """Size of each action head (the mask of head k is its slice of ``mask_dim``); may be left out only
    for a single head, whose size is then ``mask_dim``."""

    def __post_init__(self):
        sizes = tuple(int(n) for n in self.head_sizes) or ((self.mask_dim,) if self.heads == 1 else ())
        if len(sizes) != self.heads or sum(sizes) != self.mask_dim or min(sizes, default=0) < 1:
            raise ValueError(f"head sizes {self.head_sizes} do not match {self.heads} heads and a mask of "
                             f"{self.mask_dim}")
        object.__setattr__(self, "head_sizes", sizes)

    @staticmethod
    def of(spec, bptt: int, lstm: int) -> Shape:
        """The shape of an env's experience (``spec``: an EnvSpec)."""
        heads = tuple(spec.action_heads)
        return Shape(bptt=bptt, obs_dim=spec.obs_dim, mask_dim=sum(heads), heads=len(heads), lstm=lstm,
                     head_sizes=heads)

    def fields(self) -> dict[str, tuple[str, tuple]]:
        """Array name → (dtype, shape after the leading [S]) for every experience array."""
        return _fields(self.bptt, self.obs_dim, self.mask_dim, self.heads, self.lstm)

    @property
    def sample_bytes(self) -> int:
        """Bytes of one sample's arrays (what a buffer slot holds)."""
        return sum(np.dtype(dtype).itemsize * math.prod(dims) for dtype, dims in self.fields().values())


def _fields(T: int, obs_dim: int, mask_dim: int, heads: int, lstm: int) -> dict[str, tuple[str, tuple]]:
    return {
        "obs": ("float32", (T, obs_dim)),
        "mask": ("bool", (T, mask_dim)),
        "actions": ("int64", (T, heads)),
        "logp": ("float32", (T,)),
        "values": ("float32", (T,)),
        "advantages": ("float32", (T,)),
        "returns": ("float32", (T,)),
        "rewards": ("float32", (T,)),
        "discounts": ("float32", (T,)),
        "bootstrap": ("float32", ()),
        "active": ("bool", (T,)),
        "own": ("bool", (T,)),
        "first": ("bool", (T,)),
        "h0": ("float32", (lstm,)),
        "c0": ("float32", (lstm,)),
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


def samples_per_object(arrays: dict[str, np.ndarray]) -> int:
    """The most samples one object may carry and still pass every reader's limits, with a factor 2 to
    spare: an uploader splits a larger batch rather than write an object that every rank would reject."""
    rows = max(1, int(arrays["version"].shape[0]))
    per_array = max(a.nbytes for a in arrays.values()) / rows
    total = sum(a.nbytes for a in arrays.values()) / rows
    return max(1, min(MAX_SAMPLES // 2, int(LIMITS.max_array_bytes // 2 // max(per_array, 1)),
                      int(LIMITS.max_bytes // 2 // max(total, 1))))


def encode_experience(batch: ExperienceBatch) -> bytes:
    """The batch's bytes; FormatError (and no bytes) for one that :func:`decode_experience` would refuse with
    the shape its own arrays claim. Two reader rules need more than the batch: the newest published version
    (``max_version``) and, with several action heads, each head's size (the env's; the writer checks only that
    every action fits the mask's width)."""
    return codec.encode_checked(FORMAT, FORMAT_VERSION, {
        "worker": batch.worker, "seq": batch.seq, "created": float(batch.created),
        "arrays": batch.arrays, "opponents": batch.opponents, "episodes": batch.episodes,
        "env_steps": int(batch.env_steps),
    }, LIMITS, lambda tree: _batch(tree, *_claimed(tree), max_version=None))


def _claimed(tree: dict) -> tuple[dict[str, tuple[str, tuple]], tuple[int, ...] | None]:
    """The fields and head sizes (None: unknown, with several heads) that a batch's own arrays claim."""
    arrays = tree.get("arrays", {})
    try:
        T, obs_dim = arrays["obs"].shape[1:3]
        mask_dim, heads, lstm = arrays["mask"].shape[2], arrays["actions"].shape[2], arrays["h0"].shape[1]
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as e:
        raise FormatError(f"experience object: its arrays do not give its sizes ({e!r})") from e
    if not 1 <= heads <= mask_dim:
        raise FormatError(f"experience object: {heads} action heads and a mask of {mask_dim}")
    return _fields(T, obs_dim, mask_dim, heads, lstm), ((mask_dim,) if heads == 1 else None)


def _check_actions(arrays: dict, head_sizes: tuple[int, ...] | None, where: str) -> None:
    """Every action within its head, and allowed by the mask on the steps that are trained on. With the head
    sizes unknown (None), only what holds whatever they are: each action below the largest a head can be."""
    actions, mask, active = arrays["actions"], arrays["mask"], arrays["active"]
    if head_sizes is None:
        widest = mask.shape[-1] - actions.shape[-1] + 1  # every head has at least one action
        if actions.size and (actions.min() < 0 or actions.max() >= widest):
            raise FormatError(f"{where}: an action outside 0..{widest - 1}")
        return
    offset = 0
    for h, size in enumerate(head_sizes):
        a = actions[..., h]
        if a.size and (a.min() < 0 or a.max() >= size):
            raise FormatError(f"{where}: action of head {h} outside 0..{size - 1}")
        allowed = np.take_along_axis(mask[..., offset:offset + size], a[..., None], axis=-1)[..., 0]
        if not allowed[active].all():
            raise FormatError(f"{where}: an action of head {h} that its mask forbids")
        offset += size


_EPISODE_KEYS: dict[str, type | tuple[type, ...]] = {
    "learner_version": int, "opponent": str, "learner_side": int, "winner": str, "length": int,
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
    if ep["learner_version"] < 0 or ep["length"] < 0 or ep["learner_side"] not in (0, 1):
        raise FormatError(f"{where}: episode record out of range")
    return ep


def decode_experience(data: bytes, shape: Shape, max_version: int | None = None) -> ExperienceBatch:
    """The batch in ``data``, every field checked against ``shape`` and its range; with ``max_version``
    (the newest version published), samples stamped with a later one are refused."""
    tree = codec.decode(data, FORMAT, (FORMAT_VERSION,), LIMITS)
    return _batch(tree, shape.fields(), shape.head_sizes, max_version)


def _batch(tree, expected: dict[str, tuple[str, tuple]], head_sizes: tuple[int, ...] | None,
           max_version: int | None) -> ExperienceBatch:
    """The reader's rules, which the writer runs too (on ``codec.reader_view``, with the sizes it claims)."""
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
    if seq < 0 or env_steps < 0:
        raise FormatError(f"{where}: negative seq or env_steps")
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
    if max_version is not None and (arrays["version"] > max_version).any():
        raise FormatError(f"{where}: policy version newer than v{max_version}, the newest published")
    for name in ("obs", "logp", "values", "advantages", "returns", "rewards", "discounts", "bootstrap", "h0", "c0"):
        if not np.isfinite(arrays[name]).all():
            raise FormatError(f"{where}: {name} has non-finite values")
    if arrays["discounts"].size and not 0.0 <= arrays["discounts"].min() <= arrays["discounts"].max() <= 1.0:
        raise FormatError(f"{where}: a discount outside [0, 1]")
    if not arrays["mask"].any(-1).all():
        raise FormatError(f"{where}: a step with an all-forbidden action mask")
    _check_actions(arrays, head_sizes, where)
    return ExperienceBatch(worker, seq, float(created), arrays, opponents,
                           [_check_episode(ep, where) for ep in episodes], env_steps)

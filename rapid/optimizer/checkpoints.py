"""Checkpoints in a run's store: save (finite only) with retention, load with full validation, and the point
a ``--resume`` continues from.

Usage::

    >>> import tempfile
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.opt.model import Policy
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> policy = Policy(obs_dim=4, action_heads=(3,), hidden=8)
    >>> adam = torch.optim.Adam(policy.parameters())
    >>> load_latest_checkpoint(store) is None      # the run has none yet
    True
    >>> save_checkpoint(store, Checkpoint.from_torch(5, 50, policy.tensors(), adam.state_dict()), keep=3)
    'checkpoints/...'
    >>> load_latest_checkpoint(store).version      # the one checkpoints/LATEST names
    5
    >>> point = resume_point(store, policy, adam, logging.getLogger("doctest"))   # loads policy and adam
    >>> point.version, point.updates, point.source  # next publish is point.version + 1
    (5, 50, 'checkpoint v5')
    >>> other = Policy(obs_dim=4, action_heads=(3,), hidden=8)   # another optimizer rank loads exactly that one
    >>> load_resume_point(store, point, other, torch.optim.Adam(other.parameters()), logging.getLogger("doctest"))

A checkpoint is used only when everything in it is finite and fits the model: weights, every Adam moment
and step count, and parameter groups that cover each parameter once. A bad one (a crash that saved NaN
Adam moments, a truncated object, a stray file) is skipped for the next older one; with none left, the
newest published weights are used with a fresh optimizer state. Version numbers always continue after the
newest one in use anywhere in the store (checkpoints, ``params/LATEST``, ``params/…``), so a version killed
between its object and its pointer is never published twice. A store, I/O or out-of-memory error while
loading says nothing about the checkpoint: it is tried again (``LOAD_TRIES``), then the resume stops
(UsageError), never falling back to an older checkpoint or a fresh Adam. With several optimizer ranks only
rank 0 runs :func:`resume_point`; the others load the point it chose with :func:`load_resume_point`
(``rapid/roles/start_point.py``).

After a surgery (``rapid surgery``, docs/surgery.md) the run has a new shape: checkpoints and published versions
older than the newest completed surgery are never used, a checkpoint that does not fit the model is a config
from before the surgery (UsageError, one line, not a silent fall back to the old shape), and a surgery
interrupted after its commit must be finished before the run resumes.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field

import torch

from rapid.errors import FormatError, UsageError
from rapid.formats.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from rapid.formats.checkpoint import check_checkpoint as check_checkpoint  # surgery checks before it stages
from rapid.infra.store import BadObject, KeyNotFound, Store, StoreError
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import (
    CHECKPOINTS_LATEST,
    CHECKPOINTS_PREFIX,
    checkpoint_key,
    parse_checkpoint_key,
    read_version_pointer,
    surgery_key,
    surgery_states,
    write_version_pointer,
)

PUBLISHED_FALLBACKS = 8
"""Published versions tried, newest first, when no checkpoint is usable."""

_UNUSABLE = (FormatError, ValueError, KeyError, TypeError, IndexError, RuntimeError, BadObject)
"""What a bad checkpoint raises while it is decoded, checked or loaded into torch (after :func:`_transient`
has kept the errors that say nothing about it out)."""
LOAD_TRIES = 4
"""Tries of one checkpoint through a transient error (waits 1, 2, 4 s) before the resume stops."""


def save_checkpoint(store: Store, ckpt: Checkpoint, keep: int) -> str:
    """Write the checkpoint, move ``checkpoints/LATEST``, keep the newest ``keep``. A checkpoint that a reader
    would refuse (a non-finite number, an inconsistent Adam state) is refused (FormatError) and nothing is
    written: the older ones stay the newest."""
    data = encode_checkpoint(ckpt)
    key = checkpoint_key(ckpt.version)
    store.put(key, data)
    write_version_pointer(store, CHECKPOINTS_LATEST, ckpt.version)
    for stale in checkpoint_versions(store)[:-keep]:
        store.delete(checkpoint_key(stale))
    return key


def checkpoint_versions(store: Store) -> list[int]:
    """Versions with a checkpoint object, ascending."""
    return sorted(v for v in map(parse_checkpoint_key, store.list(CHECKPOINTS_PREFIX)) if v is not None)


def load_checkpoint(store: Store, version: int) -> Checkpoint:
    """One checkpoint, decoded and checked; FormatError if it is not usable, KeyNotFound if absent."""
    ckpt = decode_checkpoint(store.get(checkpoint_key(version)))
    if ckpt.version != version:
        raise FormatError(f"{checkpoint_key(version)} holds version {ckpt.version}")
    return ckpt


def _candidates(store: Store) -> list[int]:
    """Checkpoint versions to try, newest first: the pointer's (if it parses) and every listed one."""
    listed = checkpoint_versions(store)
    try:
        pointer = read_version_pointer(store, CHECKPOINTS_LATEST)
    except FormatError:
        pointer = None
    return sorted(set(listed) | ({pointer} if pointer is not None else set()), reverse=True)


def load_latest_checkpoint(store: Store) -> Checkpoint | None:
    """The checkpoint ``checkpoints/LATEST`` names, checked; None when the run has none. FormatError for a bad
    one (:func:`resume_point` falls back to older ones instead)."""
    version = read_version_pointer(store, CHECKPOINTS_LATEST)
    return None if version is None else load_checkpoint(store, version)


@dataclass(frozen=True)
class ResumePoint:
    version: int
    """The newest version number in use in the store: the next publish is ``version + 1``."""
    updates: int
    source: str
    """What the weights came from, for the log: ``checkpoint v12`` or ``published v14 (…)``."""
    loaded: int
    """The version whose weights (and, from a checkpoint, Adam state) were loaded."""
    checkpoint: bool
    """True: checkpoint ``loaded``; False: published version ``loaded`` with a fresh optimizer state."""
    meta: dict = field(default_factory=dict)
    """The loaded checkpoint's meta (a population member's state: rapid/roles/pbt_member.py)."""


def newest_version_in_use(store: Store) -> int | None:
    """The largest version named anywhere: a checkpoint, ``params/LATEST`` or a published object."""
    params = ParameterStore(store)
    try:
        pointer = params.latest_version()
    except FormatError:
        pointer = None
    found = [*checkpoint_versions(store), *params.versions(), *([pointer] if pointer is not None else [])]
    return max(found, default=None)


def surgery_floor(store: Store) -> int:
    """The version the newest completed surgery made (0 without one): nothing older fits the run's shape.
    UsageError while a surgery that committed has not completed."""
    states = surgery_states(store)
    pending = [version for version, done in states.items() if not done]
    if pending:
        raise UsageError(f"the surgery that made v{pending[-1]} was interrupted after its commit "
                         f"({surgery_key(pending[-1])}): run `rapid surgery --apply` on this run again to finish it")
    return max(states, default=0)


def _load_model(policy, tensors: dict, version: int, floor: int) -> None:
    """``policy.load_tensors``; after a surgery a mismatch means the config is from before it (UsageError)."""
    try:
        policy.load_tensors(tensors)
    except ValueError as e:
        if floor:
            raise UsageError(f"v{version} does not fit this config's model ({e}): the run went through surgery at "
                             f"v{floor}; resume it with the config the surgery wrote (its run dir's config.toml, "
                             f"or config_after in {surgery_key(floor)})") from None
        raise


def _transient(error: BaseException) -> bool:
    """A store, I/O or memory error: reading again may work, so it says nothing about the checkpoint (a missing
    or refused object does: :class:`KeyNotFound`, :class:`BadObject`)."""
    if isinstance(error, (KeyNotFound, BadObject)):
        return False
    if isinstance(error, RuntimeError):  # torch.cuda.OutOfMemoryError is one; other RuntimeErrors are bad data
        return "out of memory" in str(error)
    return isinstance(error, (StoreError, OSError, MemoryError))


def _retried(what: str, load, log: logging.Logger, tries: int, wait_s: float):
    """``load()``, tried again ``tries - 1`` times with doubling waits while it fails with a transient error;
    then UsageError: never an older checkpoint or a fresh Adam instead of the one that could not be read."""
    for attempt in range(1, tries + 1):
        try:
            return load()
        except Exception as e:  # only the transient ones are retried; anything else goes to the caller as is
            if not _transient(e):
                raise
            if attempt == tries:
                raise UsageError(f"{what} could not be loaded in {tries} tries ({type(e).__name__}: "
                                 f"{' '.join(str(e).split())}): a store, I/O or memory error, not a bad "
                                 f"checkpoint, so no older one is used; resume again once it is resolved") from e
            log.warning("%s: %s: %s; trying again in %.0fs", what, type(e).__name__, e, wait_s)
            time.sleep(wait_s)
            wait_s *= 2


def _load_checkpoint_into(store: Store, version: int, policy, adam: torch.optim.Optimizer, floor: int) -> Checkpoint:
    ckpt = load_checkpoint(store, version)
    _load_model(policy, ckpt.model, version, floor)
    adam.load_state_dict(ckpt.adam_state())
    _check_loaded(adam)
    return ckpt


def _load_published_into(store: Store, version: int, policy, floor: int):
    obj = ParameterStore(store).fetch(version)
    _load_model(policy, obj.tensors, version, floor)
    return obj


def resume_point(store: Store, policy, adam: torch.optim.Optimizer, log: logging.Logger,
                 tries: int = LOAD_TRIES, wait_s: float = 1.0) -> ResumePoint:
    """Load the newest usable state into ``policy`` and ``adam``; UsageError when the store has none, or when
    one could not be read for a transient reason (``tries`` times: see :func:`_retried`)."""
    newest = newest_version_in_use(store) or 0  # None: nothing stored, so no candidate below either
    floor = surgery_floor(store)
    fresh = copy.deepcopy(adam.state_dict())
    for version in _candidates(store):
        if version < floor:
            continue  # the shape before the newest surgery
        try:
            ckpt = _retried(f"checkpoint v{version}", lambda v=version: _load_checkpoint_into(
                store, v, policy, adam, floor), log, tries, wait_s)
        except KeyNotFound:
            continue
        except _UNUSABLE as e:
            log.warning("checkpoint v%d is not usable (%s); trying an older one", version, e)
            continue
        return ResumePoint(max(newest, ckpt.version), ckpt.updates, f"checkpoint v{ckpt.version}", ckpt.version, True,
                           ckpt.meta)
    adam.load_state_dict(fresh)  # a half-loaded bad checkpoint leaves nothing behind
    for version in [v for v in sorted(ParameterStore(store).versions(), reverse=True) if v >= floor][
            :PUBLISHED_FALLBACKS]:
        try:
            obj = _retried(f"published v{version}", lambda v=version: _load_published_into(store, v, policy, floor),
                           log, tries, wait_s)
        except (KeyNotFound, *_UNUSABLE) as e:
            log.warning("published v%d is not usable (%s); trying an older one", version, e)
            continue
        updates = obj.meta.get("updates", 0)
        updates = updates if isinstance(updates, int) and not isinstance(updates, bool) and updates >= 0 else 0
        return ResumePoint(max(newest, version), updates, f"published v{version} (no usable checkpoint; "
                                                           "optimizer state starts fresh)", version, False)
    raise UsageError(f"--resume: no usable checkpoint or published version in {store.describe()}")


def load_resume_point(store: Store, point: ResumePoint, policy, adam: torch.optim.Optimizer, log: logging.Logger,
                      tries: int = LOAD_TRIES, wait_s: float = 1.0) -> None:
    """Load exactly ``point`` (chosen by :func:`resume_point`, on another rank) into ``policy`` and ``adam``:
    the checkpoint, or the published weights with ``adam`` left fresh. Never another one: an unusable object
    raises, a transient error is tried again, then UsageError."""
    floor = surgery_floor(store)
    if point.checkpoint:
        _retried(f"checkpoint v{point.loaded}", lambda: _load_checkpoint_into(store, point.loaded, policy, adam,
                                                                             floor), log, tries, wait_s)
    else:
        _retried(f"published v{point.loaded}", lambda: _load_published_into(store, point.loaded, policy, floor),
                 log, tries, wait_s)


def _check_loaded(adam: torch.optim.Optimizer) -> None:
    """Each Adam moment has its parameter's shape: torch checks group sizes on load but not this, and a
    mismatch would only fail inside the first step."""
    for group in adam.param_groups:
        for p in group["params"]:
            for name, value in adam.state.get(p, {}).items():
                if torch.is_tensor(value) and value.dim() > 0 and value.shape != p.shape:
                    raise FormatError(f"Adam {name} has shape {tuple(value.shape)}, parameter {tuple(p.shape)}")

"""Checkpoints in a run's store: save with retention, load the newest.

Usage::

    save_checkpoint(store, Checkpoint(version, updates, policy.tensors(), adam.state_dict()), keep=3)
    ckpt = load_latest_checkpoint(store)        # None when the run has none
    policy.load_tensors(ckpt.model); adam.load_state_dict(ckpt.adam_state())
"""

from __future__ import annotations

from rapid.formats.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from rapid.infra.store import Store
from rapid.store_map import (
    CHECKPOINTS_LATEST,
    CHECKPOINTS_PREFIX,
    checkpoint_key,
    read_version_pointer,
    write_version_pointer,
)


def save_checkpoint(store: Store, ckpt: Checkpoint, keep: int) -> str:
    key = checkpoint_key(ckpt.version)
    store.put(key, encode_checkpoint(ckpt))
    write_version_pointer(store, CHECKPOINTS_LATEST, ckpt.version)
    old = sorted(k for k in store.list(CHECKPOINTS_PREFIX) if k.endswith(".rck"))
    for stale in old[:-keep]:
        store.delete(stale)
    return key


def load_latest_checkpoint(store: Store) -> Checkpoint | None:
    version = read_version_pointer(store, CHECKPOINTS_LATEST)
    if version is None:
        return None
    return decode_checkpoint(store.get(checkpoint_key(version)))

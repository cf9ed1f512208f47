"""The parameter store: published, immutable versions of the policy's weights in a run's store.

Usage::

    >>> import tempfile
    >>> from rapid.infra.store import LocalStore
    >>> params = ParameterStore(LocalStore(tempfile.mkdtemp()))
    >>> params.latest_version() is None                 # None before the first publish
    True
    >>> params.publish(7, {"w": np.ones(3, np.float32)}, meta={"updates": 70})   # params/000000000007.rpm, LATEST
    >>> v = params.latest_version()
    >>> v
    7
    >>> obj = params.fetch(v)                           # ParamsObject(version, tensors, meta)
    >>> obj.version, obj.tensors["w"].tolist(), obj.meta["updates"]
    (7, [1.0, 1.0, 1.0], 70)
"""

from __future__ import annotations

import numpy as np

from rapid.errors import FormatError
from rapid.formats.params import LIMITS, ParamsObject, decode_params, encode_params
from rapid.infra.store import KeyNotFound, Store
from rapid.run.store_map import (
    PARAMS_LATEST,
    PARAMS_PREFIX,
    params_key,
    parse_params_key,
    read_version_pointer,
    write_version_pointer,
)


class ParameterStore:
    """Published parameter versions in a store. Versions are immutable; LATEST moves forward only."""

    def __init__(self, store: Store):
        self.store = store
        self._pruned_below: int | None = None

    def publish(self, version: int, tensors: dict[str, np.ndarray], meta: dict | None = None) -> None:
        """FormatError, and nothing written, for an object that readers would refuse (a non-finite tensor, a
        ``meta`` that is not a map): every worker would skip it and stay on the version before."""
        self._put_version(version, encode_params(ParamsObject(version, tensors, meta or {})))

    def publish_encoded(self, version: int, data: bytes) -> None:
        """Publish the bytes of an encoded params object of ``version`` (surgery stages them before its commit
        and publishes them after it; publishing the same bytes again is a no-op). They were encoded elsewhere
        and have been in the store since, so they are decoded and checked first, as a reader would."""
        if decode_params(data).version != version:
            raise FormatError(f"the object to publish as v{version} holds another version")
        self._put_version(version, data)

    def _put_version(self, version: int, data: bytes) -> None:
        if not self.store.put_if_absent(params_key(version), data):
            # A retry after an ambiguous failure (the PUT landed, its answer was lost) finds its own bytes:
            # that is this publish succeeding, not a reused version.
            if self._existing(version) != data:
                raise FileExistsError(f"parameter version {version} is already published")
        # LATEST only after the version object exists, so a reader never follows a dangling pointer.
        write_version_pointer(self.store, PARAMS_LATEST, version)

    def _existing(self, version: int) -> bytes | None:
        try:
            return self.store.get(params_key(version))
        except KeyNotFound:
            return None

    def latest_version(self) -> int | None:
        return read_version_pointer(self.store, PARAMS_LATEST)

    def fetch(self, version: int) -> ParamsObject:
        obj = decode_params(self.store.get(params_key(version), max_bytes=LIMITS.max_bytes))
        if obj.version != version:
            raise FormatError(f"{params_key(version)} holds version {obj.version}")
        return obj

    def versions(self) -> list[int]:
        """Every published version, ascending; keys of any other shape under ``params/`` are ignored."""
        return sorted(v for v in map(parse_params_key, self.store.list(PARAMS_PREFIX)) if v is not None)

    def prune(self, newest: int, keep: int) -> int:
        """Delete versions older than the newest ``keep`` (0: keep all); returns how many. The first call lists
        ``params/`` once (a resumed run's leftovers); later calls delete the one version that fell out of the
        window, so a publish costs one DELETE, not a LIST. Resume needs only checkpoints and the newest
        version; snapshots are copies; ``rapid eval --version N`` then reaches the newest ``keep``."""
        if keep <= 0:
            return 0
        floor = newest - keep + 1
        if self._pruned_below is None:
            old = [v for v in self.versions() if v < floor]
        else:
            old = list(range(max(self._pruned_below, 0), floor))
        for version in old:
            self.store.delete(params_key(version))
        self._pruned_below = max(floor, self._pruned_below or 0)
        return len(old)


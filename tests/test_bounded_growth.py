"""Nothing grows without bound (issue 23): parameter versions beyond the kept window are deleted, with one
DELETE a publish after a first listing, and a run stays resumable."""

from __future__ import annotations

import numpy as np

from rapid.infra.store import LocalStore
from rapid.param_store import ParameterStore


class Counting(LocalStore):
    def __init__(self, root):
        super().__init__(root)
        self.calls: list[str] = []

    def list(self, prefix="", start_after=None):
        self.calls.append("list")
        return super().list(prefix, start_after)

    def delete(self, key):
        self.calls.append("delete")
        super().delete(key)


def test_old_versions_are_deleted_one_per_publish(tmp_path):
    store = Counting(tmp_path)
    params = ParameterStore(store)
    for v in range(10):  # a resumed run's leftovers: ten versions
        params.publish(v, {"w": np.full(2, v, np.float32)})
    store.calls.clear()
    params.publish(10, {"w": np.zeros(2, np.float32)})
    assert params.prune(10, keep=4) == 7 and store.calls.count("list") == 1
    assert params.versions() == [7, 8, 9, 10]
    for v in range(11, 40):
        params.publish(v, {"w": np.zeros(2, np.float32)})
        store.calls.clear()
        assert params.prune(v, keep=4) == 1 and store.calls == ["delete"]  # no listing on the publish path
    assert params.versions() == [36, 37, 38, 39] and params.latest_version() == 39


def test_keep_zero_keeps_everything(tmp_path):
    params = ParameterStore(LocalStore(tmp_path))
    for v in range(5):
        params.publish(v, {"w": np.zeros(2, np.float32)})
    assert params.prune(4, keep=0) == 0 and params.versions() == list(range(5))

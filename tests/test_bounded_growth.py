"""Nothing grows without bound (issue 23): parameter versions beyond the kept window are deleted, with one
DELETE a publish after a first listing, and a run stays resumable."""

from __future__ import annotations

import numpy as np

from rapid.infra.store import LocalStore
from rapid.run.param_store import ParameterStore


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


def test_a_long_runs_pool_document_and_snapshots_stop_growing(tmp_path):
    """Snapshots join every few versions for a long run: past the caps the lowest-quality ones retire, the
    oldest retired leave the document with their weights, and rating tables stay bounded."""
    from rapid.league import Tally
    from rapid.roles.league_keeper import LeagueKeeper
    from rapid.run.config import Config, LeagueConfig
    from rapid.run.store_map import POOL_POINTER

    store = LocalStore(tmp_path)
    params = ParameterStore(store)
    keeper = LeagueKeeper(store, Config(league=LeagueConfig(snapshot_every=1, max_snapshots=5, keep_retired=3)))
    sizes = []
    for v in range(1, 61):
        tensors = {"w": np.full(2, v, np.float32)}
        params.publish(v, tensors)
        keeper.after_publish(v, tensors)
        keeper.fold(Tally({f"v{v:012d}": [1, 0, 0]}))
        keeper.close()
        keeper = LeagueKeeper(store, keeper.cfg)
        sizes.append(len(store.get(POOL_POINTER)))
    keeper.close()
    state = keeper.league.read()
    assert len(state.snapshots()) == 5 and sum(m.retired for m in state.members.values()) == 3
    assert len(store.list("league/snapshots/")) == 8  # the forgotten ones' weights are gone
    assert max(sizes[40:]) <= max(sizes[20:40]) * 1.05, sizes  # the document stopped growing


def test_ratings_of_versions_outside_the_pool_are_bounded():
    from rapid.league.state import PoolState, Rating, forget_retired

    state = PoolState(ratings={f"v{v:012d}": Rating(25.0, 8.0) for v in range(50)})  # the evaluator rates each
    kept, forgotten = forget_retired(state, keep_retired=3, keep_ratings=10)
    assert sorted(kept.ratings) == [f"v{v:012d}" for v in range(40, 50)] and forgotten == []
    assert len(state.ratings) == 50  # pure

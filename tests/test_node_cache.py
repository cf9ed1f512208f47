"""The node cache (issue 23): the rollout processes of a node fetch a version, a snapshot or the pool once, not
once each, and re-read a pointer at most once per its time to live."""

from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np

from rapid.infra.store import KeyNotFound, LocalStore
from rapid.node_cache import NodeCachedStore, rollout_store
from rapid.param_store import ParameterStore


class LoggedStore(LocalStore):
    """Appends every GET's key to a file: counts reads across processes."""

    def __init__(self, root, log):
        super().__init__(root)
        self.log = log

    def get(self, key, max_bytes=1 << 40):
        with open(self.log, "a") as f:
            f.write(key + "\n")
        return super().get(key, max_bytes)


class CountingStore(LocalStore):
    """Counts GETs and LISTs that reach the store (one process)."""

    def __init__(self, root):
        super().__init__(root)
        self.gets = self.lists = 0

    def get(self, key, max_bytes=1 << 40):
        self.gets += 1
        return super().get(key, max_bytes)

    def list(self, prefix="", start_after=None):
        self.lists += 1
        return super().list(prefix, start_after)


def _read_through_cache(root, log, folder, ready):
    cached = NodeCachedStore(LoggedStore(root, log), folder, {"params/LATEST": 60.0})
    ready.wait(30)
    params = ParameterStore(cached)
    assert params.fetch(params.latest_version()).version == 3


def test_the_processes_of_a_node_fetch_a_version_once(tmp_path):
    root, log, folder = tmp_path / "store", tmp_path / "gets.log", tmp_path / "node"
    ParameterStore(LocalStore(root)).publish(3, {"w": np.ones(1000, np.float32)})
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    procs = [ctx.Process(target=_read_through_cache, args=(root, log, folder, ready)) for _ in range(6)]
    for p in procs:
        p.start()
    time.sleep(1.0)
    ready.set()  # all six ask at once
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    gets = log.read_text().splitlines()
    assert gets.count("params/LATEST") == 1 and gets.count("params/000000000003.rpm") == 1


def test_a_pointer_is_reread_after_its_time_to_live_and_misses_are_not_cached(tmp_path):
    clock = [0.0]
    store = LocalStore(tmp_path / "store")
    cached = NodeCachedStore(store, tmp_path / "node", {"params/LATEST": 5.0}, clock=lambda: clock[0])
    store.put("params/LATEST", b"1")
    clock[0] = time.time()
    assert cached.get("params/LATEST") == b"1"
    store.put("params/LATEST", b"2")
    assert cached.get("params/LATEST") == b"1"
    clock[0] += 6.0
    assert cached.get("params/LATEST") == b"2"
    try:
        cached.get("params/000000000009.rpm")
    except KeyNotFound:
        pass
    store.put("params/000000000009.rpm", b"nine")
    assert cached.get("params/000000000009.rpm") == b"nine"  # a miss was not remembered


def test_a_run_without_an_id_or_with_the_cache_off_reads_the_store_itself(tmp_path):
    store = LocalStore(tmp_path / "store")
    assert rollout_store(store, str(tmp_path), None, "", 5.0, 30.0) is store
    assert rollout_store(store, str(tmp_path), "abc", "off", 5.0, 30.0) is store
    cached = rollout_store(store, str(tmp_path), "abc", "", 5.0, 30.0)
    assert isinstance(cached, NodeCachedStore) and str(cached.folder).endswith(os.path.join("node-cache", "abc"))


def test_the_pools_next_revision_is_probed_once_per_node_and_ttl(tmp_path):
    clock = [time.time()]
    store = CountingStore(tmp_path / "store")
    cached = NodeCachedStore(store, tmp_path / "node", {"league/pool.json": 30.0}, clock=lambda: clock[0])
    probe = "league/pool/000000000008.json"
    for _ in range(5):
        try:
            cached.get(probe)
        except KeyNotFound:
            pass
    assert store.gets == 1
    store.put(probe, b"{}")
    clock[0] += 31.0  # the absence is forgotten after the pool pointer's time to live
    assert cached.get(probe) == b"{}" and store.gets == 2


def test_a_missing_pool_is_looked_up_once_per_node_and_ttl(tmp_path):
    from rapid.league import League

    store = CountingStore(tmp_path / "store")
    cached = NodeCachedStore(store, tmp_path / "node", {"league/pool.json": 30.0})
    readers = [League(cached) for _ in range(20)]  # the workers of a node, before the optimizer made a pool
    assert not any(reader.exists() for reader in readers)
    assert store.gets + store.lists == 2  # one GET of the pointer, one LIST of the revisions, for the node

"""The node cache (issue 23): the rollout processes of a node fetch a version, a snapshot or the pool once, not
once each, and re-read a pointer at most once per its time to live. Issue 31: no lock is held across a GET, so
one that hangs stalls the node's other pollers for at most one poll interval."""

from __future__ import annotations

import collections
import multiprocessing
import os
import threading
import time

import numpy as np
import pytest

from rapid.infra.store import KeyNotFound, LocalStore
from rapid.rollout.node_cache import NodeCachedStore, rollout_store
from rapid.run.param_store import ParameterStore


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


LATEST, VERSION = "params/LATEST", "params/000000000004.rpm"


class HangingStore(LocalStore):
    """Counts GETs per key; the GET of ``hang_key`` reads the object, then hangs until ``release`` (a GET stuck
    in a dead connection, answering late with what it read)."""

    def __init__(self, root, hang_key):
        super().__init__(root)
        self.hang_key, self.gets = hang_key, collections.Counter()
        self.hanging, self.release = threading.Event(), threading.Event()

    def get(self, key, max_bytes=1 << 40):
        self.gets[key] += 1
        data = super().get(key, max_bytes)
        if key == self.hang_key and not self.hanging.is_set():
            self.hanging.set()
            self.release.wait(5)  # bounded, so the old cache (which waits on its lock) fails, not hangs
        return data


def _hang(cache, key):
    """Starts ``cache.get(key)`` on a thread, returns once its GET hangs, with the list its answer goes to."""
    answer = []
    thread = threading.Thread(target=lambda: answer.append(cache.get(key)), daemon=True)
    thread.start()
    assert cache.inner.hanging.wait(5)
    return thread, answer


def test_a_hung_pointer_get_stalls_no_poller_and_one_fetch_takes_over_after_a_poll_interval(tmp_path):
    clock = [1000.0]
    store = HangingStore(tmp_path / "store", LATEST)
    a, b, c = (NodeCachedStore(store, tmp_path / "node", {LATEST: 5.0}, clock=lambda: clock[0]) for _ in "abc")
    store.put(LATEST, b"1")
    store.hanging.set()  # not yet
    assert b.get(LATEST) == b"1"
    store.hanging.clear()
    store.put(LATEST, b"2")
    clock[0] += 6.0  # the node's copy is stale: a refreshes it, and its GET hangs
    hung, answer = _hang(a, LATEST)
    started = time.monotonic()
    assert b.get(LATEST) == b"1" and c.get(LATEST) == b"1"  # the node's copy meanwhile, at once
    assert time.monotonic() - started < 1.0 and store.gets[LATEST] == 2
    store.put(LATEST, b"3")
    clock[0] += 4.9
    assert b.get(LATEST) == b"1" and store.gets[LATEST] == 2  # the claim is younger than a poll interval
    clock[0] += 0.1
    assert b.get(LATEST) == b"3" and c.get(LATEST) == b"3"  # taken over: one fetch for the node
    assert store.gets[LATEST] == 3
    store.release.set()
    hung.join(5)
    assert answer == [b"2"]  # the late answer goes to its caller, not into the node's copy
    assert c.get(LATEST) == b"3" and store.gets[LATEST] == 3


def test_after_a_short_hang_exactly_one_fetch_updates_the_node(tmp_path):
    clock = [1000.0]
    store = HangingStore(tmp_path / "store", LATEST)
    a, b, c = (NodeCachedStore(store, tmp_path / "node", {LATEST: 5.0}, clock=lambda: clock[0]) for _ in "abc")
    store.put(LATEST, b"1")
    store.hanging.set()
    assert b.get(LATEST) == b"1"
    store.hanging.clear()
    store.put(LATEST, b"2")
    clock[0] += 6.0
    hung, answer = _hang(a, LATEST)
    clock[0] += 2.0
    assert b.get(LATEST) == b"1" and c.get(LATEST) == b"1"
    store.release.set()
    hung.join(5)
    assert answer == [b"2"] and b.get(LATEST) == b"2" and c.get(LATEST) == b"2"
    assert store.gets[LATEST] == 2  # the priming read and the hung one: nobody else fetched
    assert not list((tmp_path / "node").glob(".*.claim"))  # every claim was given back


@pytest.mark.parametrize("simulated", [False, True], ids=["real-clock", "simulated-clock"])
def test_a_version_another_process_is_stuck_fetching_is_taken_over_after_one_poll_interval(tmp_path, simulated):
    """With no copy to serve, a process waits for the claimant, but for one lease at most. On a simulated
    clock (one thread, nothing else moves it) the wait moves that clock; nothing waits on the wall."""
    clock = [1000.0]
    now, sleep = ((lambda: clock[0]), (lambda s: clock.__setitem__(0, clock[0] + s))) if simulated \
        else (time.time, time.sleep)
    store = HangingStore(tmp_path / "store", VERSION)
    store.put(VERSION, b"four")
    a, b = (NodeCachedStore(store, tmp_path / "node", {LATEST: 0.3}, clock=now, sleep=sleep) for _ in "ab")
    hung, answer = _hang(a, VERSION)
    started, wall = now(), time.monotonic()
    assert b.get(VERSION) == b"four" and store.gets[VERSION] == 2
    assert 0.3 - 1e-9 <= now() - started < 0.3 + 0.5 and time.monotonic() - wall < 1.0
    store.release.set()
    hung.join(5)
    assert answer == [b"four"] and store.gets[VERSION] == 2

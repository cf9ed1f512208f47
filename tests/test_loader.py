"""ExperienceLoader hardening (issue 12) and the decode worker processes (issue 10 item 3)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from rapid.formats.experience import Shape, encode_experience
from rapid.infra.store import LocalStore
from rapid.opt.buffer import ExperienceBuffer
from rapid.optimizer.decode_pool import Decoded, DecodePool, Rejected, auto_workers
from rapid.optimizer.loader import ExperienceLoader
from tests.test_scale_mpi import make_experience

SHAPE = Shape(bptt=4, obs_dim=3, mask_dim=2, heads=1, lstm=5)


def put(store, name: str, samples: int = 4, version: int = 0, seq: int = 0) -> bytes:
    data = encode_experience(make_experience(SHAPE, "w", seq, samples, version))
    store.put(f"experience/s0000/{name.replace('/', '-')}.rxp", data)  # one shard: a one-rank run
    return data


def wait_for(predicate, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_future_versions_are_rejected_once_and_removed_by_retention(tmp_path):
    store = LocalStore(tmp_path)
    put(store, "w/0", version=2)
    put(store, "w/1", version=3)      # the optimizer is at 2: nobody can have played version 3
    buf = ExperienceBuffer(100, max_staleness=8)
    bad = []
    loader = ExperienceLoader(store, SHAPE, buf, retention_s=3600, current_version=lambda: 2,
                              on_bad=lambda k, why: bad.append((k, why)))
    assert loader.poll_once() == 1
    assert buf.stats().received == 4 and loader.stats.bad_objects == 1
    assert bad[0][0] == "experience/s0000/w-1.rxp" and "future" in bad[0][1]
    assert loader.poll_once() == 0 and loader.stats.bad_objects == 1     # not downloaded or counted again
    loader.retention_s = 1e-9
    loader.poll_once()
    assert store.list("experience/") == [] and loader.stats.deleted == 2


class _BombStore(LocalStore):
    """A narrow fake: reading one key raises what a memory bomb raises."""

    def get(self, key, **kw):
        if "bomb" in key:
            raise MemoryError
        return super().get(key, **kw)


def test_no_exception_kills_the_loader_thread(tmp_path, monkeypatch):
    store = _BombStore(tmp_path)
    put(store, "a/bomb")
    put(store, "b/good", seq=1)
    buf = ExperienceBuffer(100, max_staleness=8)
    loader = ExperienceLoader(store, SHAPE, buf, poll_s=0.02, retention_s=0)
    loader.start()
    try:
        assert wait_for(lambda: loader.stats.objects == 1 and loader.stats.bad_objects == 1)
        import rapid.optimizer.decode_pool as pool

        def explode(data, shape):
            raise MemoryError
        monkeypatch.setattr(pool, "decode_experience", explode)   # decoding itself runs out of memory
        put(store, "c/late", seq=2)
        assert wait_for(lambda: loader.stats.bad_objects == 2)
        assert loader._thread.is_alive() and loader.failure is None
    finally:
        loader.stop()
    assert loader.failure is None                                 # stopped on request: not a failure


class _DyingStore(LocalStore):
    def list(self, prefix="", start_after=None):
        raise SystemExit("gone")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_loader_thread_says_so(tmp_path):
    loader = ExperienceLoader(_DyingStore(tmp_path), SHAPE, ExperienceBuffer(10, 8), poll_s=0.01)
    loader.start()
    assert wait_for(lambda: not loader._thread.is_alive())
    assert loader.failure and "loader" in loader.failure
    loader.stop()


def test_decode_workers_give_the_same_arrays_and_survive_a_killed_worker(tmp_path):
    data = encode_experience(make_experience(SHAPE, "w", 0, 6, version=1))
    inline = DecodePool(SHAPE, workers=0)
    pool = DecodePool(SHAPE, workers=1)
    try:
        a, b = inline.result(inline.submit(data)), pool.result(pool.submit(data))
        assert isinstance(a, Decoded) and isinstance(b, Decoded) and b.max_version == 1 and b.num_samples == 6
        for key in a.arrays:
            np.testing.assert_array_equal(a.arrays[key], b.arrays[key])
        assert isinstance(pool.result(pool.submit(b"\x00" * 64)), Rejected)
        for pid in list(pool._pool._processes):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        first = pool.result(pool.submit(data))                    # lost with the worker, or decoded anew
        assert isinstance(first, (Decoded, Rejected))
        assert isinstance(pool.result(pool.submit(data)), Decoded)
        assert pool.restarts >= 1
    finally:
        pool.close()


def test_loader_with_decode_workers_loads_everything(tmp_path):
    store = LocalStore(tmp_path)
    for i in range(5):
        put(store, f"w/{i}", samples=3, seq=i)
    store.put("experience/s0000/w-bad.rxp", b"junk")
    buf = ExperienceBuffer(100, max_staleness=8)
    loader = ExperienceLoader(store, SHAPE, buf, retention_s=0, decode_workers=2)
    try:
        assert loader.poll_once() == 5
    finally:
        loader.stop()
    assert buf.stats().received == 15 and loader.stats.bad_objects == 1 and loader.stats.env_steps == 60


@pytest.mark.parametrize("cpus,expected", [(1, 1), (2, 1), (16, 2), (128, 8)])
def test_auto_decode_workers(cpus, expected):
    assert auto_workers(cpus) == expected


OWNER = """
import os, sys, time
from rapid.optimizer.decode_pool import DecodePool
from tests.test_loader import SHAPE, put
from rapid.infra.store import LocalStore
pool = DecodePool(SHAPE, workers=1)
pool.result(pool.submit(put(LocalStore(sys.argv[1]), "a")))
print(*pool._pool._processes, flush=True)
time.sleep(600)
"""


def test_decode_workers_end_when_their_optimizer_is_killed(tmp_path):
    import subprocess
    import sys

    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             cwd=os.getcwd())
    workers = [int(pid) for pid in owner.stdout.readline().split()]
    assert workers, "the owner printed no worker pid"
    owner.kill()  # SIGKILL: no shutdown of the pool
    owner.wait()

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie is gone too; its parent, the forkserver, has not reaped it yet.
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"

    assert wait_for(lambda: all(gone(pid) for pid in workers)), "a decode worker outlived its killed optimizer"

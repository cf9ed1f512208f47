"""Decode workers that read a local store themselves and hand arrays over in shared memory (issue 59 item 4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from rapid.formats.experience import encode_experience
from rapid.infra.store import LocalStore, ObservedStore
from rapid.opt.buffer import ExperienceBuffer
from rapid.optimizer import decode_pool, shared_arrays
from rapid.optimizer.decode_pool import Decoded, DecodePool, Rejected, Unread
from rapid.optimizer.loader import ExperienceLoader
from tests.test_loader import SHAPE, put, wait_for
from tests.test_scale_mpi import make_experience


def folders() -> set[str]:
    """This process's decode folders in shared memory."""
    return {p for p in os.listdir(shared_arrays.SHARED_MEMORY) if p.startswith(f"rapid-decode-{os.getpid()}-")}


def test_workers_read_a_local_store_and_bad_objects_are_rejected_and_counted(tmp_path):
    store = LocalStore(tmp_path)
    for i in range(4):
        put(store, f"w/{i}", samples=3, seq=i)
    store.put("experience/s0000/w-junk.rxp", b"junk")
    store.put("experience/s0000/w-cut.rxp", put(store, "w/4", samples=2, seq=4)[:-7])
    with open(tmp_path / "experience" / "s0000" / "w-huge.rxp", "wb") as f:  # over the limit: refused unread
        f.truncate(8 << 30)
    bad = []
    loader = ExperienceLoader(store, SHAPE, ExperienceBuffer(100, 8), retention_s=0, decode_workers=2,
                              on_bad=lambda key, why: bad.append(key))
    try:
        assert loader.decoder.reads_store
        assert loader.poll_once() == 5
    finally:
        loader.stop()
    assert loader.stats.bad_objects == 3 and sorted(k.rsplit("/", 1)[1] for k in bad) == [
        "w-cut.rxp", "w-huge.rxp", "w-junk.rxp"]
    assert loader.buffer.stats().received == 14 and loader.stats.env_steps == 4 * 3 * 4 + 2 * 4
    assert loader.stats.bytes == sum(len(store.get(k)) for k in store.list("experience/") if "w-" in k
                                     and not k.endswith(("junk.rxp", "cut.rxp", "huge.rxp")))
    assert not folders()


def test_arrays_come_through_shared_memory_equal_to_inline_decoding(tmp_path):
    data = put(LocalStore(tmp_path), "w/0", samples=6)
    inline = DecodePool(SHAPE, workers=0)
    for store in (LocalStore(tmp_path), _Subclass(tmp_path)):  # read by key; bytes sent (a store it cannot open)
        pool = DecodePool(SHAPE, workers=1, store=store)
        try:
            assert pool.reads_store == (type(store) is LocalStore)
            future = pool.submit_key("experience/s0000/w-0.rxp") if pool.reads_store else pool.submit(data)
            got, want = pool.result(future), inline.result(inline.submit(data))
            assert isinstance(got, Decoded) and isinstance(want, Decoded) and got.nbytes == len(data)
            for key in want.arrays:
                np.testing.assert_array_equal(got.arrays[key], want.arrays[key])
                assert not got.arrays[key].flags.writeable  # a view of the slot, not an unpickled copy
            assert got.episodes == want.episodes and got.max_version == want.max_version
        finally:
            pool.close()
    assert not folders()


class _Subclass(LocalStore):
    """A store the workers must not open themselves: its reads may do more than LocalStore's."""


def test_a_slot_is_not_written_while_its_arrays_live(tmp_path):
    store = LocalStore(tmp_path)
    for i in range(8):
        put(store, f"w/{i}", samples=2, version=i, seq=i)
    pool = DecodePool(SHAPE, workers=1, store=store)
    try:
        held = [pool.result(pool.submit_key(f"experience/s0000/w-{i}.rxp")) for i in range(8)]
        # Every slot held: later objects came through the pipe; none overwrote an earlier one's arrays.
        assert [int(d.arrays["version"][0]) for d in held if isinstance(d, Decoded)] == list(range(8))
        del held
        again = pool.result(pool.submit_key("experience/s0000/w-7.rxp"))
        assert isinstance(again, Decoded) and not again.arrays["obs"].flags.writeable  # slots free again
    finally:
        pool.close()
    assert not folders()


def test_a_missing_key_is_unread_and_reads_are_reported_to_the_stores_observer(tmp_path):
    seen = []
    store = ObservedStore(LocalStore(tmp_path), lambda op, n, s, ok: seen.append((op, n, ok)))
    data = put(store.inner, "w/0")
    pool = DecodePool(SHAPE, workers=1, store=store)
    try:
        assert pool.reads_store
        assert pool.result(pool.submit_key("experience/s0000/gone.rxp")) == Unread(None)
        assert isinstance(pool.result(pool.submit_key("experience/s0000/w-0.rxp")), Decoded)
        assert isinstance(pool.result(pool.submit_key("experience/s0000/../../etc")), Rejected)  # refused key
    finally:
        pool.close()
    assert seen == [("get", 0, True), ("get", len(data), True)]


def test_a_killed_worker_costs_its_object_and_leaves_no_shared_memory(tmp_path):
    store = LocalStore(tmp_path)
    put(store, "w/0", samples=4)
    key = "experience/s0000/w-0.rxp"
    pool = DecodePool(SHAPE, workers=1, store=store)
    try:
        assert isinstance(pool.result(pool.submit_key(key)), Decoded)
        folder = pool._folder
        assert folder and os.listdir(folder)  # the slot it used
        (worker,) = list(pool._pool._processes)
        os.kill(worker, signal.SIGSTOP)
        stuck = pool.submit_key(key)                         # waits in the stopped worker
        os.kill(worker, signal.SIGKILL)
        assert isinstance(pool.result(stuck), Rejected)
        assert isinstance(pool.result(pool.submit_key(key)), Decoded)
        assert pool.restarts == 1
        assert all(name.startswith("1-") for name in os.listdir(folder))  # the dead generation's slots removed
    finally:
        pool.close()
    assert not os.path.exists(folder) and not folders()


OWNER = """
import sys, time
from rapid.infra.store import LocalStore
from rapid.optimizer.decode_pool import DecodePool
from tests.test_loader import SHAPE, put
pool = DecodePool(SHAPE, workers=1, store=LocalStore(sys.argv[1]))
put(LocalStore(sys.argv[1]), "a")
assert pool.result(pool.submit_key("experience/s0000/a.rxp")).num_samples
print(pool._folder, flush=True)
time.sleep(600)
"""


def test_the_workers_remove_the_shared_memory_of_a_killed_optimizer(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[1])
    folder = owner.stdout.readline().strip()
    assert folder.startswith(shared_arrays.SHARED_MEMORY) and os.listdir(folder)
    owner.kill()  # SIGKILL: no close, no exit handlers
    owner.wait()
    assert wait_for(lambda: not os.path.exists(folder)), "a killed optimizer's shared memory outlived it"


def test_a_slot_that_grew_for_a_large_object_shrinks_back(tmp_path, monkeypatch):
    monkeypatch.setattr(shared_arrays, "KEEP_BYTES", 4096)
    big, small = make_experience(SHAPE, "w", 0, 400, 0).arrays, make_experience(SHAPE, "w", 1, 2, 0).arrays
    folder = shared_arrays.make_folder()
    try:
        slot = shared_arrays.Slot(f"{folder}/0")
        shared_arrays.write(slot.path, big)
        grown = os.path.getsize(slot.path)
        fields = shared_arrays.write(slot.path, small)
        assert os.path.getsize(slot.path) == fields[-1].end < grown
        np.testing.assert_array_equal(slot.take(fields)["obs"], small["obs"])
    finally:
        shared_arrays.remove_folder(folder)


def test_an_object_shared_memory_cannot_hold_takes_the_pipe():
    data = encode_experience(make_experience(SHAPE, "w", 0, 3, 0))
    pool = DecodePool(SHAPE, workers=1)
    try:
        shared_arrays.remove_folder(pool._folder)  # as if tmpfs refused every write
        got = pool.result(pool.submit(data))
        assert isinstance(got, Decoded) and got.num_samples == 3 and got.arrays["obs"].flags.writeable
    finally:
        pool.close()
    assert not folders()


def test_the_pool_starts_another_process_while_its_processes_stay_busy(tmp_path, monkeypatch):
    """A clock the test moves: a long quiet while (the process mostly idle) starts nothing; a while the one process
    spent decoding all along starts a second. Objects in flight on the first executor still come back whole."""
    monkeypatch.setattr(decode_pool, "GROW_EVERY_S", 1e-7)
    store = LocalStore(tmp_path)
    sent = {f"experience/s0000/w-{i}.rxp": put(store, f"w/{i}", samples=3, seq=i) for i in range(6)}
    keys = list(sent)
    now = [0.0]
    pool = DecodePool(SHAPE, workers=1, store=store, most=2, clock=lambda: now[0])
    inline = DecodePool(SHAPE, workers=0)
    try:
        now[0] = 1000.0
        assert isinstance(pool.result(pool.submit_key(keys[0])), Decoded) and pool.workers == 1, "idle: no growth"
        now[0] += 1e-6
        futures = [pool.submit_key(k) for k in keys[1:4]]
        got = [pool.result(f) for f in futures]
        assert pool.workers == 2, "busy all the while: a second process"
        got += [pool.result(pool.submit_key(k)) for k in keys[4:]]   # on the new executor
        for key, out in zip(keys[1:], got):
            want = inline.result(inline.submit(sent[key]))
            assert isinstance(out, Decoded) and isinstance(want, Decoded)
            assert all(np.array_equal(out.arrays[n], want.arrays[n]) for n in want.arrays)
            assert out.busy_s > 0
        now[0] += 1e-6
        pool.result(pool.submit_key(keys[0]))
        assert pool.workers == 2, "never beyond most"
    finally:
        pool.close()
    assert not folders()

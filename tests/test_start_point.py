"""Issue 33, item 1: one start point for every optimizer rank. Ranks are threads here, meeting through a small
in-process stand-in for the process group's all-gather and broadcast (about a second in all); the real ranks
under mpiexec are in tests/test_ranks_agree_mpi.py.
"""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from rapid.errors import FormatError, UsageError
from rapid.formats.checkpoint import decode_checkpoint, encode_checkpoint
from rapid.infra.store import LocalStore, StoreError
from rapid.optimizer.checkpoints import resume_point
from rapid.roles.start_point import agree_on_start, state_digest
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import CHECKPOINTS_LATEST, checkpoint_key, write_version_pointer
from tests.test_resume import ckpt_of, trained

LOG = logging.getLogger("test-start-point")


class Group:
    """What a process group gives ``agree_on_start``, for ranks that are threads."""

    def __init__(self, size: int):
        self.size, self.slots = size, [None] * size
        self.barrier = threading.Barrier(size, timeout=30)

    def ctx(self, rank: int):
        group = self

        class Ctx:
            def all_gather_bytes(self, data: bytes) -> list[bytes]:
                group.slots[rank] = data
                group.barrier.wait()
                out = list(group.slots)
                group.barrier.wait()
                return out

            def broadcast_parameters(self, module, src: int = 0) -> None:
                if rank == src:
                    group.weights = {k: v.clone() for k, v in module.state_dict().items()}
                group.barrier.wait()
                module.load_state_dict(group.weights)
                group.barrier.wait()
        return Ctx()


def run_ranks(size: int, stores, build, resume: bool = True, **kw) -> list:
    """``agree_on_start`` on ``size`` threads; each rank's Start, or the exception it raised."""
    group, out = Group(size), [None] * size

    def one(rank: int) -> None:
        policy, adam = build(rank)
        try:
            start = agree_on_start(group.ctx(rank), stores[rank], policy, adam, resume, rank, LOG, **kw)
            out[rank] = (start, policy, adam)
        except Exception as e:  # the test looks at what each rank raised
            out[rank] = e
    threads = [threading.Thread(target=one, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def damaged_run(tmp_path) -> LocalStore:
    """Published v0–v6, checkpoints v3 (good) and v6 cut short (LATEST names v6)."""
    store = LocalStore(tmp_path / "store")
    policy, adam = trained(1)
    for v in range(7):
        ParameterStore(store).publish(v, policy.tensors(), {"updates": 10 * v})
    store.put(checkpoint_key(3), encode_checkpoint(ckpt_of(3, 30, policy, adam)))
    whole = encode_checkpoint(ckpt_of(6, 60, *trained(3)))
    store.put(checkpoint_key(6), whole[:len(whole) // 2])
    with pytest.raises(FormatError):
        decode_checkpoint(store.get(checkpoint_key(6)))
    write_version_pointer(store, CHECKPOINTS_LATEST, 6)
    return store


def fresh(rank: int):
    """A rank's model before it loads anything: each its own initial weights."""
    return trained(10 + rank)


def test_ranks_resumed_after_the_newest_checkpoint_was_damaged_start_from_one_point(tmp_path, caplog):
    store = damaged_run(tmp_path)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        out = run_ranks(3, [store] * 3, fresh)
    starts = [o[0] for o in out]
    assert {(s.version, s.updates, s.source) for s in starts} == {(6, 30, "checkpoint v3")}
    assert len({s.digest for s in starts}) == 1
    assert {state_digest(p, a, 30, 6) for _, p, a in out} == {starts[0].digest}
    # only rank 0 looked for a usable checkpoint: one line about the damaged one, not one a rank
    assert sum("checkpoint v6 is not usable" in r.getMessage() for r in caplog.records) == 1


class Flaky(LocalStore):
    """A store whose reads of one key fail ``times`` times with ``error``, then work."""

    def __init__(self, root, key: str, error: Exception, times: int):
        super().__init__(root)
        self.key, self.error, self.times = key, error, times

    def get(self, key: str, max_bytes: int = 4 << 30) -> bytes:
        if key == self.key and self.times > 0:
            self.times -= 1
            raise self.error
        return super().get(key, max_bytes)


def test_a_rank_that_cannot_load_rank_0s_choice_stops_every_rank_naming_it(tmp_path):
    store = damaged_run(tmp_path)
    root = tmp_path / "store"
    # rank 1 cannot read checkpoint v3 (its own path to the store fails for longer than the retries)
    stores = [store, Flaky(root, checkpoint_key(3), StoreError("get checkpoints/v3: timed out"), 99), store]
    out = run_ranks(3, stores, fresh, wait_s=0.01)
    assert all(isinstance(o, UsageError) for o in out), out
    assert {str(o) for o in out} == {
        "rank 1 could not load checkpoint v3, which rank 0 chose: checkpoint v3 could not be loaded in 4 tries "
        "(StoreError: get checkpoints/v3: timed out): a store, I/O or memory error, not a bad checkpoint, so no "
        "older one is used; resume again once it is resolved"}


def test_a_transient_error_on_another_rank_is_retried_there(tmp_path):
    store = damaged_run(tmp_path)
    stores = [store, Flaky(tmp_path / "store", checkpoint_key(3), StoreError("connection reset"), 2)]
    out = run_ranks(2, stores, fresh, wait_s=0.01)
    assert [o[0].source for o in out] == ["checkpoint v3"] * 2 and out[0][0].digest == out[1][0].digest


def test_out_of_memory_while_loading_is_not_an_unusable_checkpoint(tmp_path, monkeypatch):
    """A CUDA out-of-memory error while a checkpoint loads is tried again, and then stops the resume: today it
    marked the checkpoint unusable and the rank went on from an older one."""
    store = LocalStore(tmp_path / "store")
    policy, adam = trained(1)
    ParameterStore(store).publish(4, policy.tensors(), {"updates": 40})
    store.put(checkpoint_key(3), encode_checkpoint(ckpt_of(3, 30, policy, adam)))
    store.put(checkpoint_key(4), encode_checkpoint(ckpt_of(4, 40, policy, adam)))
    failures = {"left": 2}
    target, target_adam = trained(2)
    real = type(target).load_tensors

    def load_tensors(self, tensors):
        if failures["left"]:
            failures["left"] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        real(self, tensors)
    monkeypatch.setattr(type(target), "load_tensors", load_tensors)
    point = resume_point(store, target, target_adam, LOG, wait_s=0.01)
    assert (point.source, point.updates) == ("checkpoint v4", 40), "retried, not an older checkpoint"
    failures["left"] = 99
    with pytest.raises(UsageError, match="checkpoint v4 could not be loaded in 4 tries .OutOfMemoryError"):
        resume_point(store, *trained(2), LOG, wait_s=0.01)


def test_ranks_that_would_start_from_different_states_refuse_to(tmp_path):
    """A fresh run whose ranks were configured apart (another learning rate on rank 1): the weights are rank 0's
    on every rank, but Adam's hyperparameters differ, so the digests do."""
    def build(rank: int):
        policy, _ = trained(rank)
        return policy, torch.optim.Adam(policy.parameters(), lr=1e-3 * (1 + rank))
    out = run_ranks(2, [LocalStore(tmp_path / "store")] * 2, build, resume=False)
    assert all(isinstance(o, UsageError) for o in out), out
    assert "ranks would start from different states" in str(out[0]) and "rank 1 " in str(out[0])


def test_rank_0s_own_failure_reaches_every_rank(tmp_path):
    out = run_ranks(2, [LocalStore(tmp_path / "empty")] * 2, fresh)
    assert isinstance(out[0], UsageError) and "no usable checkpoint" in str(out[0])
    assert isinstance(out[1], UsageError) and str(out[1]) == f"rank 0: {out[0]}"


"""Hostile objects a reviewer planted in a run's store: each is refused with FormatError (or a store error)
before it can reach the learner or exhaust memory, and the readers go on.

Out-of-range fields (actions beyond their head, actions the mask forbids, versions from the future,
negative counts) and amplifying msgpack (nested empty containers decode ~72x bigger than they are).
"""

from __future__ import annotations

import copy

import msgpack
import numpy as np
import pytest

from rapid.errors import FormatError
from rapid.formats import codec, experience
from rapid.formats.experience import ExperienceBatch, Shape, decode_experience, encode_experience
from rapid.formats.params import decode_params

SHAPE = Shape(bptt=3, obs_dim=4, mask_dim=5, heads=2, lstm=2, head_sizes=(2, 3))


def good_batch(S: int = 4) -> ExperienceBatch:
    rng = np.random.default_rng(0)
    arrays = {}
    for name, (dtype, rest) in SHAPE.fields().items():
        full = (S, *rest)
        arrays[name] = (rng.normal(size=full).astype(dtype) if dtype == "float32"
                        else np.ones(full, dtype) if dtype == "bool" else np.zeros(full, dtype))
    arrays["actions"][..., 0] = 1
    arrays["actions"][..., 1] = 2
    arrays["discounts"][:] = 0.9  # a discount lies within [0, 1]
    return ExperienceBatch("w0", 3, 1.0, arrays, ["latest"],
                           [{"learner_version": 2, "opponent": "latest", "learner_side": 0, "winner": "draw",
                             "length": 9, "learner_return": 0.0}], env_steps=24)


def changed(edit) -> bytes:
    """A hostile writer's bytes (encode_experience refuses most of these itself: tests/test_writers_validate.py)."""
    b = copy.deepcopy(good_batch())
    edit(b)
    return codec.encode(experience.FORMAT, experience.FORMAT_VERSION, {
        "worker": b.worker, "seq": b.seq, "created": b.created, "arrays": b.arrays, "opponents": b.opponents,
        "episodes": b.episodes, "env_steps": b.env_steps})


def rejects(data: bytes, **kw) -> str:
    with pytest.raises(FormatError) as e:
        decode_experience(data, SHAPE, **kw)
    return str(e.value)


def test_the_good_batch_decodes():
    assert decode_experience(encode_experience(good_batch()), SHAPE, max_version=0).num_samples == 4


@pytest.mark.parametrize("head,value", [(0, 2), (0, -1), (1, 3), (1, 99), (1, -(1 << 62))])
def test_action_outside_its_head_is_refused(head, value):
    def edit(b):
        b.arrays["actions"][1, 2, head] = value
    assert "outside" in rejects(changed(edit))


def test_action_outside_its_head_is_refused_even_on_an_inactive_step():
    def edit(b):
        b.arrays["active"][:] = False
        b.arrays["actions"][0, 0, 0] = 5  # log_prob is still evaluated on every step
    assert "outside" in rejects(changed(edit))


def test_action_the_mask_forbids_on_an_active_step_is_refused():
    def edit(b):
        b.arrays["mask"][2, 1, 2 + 2] = False  # head 1 (offset 2) took action 2
    assert "forbids" in rejects(changed(edit))


def test_action_the_mask_forbids_on_an_inactive_step_is_fine():
    def edit(b):
        b.arrays["mask"][2, 1, 2 + 2] = False
        b.arrays["active"][2, 1] = False
    decode_experience(changed(edit), SHAPE)


def test_versions_from_the_future_are_refused_when_the_decoder_knows_the_present():
    def edit(b):
        b.arrays["version"][:] = [3, 4, 5, 6]
    data = changed(edit)
    decode_experience(data, SHAPE, max_version=6)
    assert "newer" in rejects(data, max_version=5)


@pytest.mark.parametrize("edit", [
    lambda b: setattr(b, "env_steps", -1),
    lambda b: setattr(b, "seq", -5),
    lambda b: b.episodes[0].update(length=-3),
    lambda b: b.episodes[0].update(learner_version=-1),
    lambda b: b.episodes[0].update(learner_side=2),
])
def test_negative_counts_are_refused(edit):
    rejects(changed(edit))


def test_shape_carries_the_head_sizes():
    from types import SimpleNamespace

    spec = SimpleNamespace(obs_dim=4, action_heads=(2, 3))
    assert Shape.of(spec, bptt=3, lstm=2) == SHAPE
    assert Shape(3, 4, 7, 1, 2).head_sizes == (7,)
    for bad in (dict(heads=2), dict(heads=2, head_sizes=(2, 2)), dict(heads=1, head_sizes=(3, 4))):
        with pytest.raises(ValueError):
            Shape(bptt=3, obs_dim=4, mask_dim=5, lstm=2, **bad)


# --- amplification -------------------------------------------------------------------------------------

def nested_empty(width: int, per: int) -> bytes:
    """``width`` arrays of ``per`` empty arrays: 1 byte each, ~60 bytes each once decoded."""
    inner = b"\xdc" + per.to_bytes(2, "big") + b"\x90" * per
    return b"\xdc" + width.to_bytes(2, "big") + inner * width


def wrapped(fmt: str, payload: bytes, version: int = 1) -> bytes:
    import zlib

    return msgpack.packb([fmt, version, zlib.crc32(payload), payload], use_bin_type=True)


def test_nested_empty_containers_are_refused_before_they_are_built():
    payload = nested_empty(2000, 1000)  # 2 MB that would decode into 2 million lists (~130 MB)
    for decode in (lambda d: decode_experience(d, SHAPE), decode_params):
        fmt, version = ((experience.FORMAT, experience.FORMAT_VERSION) if decode is not decode_params
                        else ("rapid.params", 1))
        with pytest.raises(FormatError, match="items"):
            decode(wrapped(fmt, payload, version))


def test_deep_nesting_is_refused():
    payload = b"\x91" * 100 + b"\xc0"
    with pytest.raises(FormatError, match="nested"):
        codec.decode(wrapped("x", payload), "x", (1,))


@pytest.mark.parametrize("header", [b"\xdd\xff\xff\xff\xff", b"\xdf\x7f\xff\xff\xff", b"\xc6\xff\xff\xff\xf0",
                                    b"\xdb\x00\x10\x00\x00abc", b"\xc9\x7f\x00\x00\x00\x01"])
def test_huge_declared_counts_and_lengths_are_refused_without_allocating(header):
    with pytest.raises(FormatError):
        codec.decode(wrapped("x", header), "x", (1,))


def test_scan_accepts_every_msgpack_type():
    tree = {"a": [None, True, False, 1, -1, 300, -300, 70000, -70000, 1 << 40, -(1 << 40), (1 << 64) - 1,
                  1.5, "s" * 40, "t" * 300, "u" * 70000, b"b", b"c" * 300, b"d" * 70000, {}, []],
            "n": np.arange(3, dtype=np.int32), 7: {"x": np.zeros((2, 2), np.float32)}}
    payload = msgpack.packb(tree, use_bin_type=True, default=codec._default)
    codec.scan(payload, codec.Limits())
    out = codec.decode(codec.encode("x", 1, tree), "x", (1,))
    assert out["a"][:-2] == tree["a"][:-2] and out["n"].tolist() == [0, 1, 2]


# --- the rollout worker's parameter poller -----------------------------------------------------------------

class Failures(list):
    def __call__(self, why: str) -> None:
        self.append(why)


def poller_on(tmp_path, **kw):
    import logging

    from rapid.infra.store import LocalStore
    from rapid.roles.rollout import ParamPoller
    from rapid.run.param_store import ParameterStore

    store = LocalStore(tmp_path / "run")
    params = ParameterStore(store)
    failures = Failures()
    poller = ParamPoller(params, kw.pop("interval_s", 0.05), logging.getLogger("test-poller"),
                         on_failure=failures, **kw)
    return store, params, poller, failures


def tensors(x: float) -> dict:
    return {"w": np.full((2, 2), x, np.float32)}


def plant(store, version: int, data: bytes | None = None, fifo: bool = False) -> None:
    import os

    from rapid.run.store_map import PARAMS_LATEST, params_key, write_version_pointer

    if fifo:
        path = store.root / params_key(version)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
    else:
        store.put(params_key(version), data)
    write_version_pointer(store, PARAMS_LATEST, version)


def wait_for(fn, timeout: float = 10.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = fn()
        if out:
            return out
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_poller_survives_bombs_fifos_and_garbage_and_takes_the_next_good_version(tmp_path):
    store, params, poller, failures = poller_on(tmp_path)
    params.publish(0, tensors(0))
    poller.start()
    try:
        assert wait_for(poller.take)[0] == 0
        plant(store, 1, wrapped("rapid.params", nested_empty(2000, 1000)))  # amplifying
        wait_for(lambda: len(failures) >= 1)
        plant(store, 2, fifo=True)                                         # would block a reader forever
        wait_for(lambda: len(failures) >= 2)
        plant(store, 3, b"\x00" * 100)                                     # garbage
        wait_for(lambda: len(failures) >= 3)
        assert poller.alive() and poller.take() is None and poller.behind_s() > 0
        params.publish(4, tensors(4), meta={"team_spirit": 0.7})
        version, got, meta = wait_for(poller.take)
        assert version == 4 and got["w"][0, 0] == 4 and meta["team_spirit"] == 0.7  # the schedule travels too
        wait_for(lambda: poller.behind_s() == 0)
        assert len(failures) == 3  # each bad version was tried once, not at every poll
    finally:
        poller.stop()


def test_poller_falls_back_to_the_newest_good_version_below_a_bad_latest(tmp_path):
    store, params, poller, failures = poller_on(tmp_path)
    params.publish(0, tensors(0))
    poller.start()
    try:
        assert wait_for(poller.take)[0] == 0
        from rapid.formats.params import ParamsObject, encode_params
        from rapid.run.store_map import params_key

        for v in (1, 2):  # published objects whose pointer move was never seen
            store.put(params_key(v), encode_params(ParamsObject(v, tensors(v))))
        plant(store, 3, b"not params")
        assert wait_for(poller.take)[0] == 2
        assert poller.behind_s() > 0 and len(failures) == 1  # the newest is still out of reach: visible
    finally:
        poller.stop()


def test_poller_thread_outlives_any_exception_and_reports_it(tmp_path):
    store, params, poller, failures = poller_on(tmp_path)
    params.publish(0, tensors(0))
    calls = []

    def broken(version):
        calls.append(version)
        raise MemoryError("decoding took all the memory")

    params.fetch = broken
    poller.start()
    try:
        wait_for(lambda: len(failures) >= 3)
        assert poller.alive() and poller.behind_s() > 0 and "MemoryError" in failures[0]
    finally:
        poller.stop()


def test_poller_warns_while_it_stays_behind(tmp_path, caplog):
    store, params, poller, failures = poller_on(tmp_path, warn_every_s=0.2)
    plant(store, 5, b"bad")
    with caplog.at_level("WARNING", logger="test-poller"):
        poller.start()
        try:
            wait_for(lambda: any("no newer parameters" in r.message for r in caplog.records))
        finally:
            poller.stop()
    assert poller.take() is None and len(failures) == 1


def test_params_that_do_not_fit_the_model_are_rejected_and_the_worker_keeps_its_version(tmp_path):
    import logging

    from rapid.roles.rollout_loop import RolloutLoop

    class Worker:
        version = 0

        def set_params(self, version, tensors, meta):
            if "w" not in tensors:
                raise ValueError("parameters do not match the model")
            self.version = version

    store, params, poller, failures = poller_on(tmp_path)
    worker = Worker()
    loop = RolloutLoop(worker, None, poller, None, None, 2, 0.0, None, logging.getLogger("t"))
    loop.version = 0
    assert loop._swap((7, {"x": np.zeros(1)}, {})) == 0 and worker.version == 0
    assert loop._swap((8, tensors(8), {})) == 8 and loop.version == 8
    assert 7 in poller._bad and "does not fit" in failures[0]


def test_loader_skips_oversized_fifo_and_linked_objects_and_loads_the_rest(tmp_path):
    """The optimizer's loader over a store holding an 8 GB sparse file, a FIFO and a /dev/zero link named
    like experience objects: nothing blocks or is read whole, the oversized object is counted as bad
    once, and the good object is loaded."""
    import os

    from rapid.infra.store import LocalStore
    from rapid.opt.buffer import ExperienceBuffer
    from rapid.optimizer.loader import ExperienceLoader

    store = LocalStore(tmp_path)
    store.put("experience/s0000/1-w0-a-00000001.rxp", encode_experience(good_batch()))
    folder = tmp_path / "experience" / "s0000"  # the one shard of a one-rank run
    with open(folder / "2-w9-a-00000001.rxp", "wb") as f:
        f.truncate(8 << 30)
    os.mkfifo(folder / "3-w9-a-00000002.rxp")
    os.symlink("/dev/zero", folder / "4-w9-a-00000003.rxp")
    loader = ExperienceLoader(store, SHAPE, ExperienceBuffer(100, max_staleness=8), poll_s=0.02, retention_s=0)
    loader.start()
    try:
        wait_for(lambda: loader.stats.objects == 1 and loader.stats.bad_objects == 1)
        import time

        time.sleep(0.5)  # many more polls: nothing re-counted, nothing blocked
        assert loader.stats.store_errors == 0
        assert loader.stats.bad_objects == 1 and loader.stats.objects == 1
    finally:
        loader.stop()



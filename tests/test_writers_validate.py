"""Every store writer refuses what its readers refuse, before any PUT, and leaves the store as it was.

A writer that stores an object every reader refuses fails silently far away: the scale model published a params
object whose ``meta`` was an int, and every worker skipped every version after v0 (issue 31). Each test here
fails on a writer that only encodes, except the snapshot one (``League.add_snapshot_bytes`` already decoded what it
stores) and the round trips.
"""

from __future__ import annotations

import numpy as np
import pytest

from rapid.errors import FormatError
from rapid.formats import codec
from rapid.formats.checkpoint import Checkpoint, decode_checkpoint
from rapid.formats.experience import ExperienceBatch, Shape, decode_experience, encode_experience
from rapid.formats.params import ParamsObject, decode_params, encode_params
from rapid.infra.store import LocalStore
from rapid.league.pool import League
from rapid.league.state import Member, PoolFormatError, Rating, ensure_bots, load_pool
from rapid.optimizer.checkpoints import save_checkpoint
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import (
    CHECKPOINTS_LATEST,
    LAYOUT,
    loader_mark_key,
    read_loader_mark,
    read_run,
    write_layout,
    write_loader_mark,
    write_version_pointer,
)

TENSORS = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)}


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "store")


def contents(store) -> dict[str, bytes]:
    return {k: store.get(k) for k in store.list("")}


def refused(store, write, error=FormatError, match=None) -> None:
    """``write`` raises ``error`` and the store holds exactly what it held before."""
    before = contents(store)
    with pytest.raises(error, match=match):
        write()
    assert contents(store) == before


# --- params and snapshots -------------------------------------------------------------------------------

def test_publish_refuses_meta_that_is_not_a_map(store):
    params = ParameterStore(store)
    params.publish(0, TENSORS, {"updates": 0})
    refused(store, lambda: params.publish(1, TENSORS, 3), match="'meta' has type int")  # the scale model's bug
    assert params.latest_version() == 0 and params.versions() == [0]


@pytest.mark.parametrize("tensors", [{"w": np.array([1.0, np.nan], np.float32)}, {3: np.ones(2, np.float32)},
                                     {"w": np.array(["a"])}])
def test_publish_refuses_tensors_readers_refuse(store, tensors):
    refused(store, lambda: ParameterStore(store).publish(1, tensors))


def test_publish_encoded_checks_the_bytes_it_is_given(store):
    params = ParameterStore(store)
    refused(store, lambda: params.publish_encoded(2, encode_params(ParamsObject(3, TENSORS))), match="another")
    refused(store, lambda: params.publish_encoded(2, b"not a params object"))
    params.publish_encoded(2, encode_params(ParamsObject(2, TENSORS)))
    assert params.fetch(2).version == 2


def test_pointers_refuse_what_readers_refuse(store):
    refused(store, lambda: write_version_pointer(store, CHECKPOINTS_LATEST, -1))
    refused(store, lambda: write_version_pointer(store, CHECKPOINTS_LATEST, 10 ** 18))


def test_snapshot_refuses_meta_that_is_not_a_map(store):
    ParameterStore(store).publish(0, TENSORS)
    league = League(store, clock=lambda: 0.0)
    league.update(lambda s: ensure_bots(s, ["bot:random"], 0.0))
    refused(store, lambda: league.add_snapshot(ParamsObject(0, TENSORS, meta=3), member_id="snap"))


# --- the pool document ------------------------------------------------------------------------------------

def bad_member(**fields):
    def fn(state):
        state.members["snap"] = Member(id="snap", kind="snapshot", version=0, **fields)
        return state
    return fn


@pytest.mark.parametrize("fn", [
    bad_member(games=-1),
    bad_member(wins=True),
    bad_member(quality=float("nan")),
    bad_member(added_at=np.float32(1.0)),
    lambda s: (s.ratings.__setitem__("v000000000001", Rating(25.0, 8.0, games=2.5)), s)[1],
    lambda s: (s.ratings.__setitem__(7, Rating(25.0, 8.0)), s)[1],
    lambda s: (s.folded_keys.append(3), s)[1],
], ids=["negative-games", "bool-wins", "nan-quality", "float32", "float-games", "int-rating-key", "int-key"])
def test_pool_update_refuses_a_document_readers_refuse(store, fn):
    league = League(store, clock=lambda: 0.0)
    league.update(lambda s: ensure_bots(s, ["bot:random"], 0.0))
    refused(store, lambda: league.update(fn), PoolFormatError)
    assert league.read().revision == 1


# --- checkpoints ------------------------------------------------------------------------------------------

def checkpoint(**adam_changes) -> Checkpoint:
    state = {i: {"step": np.array(3.0, np.float32), "exp_avg": np.zeros_like(t), "exp_avg_sq": np.ones_like(t)}
             for i, t in enumerate(TENSORS.values())}
    group = {"params": [0, 1], "lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    return Checkpoint(4, 40, TENSORS, {"state": state, "param_groups": [{**group, **adam_changes}]})


def test_a_good_checkpoint_round_trips(store):
    save_checkpoint(store, checkpoint(), keep=2)
    assert decode_checkpoint(store.get("checkpoints/000000000004.rck")).adam["param_groups"][0]["betas"] == [0.9,
                                                                                                          0.999]


@pytest.mark.parametrize("change", [
    lambda c: c.adam["param_groups"][0].pop("betas"),
    lambda c: c.adam["param_groups"][0].update(lr="fast"),
    lambda c: c.adam["param_groups"][0].update(weight_decay="none"),
    lambda c: c.adam["state"][0].update(step="three"),
    lambda c: c.adam["state"].update({"zero": c.adam["state"].pop(0)}),  # refused before too: no group has it
    lambda c: setattr(c, "meta", 3),
    lambda c: setattr(c, "updates", -1),
], ids=["no-betas", "str-lr", "str-weight-decay", "str-step", "str-index", "int-meta", "negative-updates"])
def test_save_checkpoint_refuses_a_bad_adam_state(store, change):
    save_checkpoint(store, checkpoint(), keep=2)
    ckpt = checkpoint()
    ckpt.version = 5
    change(ckpt)
    refused(store, lambda: save_checkpoint(store, ckpt, keep=2))


# --- experience -------------------------------------------------------------------------------------------

SHAPE = Shape(bptt=3, obs_dim=4, mask_dim=5, heads=2, lstm=2, head_sizes=(2, 3))


def batch(**changes) -> ExperienceBatch:
    arrays = {name: np.zeros((2, *dims), dtype) for name, (dtype, dims) in SHAPE.fields().items()}
    arrays["mask"][:] = True
    arrays.update(changes)
    game = {"learner_version": 0, "opponent": "latest", "learner_side": 0, "winner": "draw", "length": 3,
            "learner_return": 0.0}
    return ExperienceBatch("w0", 1, 0.0, arrays, ["latest"], [game], env_steps=6)


def test_a_good_batch_round_trips():
    assert decode_experience(encode_experience(batch()), SHAPE).num_samples == 2


@pytest.mark.parametrize("changes", [
    {"obs": np.zeros((2, 3, 4), np.float64)},
    {"h0": np.zeros((3, 2), np.float32)},
    {"obs": np.full((2, 3, 4), np.inf, np.float32)},
    {"opponent": np.ones(2, np.int32)},
    {"version": -np.ones(2, np.int64)},
    {"mask": np.zeros((2, 3, 5), bool)},
    {"actions": np.full((2, 3, 2), 4, np.int64)},  # past the widest head any split of 5 into 2 allows
    {"extra": np.zeros(2, np.int64)},
], ids=["float64-obs", "h0-rows", "inf-obs", "opponent-index", "negative-version", "no-allowed-action",
        "action-range", "extra-array"])
def test_encode_experience_refuses_a_batch_readers_refuse(changes):
    with pytest.raises(FormatError):
        encode_experience(batch(**changes))


def test_encode_experience_refuses_bad_episodes_and_missing_arrays():
    b = batch()
    b.episodes[0]["winner"] = "nobody"
    with pytest.raises(FormatError, match="winner"):
        encode_experience(b)
    b = batch()
    del b.arrays["obs"]
    with pytest.raises(FormatError):
        encode_experience(b)


def test_encode_experience_checks_each_head_when_there_is_one():
    one = Shape(bptt=3, obs_dim=4, mask_dim=5, heads=1, lstm=2)
    arrays = {name: np.zeros((2, *dims), dtype) for name, (dtype, dims) in one.fields().items()}
    arrays["mask"][..., 1:] = True  # action 0 is forbidden, and every action taken is 0
    arrays["active"][:] = True
    with pytest.raises(FormatError, match="mask forbids"):
        encode_experience(ExperienceBatch("w0", 1, 0.0, arrays, ["latest"]))


# --- the layout and loader marks ---------------------------------------------------------------------------

def test_layout_refuses_a_shard_count_readers_refuse(store):
    refused(store, lambda: write_layout(store, 0))
    refused(store, lambda: write_layout(store, 1 << 20))
    assert write_layout(store, 8) == 8 and read_run(store)[0] == 8 and store.exists(LAYOUT)


def test_loader_mark_before_time_zero_is_readable(store):
    key = loader_mark_key(3)
    write_loader_mark(store, key, -5000, ["experience/s0003/a"])  # a clock at 0 less a look-back of 5 s
    assert read_loader_mark(store, key) == (0, {"experience/s0003/a"})
    refused(store, lambda: write_loader_mark(store, key, 10, [1, 2]))


# --- the codec ------------------------------------------------------------------------------------------

def test_reader_view_is_what_decode_returns():
    tree = {"t": (1, 2.5, np.int64(3), np.float32(0.5)), "a": np.arange(6, dtype=np.int16).reshape(2, 3)[:, ::2],
            "n": None, "b": b"x", "nested": {7: [True, "s"]}}
    view = codec.reader_view(tree, "t", codec.Limits())
    decoded = codec.decode(codec.encode("t", 1, tree), "t", (1,))
    assert view.keys() == decoded.keys() and view["t"] == decoded["t"] == [1, 2.5, 3, 0.5]
    assert view["nested"] == decoded["nested"] == {7: [True, "s"]} and view["b"] == decoded["b"] == b"x"
    assert np.array_equal(view["a"], decoded["a"]) and view["a"].dtype == decoded["a"].dtype
    with pytest.raises(FormatError):
        codec.reader_view({"m": {str(i): i for i in range(51)}}, "t", codec.Limits(max_elements=50))


def test_a_big_endian_array_keeps_its_values():
    w = np.arange(4, dtype=">f4")
    obj = decode_params(encode_params(ParamsObject(1, {"w": w})))
    assert obj.tensors["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_pool_document_written_is_the_one_read(store):
    league = League(store, clock=lambda: 0.0)
    state = league.update(lambda s: ensure_bots(s, ["bot:random"], 0.0))
    assert load_pool(store.get("league/pool.json")).members.keys() == state.members.keys()


def test_uploader_never_uploads_what_readers_refuse_and_goes_on_sealing(store):
    from rapid.rollout.uploader import Uploader
    from rapid.rollout.worker import Segment

    up = Uploader(store, worker="w0", interval_s=60, max_backlog=8, shards=1)
    up.add(Segment(batch(obs=np.full((2, 3, 4), np.nan, np.float32)).arrays, opponents=["latest"]))
    up.flush()
    assert store.list("experience/") == [] and (up.stats.refused_objects, up.stats.refused_samples) == (1, 2)
    up.add(Segment(batch().arrays, opponents=["latest"]))
    up.flush()
    assert len(store.list("experience/")) == 1 and up.stats.objects == 1

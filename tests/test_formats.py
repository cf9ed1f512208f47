"""Experience, parameter and checkpoint objects: round trips, and every kind of bad object rejected with
exactly FormatError (never another exception type), and nothing ever executed (no pickle)."""

from __future__ import annotations

import ast
import copy
import math
import pickle
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch

from rapid.errors import FormatError
from rapid.formats import checkpoint as ckpt_mod
from rapid.formats import codec, experience, params
from rapid.formats.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from rapid.formats.experience import ExperienceBatch, Shape, decode_experience, encode_experience
from rapid.formats.params import ParamsObject, decode_params, encode_params
from rapid.optimizer import checkpoints
from rapid.run import store_map
from rapid.run.param_store import ParameterStore

torch.set_num_threads(1)

SHAPE = Shape(bptt=4, obs_dim=5, mask_dim=7, heads=2, lstm=3, head_sizes=(3, 4))
ROOT = Path(__file__).resolve().parents[1]


def make_arrays(shape: Shape = SHAPE, S: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, (dtype, rest) in shape.fields().items():
        full = (S, *rest)
        if dtype == "float32":
            out[name] = rng.normal(size=full).astype(np.float32)
        elif dtype == "bool":
            out[name] = rng.random(full) < 0.5
        else:
            out[name] = rng.integers(0, 3, size=full).astype(dtype)
    out["mask"][..., 0] = True
    for h, offset in enumerate(np.cumsum((0, *shape.head_sizes[:-1]))):  # the taken actions are allowed
        np.put_along_axis(out["mask"], offset + out["actions"][..., h:h + 1], True, axis=-1)
    out["discounts"] = rng.random((S, *shape.fields()["discounts"][1])).astype(np.float32)  # within [0, 1]
    out["opponent"] = np.array([0, 1, 0], np.int32)[:S]
    out["version"] = np.array([5, 6, 7], np.int64)[:S]
    return out


def make_batch(**kw) -> ExperienceBatch:
    return ExperienceBatch(
        worker="w0", seq=12, created=1700000000.5, arrays=make_arrays(**kw), opponents=["latest", "v3"],
        episodes=[{"learner_version": 7, "opponent": "latest", "learner_side": 1, "winner": "learner",
                   "length": 21, "learner_return": 1.0}],
        env_steps=96)


def batch_tree(batch: ExperienceBatch) -> dict:
    return {"worker": batch.worker, "seq": batch.seq, "created": batch.created, "arrays": dict(batch.arrays),
            "opponents": list(batch.opponents), "episodes": copy.deepcopy(batch.episodes),
            "env_steps": batch.env_steps}


def enc_exp(tree) -> bytes:
    """A hostile writer's bytes: the format's own encoder refuses what its reader refuses."""
    return codec.encode(experience.FORMAT, experience.FORMAT_VERSION, tree)


def enc_ckpt(ck: Checkpoint) -> bytes:
    """A hostile writer's checkpoint: encode_checkpoint refuses what decode_checkpoint refuses."""
    return codec.encode(ckpt_mod.FORMAT, ckpt_mod.FORMAT_VERSION, {"version": ck.version, "updates": ck.updates,
                                                                   "model": ck.model, "adam": ck.adam, "meta": ck.meta})


def make_params() -> ParamsObject:
    rng = np.random.default_rng(1)
    return ParamsObject(version=42, tensors={
        "encoder.0.weight": rng.normal(size=(4, 3)).astype(np.float32),
        "obs_norm.mean": rng.normal(size=3),
        "obs_norm.count": np.array(17.0),
        "return_scale": np.array(1.5, dtype=np.float64),
        "steps": np.arange(5, dtype=np.int64),
    }, meta={"updates": 420, "note": "hi"})


def make_checkpoint() -> Checkpoint:
    from rapid.opt.model import Policy

    torch.manual_seed(0)
    policy = Policy(5, (3, 2), hidden=8, encoder_layers=1, lstm=4)
    adam = torch.optim.Adam(policy.parameters(), lr=1e-3, betas=(0.8, 0.99), eps=1e-5)
    out = policy.act(torch.randn(6, 5), torch.ones(6, 5, dtype=torch.bool), policy.initial_state(6))
    for _ in range(2):
        logp, ent, value = policy.evaluate(torch.randn(2, 3, 5), torch.ones(2, 3, 5, dtype=torch.bool),
                                           torch.zeros(2, 3, 2, dtype=torch.int64), torch.zeros(2, 4),
                                           torch.zeros(2, 4), torch.zeros(2, 3, dtype=torch.bool))
        (logp.sum() + value.pow(2).sum()).backward()
        adam.step()
        adam.zero_grad()
    del out
    return Checkpoint.from_torch(9, 90, policy.tensors(), adam.state_dict(), meta={"run": "t"})


def assert_format_error(fn, data, *args):
    """fn(data) must raise FormatError and nothing else."""
    try:
        fn(data, *args)
    except FormatError:
        return
    except BaseException as e:  # noqa: BLE001 - the point of the test
        pytest.fail(f"raised {type(e).__name__} instead of FormatError: {e}")
    pytest.fail("accepted a bad object")


def wrap(payload: bytes, name: str, version=1, crc=None) -> bytes:
    """An envelope around raw payload bytes with a correct checksum (unless given)."""
    return msgpack.packb([name, version, zlib.crc32(payload) if crc is None else crc, payload], use_bin_type=True)


# --- round trips -----------------------------------------------------------------------------------------


def test_experience_round_trip_bit_identical():
    batch = make_batch()
    data = encode_experience(batch)
    out = decode_experience(data, SHAPE)
    assert (out.worker, out.seq, out.created, out.opponents, out.episodes, out.env_steps) == (
        batch.worker, batch.seq, batch.created, batch.opponents, batch.episodes, batch.env_steps)
    assert set(out.arrays) == set(SHAPE.fields())
    for k, v in batch.arrays.items():
        assert out.arrays[k].dtype == v.dtype and out.arrays[k].shape == v.shape
        assert out.arrays[k].tobytes() == v.tobytes(), k
    assert out.num_samples == 3
    # special float values that are allowed survive bit for bit (-0.0, subnormals)
    batch.arrays["obs"][0, 0, :3] = [-0.0, np.float32(1e-45), np.float32(3.4e38)]
    out = decode_experience(encode_experience(batch), SHAPE)
    assert out.arrays["obs"].tobytes() == batch.arrays["obs"].tobytes()


def test_experience_non_contiguous_arrays_encode():
    batch = make_batch()
    batch.arrays["obs"] = np.asfortranarray(batch.arrays["obs"])
    out = decode_experience(encode_experience(batch), SHAPE)
    np.testing.assert_array_equal(out.arrays["obs"], batch.arrays["obs"])


def test_params_round_trip_bit_identical():
    obj = make_params()
    out = decode_params(encode_params(obj))
    assert out.version == 42 and out.meta == obj.meta
    assert set(out.tensors) == set(obj.tensors)
    for k, v in obj.tensors.items():
        assert out.tensors[k].dtype == v.dtype and out.tensors[k].shape == v.shape
        assert out.tensors[k].tobytes() == v.tobytes()


def test_params_from_real_policy_round_trip_loads():
    from rapid.opt.model import Policy

    torch.manual_seed(3)
    src = Policy(5, (3, 2), hidden=8, encoder_layers=1, lstm=4)
    out = decode_params(encode_params(ParamsObject(1, src.tensors())))
    dst = Policy(5, (3, 2), hidden=8, encoder_layers=1, lstm=4)
    dst.load_tensors(out.tensors)
    for k, v in src.tensors().items():
        assert dst.tensors()[k].tobytes() == v.tobytes()


def test_checkpoint_round_trip_bit_identical_and_adam_reloads():
    ck = make_checkpoint()
    out = decode_checkpoint(encode_checkpoint(ck))
    assert (out.version, out.updates, out.meta) == (9, 90, {"run": "t"})
    for k, v in ck.model.items():
        assert out.model[k].tobytes() == v.tobytes() and out.model[k].dtype == v.dtype
    state = out.adam_state()
    from rapid.opt.model import Policy

    policy = Policy(5, (3, 2), hidden=8, encoder_layers=1, lstm=4)
    adam = torch.optim.Adam(policy.parameters(), lr=1.0)
    adam.load_state_dict(state)
    assert adam.param_groups[0]["betas"] == (0.8, 0.99)
    assert adam.param_groups[0]["lr"] == 1e-3
    original = ck.adam_state()
    for idx, s in original["state"].items():
        for name, v in s.items():
            got = adam.state_dict()["state"][idx][name]
            assert torch.equal(torch.as_tensor(got), torch.as_tensor(v)), (idx, name)


def test_checkpoint_save_and_load_latest(tmp_path):
    from rapid.infra.store import LocalStore

    store = LocalStore(tmp_path / "s")
    assert checkpoints.load_latest_checkpoint(store) is None
    ck = make_checkpoint()
    for v in (1, 2, 3, 4):
        ck.version = v
        checkpoints.save_checkpoint(store, ck, keep=2)
    assert store.list("checkpoints/") == ["checkpoints/000000000003.rck", "checkpoints/000000000004.rck",
                                          "checkpoints/LATEST"]
    assert checkpoints.load_latest_checkpoint(store).version == 4
    store.put("checkpoints/LATEST", b"garbage")
    assert_format_error(lambda _: checkpoints.load_latest_checkpoint(store), None)


def test_parameter_store_publish_fetch_latest(tmp_path):
    from rapid.infra.store import LocalStore

    store = LocalStore(tmp_path / "s")
    ps = ParameterStore(store)
    assert ps.latest_version() is None
    obj = make_params()
    ps.publish(3, obj.tensors, meta={"a": 1})
    ps.publish(4, obj.tensors)
    assert ps.latest_version() == 4 and ps.versions() == [3, 4]
    got = ps.fetch(3)
    assert got.version == 3 and got.meta == {"a": 1}
    with pytest.raises(FileExistsError):  # versions are immutable
        ps.publish(3, {"x": np.zeros(1, np.float32)})
    assert ps.fetch(3).tensors.keys() == obj.tensors.keys()
    # a version object stored under the wrong key is rejected
    store.put(store_map.params_key(5), store.get(store_map.params_key(4)))
    assert_format_error(lambda _: ps.fetch(5), None)
    store.put(store_map.PARAMS_LATEST, b"\xff\xfe")
    assert_format_error(lambda _: ps.latest_version(), None)


# --- corrupt, truncated, oversized ------------------------------------------------------------------------

DECODERS = {
    "experience": (lambda d: decode_experience(d, SHAPE), lambda: encode_experience(make_batch())),
    "params": (decode_params, lambda: encode_params(make_params())),
    "checkpoint": (decode_checkpoint, lambda: encode_checkpoint(make_checkpoint())),
}


@pytest.mark.parametrize("kind", DECODERS)
def test_bit_flips_rejected(kind):
    decode, make = DECODERS[kind]
    data = make()
    for bit in range(len(data) * 8):  # every single bit (a few ms: the checksum catches most early)
        bad = bytearray(data)
        bad[bit // 8] ^= 1 << (bit % 8)
        assert_format_error(decode, bytes(bad))


@pytest.mark.parametrize("kind", DECODERS)
def test_truncations_rejected(kind):
    decode, make = DECODERS[kind]
    data = make()
    for n in range(len(data)):  # every prefix
        assert_format_error(decode, data[:n])
    # and extra bytes after a valid object
    assert_format_error(decode, data + b"\x00")


def test_oversized_actual_bytes(monkeypatch):
    data = encode_experience(make_batch())
    monkeypatch.setattr(experience, "LIMITS", codec.Limits(max_bytes=len(data) - 1))
    assert_format_error(decode_experience, data, SHAPE)
    monkeypatch.setattr(experience, "LIMITS", codec.Limits(max_bytes=len(data)))
    decode_experience(data, SHAPE)  # exactly at the limit is fine


def test_oversized_array_and_counts_against_limits():
    tree = {"a": np.zeros(1000, np.float64), "l": list(range(50))}
    data = codec.encode("t", 1, tree)
    codec.decode(data, "t", (1,), codec.Limits(max_array_bytes=8100, max_elements=50))
    assert_format_error(codec.decode, data, "t", (1,), codec.Limits(max_array_bytes=7999))
    assert_format_error(codec.decode, data, "t", (1,), codec.Limits(max_elements=49))
    assert_format_error(codec.decode, codec.encode("t", 1, {"a": np.zeros((1,) * 7)}), "t", (1,), codec.Limits())
    assert_format_error(codec.decode, codec.encode("t", 1, {"m": {str(i): i for i in range(51)}}), "t", (1,),
                        codec.Limits(max_elements=50))


def test_too_many_samples_rejected(monkeypatch):
    monkeypatch.setattr(experience, "MAX_SAMPLES", 2)
    assert_format_error(decode_experience, enc_exp(batch_tree(make_batch())), SHAPE)


@pytest.mark.parametrize("name", ["experience", "params", "checkpoint"])
def test_declared_sizes_far_above_limits(name):
    decode, _ = DECODERS[name]
    fmt = {"experience": experience.FORMAT, "params": params.FORMAT, "checkpoint": ckpt_mod.FORMAT}[name]
    # envelope whose payload bin declares 4 GiB but holds a few bytes
    env = b"\x94" + msgpack.packb(fmt) + b"\x01\x00\xc6\xff\xff\xff\xff" + b"\x80"
    assert_format_error(decode, env)
    # payloads (with a correct checksum) declaring huge arrays / maps / strings / bins / exts
    for payload in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
                    b"\xc6\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x01",
                    b"\x81\xa6arrays\xdf\x7f\xff\xff\xff"):
        assert_format_error(decode, wrap(payload, fmt))
    # an array that declares a vast shape with no data, and one whose shape overflows
    for shape, raw in (([1 << 40, 1 << 40], b""), ([0, (1 << 64) - 1], b""), ([1 << 62], b"\x00" * 8),
                       ([2] * 7, b"\x00" * 128), ([-1], b"")):
        body = msgpack.packb(["float32", shape, raw], use_bin_type=True)
        payload = msgpack.packb({"version": 1, "tensors": {"x": msgpack.ExtType(1, body)}}, use_bin_type=True)
        assert_format_error(decode, wrap(payload, fmt))


@pytest.mark.parametrize("name", ["experience", "params", "checkpoint"])
def test_msgpack_bombs_deep_nesting(name):
    decode, _ = DECODERS[name]
    fmt = {"experience": experience.FORMAT, "params": params.FORMAT, "checkpoint": ckpt_mod.FORMAT}[name]
    for payload in (b"\x91" * 100_000 + b"\xc0", b"\x81\xa1a" * 50_000 + b"\xc0",
                    b"\x81\xa4meta" * 3000 + b"\x80"):
        assert_format_error(decode, wrap(payload, fmt))


# --- wrong format, fields, dtypes, shapes, values ----------------------------------------------------------


@pytest.mark.parametrize("kind", DECODERS)
def test_wrong_format_name_and_version(kind):
    decode, make = DECODERS[kind]
    data = make()
    name, version, crc, payload = msgpack.unpackb(data, raw=False)
    other = {"experience": params.FORMAT, "params": ckpt_mod.FORMAT, "checkpoint": experience.FORMAT}[kind]
    assert_format_error(decode, msgpack.packb([other, version, crc, payload], use_bin_type=True))
    assert_format_error(decode, msgpack.packb([name + "x", version, crc, payload], use_bin_type=True))
    for v in (0, version - 1, version + 1, -1, 99, "1", None):
        assert_format_error(decode, msgpack.packb([name, v, crc, payload], use_bin_type=True))
    # checksum mismatch and wrong envelope shapes
    assert_format_error(decode, msgpack.packb([name, version, crc ^ 1, payload], use_bin_type=True))
    assert_format_error(decode, msgpack.packb([name, version, payload], use_bin_type=True))
    assert_format_error(decode, msgpack.packb({"name": name}, use_bin_type=True))
    assert_format_error(decode, msgpack.packb([name, version, str(crc), payload], use_bin_type=True))
    # another format's object entirely
    for other_kind, (_, other_make) in DECODERS.items():
        if other_kind != kind:
            assert_format_error(decode, other_make())


def test_an_experience_object_of_format_version_1_is_refused():
    """Version 2 added each step's rewards and discounts and each sample's bootstrap (V-trace's inputs); a version 1
    object, without them, is a bad object like any other (counted and skipped), even with them added."""
    tree = batch_tree(make_batch())
    added = ("rewards", "discounts", "bootstrap")
    assert decode_experience(codec.encode(experience.FORMAT, 2, tree), SHAPE).num_samples == 3
    for name in added:
        assert_format_error(decode_experience, codec.encode(experience.FORMAT, 2, {
            **tree, "arrays": {k: v for k, v in tree["arrays"].items() if k != name}}), SHAPE)
    old = {**tree, "arrays": {k: v for k, v in tree["arrays"].items() if k not in added}}
    assert_format_error(decode_experience, codec.encode(experience.FORMAT, 1, old), SHAPE)
    assert_format_error(decode_experience, codec.encode(experience.FORMAT, 1, tree), SHAPE)


def test_version_must_be_an_int():
    data = encode_params(make_params())
    name, version, crc, payload = msgpack.unpackb(data, raw=False)
    for v in (True, 1.0):
        assert_format_error(decode_params, msgpack.packb([name, v, crc, payload], use_bin_type=True))


@pytest.mark.parametrize("field", sorted(SHAPE.fields()))
def test_experience_wrong_dtype_shape_missing_field(field):
    dtype, rest = SHAPE.fields()[field]
    base = batch_tree(make_batch())
    wrong_dtype = {"float32": "float64", "bool": "uint8", "int64": "int32", "int32": "int64"}[dtype]
    for bad_value in (
        base["arrays"][field].astype(wrong_dtype),                      # wrong dtype
        np.zeros((3, *rest, 1), dtype),                                 # an extra dimension
        np.zeros((2, *rest), dtype),                                    # wrong sample count
        np.zeros((3, *[d + 1 for d in rest]), dtype) if rest else np.zeros((3, 1), dtype),  # wrong size
        base["arrays"][field].tolist(),                                 # a list, not an array
        "x",
    ):
        tree = batch_tree(make_batch())
        tree["arrays"][field] = bad_value
        assert_format_error(decode_experience, enc_exp(tree), SHAPE)
    tree = batch_tree(make_batch())
    del tree["arrays"][field]
    assert_format_error(decode_experience, enc_exp(tree), SHAPE)


def test_experience_decoded_against_a_different_shape():
    data = encode_experience(make_batch())
    for other in (Shape(5, 5, 7, 2, 3, (3, 4)), Shape(4, 6, 7, 2, 3, (3, 4)), Shape(4, 5, 8, 2, 3, (4, 4)),
                  Shape(4, 5, 7, 1, 3), Shape(4, 5, 7, 2, 4, (3, 4))):
        assert_format_error(decode_experience, data, other)


@pytest.mark.parametrize("key", ["worker", "seq", "created", "arrays", "opponents", "episodes", "env_steps"])
def test_experience_missing_or_mistyped_top_level(key):
    tree = batch_tree(make_batch())
    del tree[key]
    assert_format_error(decode_experience, enc_exp(tree), SHAPE)
    wrong = {"worker": 3, "seq": "12", "created": "now", "arrays": [1], "opponents": "latest",
             "episodes": {}, "env_steps": 1.5}[key]
    tree = batch_tree(make_batch())
    tree[key] = wrong
    assert_format_error(decode_experience, enc_exp(tree), SHAPE)
    tree = batch_tree(make_batch())
    tree[key] = True  # bool is not an int/str/...
    assert_format_error(decode_experience, enc_exp(tree), SHAPE)


def test_experience_bad_values():
    def check(mutate):
        tree = batch_tree(make_batch())
        mutate(tree)
        assert_format_error(decode_experience, enc_exp(tree), SHAPE)

    for name in ("obs", "logp", "values", "advantages", "returns", "rewards", "discounts", "bootstrap", "h0", "c0"):
        for bad in (np.nan, np.inf, -np.inf):
            def put(t, name=name, bad=bad):
                a = t["arrays"][name].copy()
                a.reshape(-1)[-1] = bad
                t["arrays"][name] = a
            check(put)

    for bad in (-0.01, 1.01):
        def discount(t, bad=bad):
            a = t["arrays"]["discounts"].copy()
            a[1, 2] = bad
            t["arrays"]["discounts"] = a
        check(discount)

    def opp_oob(t):
        t["arrays"]["opponent"] = np.array([0, 2, 0], np.int32)
    check(opp_oob)

    def opp_neg(t):
        t["arrays"]["opponent"] = np.array([0, -1, 0], np.int32)
    check(opp_neg)

    def neg_version(t):
        t["arrays"]["version"] = np.array([0, -1, 2], np.int64)
    check(neg_version)

    def all_forbidden(t):
        m = t["arrays"]["mask"].copy()
        m[1, 2, :] = False
        t["arrays"]["mask"] = m
    check(all_forbidden)

    def zero_samples(t):
        t["arrays"] = {k: v[:0] for k, v in t["arrays"].items()}
    check(zero_samples)

    def opponent_not_str(t):
        t["opponents"] = ["latest", 3]
    check(opponent_not_str)

    def extra_array(t):
        t["arrays"]["extra"] = np.zeros(3, np.float32)
    check(extra_array)

    def payload_list(t):
        t.clear()
    check(payload_list)

    for key in ("learner_version", "opponent", "learner_side", "winner", "length", "learner_return"):
        def drop(t, key=key):
            del t["episodes"][0][key]
        check(drop)

    def bad_winner(t):
        t["episodes"][0]["winner"] = "nobody"
    check(bad_winner)

    def episode_not_map(t):
        t["episodes"] = [[1, 2]]
    check(episode_not_map)

    # a payload that is not a map at all
    assert_format_error(decode_experience, enc_exp([1, 2, 3]), SHAPE)
    assert_format_error(decode_experience, enc_exp(None), SHAPE)


@pytest.mark.parametrize("where", ["created", "learner_return"])
def test_experience_nan_in_float_scalars(where):
    tree = batch_tree(make_batch())
    if where == "created":
        tree["created"] = math.nan
    else:
        tree["episodes"][0]["learner_return"] = math.inf
    assert_format_error(decode_experience, enc_exp(tree), SHAPE)


def test_params_bad_contents():
    def enc(tree):
        return codec.encode(params.FORMAT, params.FORMAT_VERSION, tree)

    good = {"version": 1, "tensors": {"w": np.ones(3, np.float32)}, "meta": {}}
    decode_params(enc(good))
    for bad in (
        {**good, "version": -1},
        {**good, "version": "1"},
        {**good, "version": True},
        {**good, "tensors": {"w": np.array([1.0, np.nan], np.float32)}},
        {**good, "tensors": {"w": np.array([np.inf], np.float64)}},
        {**good, "tensors": {"w": np.array([np.nan], np.float16)}},
        {**good, "tensors": {"w": [1.0, 2.0]}},
        {**good, "tensors": {3: np.ones(1, np.float32)}},
        {**good, "tensors": [np.ones(1, np.float32)]},
        {**good, "meta": []},
        {"tensors": good["tensors"], "meta": {}},
        {"version": 1, "meta": {}},
        {"version": 1, "tensors": good["tensors"]},
        [good],
    ):
        assert_format_error(decode_params, enc(bad))


def test_checkpoint_bad_contents():
    def enc(tree):
        return codec.encode(ckpt_mod.FORMAT, ckpt_mod.FORMAT_VERSION, tree)

    good = {"version": 1, "updates": 2, "model": {"w": np.ones(2, np.float32)},
            "adam": {"state": {}, "param_groups": []}, "meta": {}}
    decode_checkpoint(enc(good))
    for bad in (
        {**good, "version": "1"},
        {**good, "updates": 1.5},
        {**good, "model": {"w": [1.0]}},
        {**good, "model": {1: np.ones(1, np.float32)}},
        {**good, "adam": {"state": {}}},
        {**good, "adam": {"param_groups": []}},
        {**good, "adam": []},
        {**good, "meta": None},
        {k: v for k, v in good.items() if k != "model"},
        "checkpoint",
    ):
        assert_format_error(decode_checkpoint, enc(bad))


def test_checkpoint_nan_model_rejected():
    ck = make_checkpoint()
    name = next(k for k, v in ck.model.items() if v.dtype.kind == "f" and v.size)
    ck.model[name] = ck.model[name].copy()
    ck.model[name].reshape(-1)[0] = np.nan
    assert_format_error(decode_checkpoint, enc_ckpt(ck))


def test_checkpoint_malformed_adam_state_rejected():
    ck = make_checkpoint()
    ck.adam = {"state": {"zero": {"step": np.zeros(())}}, "param_groups": [{"lr": 1.0}]}  # no betas, str index
    data = enc_ckpt(ck)
    try:
        decode_checkpoint(data).adam_state()
    except FormatError:
        return
    except BaseException as e:  # noqa: BLE001
        pytest.fail(f"raised {type(e).__name__} instead of FormatError: {e}")
    pytest.fail("accepted a malformed Adam state")


def test_array_ext_rejects_unsafe_dtypes_and_ext_types():
    for dtype in ("object", "O", "V8", "<U4", "complex64", "datetime64[s]", "float128", "|S4"):
        body = msgpack.packb([dtype, [1], b"\x00" * 8], use_bin_type=True)
        data = codec.encode("t", 1, {"a": msgpack.ExtType(1, body)})
        assert_format_error(codec.decode, data, "t", (1,))
    for code in (0, 2, 5, 127):
        data = codec.encode("t", 1, {"a": msgpack.ExtType(code, b"\x00\x01")})
        assert_format_error(codec.decode, data, "t", (1,))
    for body in (b"", b"\xc1", msgpack.packb(["float32", [1]]), msgpack.packb(["float32", [1], "abcd"]),
                 msgpack.packb(["float32", 1, b"\x00" * 4]), msgpack.packb(["float32", [True], b"\x00" * 4]),
                 msgpack.packb(["float32", [1.0], b"\x00" * 4]), msgpack.packb(["float32", [2], b"\x00" * 4]),
                 msgpack.packb({"dtype": "float32"})):
        data = codec.encode("t", 1, {"a": msgpack.ExtType(1, body)})
        assert_format_error(codec.decode, data, "t", (1,))
    with pytest.raises(TypeError):
        codec.encode("t", 1, {"a": np.array([object()])})


def test_decode_rejects_non_bytes():
    for obj in ("text", None, 3, [b"x"]):
        assert_format_error(decode_params, obj)


# --- nothing is executed: no pickle -----------------------------------------------------------------------


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("module", ["rapid/formats/codec.py", "rapid/formats/experience.py",
                                    "rapid/formats/params.py", "rapid/formats/checkpoint.py",
                                    "rapid/optimizer/loader.py", "rapid/rollout/uploader.py",
                                    "rapid/run/param_store.py", "rapid/optimizer/checkpoints.py",
                                    "rapid/run/store_map.py", "infra/store.py"])
def test_data_path_modules_do_not_use_pickle(module):
    tree = ast.parse((ROOT / module).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] in ("pickle", "dill", "cloudpickle", "marshal", "shelve")
                           for a in node.names), module
        elif isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] not in ("pickle", "dill", "cloudpickle", "marshal", "shelve")
        elif isinstance(node, ast.Attribute):
            # torch.load / np.load(allow_pickle) unpickle; raw=True etc. are fine
            assert not (node.attr == "load" and isinstance(node.value, ast.Name)
                        and node.value.id in ("torch", "pickle", "np", "numpy")), module
        elif isinstance(node, ast.keyword):
            assert node.arg != "allow_pickle", module


def test_pickle_payloads_are_never_executed(tmp_path):
    # The payload is live: unpickling it really creates a file.
    canary = tmp_path / "canary"
    pickle.loads(pickle.dumps(_Evil(str(canary))))
    assert canary.exists()

    target = tmp_path / "pwned"
    evil = pickle.dumps(_Evil(str(target)))
    evil0 = pickle.dumps(_Evil(str(target)), protocol=0)

    # 1. bytes inside a legitimate field come back as inert bytes
    obj = make_params()
    obj.meta = {"blob": evil}
    out = decode_params(encode_params(obj))
    assert out.meta["blob"] == evil and isinstance(out.meta["blob"], bytes)
    # 2. a raw pickle as the whole object, and as a payload with a correct checksum
    for fmt, decode in ((params.FORMAT, decode_params), (experience.FORMAT, lambda d: decode_experience(d, SHAPE)),
                        (ckpt_mod.FORMAT, decode_checkpoint)):
        for blob in (evil, evil0):
            assert_format_error(decode, blob)
            assert_format_error(decode, wrap(blob, fmt))
    # 3. pickle as an ext type, as object-dtype array data, as an array's dtype string
    for ext in (msgpack.ExtType(2, evil), msgpack.ExtType(1, evil),
                msgpack.ExtType(1, msgpack.packb(["object", [1], evil], use_bin_type=True)),
                msgpack.ExtType(1, msgpack.packb([evil, [1], b"\x00"], use_bin_type=True))):
        data = codec.encode(params.FORMAT, params.FORMAT_VERSION,
                            {"version": 1, "tensors": {"w": ext}, "meta": {}})
        assert_format_error(decode_params, data)
    # 4. a checkpoint with a pickle where Adam state would be
    data = codec.encode(ckpt_mod.FORMAT, ckpt_mod.FORMAT_VERSION,
                        {"version": 1, "updates": 1, "model": {}, "adam": {"state": {"0": evil},
                                                                           "param_groups": []}, "meta": {}})
    with pytest.raises(FormatError):  # rejected as a malformed Adam state, and never unpickled
        decode_checkpoint(data)
    assert not target.exists(), "a pickle payload was executed"

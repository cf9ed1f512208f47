"""Property tests: generated objects thrown at the decoders; the only exception allowed is FormatError.

Generators: random bytes, mutations of valid objects, valid envelopes around random msgpack, valid
envelopes around well-formed trees with wrong contents, amplifying structures (nested empty containers,
huge declared counts and lengths, deep nesting), each against all four decoders; and experience objects
with out-of-range values, where whatever is accepted must be in range. Each test checks its own count,
and the counts add up to at least 10,000 objects. The worst amplifying objects also go to every decoder
in a child process under an address-space limit (RLIMIT_AS): FormatError, never MemoryError.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rapid.errors import FormatError
from rapid.formats import checkpoint as ckpt_mod
from rapid.formats import codec, experience, params
from rapid.formats.checkpoint import decode_checkpoint
from rapid.formats.experience import ExperienceBatch, Shape, decode_experience, encode_experience
from rapid.formats.params import ParamsObject, decode_params, encode_params

SHAPE = Shape(bptt=2, obs_dim=3, mask_dim=5, heads=2, lstm=2, head_sizes=(3, 2))
COUNT = {"objects": 0}
CHEAP, COSTLY = 1500, 300  # examples per test: byte-level generators are cheap, tree generators are not
AMPLIFYING = 2 * COSTLY
# 4 decoders × (2 × CHEAP + 2 × COSTLY + AMPLIFYING) + COSTLY = 17,100 objects at least, each test checking
# its share
TOTAL_MIN = 4 * (2 * CHEAP + 2 * COSTLY + AMPLIFYING) + COSTLY


def fuzz(n):
    return settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _valid_experience() -> bytes:
    rng = np.random.default_rng(0)
    arrays = {}
    for name, (dtype, rest) in SHAPE.fields().items():
        shape = (2, *rest)
        arrays[name] = (rng.normal(size=shape).astype(dtype) if dtype.startswith("float")
                        else np.ones(shape, dtype) if dtype == "bool" else np.zeros(shape, dtype))
    arrays["actions"][..., 0] = [[0, 2], [1, 0]]
    arrays["discounts"][:] = 0.9  # a discount lies within [0, 1]
    arrays["actions"][..., 1] = [[1, 1], [0, 1]]
    return encode_experience(ExperienceBatch("w", 1, 0.0, arrays, ["latest"], [
        {"learner_version": 0, "opponent": "latest", "learner_side": 0, "winner": "draw", "length": 3,
         "learner_return": 0.0}], 4))


def _valid_params() -> bytes:
    return encode_params(ParamsObject(3, {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                                          "b": np.zeros(2, np.float64)}, {"k": 1}))


def _valid_checkpoint() -> bytes:
    return ckpt_mod.encode_checkpoint(ckpt_mod.Checkpoint(
        2, 20, {"w": np.ones((2, 2), np.float32)},
        {"state": {0: {"step": np.array(3.0, np.float32), "exp_avg": np.zeros((2, 2), np.float32)}},
         "param_groups": [{"lr": 0.001, "betas": [0.9, 0.999], "params": [0]}]}, {}))


def _valid_generic() -> bytes:
    return codec.encode("fuzz", 1, {"a": np.arange(4, dtype=np.int16), "b": [1, "x", None, 2.5], "c": {"d": b"e"}})


SMALL = codec.Limits(max_bytes=1 << 20, max_array_bytes=1 << 16, max_elements=1000, max_items=5000)
DECODERS = {
    "experience": (experience.FORMAT, lambda d: decode_experience(d, SHAPE), _valid_experience()),
    "params": (params.FORMAT, decode_params, _valid_params()),
    "checkpoint": (ckpt_mod.FORMAT, decode_checkpoint, _valid_checkpoint()),
    "codec": ("fuzz", lambda d: codec.decode(d, "fuzz", (1,), SMALL), _valid_generic()),
}


def run(decoder: str, data: bytes) -> None:
    COUNT["objects"] += 1
    _, decode, _ = DECODERS[decoder]
    try:
        decode(data)
    except FormatError:
        pass
    # Any other exception propagates and fails the property.


def wrap(fmt: str, payload: bytes, version: int = 1) -> bytes:
    return msgpack.packb([fmt, version, zlib.crc32(payload), payload], use_bin_type=True)


# --- generators ----------------------------------------------------------------------------------------

mutation = st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "splice"]),
                     st.integers(0, 1 << 30), st.integers(0, 255), st.binary(max_size=16))


def mutate(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for kind, pos, byte, blob in ops:
        if not b:
            b = bytearray(blob)
            continue
        i = pos % len(b)
        if kind == "flip":
            b[i] ^= 1 << (byte % 8)
        elif kind == "set":
            b[i] = byte
        elif kind == "insert":
            b[i:i] = blob
        elif kind == "delete":
            del b[i:i + 1 + byte % 8]
        elif kind == "truncate":
            del b[i:]
        else:
            b[i:i + len(blob)] = blob
    return bytes(b)


def _ext(body: bytes, code: int) -> msgpack.ExtType:
    return msgpack.ExtType(code, body)


dtype_names = st.sampled_from(sorted(codec.ALLOWED_DTYPES) + ["object", "float128", "<U2", "V4", "complex64", ""])
shapes = st.lists(st.one_of(st.integers(0, 4), st.integers(-3, (1 << 64) - 1)), max_size=8)
array_ext = st.builds(
    lambda d, s, raw, code: _ext(msgpack.packb([d, s, raw], use_bin_type=True), code),
    dtype_names, shapes, st.binary(max_size=64), st.sampled_from([1, 1, 1, 0, 2, 127]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1), st.floats(),
                    st.text(max_size=12), st.binary(max_size=24), array_ext)
keys = st.one_of(st.sampled_from(["version", "tensors", "meta", "arrays", "worker", "seq", "created", "opponents",
                                  "episodes", "env_steps", "updates", "model", "adam", "state", "param_groups",
                                  "obs", "mask", "first", "winner"]), st.text(max_size=6), st.integers(-2, 5))
trees = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                     st.dictionaries(keys, inner, max_size=6)), max_leaves=15)


def _structured(decoder: str):
    """Trees shaped like the real object, with fields swapped for random values."""
    fmt, decode, valid = DECODERS[decoder]
    name, version, crc, payload = msgpack.unpackb(valid, raw=False)
    base = msgpack.unpackb(payload, raw=False, strict_map_key=False)

    def build(replacements, drops, deep):
        tree = dict(base) if isinstance(base, dict) else {}
        for k, v in replacements:
            if deep and isinstance(tree.get(deep), dict) and tree[deep]:
                inner = dict(tree[deep])
                inner[k if k in inner or not inner else sorted(map(str, inner))[0]] = v
                tree[deep] = inner
            else:
                tree[k] = v
        for k in drops:
            tree.pop(k, None)
        return wrap(fmt, msgpack.packb(tree, use_bin_type=True, default=lambda o: o))

    top = sorted(k for k in base if isinstance(k, str)) if isinstance(base, dict) else ["x"]
    nested = [k for k in top if isinstance(base[k], dict)] + [None]
    return st.builds(build, st.lists(st.tuples(st.sampled_from(top) | keys, trees), min_size=1, max_size=3),
                     st.lists(st.sampled_from(top), max_size=2), st.sampled_from(nested))


# --- the properties ------------------------------------------------------------------------------------

DECODER_NAMES = sorted(DECODERS)


@pytest.mark.parametrize("decoder", DECODER_NAMES)
def test_random_bytes(decoder):
    fmt = DECODERS[decoder][0]
    before = COUNT["objects"]

    @fuzz(CHEAP)
    @given(st.one_of(st.binary(max_size=512), st.builds(lambda p: wrap(fmt, p), st.binary(max_size=256))))
    def prop(data):
        run(decoder, data)

    prop()
    assert COUNT["objects"] - before >= CHEAP


@pytest.mark.parametrize("decoder", DECODER_NAMES)
def test_mutations_of_valid_objects(decoder):
    fmt, _, valid = DECODERS[decoder]
    name, version, crc, payload = msgpack.unpackb(valid, raw=False)
    before = COUNT["objects"]

    @fuzz(CHEAP)
    @given(st.lists(mutation, min_size=1, max_size=4), st.booleans())
    def prop(ops, fix_checksum):
        if fix_checksum:  # mutate inside the payload and re-seal, so the checksum does not catch it
            run(decoder, wrap(fmt, mutate(payload, ops)))
        else:
            run(decoder, mutate(valid, ops))

    prop()
    assert COUNT["objects"] - before >= CHEAP


@pytest.mark.parametrize("decoder", DECODER_NAMES)
def test_valid_msgpack_wrong_contents(decoder):
    fmt = DECODERS[decoder][0]
    before = COUNT["objects"]

    @fuzz(COSTLY)
    @given(trees, st.sampled_from([1, 1, 1, 0, 2]), st.booleans())
    def prop(tree, version, raw):
        payload = msgpack.packb(tree, use_bin_type=True)
        run(decoder, wrap(fmt, payload, version))
        if raw:
            run(decoder, payload)

    prop()
    assert COUNT["objects"] - before >= COSTLY


@pytest.mark.parametrize("decoder", DECODER_NAMES)
def test_real_structure_with_fields_replaced(decoder):
    before = COUNT["objects"]

    @fuzz(COSTLY)
    @given(_structured(decoder))
    def prop(data):
        run(decoder, data)

    prop()
    assert COUNT["objects"] - before >= COSTLY


def test_valid_objects_still_decode():
    for _, decode, valid in DECODERS.values():
        decode(valid)


def test_mixed_type_array_keys_regression():
    """Found by this fuzzer: error messages sorted map keys of mixed types (TypeError). Fixed in bd9cc4e."""
    fmt, decode, valid = DECODERS["experience"]
    _, _, _, payload = msgpack.unpackb(valid, raw=False)
    tree = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    tree["arrays"] = {**tree["arrays"], 7: b"x"}
    with pytest.raises(FormatError):
        decode(wrap(fmt, msgpack.packb(tree, use_bin_type=True, default=lambda o: o)))


def test_the_counts_add_up_to_at_least_10000_objects():
    """Each test above asserts its own share, so the total holds whatever order or subset runs."""
    assert TOTAL_MIN >= 10_000


# --- amplifying structures -----------------------------------------------------------------------------

def _header(kind: str, n: int) -> bytes:
    """A msgpack array or map header declaring ``n`` entries (fix, 16 or 32 bits as msgpack would)."""
    fix, h16, h32, top = {"array": (0x90, 0xDC, 0xDD, 15), "map": (0x80, 0xDE, 0xDF, 15)}[kind]
    if n <= top:
        return bytes([fix | n])
    if n < 1 << 16:
        return bytes([h16]) + n.to_bytes(2, "big")
    return bytes([h32]) + n.to_bytes(4, "big")


def amplifying(kind: str, width: int, per: int, depth: int) -> bytes:
    """Containers of empty containers (1 byte encoded, ~60 decoded), optionally wrapped ``depth`` deep."""
    if kind == "arrays":
        body = _header("array", width) + (_header("array", per) + b"\x90" * per) * width
    elif kind == "maps":  # {i: {}} maps: 3 bytes per entry, ~250 decoded
        entry = b"".join(bytes([i & 0x7F]) + b"\x80" for i in range(per))
        body = _header("array", width) + (_header("map", per) + entry) * width
    elif kind == "declared":  # a header that declares far more than is there
        body = _header("array", width << 12) + b"\x90" * per
    else:  # nesting: each level one array around the next
        body = b"\x91" * (width * per) + b"\xc0"
    return b"\x91" * depth + body


amplifiers = st.builds(amplifying, st.sampled_from(["arrays", "maps", "declared", "nested"]),
                       st.integers(1, 300), st.integers(0, 100), st.integers(0, 20))


@pytest.mark.parametrize("decoder", DECODER_NAMES)
def test_amplifying_structures(decoder):
    fmt = DECODERS[decoder][0]
    before = COUNT["objects"]

    @fuzz(AMPLIFYING)
    @given(amplifiers, st.booleans())
    def prop(payload, in_tree):
        if in_tree:  # in place of a real field, so the envelope and the other fields are right
            _, _, _, valid_payload = msgpack.unpackb(DECODERS[decoder][2], raw=False)
            tree = msgpack.unpackb(valid_payload, raw=False, strict_map_key=False)
            key = sorted(k for k in tree if isinstance(k, str))[len(payload) % len(tree)]
            head = msgpack.packb({k: v for k, v in tree.items() if k != key}, use_bin_type=True,
                                 default=lambda o: o)
            # splice the amplifier in as the value of ``key`` (one more map entry than the header says)
            n = len(tree)
            payload = _header("map", n) + head[len(_header("map", n - 1)):] + msgpack.packb(key) + payload
        run(decoder, wrap(fmt, payload))

    prop()
    assert COUNT["objects"] - before >= AMPLIFYING


# --- out-of-range values -------------------------------------------------------------------------------

big_ints = st.one_of(st.integers(-3, 4), st.integers(-(1 << 63), (1 << 63) - 1))


def test_out_of_range_values_are_refused_and_whatever_is_accepted_is_in_range():
    fmt, decode, valid = DECODERS["experience"]
    batch = decode(valid)
    before = COUNT["objects"]

    @fuzz(COSTLY)
    @given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 1), big_ints), max_size=4),
           st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 4)), max_size=4),
           big_ints, big_ints, big_ints, st.sampled_from(["length", "learner_version", "learner_side"]), big_ints)
    def prop(action_edits, mask_edits, version, seq, env_steps, ep_field, ep_value):
        arrays = {k: v.copy() for k, v in batch.arrays.items()}
        for s_, t, h, a in action_edits:
            arrays["actions"][s_, t, h] = a
        for s_, t, m in mask_edits:
            arrays["mask"][s_, t, m] = not arrays["mask"][s_, t, m]
        arrays["version"][0] = version
        episodes = [{**batch.episodes[0], ep_field: ep_value}]
        data = codec.encode(experience.FORMAT, experience.FORMAT_VERSION, {  # a hostile writer's: no checks
            "worker": "w", "seq": seq, "created": 0.0, "arrays": arrays, "opponents": batch.opponents,
            "episodes": episodes, "env_steps": env_steps})
        COUNT["objects"] += 1
        try:
            out = decode_experience(data, SHAPE, max_version=3)
        except FormatError:
            return
        a, mask, active = out.arrays["actions"], out.arrays["mask"], out.arrays["active"]
        offsets = np.cumsum((0, *SHAPE.head_sizes[:-1]))
        for h, size in enumerate(SHAPE.head_sizes):
            assert ((a[..., h] >= 0) & (a[..., h] < size)).all()
            taken = np.take_along_axis(mask, offsets[h] + a[..., h:h + 1], axis=-1)[..., 0]
            assert taken[active].all()
        assert 0 <= out.arrays["version"].min() and out.arrays["version"].max() <= 3
        assert out.seq >= 0 and out.env_steps >= 0
        ep = out.episodes[0]
        assert ep["length"] >= 0 and ep["learner_version"] >= 0 and ep["learner_side"] in (0, 1)

    prop()
    assert COUNT["objects"] - before >= COSTLY


# --- the worst objects, under a memory limit -----------------------------------------------------------

_UNDER_LIMIT = """
import json, re, resource, sys, zlib
import msgpack
sys.path.insert(0, {tests!r})
from test_fuzz import DECODERS, amplifying, wrap
from rapid.errors import FormatError

fmt, decode, valid = DECODERS[{decoder!r}]
vm = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
limit = vm + {budget}
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
worst = {{
    "arrays-96MiB": amplifying("arrays", 48 * 1024, 2000, 0),    # ~6.5 GB once decoded
    "maps-64MiB": amplifying("maps", 64 * 1024, 300, 1),
    "declared-4G-entries": amplifying("declared", (1 << 20) - 1, 100, 0),
    "nested-1M-deep": amplifying("nested", 1024, 1024, 0),
}}
out = {{}}
for name, payload in worst.items():
    try:
        decode(wrap(fmt, payload))
        out[name] = "accepted"
    except FormatError:
        out[name] = "FormatError"
    except BaseException as e:
        out[name] = type(e).__name__
    del payload
print(json.dumps(out))
"""


@pytest.mark.parametrize("decoder", DECODER_NAMES)
def test_worst_objects_under_a_memory_limit(decoder):
    """1.5 GiB of address space above what the interpreter already holds: the amplifying objects that
    took gigabytes (a 15.8 MiB one +1,144 MiB) are refused with FormatError, never MemoryError."""
    from pathlib import Path

    code = _UNDER_LIMIT.format(tests=str(Path(__file__).parent), decoder=decoder, budget=3 << 29)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results and set(results.values()) == {"FormatError"}, results

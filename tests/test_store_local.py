"""LocalStore: the object interface, create-if-absent races, atomic replace, listing and key validation."""

from __future__ import annotations

import os
import threading

import pytest

from rapid.infra.store import (
    BadObject,
    InvalidKey,
    KeyNotFound,
    LocalStore,
    ObjectTooLarge,
    StoreError,
    open_store,
    validate_key,
)


def tree_of(path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), path))
    return out


def test_put_get_list_delete_exists(tmp_path):
    s = LocalStore(tmp_path / "root")
    assert s.list() == []
    s.put("a/b/c.bin", b"one")
    s.put("a/x.bin", b"two")
    s.put("top", b"")
    assert s.get("a/b/c.bin") == b"one" and s.get("top") == b""
    assert s.exists("a/x.bin") and not s.exists("a/nope") and not s.exists("a")  # a folder is not an object
    s.put("a/x.bin", b"three")                               # replace
    assert s.get("a/x.bin") == b"three"
    assert s.list() == ["a/b/c.bin", "a/x.bin", "top"]
    s.delete("a/x.bin")
    s.delete("a/x.bin")                                       # absent: not an error
    assert s.list() == ["a/b/c.bin", "top"]
    with pytest.raises(KeyNotFound):
        s.get("a/x.bin")
    with pytest.raises(KeyError):                             # KeyNotFound is a KeyError too
        s.get("missing")
    with pytest.raises(KeyNotFound):
        s.get("a")                                            # a folder
    s.put("bytes/ba", bytearray(b"xy"))
    s.put("bytes/mv", memoryview(b"zw"))
    assert s.get("bytes/ba") == b"xy" and s.get("bytes/mv") == b"zw"
    assert s.describe().startswith("file://") and "root" in s.describe()


def test_put_if_absent_keeps_first(tmp_path):
    s = LocalStore(tmp_path)
    assert s.put_if_absent("params/1.rpm", b"first") is True
    assert s.put_if_absent("params/1.rpm", b"second") is False
    assert s.get("params/1.rpm") == b"first"
    assert s.list() == ["params/1.rpm"]  # the loser left no temp file behind
    assert [n for n in os.listdir(tmp_path / "params")] == ["1.rpm"]


def test_put_if_absent_race_has_one_winner(tmp_path):
    s = LocalStore(tmp_path)
    for round_ in range(10):
        key = f"race/{round_}"
        barrier = threading.Barrier(8)
        results = [None] * 8

        def worker(i):
            barrier.wait()
            results[i] = s.put_if_absent(key, f"writer-{i}".encode() * 1000)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(True) == 1, results
        winner = results.index(True)
        assert s.get(key) == f"writer-{winner}".encode() * 1000
    assert len(s.list("race/")) == 10
    assert not any(n.startswith(".tmp-") for n in os.listdir(tmp_path / "race"))


def test_reader_always_sees_a_whole_version(tmp_path):
    s = LocalStore(tmp_path)
    versions = [bytes([i]) * (200_000 + i * 1000) for i in range(20)]
    allowed = set(versions)
    s.put("obj", versions[0])
    done = threading.Event()
    bad, reads = [], [0]

    def reader():
        while not done.is_set():
            data = s.get("obj")
            reads[0] += 1
            if data not in allowed:
                bad.append(len(data))
            for key in s.list():
                if key != "obj":
                    bad.append(key)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for round_ in range(10):
            for v in versions:
                s.put("obj", v)
    finally:
        done.set()
        t.join()
    assert not bad, bad[:5]
    assert reads[0] > 0
    assert s.get("obj") == versions[-1]


def test_listing_by_prefix_and_nested(tmp_path):
    s = LocalStore(tmp_path)
    keys = ["experience/w0/a-00000001.rxp", "experience/w0/a-00000002.rxp", "experience/w1/b-00000001.rxp",
            "experiment/x", "params/000000000001.rpm", "params/LATEST", "league/pool.json"]
    for k in keys:
        s.put(k, k.encode())
    assert s.list() == sorted(keys)
    assert s.list("experience/") == keys[:3]
    assert s.list("experience/w0/") == keys[:2]
    assert s.list("experience/w0/a-00000002") == [keys[1]]
    assert s.list("exp") == sorted(keys[:4])  # a prefix need not end on a folder boundary
    assert s.list("params/") == ["params/000000000001.rpm", "params/LATEST"]
    assert s.list("nothing/") == [] and s.list("nothing") == []
    assert s.list("experience/w2/") == []
    with pytest.raises(InvalidKey):
        s.list("../")
    with pytest.raises(InvalidKey):
        s.list("/etc/")


def test_temp_files_never_listed(tmp_path):
    s = LocalStore(tmp_path)
    s.put("experience/w0/1.rxp", b"x")
    (tmp_path / "experience" / "w0" / ".tmp-abc.part").write_bytes(b"partial")
    (tmp_path / ".tmp-top.part").write_bytes(b"partial")
    assert s.list() == ["experience/w0/1.rxp"]
    assert s.list("experience/") == ["experience/w0/1.rxp"]
    # no temp files are left behind by writes
    for i in range(20):
        s.put(f"experience/w0/{i}.rxp", b"y" * i)
    assert sorted(n for n in os.listdir(tmp_path / "experience" / "w0") if n.startswith(".tmp-")) == [
        ".tmp-abc.part"]


BAD_KEYS = ["", "..", "../x", "a/../../x", "a/..", ".", "./a", "/etc/passwd", "/abs", "a\\b", "..\\x", "a//b",
            "a/", "/", "a b", "a:b", "a*b", "a?b", "a\x00b", "\u00e9t\u00e9", ".hidden", "a/.tmp-x", "-rf", "a|b",
            "~", "~/x", "a" * 513, "x/" * 300 + "y", "a\tb", "a\nb/c", "C:\\x", "file://x"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_raise_and_nothing_escapes(tmp_path, key):
    root = tmp_path / "root"
    s = LocalStore(root)
    before = tree_of(tmp_path)
    for op in (lambda: s.put(key, b"x"), lambda: s.put_if_absent(key, b"x"), lambda: s.get(key),
               lambda: s.delete(key), lambda: s.exists(key), lambda: validate_key(key)):
        with pytest.raises(InvalidKey):
            op()
    assert tree_of(tmp_path) == before


def test_bad_key_types():
    for key in (None, 3, b"abc", ["a"]):
        with pytest.raises(InvalidKey):
            validate_key(key)


def test_trailing_newline_key_rejected(tmp_path):
    s = LocalStore(tmp_path / "root")
    with pytest.raises(InvalidKey):
        s.put("abc\n", b"x")


def test_good_keys(tmp_path):
    s = LocalStore(tmp_path)
    for key in ("a", "A.b-c_d", "_x", "experience/w0/1700000000abc-00000001.rxp", "a" * 512,
                "/".join(["s"] * 200)):
        assert validate_key(key) == key
    s.put("a" * 200, b"long")
    assert s.get("a" * 200) == b"long"


def test_symlink_outside_root_is_not_followed_by_keys(tmp_path):
    # Even a valid key cannot name anything outside the root: keys are relative and '..'-free.
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"secret")
    s = LocalStore(tmp_path / "root")
    with pytest.raises(InvalidKey):
        s.get("../outside.txt")


def test_open_store(tmp_path):
    a = open_store(str(tmp_path / "p"))
    assert isinstance(a, LocalStore) and (tmp_path / "p").is_dir()
    a.put("k", b"v")
    b = open_store((tmp_path / "p").as_uri())
    assert isinstance(b, LocalStore) and b.get("k") == b"v"
    assert b.url == a.url
    rel = open_store(os.path.relpath(tmp_path / "p"))
    assert rel.get("k") == b"v"
    for url in ("ftp://host/x", "http://example.com/bucket", "gs://bucket/x", "s4://b"):
        with pytest.raises(ValueError, match="scheme"):
            open_store(url)


# --- hostile files put in the folder behind the store's back -----------------------------------------------

def isolated_get(root, key: str, max_bytes: int | None = None, timeout: float = 20.0) -> str:
    """``LocalStore(root).get(key)`` in a child with 1 GiB of address space and a time limit (a FIFO
    or /dev/zero must neither block nor exhaust this test run): the name of the exception raised."""
    import subprocess
    import sys

    code = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from rapid.infra.store import LocalStore
try:
    LocalStore({str(root)!r}).get({key!r}{'' if max_bytes is None else f', max_bytes={max_bytes}'})
    print("read")
except Exception as e:
    print(type(e).__name__)
"""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "blocked"
    return out.stdout.strip() or out.stderr.strip().splitlines()[-1]


def test_fifo_named_like_an_object_neither_blocks_nor_is_listed(tmp_path):
    s = LocalStore(tmp_path)
    s.put("experience/w0/1.rxp", b"ok")
    os.mkfifo(tmp_path / "experience" / "w0" / "2.rxp")
    assert s.list("experience/") == ["experience/w0/1.rxp"]
    assert isolated_get(tmp_path, "experience/w0/2.rxp", timeout=10) == "BadObject"


def test_link_to_dev_zero_is_refused_not_read(tmp_path):
    s = LocalStore(tmp_path)
    s.put("experience/w0/1.rxp", b"ok")
    os.symlink("/dev/zero", tmp_path / "experience" / "w0" / "0.rxp")
    assert s.list("experience/") == ["experience/w0/1.rxp"]
    assert isolated_get(tmp_path, "experience/w0/0.rxp") == "BadObject"


def test_size_is_checked_before_reading(tmp_path):
    s = LocalStore(tmp_path)
    with open(tmp_path / "big.rxp", "wb") as f:
        f.truncate(8 << 30)  # an 8 GB sparse file: takes no disk, would take 8 GB of memory
    assert isolated_get(tmp_path, "big.rxp") == "ObjectTooLarge"
    assert isolated_get(tmp_path, "big.rxp", max_bytes=1 << 20) == "ObjectTooLarge"
    s.put("small", b"x" * 100)
    assert s.get("small", max_bytes=100) == b"x" * 100
    with pytest.raises(ObjectTooLarge):
        s.get("small", max_bytes=99)
    assert issubclass(ObjectTooLarge, BadObject) and issubclass(BadObject, StoreError)


def test_symlinked_folder_out_of_the_root_is_never_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "1.rxp").write_bytes(b"precious")
    s = LocalStore(tmp_path / "root")
    s.put("experience/w0/1.rxp", b"mine")
    os.symlink(outside, tmp_path / "root" / "experience" / "evil")
    os.symlink(outside, tmp_path / "root" / "params")
    assert s.list() == ["experience/w0/1.rxp"]
    assert s.list("experience/evil/") == [] and s.list("params/") == []
    for op in (lambda: s.get("experience/evil/1.rxp"), lambda: s.delete("experience/evil/1.rxp"),
               lambda: s.put("experience/evil/2.rxp", b"x"), lambda: s.put_if_absent("params/3.rpm", b"x"),
               lambda: s.delete("params/1.rxp")):
        with pytest.raises(BadObject):
            op()
    assert sorted(os.listdir(outside)) == ["1.rxp"] and (outside / "1.rxp").read_bytes() == b"precious"


def test_symlinked_file_out_of_the_root_is_not_read_and_delete_removes_only_the_link(tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"secret")
    s = LocalStore(tmp_path / "root")
    s.put("experience/w0/1.rxp", b"mine")
    os.symlink(outside, tmp_path / "root" / "experience" / "w0" / "2.rxp")
    assert s.list() == ["experience/w0/1.rxp"] and not s.exists("experience/w0/2.rxp")
    with pytest.raises(BadObject):
        s.get("experience/w0/2.rxp")
    s.delete("experience/w0/2.rxp")
    assert outside.read_bytes() == b"secret" and not (tmp_path / "root" / "experience" / "w0" / "2.rxp").exists()


def test_killed_writes_temp_files_are_removed_by_age(tmp_path):
    import time

    from rapid.infra.store import TEMP_MAX_AGE_S

    s = LocalStore(tmp_path)
    s.put("experience/w0/1.rxp", b"x")
    folder = tmp_path / "experience" / "w0"
    old, fresh = folder / ".tmp-killed.part", folder / ".tmp-writing.part"
    old.write_bytes(b"partial")
    fresh.write_bytes(b"partial")
    long_ago = time.time() - TEMP_MAX_AGE_S - 60
    os.utime(old, (long_ago, long_ago))
    assert s.list("experience/") == ["experience/w0/1.rxp"]
    assert not old.exists() and fresh.exists()  # a live write's temp file is left alone

"""LocalStore: the object interface, create-if-absent races, atomic replace, listing and key validation."""

from __future__ import annotations

import os
import threading

import pytest

from rapid.infra.store import InvalidKey, KeyNotFound, LocalStore, open_store, validate_key


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

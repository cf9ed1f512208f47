"""S3Store against a real S3-compatible HTTP server (moto_server on loopback), no mocks."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rapid.infra.s3 import MiB, S3Store
from rapid.infra.store import InvalidKey, KeyNotFound, ObjectTooLarge, StoreError, open_store
from tests.s3_server import free_port, s3_server, s3_store  # noqa: F401  (fixtures)


def sibling(store: S3Store, path: str, **options) -> S3Store:
    """Another store on the same bucket and endpoint."""
    return S3Store(f"s3://{store.bucket}/{path}".rstrip("/"), endpoint_url=store._client.meta.endpoint_url,
                   **options)


def test_round_trip_overwrite_delete(s3_store):
    payloads = {"a": b"", "b/c.rxp": bytes(range(256)) * 100, "params/LATEST": b"000000000007"}
    for key, data in payloads.items():
        s3_store.put(key, data)
    for key, data in payloads.items():
        assert s3_store.get(key) == data
        assert s3_store.exists(key)
    s3_store.put("a", b"new")
    assert s3_store.get("a") == b"new"
    assert s3_store.list() == sorted(payloads)
    assert s3_store.list("b/") == ["b/c.rxp"]
    s3_store.delete("a")
    s3_store.delete("a")  # absent: not an error
    assert not s3_store.exists("a")
    assert s3_store.list() == ["b/c.rxp", "params/LATEST"]


def test_open_store_and_describe_without_credentials(s3_server, s3_store, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value")
    store = open_store(f"s3://{s3_store.bucket}/x/y/", endpoint_url=s3_server)
    assert isinstance(store, S3Store)
    assert store.describe() == f"s3://{s3_store.bucket}/x/y @ {s3_server}"
    assert "very-secret-value" not in store.describe() and "test" not in store.describe().split("@")[1]


def test_missing_key_is_key_not_found(s3_store):
    with pytest.raises(KeyNotFound):
        s3_store.get("nothing/here")
    assert not s3_store.exists("nothing/here")
    assert s3_store.list("nothing/") == []


def test_missing_bucket_is_a_store_error_not_key_not_found(s3_server, s3_store):
    store = S3Store("s3://no-such-bucket-here/run", endpoint_url=s3_server)
    with pytest.raises(StoreError) as info:
        store.get("k")
    assert not isinstance(info.value, KeyNotFound)
    assert "NoSuchBucket" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("key", ["", "../x", "/abs", "a//b", "a/../../b", "a\\b", "./a", "a/", "sp ace", "x" * 600])
def test_invalid_keys_rejected(s3_store, key):
    for op in (lambda: s3_store.put(key, b"x"), lambda: s3_store.get(key), lambda: s3_store.delete(key),
               lambda: s3_store.put_if_absent(key, b"x"), lambda: s3_store.exists(key)):
        with pytest.raises(InvalidKey):
            op()


def test_invalid_urls_and_prefixes_rejected(s3_store):
    for url in ("s3://", "s3://Bad_Bucket/run", "s3://bucket/../escape", "s3://bucket/a//b", "http://bucket/x"):
        with pytest.raises(InvalidKey):
            S3Store(url)
    with pytest.raises(InvalidKey):
        s3_store.list("../")


def test_put_if_absent_honoured(s3_store):
    assert s3_store.put_if_absent("params/000000000001.rpm", b"first")
    assert not s3_store.put_if_absent("params/000000000001.rpm", b"second")
    assert s3_store.get("params/000000000001.rpm") == b"first"


def test_put_if_absent_race_has_one_winner(s3_store):
    key = "params/000000000002.rpm"
    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda i: s3_store.put_if_absent(key, f"writer {i}".encode()), range(8)))
    assert won.count(True) == 1
    assert s3_store.get(key) == f"writer {won.index(True)}".encode()


def test_readers_see_whole_objects_only(s3_store):
    size, versions = 512 * 1024, 12
    s3_store.put("obj", bytes([0]) * size)
    done = threading.Event()
    seen: list[bytes] = []

    def read() -> None:
        while not done.is_set():
            seen.append(s3_store.get("obj"))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for v in range(1, versions):
        s3_store.put("obj", bytes([v]) * size)
    done.set()
    for t in readers:
        t.join()
    assert seen
    for data in seen:
        assert len(data) == size and data == bytes([data[0]]) * size


def test_listing_more_than_1000_objects(s3_store):
    keys = [f"experience/w{i % 4}/{i:06d}.rxp" for i in range(1100)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: s3_store.put(k, b"x"), keys))
    s3_store.put("params/LATEST", b"1")
    # The server really paginates: one ListObjectsV2 call stops at 1,000 keys.
    page = s3_store._client.list_objects_v2(Bucket=s3_store.bucket, Prefix="run/experience/")
    assert page["IsTruncated"] and page["KeyCount"] == 1000
    assert s3_store.list("experience/") == sorted(keys)
    assert s3_store.list("experience/w1/") == sorted(k for k in keys if k.startswith("experience/w1/"))
    assert len(s3_store.list()) == 1101


def test_prefix_isolation(s3_store):
    other = sibling(s3_store, "run10")  # "run" and "run10" share a string prefix but not a folder
    s3_store.put("k", b"mine")
    other.put("k", b"theirs")
    other.put("only-there", b"x")
    assert s3_store.list() == ["k"] and s3_store.get("k") == b"mine"
    assert other.list() == ["k", "only-there"] and other.get("k") == b"theirs"
    with pytest.raises(KeyNotFound):
        s3_store.get("only-there")
    whole_bucket = sibling(s3_store, "")
    assert whole_bucket.list() == ["run/k", "run10/k", "run10/only-there"]


def test_multipart_above_threshold(s3_store):
    seen: list[tuple[str, int, bool]] = []
    store = sibling(s3_store, "run", multipart_threshold=1 * MiB, multipart_chunksize=5 * MiB,
                    observer=lambda op, nbytes, seconds, ok: seen.append((op, nbytes, ok)))
    big = os.urandom(11 * MiB)
    store.put("checkpoints/7/model.pt", big)
    store.put("small", b"tiny")
    assert store.get("checkpoints/7/model.pt") == big
    etag = lambda key: store._client.head_object(Bucket=store.bucket, Key=f"run/{key}")["ETag"]  # noqa: E731
    assert etag("checkpoints/7/model.pt").strip('"').endswith("-3")  # three parts: 5 + 5 + 1 MiB
    assert "-" not in etag("small")  # a single PUT
    assert seen == [("put", len(big), True), ("put", 4, True), ("get", len(big), True)]


def test_observer_reports_failures(s3_store):
    seen: list[tuple[str, int, bool]] = []
    store = sibling(s3_store, "run", observer=lambda op, nbytes, seconds, ok: seen.append((op, nbytes, ok)))
    store.put("a", b"123")
    with pytest.raises(KeyNotFound):
        store.get("b")
    store.list()
    store.delete("a")
    assert seen == [("put", 3, True), ("get", 0, False), ("list", 0, True), ("delete", 0, True)]


def test_unreachable_endpoint_fails_fast_without_credentials(monkeypatch):
    key_id, secret = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    store = S3Store("s3://bucket/run", endpoint_url=endpoint, max_attempts=2, connect_timeout=0.5,
                    read_timeout=0.5)
    for op in (lambda: store.put("k", b"x"), lambda: store.get("k"), lambda: store.list(),
               lambda: store.put_if_absent("k", b"x"), lambda: store.exists("k")):
        start = time.monotonic()
        with pytest.raises(StoreError) as info:
            op()
        assert time.monotonic() - start < 5
        message = str(info.value)
        assert not isinstance(info.value, KeyNotFound)
        assert "\n" not in message and key_id not in message and secret not in message
        assert endpoint in message


def test_bad_client_settings_are_store_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))  # no profiles at all
    for options in ({"profile": "no-such-profile"}, {"endpoint_url": "not a url"}):
        with pytest.raises(StoreError):
            S3Store("s3://bucket/run", **options)


def test_get_reads_no_more_than_max_bytes(s3_store):
    s3_store.put("experience/w0/1.rxp", b"x" * 1000)
    assert s3_store.get("experience/w0/1.rxp", max_bytes=1000) == b"x" * 1000
    with pytest.raises(ObjectTooLarge, match="1000 bytes"):
        s3_store.get("experience/w0/1.rxp", max_bytes=999)  # refused on Content-Length, body not read
    with pytest.raises(KeyNotFound):
        s3_store.get("experience/w0/2.rxp", max_bytes=10)


def test_no_log_level_prints_a_credential(s3_server, tmp_path):
    """A role at RAPID_LOG_LEVEL=DEBUG talking to S3: the key id, session token and signatures never
    reach the log (botocore prints whole signed requests at DEBUG)."""
    import subprocess
    import sys

    key_id, token = "AKIACANARY0123456789", "CANARYSESSIONTOKEN" + "x" * 40
    code = f"""
from rapid.roles.startup import setup_logging
from rapid.infra.s3 import S3Store
log = setup_logging("rollout")
log.debug("debug logging is on")
store = S3Store("s3://creds-bucket/run", endpoint_url={s3_server!r}, create_bucket=True)
store.put("params/000000000001.rpm", b"x" * 100)
store.get("params/000000000001.rpm")
store.list("params/")
store.delete("params/000000000001.rpm")
"""
    env = {**os.environ, "RAPID_LOG_LEVEL": "DEBUG", "AWS_ACCESS_KEY_ID": key_id,
           "AWS_SECRET_ACCESS_KEY": "canary-secret", "AWS_SESSION_TOKEN": token, "AWS_DEFAULT_REGION": "us-east-1"}
    env.pop("AWS_PROFILE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    logs = out.stdout + out.stderr
    assert out.returncode == 0, logs[-2000:]
    assert "debug logging is on" in logs  # DEBUG was really on
    for secret in (key_id, token, "canary-secret", "Signature=", "X-Amz-Security-Token"):
        assert secret not in logs, f"{secret!r} printed in the log"

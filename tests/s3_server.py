"""pytest fixtures for a real S3-compatible server on loopback (``moto_server``, in memory).

Usage (in a test module, or from ``tests/conftest.py`` via ``pytest_plugins = ["tests.s3_server"]``)::

    from tests.s3_server import s3_server, s3_store  # noqa: F401  (pytest finds fixtures by name)

    def test_round_trip(s3_store):          # a fresh bucket, S3Store with dummy credentials
        s3_store.put("a/b", b"x")

    def test_raw(s3_server):                # the endpoint URL, e.g. "http://127.0.0.1:40123"
        store = S3Store("s3://my-bucket/run", endpoint_url=s3_server, create_bucket=True)

The server is started once per session from the virtual environment's ``bin`` and stopped at the end. A
missing ``moto_server`` is a failure, never a skip: these tests are the proof the S3 backend works.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rapid.infra.s3 import S3Store

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_bucket_numbers = itertools.count()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moto_server_path() -> Path:
    """``moto_server`` next to this interpreter (the venv's bin), falling back to PATH."""
    candidate = Path(sys.executable).parent / "moto_server"
    if candidate.exists():
        return candidate
    raise FileNotFoundError(f"moto_server not found next to {sys.executable}; pip install 'moto[server]'")


def start_moto_server(timeout: float = 15.0) -> tuple[subprocess.Popen, str]:
    """Start ``moto_server`` on a free loopback port; return the process and its endpoint once it answers."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(moto_server_path()), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
            return proc, endpoint
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto_server did not start on {endpoint} (exit code {proc.poll()})")
            time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def use_dummy_credentials() -> None:
    """Point boto3 at fake credentials (moto accepts any) so no real profile or instance role is used."""
    os.environ.update(DUMMY_CREDENTIALS)
    os.environ.pop("AWS_PROFILE", None)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    proc, endpoint = start_moto_server()
    try:
        yield endpoint
    finally:
        stop(proc)


@pytest.fixture
def s3_store(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    """A fresh bucket on the session's server, as an S3Store rooted at ``s3://<bucket>/run``."""
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    bucket = f"rapid-test-{os.getpid()}-{next(_bucket_numbers)}"
    return S3Store(f"s3://{bucket}/run", endpoint_url=s3_server, create_bucket=True)

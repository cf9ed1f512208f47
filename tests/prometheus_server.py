"""A real Prometheus server for tests, started by hand on a free loopback port.

Usage in a test module::

    from tests.prometheus_server import prometheus  # noqa: F401  (pytest finds the fixture by name)

    def test_scrape(prometheus):
        write_file_sd(targets, prometheus.targets_file, run="t")   # file_sd: picked up within a second
        prometheus.wait_for('up{run="t"} == 1', timeout=25)
        prometheus.query("rapid_updates_total")

The server loads the shipped ``alerts.yml`` and scrapes/evaluates every second. A missing ``prometheus``
binary fails the test: these checks must run for real in CI, never be skipped.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from rapid.monitoring.prom import ALERTS_PATH, find_prometheus, free_port, launch_prometheus, query, render_config

READY_TIMEOUT_S = 20.0
# The first scrape lands ~5-6 s after start even with a 1 s interval; leave room on a loaded 2-core box.
DATA_TIMEOUT_S = 25.0


class PrometheusServer:
    """A started prometheus process with its URL, file_sd targets file and query helpers."""

    def __init__(self, workdir: Path, binary: str):
        self.workdir = workdir
        self.targets_file = workdir / "targets.json"
        self.targets_file.write_text("[]")  # exists from the start so file_sd watches it, not a missing path
        self.config_file = workdir / "prometheus.yml"
        self.config_file.write_text(render_config(self.targets_file, ALERTS_PATH, scrape_interval="1s"))
        self.log_file = workdir / "prometheus.log"
        self.proc = launch_prometheus(binary, self.config_file, workdir / "data", free_port(), self.log_file)
        self.url = self.proc.url

    def wait_ready(self) -> None:
        try:
            self.proc.wait_ready(READY_TIMEOUT_S)
        except RuntimeError as e:
            pytest.fail(f"{e}\n{self.log_tail()}")

    def query(self, promql: str) -> list[dict]:
        return query(self.url, promql)

    def wait_for(self, promql: str, timeout: float = DATA_TIMEOUT_S) -> list[dict]:
        """Poll until ``promql`` returns a non-empty result; fails the test with the server log otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(promql)
            if result:
                return result
            if time.monotonic() >= deadline:
                pytest.fail(f"no data for {promql!r} after {timeout:.0f}s\n{self.log_tail()}")
            time.sleep(0.5)

    def api(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=5) as resp:
            return json.load(resp)

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        self.proc.stop()


@pytest.fixture
def prometheus(tmp_path):
    """A running Prometheus (1 s scrape and rule evaluation) reading ``prometheus.targets_file``."""
    binary = find_prometheus()
    if binary is None:
        pytest.fail("prometheus binary not found: apt-get install -y --no-install-recommends prometheus")
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    server = PrometheusServer(workdir, binary)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()

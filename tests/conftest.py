"""Shared fixtures: the real S3-compatible server and the real Prometheus server."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["tests.s3_server", "tests.prometheus_server"]

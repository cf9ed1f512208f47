"""Shared fixtures: the real S3-compatible server and the real Prometheus server."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["tests.s3_server", "tests.prometheus_server"]


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` run wherever CUDA is present and are skipped, with the reason, where it is not."""
    cuda_items = [item for item in items if item.get_closest_marker("cuda")]
    if not cuda_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    import pytest

    skip = pytest.mark.skip(reason="needs CUDA (no CUDA device here)")
    for item in cuda_items:
        item.add_marker(skip)

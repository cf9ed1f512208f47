"""Shared fixtures: the real S3-compatible server and the real Prometheus server."""

import os
import signal

os.environ.setdefault("OMP_NUM_THREADS", "1")

# A suite started in the background by a script inherits SIGINT ignored (POSIX shells do that to `&` jobs) and
# its children would too: the Ctrl-C tests then cannot stop what they start. Take the default back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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

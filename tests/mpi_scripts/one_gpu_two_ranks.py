"""One of two ranks of ``rapid optimizer`` on a pretend host where both see one and the same GPU (UUID GPU-f00d)
and nothing bound a GPU to each rank. Both take cuda:0; the job must stop when the ranks meet, before any CUDA
call (every real one would fail here: there is no GPU behind the pretence).

Usage: ``mpiexec -n 2 python one_gpu_two_ranks.py RUN_DIR``, or two processes with RAPID_RANK, RAPID_WORLD_SIZE,
RAPID_LOCAL_RANK, RAPID_LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.set_device = lambda device: None
torch.cuda.get_device_properties = lambda device: SimpleNamespace(uuid="GPU-f00d")

from rapid import cli  # noqa: E402  (after the pretence, as a launcher would start it)

if __name__ == "__main__":
    sys.exit(cli.main(["optimizer", "--set", f'run.dir="{sys.argv[1]}"', "--set", "metrics.enabled=false"]))

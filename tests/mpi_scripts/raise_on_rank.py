"""Run under ``mpiexec -n N``: rank 1 raises while the others wait in a collective.

With :class:`abort_on_error` the whole job must end at once, non-zero, with one clear line on stderr.
"""

from __future__ import annotations

import torch

from rapid.infra.distributed import abort_on_error, detect_identity, init_process_group


def main() -> None:
    identity = detect_identity()
    with abort_on_error(identity), init_process_group(identity, backend="gloo", timeout=120) as dist:
        if identity.rank == 1:
            raise ValueError("boom from the test\nsecond line")
        params = [torch.nn.Parameter(torch.ones(10))]
        params[0].grad = torch.ones(10)
        dist.all_reduce_gradients(params)  # blocks: rank 1 never joins


if __name__ == "__main__":
    main()

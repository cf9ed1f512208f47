"""Run under ``mpiexec -n N``: the real optimizer loop (``rapid.roles.optimizer.run_optimizer``) on every rank,
then prove the ranks ended with bit-identical parameters.

The roles do not expose a rank's weights, so this driver swaps ``rapid.roles.optimizer.Learner`` for a subclass
that only remembers its instance (the real learner, real all-reduce, real data from a rollout worker) and,
after the run ends by itself at ``run.updates``, gathers a digest of every rank's weights, normalizer
buffers and Adam state. Rank 0 prints one JSON line, ``RESULT {...}``; any failure aborts the job.

Usage: ``mpiexec -n 2 python optimizer_ranks.py CONFIG.toml [COLLECTIVE_TIMEOUT_S]``
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np


def digest(tensors: dict[str, np.ndarray]) -> str:
    """sha256 over names, dtypes, shapes and raw bytes: equal only if every value is bit-identical."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        value = np.ascontiguousarray(tensors[name])
        h.update(f"{name}:{value.dtype.str}:{value.shape}".encode())
        h.update(value.tobytes())
    return h.hexdigest()


def adam_digest(adam) -> str:
    state = adam.state_dict()["state"]
    return digest({f"{i}.{k}": v.detach().cpu().numpy() for i, s in state.items() for k, v in s.items()
                   if hasattr(v, "detach")})


def main(config_path: str, timeout_s: float = 120.0) -> None:
    from mpi4py import MPI

    import rapid.roles.optimizer
    from rapid.infra.distributed import abort_on_error, detect_identity, init_process_group
    from rapid.roles.startup import StopFlag
    from rapid.run.config_files import load_config

    learners = []

    class RecordingLearner(rapid.roles.optimizer.Learner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            learners.append(self)

    rapid.roles.optimizer.Learner = RecordingLearner
    identity = detect_identity()
    with abort_on_error(identity):
        # A CPU learner with gloo, named: on a GPU host the defaults would be a GPU learner with NCCL.
        cfg = load_config(config_path, ["optimizer.device=cpu"])
        with init_process_group(identity, backend="gloo", timeout=timeout_s) as ctx:
            assert ctx.backend == "gloo", ctx.backend
            stop = StopFlag(install_signals=False)
            code = rapid.roles.optimizer.run_optimizer(cfg, rank=identity, ctx=ctx, stop=stop)
        (learner,) = learners
        mine = {"rank": identity.rank, "exit": code, "updates": learner.updates, "skipped": learner.skipped,
                "params": digest(learner.policy.tensors()), "adam": adam_digest(learner.adam)}
        everyone = MPI.COMM_WORLD.gather(mine, root=0)
        if identity.rank == 0:
            print("RESULT " + json.dumps(everyone), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], *map(float, sys.argv[2:3]))

"""Run under ``mpiexec -n N``: the real optimizer loop (``rapid.roles.optimizer.run_optimizer``) on every rank with
gloo and a short collective timeout, against a run store whose parameter and checkpoint writes fail for
``OUTAGE_S`` seconds from the first write of version ``OUTAGE_FROM`` (as S3 in an outage; rank 0 alone writes
them), so the run has checkpoints from before it.

Each rank records when it updated; at the end rank 0 prints one JSON line, ``RESULT {...}``: per rank its exit
code, update count, digests of its weights and Adam state, and how many updates it made during the outage, plus
the outage's window. Any failure aborts the job. With ``--resume`` the ranks resume the run instead (the test
reads the start each rank logged).

Usage: ``mpiexec -n 2 python optimizer_outage.py CONFIG.toml TIMEOUT_S OUTAGE_S [--resume]``
"""

from __future__ import annotations

import json
import sys
import time

from optimizer_ranks import adam_digest, digest

OUTAGE_FROM = 12


def outage_store(url: str, outage_s: float, window: dict):
    """The run's local store, with params/ and checkpoints/ writes refused for ``outage_s`` from the first params
    write of version ``OUTAGE_FROM`` or later (``window`` gets its start and end, wall clock)."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for tests.helpers
    from rapid.run.store_map import parse_params_key
    from tests.helpers import RefusingStore

    class Outage(RefusingStore):
        def refuses(self, key: str) -> bool:
            now = time.time()
            version = parse_params_key(key)
            if "from" not in window and version is not None and version >= OUTAGE_FROM:
                window.update({"from": now, "to": now + outage_s})
            return key.startswith(("params/", "checkpoints/")) and window.get("from", now + 1) <= now < window["to"]

    return Outage(url)


def main(config_path: str, timeout_s: float, outage_s: float, resume: bool) -> None:
    from mpi4py import MPI

    import rapid.roles.optimizer as optimizer
    from rapid.infra.distributed import abort_on_error, detect_identity, init_process_group
    from rapid.roles.startup import StopFlag
    from rapid.run.config_files import load_config

    learners, window = [], {}

    class RecordingLearner(optimizer.Learner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.times: list[float] = []
            learners.append(self)

        def update(self, batch, progress=0.0):
            stats = super().update(batch, progress)
            self.times.append(time.time())
            return stats

    optimizer.Learner = RecordingLearner
    optimizer.open_run_store = lambda cfg, metrics=None: outage_store(cfg.derive().store_url, outage_s, window)
    identity = detect_identity()
    with abort_on_error(identity):
        cfg = load_config(config_path, ["optimizer.device=cpu"])
        with init_process_group(identity, backend="gloo", timeout=timeout_s) as ctx:
            code = optimizer.run_optimizer(cfg, resume=resume, rank=identity, ctx=ctx,
                                           stop=StopFlag(install_signals=False))
        (learner,) = learners
        window = MPI.COMM_WORLD.bcast(window, root=0)
        during = sum(window.get("from", 0) <= t < window.get("to", 0) for t in learner.times)
        mine = {"rank": identity.rank, "exit": code, "updates": learner.updates, "during_outage": during,
                "params": digest(learner.policy.tensors()), "adam": adam_digest(learner.adam)}
        everyone = MPI.COMM_WORLD.gather(mine, root=0)
        if identity.rank == 0:
            print("RESULT " + json.dumps({"ranks": everyone, "outage": window}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), "--resume" in sys.argv[4:])

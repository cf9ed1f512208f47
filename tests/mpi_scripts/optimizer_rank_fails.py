"""Run under ``mpiexec -n 2``: the real ``rapid optimizer`` command on every rank, where rank 1's learner
raises inside the update loop (after the process group is up and a first update went through all ranks).

The other rank is then waiting in a collective; the job must still end at once, non-zero, with
``rapid: rank 1: RuntimeError: …`` on stderr, never hang. Only ``Learner.update`` on rank 1 is replaced.

Usage: ``mpiexec -n 2 python optimizer_rank_fails.py CONFIG.toml``
"""

from __future__ import annotations

import sys


def main(config_path: str) -> int:
    from rapid import cli
    from rapid.infra.distributed import detect_identity
    from rapid.opt.learner import Learner

    if detect_identity().rank == 1:
        real_update = Learner.update

        def failing_update(self, batch, progress=0.0):
            if self.updates >= 1:
                raise RuntimeError(f"injected failure in update {self.updates + 1} on this rank")
            return real_update(self, batch, progress)

        Learner.update = failing_update
    return cli.main(["optimizer", "--config", config_path])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

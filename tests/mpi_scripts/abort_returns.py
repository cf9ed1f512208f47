"""Run under ``mpiexec -n 2``: does a rank's Python stop once ``abort_on_error`` has called MPI Abort?

Rank 1 raises inside ``abort_on_error``; the context manager prints its one line and calls
``MPI.COMM_WORLD.Abort(1)``. If Abort returns (pip's MPICH returns and leaves the killing to the process
manager), the exception propagates on and Python prints a traceback before the kill arrives. To see that
deterministically, this script catches what propagates and prints ``RAN ON AFTER ABORT``; with a correct
``abort_on_error`` that line never appears.
"""

from __future__ import annotations

import sys
import time

from rapid.infra.distributed import abort_on_error, detect_identity


def main() -> None:
    identity = detect_identity()
    if identity.rank != 1:
        time.sleep(30)  # ended by the abort long before this
        return
    try:
        with abort_on_error(identity):
            raise RuntimeError("rank 1 fails")
    except RuntimeError:
        print("RAN ON AFTER ABORT", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

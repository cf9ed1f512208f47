"""Run under ``mpiexec -n 2 … rank_raises.py KIND``: rank 1 raises a ``UsageError`` (KIND ``usage``) or a
``RuntimeError`` (KIND ``bug``) inside ``abort_on_error``; the job's exit code says which (2 or 1)."""

from __future__ import annotations

import sys
import time

from rapid.errors import UsageError
from rapid.infra.distributed import abort_on_error, detect_identity


def main() -> None:
    identity = detect_identity()
    with abort_on_error(identity):
        if identity.rank == 1:
            raise UsageError("no such run directory") if sys.argv[1] == "usage" else RuntimeError("a bug")
        time.sleep(30)  # ended by the abort long before this


if __name__ == "__main__":
    main()

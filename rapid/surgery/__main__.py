"""`python -m rapid.surgery …`: the `rapid surgery` command on its own (see rapid.surgery.cli)."""

from __future__ import annotations

import sys

from rapid.cli import OneLineParser
from rapid.surgery.cli import HELP, add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="rapid surgery", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

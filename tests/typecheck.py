"""Type-check the project with mypy as installed: ``python tests/typecheck.py [FILE ...]`` (``make test`` runs it).

setuptools installs ``envs/`` as ``rapid.envs``, ``opt/`` as ``rapid.opt`` and so on (``package-dir`` in
pyproject.toml), and an editable install finds them through an import hook that mypy cannot follow. So this
script first lays out the installed package as links under ``.mypy_cache/layout/rapid`` (a real folder holding a
link to every entry of ``rapid/`` and one to each folder that package-dir maps into ``rapid``), the tree that
``[tool.mypy]``'s ``mypy_path`` and ``files`` name, then runs mypy with that config. The layout is rebuilt on every
run (links only, milliseconds), so added or moved modules are always seen; mypy's own cache stays warm beside it.

With no FILE, mypy checks ``files`` from the config (the package and ``benchmarks/``); with FILEs, only those and
what they import. Messages name the real files (``envs/base.py``), not their links. The exit code is mypy's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / ".mypy_cache" / "layout"


def build_layout(root: Path = ROOT, layout: Path = LAYOUT) -> Path:
    """Links the installed ``rapid`` package under ``layout``; returns the folder to give mypy as a path."""
    mapping: dict[str, str] = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    package = layout / "rapid"
    if package.exists():
        for entry in package.iterdir():
            entry.unlink()
    else:
        package.mkdir(parents=True)
    for entry in (root / mapping["rapid"]).iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in mapping.items():
        if name == "rapid":
            continue
        place = layout.joinpath(*name.split("."))
        source = (root / folder).resolve()
        # A sub-package inside its parent's folder (rapid.roles, rapid.envs.moba) is already reached through it.
        if not place.exists():
            place.symlink_to(source)
        elif place.resolve() != source:
            raise SystemExit(f"typecheck: {name} maps to {folder} but {place} already leads to {place.resolve()}")
    return package


def real_path(line: str, root: Path = ROOT, layout: Path = LAYOUT) -> str:
    """``.mypy_cache/layout/rapid/envs/base.py:3: error ...`` -> ``envs/base.py:3: error ...``."""
    prefix = str(layout.relative_to(root)) + os.sep
    if not line.startswith(prefix):
        return line
    path, sep, rest = line.partition(":")
    return str(Path(os.path.realpath(root / path)).relative_to(root)) + sep + rest


def main(argv: list[str]) -> int:
    build_layout()
    done = subprocess.run([sys.executable, "-m", "mypy", *argv], cwd=ROOT, capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    for line in done.stdout.splitlines(keepends=True):
        sys.stdout.write(real_path(line))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The Python floor that pyproject.toml declares admits no version the code cannot import on: every stdlib module,
name and grammar the installed packages and the benchmarks use exists at the floor, and the README says the same
floor. (On 3.10, `import tomllib` in rapid/run/config.py failed every command of an install pip allowed.)"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# First Python version of the stdlib modules and names that are new since 3.9 (extend when using another).
FIRST_MODULE = {"tomllib": (3, 11), "zoneinfo": (3, 9), "graphlib": (3, 9)}
FIRST_NAME = {
    ("typing", "Self"): (3, 11), ("typing", "LiteralString"): (3, 11), ("typing", "Never"): (3, 11),
    ("typing", "assert_never"): (3, 11), ("typing", "reveal_type"): (3, 11), ("typing", "Required"): (3, 11),
    ("typing", "NotRequired"): (3, 11), ("typing", "TypeVarTuple"): (3, 11), ("typing", "Unpack"): (3, 11),
    ("typing", "dataclass_transform"): (3, 11), ("typing", "override"): (3, 12), ("typing", "TypeIs"): (3, 13),
    ("enum", "StrEnum"): (3, 11), ("datetime", "UTC"): (3, 11), ("contextlib", "chdir"): (3, 11),
    ("hashlib", "file_digest"): (3, 11), ("asyncio", "TaskGroup"): (3, 11), ("asyncio", "timeout"): (3, 11),
    ("itertools", "batched"): (3, 12), ("warnings", "deprecated"): (3, 13), ("copy", "replace"): (3, 13),
}


def declared_floor() -> tuple[int, int]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    m = re.fullmatch(r">=\s*3\.(\d+)", spec.strip())
    assert m, f"requires-python {spec!r}: expected '>=3.N'"
    return 3, int(m.group(1))


def shipped_sources() -> list[Path]:
    """The installed packages' folders (pyproject's package-dir) and the benchmark scripts a user runs."""
    dirs = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    files = {p for d in dirs for p in (ROOT / d).glob("*.py")}
    return sorted(files | set((ROOT / "benchmarks").glob("*.py")))


def needs(tree: ast.AST) -> list[tuple[tuple[int, int], str]]:
    """(first version, what) for every versioned stdlib module or name the module uses."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(FIRST_MODULE[a.name], f"import {a.name}") for a in node.names if a.name in FIRST_MODULE]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module in FIRST_MODULE:
                found.append((FIRST_MODULE[node.module], f"from {node.module} import"))
            found += [(FIRST_NAME[node.module, a.name], f"from {node.module} import {a.name}")
                      for a in node.names if (node.module, a.name) in FIRST_NAME]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in FIRST_NAME:
                found.append((FIRST_NAME[node.value.id, node.attr], f"{node.value.id}.{node.attr}"))
    return found


def too_new(source: str, floor: tuple[int, int]) -> list[str]:
    """What in this source the floor lacks: newer grammar (ast's feature_version), modules or names."""
    try:
        ast.parse(source, feature_version=floor)
    except SyntaxError as e:
        return [f"line {e.lineno}: grammar newer than {floor[0]}.{floor[1]}: {e.msg}"]
    return [f"{what} (Python {v[0]}.{v[1]})" for v, what in needs(ast.parse(source)) if v > floor]


def test_the_declared_floor_admits_no_python_the_code_cannot_import_on():
    floor = declared_floor()
    problems = {str(p.relative_to(ROOT)): bad for p in shipped_sources() if (bad := too_new(p.read_text(), floor))}
    assert problems == {}, f"requires-python >={floor[0]}.{floor[1]} is too low"


def test_the_check_catches_what_an_older_floor_lacks():
    assert too_new("import tomllib\n", (3, 10)) == ["import tomllib (Python 3.11)"]
    assert too_new("import typing\nx: typing.Self\n", (3, 10)) == ["typing.Self (Python 3.11)"]
    assert too_new("from itertools import batched\n", (3, 11)) == ["from itertools import batched (Python 3.12)"]
    [grammar] = too_new("match x:\n    case 1:\n        pass\n", (3, 9))
    assert "grammar newer than 3.9: Pattern matching is only supported in Python 3.10" in grammar
    assert too_new("import tomllib\nfrom typing import Self\n", (3, 11)) == []


def test_the_readme_states_the_declared_floor():
    floor = declared_floor()
    stated = re.findall(r"Python ≥ (3\.\d+)", (ROOT / "README.md").read_text())
    assert stated == [f"{floor[0]}.{floor[1]}"], stated

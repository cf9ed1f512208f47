"""The layout (docs/architecture.md, Layers): packages listed explicitly, installed under rapid.*, layers importing
downwards."""

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"rapid": "rapid", "envs": "rapid.envs", "opt": "rapid.opt", "infra": "rapid.infra",
           "monitoring": "rapid.monitoring"}
# What each layer may import from the project (besides itself).
ALLOWED = {"rapid.envs": set(), "rapid.infra": set(), "rapid.monitoring": set(), "rapid.opt": {"rapid.infra"}}


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def package_folders() -> dict[str, Path]:
    """Every folder with an __init__.py under the mapped roots, by its import name."""
    found = {}
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found[".".join([name, *rel])] = init.parent
    return found


def test_every_package_folder_is_listed():
    listed = set(pyproject()["tool"]["setuptools"]["packages"])
    assert set(package_folders()) == listed


def test_package_dir_maps_top_level_folders_under_rapid():
    mapping = pyproject()["tool"]["setuptools"]["package-dir"]
    for folder, name in FOLDERS.items():
        assert mapping[name] == folder
    for name in pyproject()["tool"]["setuptools"]["packages"]:
        assert name == "rapid" or name.startswith("rapid.")


def test_no_generic_top_level_names_installed(tmp_path):
    code = ("import importlib.util,sys; "
            "sys.exit(any(importlib.util.find_spec(n) for n in ('envs','opt','infra','monitoring')))")
    assert subprocess.run([sys.executable, "-c", code], cwd=tmp_path).returncode == 0


def test_importing_envs_does_not_import_torch():
    code = "import sys, rapid.envs, rapid.envs.registry, rapid.infra.store; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _project_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n == "rapid" or n.startswith("rapid.")}


def test_layers_import_only_downwards():
    bad = []
    for package, folder in package_folders().items():
        layer = next((l for l in ALLOWED if package == l or package.startswith(l + ".")), None)
        if layer is None:
            continue
        for path in folder.glob("*.py"):
            for name in _project_imports(path):
                if not (name == layer or name.startswith(layer + ".")
                        or any(name == a or name.startswith(a + ".") for a in ALLOWED[layer])):
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert bad == []


def test_console_scripts():
    scripts = pyproject()["project"]["scripts"]
    assert set(scripts) >= {"rapid", "rapid-optimizer", "rapid-rollout", "rapid-league"}
    for script in ("rapid", "rapid-optimizer", "rapid-rollout", "rapid-league"):
        out = subprocess.run([Path(sys.executable).parent / script, "--help"], capture_output=True, text=True)
        assert out.returncode == 0 and "usage" in out.stdout


CITATION = "SPEC " + "§"  # spelled apart, so this file does not cite it


def _tracked(*patterns: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_no_citations_of_the_brief_outside_the_repository():
    """The SPEC is not in the repository: comments point at docs/architecture.md instead."""
    citing = {p for p in _tracked("*.py", "*.yml", "*.yaml", "*.md", "*.toml") if CITATION in (ROOT / p).read_text()}
    assert not citing, sorted(citing)


def test_architecture_doc_names_only_files_that_exist():
    text = (ROOT / "docs" / "architecture.md").read_text()
    paths = set(re.findall(r"`((?:rapid|envs|opt|infra|monitoring|tests|docs)/[\w/.-]+)`", text))
    assert len(paths) > 30
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []


# rapid/ by side: what each side's package must not import (the shared run package imports neither side).
SIDES = {"rapid.rollout": ("rapid.optimizer",), "rapid.optimizer": ("rapid.rollout",),
         "rapid.run": ("rapid.rollout", "rapid.optimizer")}


def test_the_rollout_and_optimizer_sides_never_import_each_other():
    folders = package_folders()
    bad = []
    for side, forbidden in SIDES.items():
        for path in folders[side].rglob("*.py"):
            for name in _project_imports(path):
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert bad == []


def test_rapid_holds_packages_and_a_handful_of_modules():
    """A newcomer finds a role's parts by folder: rollout/, optimizer/, run/ (shared), agents/, roles/ (the mains)."""
    assert sorted(p.name for p in (ROOT / "rapid").glob("*.py")) == ["__init__.py", "api.py", "cli.py", "errors.py"]

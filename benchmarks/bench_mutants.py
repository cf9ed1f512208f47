"""The mutation check of the scale model: plant each bug of ``benchmarks/fleet/mutants.py`` in a scratch copy of
rapid, run the small fleets on it, and say which figure caught it.

    python benchmarks/bench_mutants.py                  # every mutant, 2 at a time, up to three fleets each
    python benchmarks/bench_mutants.py --every-fleet    # both fleets on every mutant: every figure that catches it
    python benchmarks/bench_mutants.py --only backlog-drops-newest --jobs 1

rapid is copied as installed (``pyproject.toml``'s ``package-dir``: ``envs/`` as ``rapid/envs`` …) into a scratch
folder, once unmutated and once per mutant, and ``benchmarks/bench_fleet.py`` runs with ``PYTHONPATH`` pointing
there (the model itself is never mutated). Three fleets: ``small`` (healthy, its cadence short enough that
versions, snapshots, checkpoints and folds all happen in four minutes; two of its workers rapid's
``RolloutWorker`` on a stand-in game) and ``outage`` (the same with an
experience-store outage that fills the uploaders' small backlogs, and node inference servers deciding the workers'
actions), then ``lease-lost`` (another optimizer takes the run at second 120: the holder must stop and write
nothing more). A mutant is caught when a figure that is
in bound on the unmutated copy is out of bound on it, or when the fleet crashes or hangs on it. Exit 1 when
the share caught is below ``--min-score``; exit 2 when a mutant's text is not found in rapid (a refactor moved
it: update the mutant, never let it run unmutated).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # benchmarks/fleet

from fleet.mutants import MUTANTS, Mutant  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--workers", "32", "--ranks", "4", "--minutes", "4", "--upload-s", "10", "--publish-s", "20",
         "--snapshot-every", "3", "--checkpoint-every", "20", "--workers-per-node", "8", "--max-backlog", "2"]
# The outage fleet decides through node inference servers: the small one covers the workers' own pollers, and
# two of its workers are rapid's RolloutWorker on a stand-in game (the worker's own bookkeeping).
FLEETS = {"small": [*SMALL, "--real-workers", "2"],
          "outage": [*SMALL, "--fault", "experience-outage=60", "--inference", "node"],
          "lease-lost": [*SMALL, "--fault", "lease-lost"]}
TIMEOUT_S = 180.0  # a fleet that runs this long on a mutant hangs (the unmutated one takes a few seconds)


class AnchorMissing(Exception):
    """A mutant's text is not in rapid exactly once."""


def install_copy(dest: Path) -> Path:
    """rapid's packages laid out as installed, under ``dest``; returns ``dest``."""
    mapping: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / mapping["rapid"], dest / "rapid", ignore=skip)
    for name, folder in mapping.items():
        place = dest.joinpath(*name.split("."))
        if not place.exists():  # a sub-package inside its parent's folder came with it
            shutil.copytree(ROOT / folder, place, ignore=skip)
    return dest


def read_mutants(path: Path) -> list[Mutant]:
    """Mutants from a JSON list of {"name", "what", "path", "edits": [[text, replacement], ...]}."""
    rows = json.loads(path.read_text())
    if not isinstance(rows, list):
        raise ValueError("not a JSON list")
    return [Mutant(str(r["name"]), str(r["what"]), str(r["path"]), tuple((str(a), str(b)) for a, b in r["edits"]))
            for r in rows]


def plant(root: Path, m: Mutant) -> None:
    path = root / m.path
    text = path.read_text()
    for old, new in m.edits:
        if text.count(old) != 1:
            raise AnchorMissing(f"{m.name}: {old!r} occurs {text.count(old)} times in {m.path}, not once")
        text = text.replace(old, new)
    path.write_text(text)


def run_fleet(code: Path, args: list[str], out: Path) -> tuple[str, list[str]]:
    """Run bench_fleet.py on the rapid under ``code``: ("ok", its failing figures), or ("crashed"/"hung", [])."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_fleet.py"), *args, "--json", str(out), "--no-fail"]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "hung", []
    if f"code: {code}/rapid" not in done.stdout:  # the installed rapid ran instead of the copy: nothing was tested
        raise RuntimeError(f"the fleet did not run the copy under {code}:\n{done.stdout[:400]}{done.stderr[-400:]}")
    if done.returncode != 0 or not out.exists():
        return "crashed", [done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"]
    return "ok", [line.split()[1] for line in json.loads(out.read_text())["failures"]]


def check(scratch: Path, m: Mutant, baseline: dict[str, set[str]], every_fleet: bool) -> tuple[Mutant, list[str]]:
    """What caught ``m``: "<figure> (<fleet>)" for each figure newly out of bound, or how the fleet ended; the
    fleets after the first that caught it run only with ``every_fleet`` (caught or missed is the same)."""
    code = install_copy(scratch / m.name)
    plant(code, m)
    caught: list[str] = []
    for fleet, args in FLEETS.items():
        if caught and not every_fleet:
            break
        how, failing = run_fleet(code, args, scratch / f"{m.name}-{fleet}.json")
        if how != "ok":
            caught.append(f"{how} ({fleet}: {'; '.join(failing)[:120]})" if failing else f"{how} ({fleet})")
        caught += [f"{name} ({fleet})" for name in failing if name not in baseline[fleet]]
    shutil.rmtree(code)
    return m, caught


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=2, help="mutants run at once (each runs its fleets in turn)")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="run only these mutants")
    p.add_argument("--mutants", metavar="FILE",
                   help="a JSON list of other mutants to run instead of fleet/mutants.py's, each {\"name\", \"what\", "
                        "\"path\", \"edits\": [[text, replacement], ...]} (a list planted by someone else)")
    p.add_argument("--min-score", type=float, default=0.9, help="exit 1 below this share caught")
    p.add_argument("--json", help="also write {mutant: [what caught it]} to this file")
    p.add_argument("--every-fleet", action="store_true",
                   help="run every fleet on every mutant (default: stop at the first fleet that catches it)")
    a = p.parse_args(argv)
    try:
        listed = MUTANTS if a.mutants is None else read_mutants(Path(a.mutants))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: --mutants {a.mutants}: {e}", file=sys.stderr)
        return 2
    chosen = [m for m in listed if not a.only or m.name in a.only]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fleet-mutants-") as tmp:
        scratch = Path(tmp)
        for m in chosen:  # every anchor first: a missing one fails the check before any fleet runs
            try:
                plant(install_copy(scratch / "anchors" / m.name), m)
            except AnchorMissing as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        shutil.rmtree(scratch / "anchors")
        base = install_copy(scratch / "unmutated")
        baseline = {}
        for fleet, args in FLEETS.items():
            how, failing = run_fleet(base, args, scratch / f"unmutated-{fleet}.json")
            if how != "ok":
                print(f"error: the unmutated fleet {fleet} {how}: {failing}", file=sys.stderr)
                return 2
            baseline[fleet] = set(failing)
            print(f"unmutated {fleet}: " + (", ".join(sorted(failing)) + " out of bound (not counted)"
                                            if failing else "every figure in bound"))
        with ThreadPoolExecutor(max(1, a.jobs)) as pool:
            results = list(pool.map(lambda m: check(scratch, m, baseline, a.every_fleet), chosen))
    caught = [m for m, by in results if by]
    for m, by in results:
        print(f"{'caught' if by else 'MISSED':<7} {m.name:<30} " + (", ".join(by) if by else m.what))
    score = len(caught) / max(1, len(results))
    load = open("/proc/loadavg").read().split()[:3]
    print(f"mutation score: {len(caught)} of {len(results)} caught ({score:.0%}) in "
          f"{time.perf_counter() - started:.0f} s wall, {a.jobs} at a time; load {load}")
    if a.json:
        Path(a.json).write_text(json.dumps({m.name: by for m, by in results}, indent=1))
    return 0 if score >= a.min_score else 1


if __name__ == "__main__":
    sys.exit(main())

"""Running the real `rapid` command from tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rapid.infra.store import LocalStore, StoreError
from rapid.run.progress import baseline_evals

ROOT = Path(__file__).resolve().parents[1]
RAPID = str(Path(sys.executable).parent / "rapid")


def worker_keys(store, worker: str) -> list[str]:
    """The experience keys one worker uploaded (``experience/s<shard>/<ms>-<worker>-<incarnation>-<seq>.rxp``)."""
    return sorted(k for k in store.list("experience/") if f"-{worker}-" in k.rsplit("/", 1)[-1])


def rapid(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([RAPID, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check and out.returncode != 0:
        raise AssertionError(f"rapid {' '.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out


def start_rapid(*args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([RAPID, *args], stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def check_beats_random(run: Path, started: float, out: subprocess.CompletedProcess, within_s: float,
                       target: float = 0.9) -> None:
    """The learning check of a Connect Four run of `rapid train` with ``run.target_win_rate=<target>``: at least
    ``target`` wins against uniform random over ≥ 200 games within ``within_s`` of ``started``, the run stopped
    by that target, and independent evaluations of that version, with other seeds, sampling and greedy, confirm
    it is no fluke (0.1 below the target, for the spread of 400 games)."""
    evals = [e for e in baseline_evals(run, "sampled") if e.get("opponent") == "random"]
    curve = [(round(e["time"] - started), e["version"], e["win_rate"]) for e in evals]
    print("win-rate curve (s, version, win rate):", curve)
    reached = [e for e in evals if e["games"] >= 200 and e["win_rate"] >= target]
    assert reached, f"never reached {target:.0%} vs random: {curve}\n{out.stdout[-2000:]}"
    assert reached[0]["time"] - started <= within_s
    assert f"target win rate {target:g} reached" in out.stdout
    for greedy in ([], ["--greedy"]):  # as trained, and as the benchmark plays it (most likely moves)
        check = rapid("eval", "--run-dir", str(run), "--version", str(reached[0]["version"]), "--against", "random",
                      "--games", "400", "--seed", "777", *greedy)
        win_rate = float(check.stdout.split("win rate ")[1].split()[0])
        assert win_rate >= target - 0.1, check.stdout


class RefusingStore(LocalStore):
    """A local run store that refuses the writes ``refuses(key)`` names, as S3 does in an outage."""

    def refuses(self, key: str) -> bool:
        return False

    def _check(self, key: str) -> None:
        if self.refuses(key):
            raise StoreError(f"put {key}: connection refused")

    def put(self, key: str, data: bytes) -> None:
        self._check(key)
        super().put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._check(key)
        return super().put_if_absent(key, data)

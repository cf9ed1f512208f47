"""Running the real `rapid` command from tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RAPID = str(Path(sys.executable).parent / "rapid")


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

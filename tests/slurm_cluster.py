"""A real Slurm cluster on this one machine, for the tests that submit ``infra/deploy/slurm/rapid.sbatch``.

Debian's ``slurm-wlm`` (``make slurm`` installs it): one ``munged`` on a socket of its own, one
``slurmctld`` and two ``slurmd`` (Slurm's multiple-slurmd mode) posing as a GPU node and a CPU node, so the
script's heterogeneous job gets a component on each. No cgroups (``proctrack/linuxproc``, ``task/none``),
no accounting; the GPU node's eight GPUs are a scheduling count only (no device behind them: rapid sees no
CUDA and trains on the CPU). Everything lives in a temporary folder and is stopped at the end of the
session; ``SLURM_CONF`` points the commands at it. A missing Slurm is a failure, never a skip.

Usage::

    def test_submit(slurm):                   # the cluster's environment: SLURM_CONF set, commands on PATH
        subprocess.run(["sbatch", ...], env=slurm.env)
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(home: Path, host: str, munge_socket: Path) -> str:
    ports = [_free_port() for _ in range(3)]
    return f"""ClusterName=rapidtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports[0]}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
SlurmUser=root
SlurmdUser=root
ReturnToService=2
StateSaveLocation={home}/state
SlurmdSpoolDir={home}/spool/%n
SlurmctldPidFile={home}/slurmctld.pid
SlurmdPidFile={home}/slurmd-%n.pid
SlurmctldLogFile={home}/slurmctld.log
SlurmdLogFile={home}/slurmd-%n.log
NodeName=gpu1 NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[1]} CPUs=2 RealMemory=2000 Gres=gpu:8
NodeName=cpu1 NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[2]} CPUs=2 RealMemory=2000
PartitionName=gpu Nodes=gpu1 MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
PartitionName=cpu Nodes=cpu1 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
"""


@dataclass
class SlurmCluster:
    home: Path
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    def run(self, *args: str, timeout: float = 30, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=env or self.env, capture_output=True, text=True, timeout=timeout)

    def job_done(self, job: str) -> bool:
        return self.run("squeue", "-h", "-j", job).stdout.strip() == ""

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n" + p.read_text()[-3000:] for p in sorted(self.home.glob("*.log")))


def _start(args: list[str], env: dict[str, str], home: Path) -> None:
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {out.stderr.strip()}")


@pytest.fixture(scope="session")
def slurm():
    missing = [d for d in DAEMONS if not os.access(d, os.X_OK)]
    assert not missing, f"Slurm is not installed ({', '.join(missing)} missing): run `make slurm`"
    home = Path(tempfile.mkdtemp(prefix="rapid-slurm-"))
    for sub in ("state", "spool/gpu1", "spool/cpu1", "munge"):
        (home / sub).mkdir(parents=True)
    for gpu in range(8):
        (home / f"gpu{gpu}").touch()
    host = socket.gethostname()
    munge_socket = home / "munge" / "socket"
    (home / "slurm.conf").write_text(_config(home, host, munge_socket))
    (home / "gres.conf").write_text(f"NodeName=gpu1 Name=gpu File={home}/gpu[0-7]\n")
    env = {**os.environ, "SLURM_CONF": str(home / "slurm.conf")}
    cluster = SlurmCluster(home, env)
    pids = []
    try:
        _start(["/usr/sbin/munged", "--force", f"--socket={munge_socket}", f"--pid-file={home}/munged.pid",
                f"--log-file={home}/munged.log", f"--seed-file={home}/munge/seed"], env, home)
        pids.append(home / "munged.pid")
        _start(["/usr/sbin/slurmctld"], env, home)
        pids.append(home / "slurmctld.pid")
        for node in ("gpu1", "cpu1"):
            _start(["/usr/sbin/slurmd", "-N", node], env, home)
            pids.append(home / f"slurmd-{node}.pid")
        deadline = time.monotonic() + 30
        while "idle" not in cluster.run("sinfo", "-h", "-o", "%t", "-p", "cpu").stdout or \
                "idle" not in cluster.run("sinfo", "-h", "-o", "%t", "-p", "gpu").stdout:
            assert time.monotonic() < deadline, f"the Slurm nodes did not come up:\n{cluster.logs()}"
            time.sleep(0.3)
        yield cluster
    finally:
        cluster.run("scancel", "--user", getpass.getuser())
        for path in reversed(pids):  # the daemons this fixture started, by their pid files
            try:
                os.kill(int(path.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        time.sleep(0.5)
        shutil.rmtree(home, ignore_errors=True)

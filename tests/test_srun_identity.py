"""What a real ``srun`` tells its tasks, read by rapid: Debian's Slurm on this machine (``tests/slurm_cluster.py``,
a GPU node and a CPU node), a step on one node with and without ``--ntasks-per-node``, and a heterogeneous step
over both nodes, whose SLURM_NODEID follows the components while SLURM_TASKS_PER_NODE follows the sorted node
names (gpu1 is node 0 but its count comes second)."""

from __future__ import annotations

import sys

import pytest

from tests.slurm_cluster import slurm  # noqa: F401  (pytest finds fixtures by name)

PRINT_IDENTITY = ("import os, socket; from rapid.infra.identity import identity_from_env; "
                  "i = identity_from_env(os.environ, socket.gethostname()); "
                  "print(i.launcher, i.rank, i.size, i.local_rank, i.local_size, os.environ['SLURMD_NODENAME'])")


@pytest.mark.parametrize("layout, expected", [
    (["-p", "cpu", "-n", "2"], ["slurm 0 2 0 2 cpu1", "slurm 1 2 1 2 cpu1"]),
    (["-p", "gpu", "-n", "2", "--ntasks-per-node=2"], ["slurm 0 2 0 2 gpu1", "slurm 1 2 1 2 gpu1"]),
    (["-p", "gpu", "-n", "1", ":", "-p", "cpu", "-n", "2"],
     ["slurm 0 3 0 1 gpu1", "slurm 1 3 0 2 cpu1", "slurm 2 3 1 2 cpu1"]),
], ids=["one node", "--ntasks-per-node", "heterogeneous"])
def test_srun_tasks_know_their_rank_and_their_node(slurm, layout, expected):  # noqa: F811
    # With a heterogeneous step every component needs the command: srun runs the last one given for each.
    parts = " ".join(layout).split(" : ")
    command = [sys.executable, "-c", PRINT_IDENTITY]
    argv = [arg for i, part in enumerate(parts) for arg in ([":"] if i else []) + part.split() + command]
    out = slurm.run("srun", "--mpi=none", *argv, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert sorted(out.stdout.split("\n")[:-1]) == expected, out.stdout + out.stderr


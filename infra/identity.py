"""Who a process is among its peers, read from whatever launcher started it.

Each launcher tells its processes their rank, the world size, their rank among the processes of their node
(the local rank) and how many those are (the local size), in variables of its own. rapid reads them, first
found first (docs/cluster.md "Launchers" lists what it reads from each):

1. ``RAPID_RANK``/``RAPID_WORLD_SIZE``/``RAPID_LOCAL_RANK``/``RAPID_LOCAL_WORLD_SIZE``: set by hand, they win.
2. torchrun (and any launcher with torch's convention: Kubeflow's PyTorchJob): ``RANK``/``WORLD_SIZE``/
   ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``. torchrun is always the innermost launcher (``srun torchrun …``), so its
   variables win over MPI's and Slurm's, which then describe torchrun's agent, not this process.
3. An MPI launcher (MPICH's Hydra, Open MPI's mpirun, a Kubernetes MPIJob's launcher, ``srun --mpi=pmi2``):
   through mpi4py, which also forms the local communicator; without mpi4py, Open MPI's ``OMPI_COMM_WORLD_*``
   or MPICH's ``PMI_RANK``/``PMI_SIZE``/``MPI_LOCALRANKID``/``MPI_LOCALNRANKS``.
4. Slurm's srun: ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``, and the local size from ``SLURM_GTIDS``
   (the node's tasks), else from ``SLURM_STEP_TASKS_PER_NODE`` (or ``SLURM_TASKS_PER_NODE``) at
   ``SLURM_NODEID``. ``SLURM_NTASKS_PER_NODE`` is not read: srun sets it only with ``--ntasks-per-node``.

Usage::

    >>> env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
    ...        "SLURM_TASKS_PER_NODE": "2(x3),1"}      # srun -n 7 on 4 nodes: 2, 2, 2 and 1 tasks
    >>> identity_from_env(env, "node3")
    Identity(rank=5, size=7, local_rank=1, local_size=2, hostname='node3', launcher='slurm')
    >>> tasks_per_node("2(x3),1")
    [2, 2, 2, 1]
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: Environment variables that only exist when a process was started by an MPI launcher (MPICH/Hydra,
#: Open MPI, PMIx, Slurm's PMI). Without them, mpi4py would make a singleton: we don't initialize MPI.
MPI_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_")
_IDENTITY_VARS = ("RAPID_RANK", "RAPID_WORLD_SIZE", "RAPID_LOCAL_RANK", "RAPID_LOCAL_WORLD_SIZE", "RANK",
                  "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")


def env_outside_launchers(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without what would make a process take itself for one of a launcher's ranks: for a helper process
    that a rank starts and that is nobody's rank (a node's inference server). Under MPI it would otherwise wait
    on the launcher's PMI connection, which belongs to the rank.

    >>> env_outside_launchers({"PMI_RANK": "1", "PMI_FD": "7", "RANK": "1", "SLURM_JOB_ID": "9", "HOME": "/h"})
    {'SLURM_JOB_ID': '9', 'HOME': '/h'}
    """
    return {k: v for k, v in env.items() if not k.startswith(_LAUNCHER_PREFIXES) and k not in _IDENTITY_VARS}


_TASKS = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")


class LayoutError(ValueError):
    """A layout of ranks and devices that cannot run (a launcher's variables that contradict each other, no
    CUDA, two ranks on one GPU): a usage error, not a bug."""

    exit_code = 2


@dataclass(frozen=True)
class Identity:
    """Who this process is among its peers. ``launcher`` says where it came from: mpi (mpi4py), rapid,
    torchrun, openmpi, mpich or slurm (their variables), or none."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    hostname: str
    launcher: str = "none"

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def under_mpi(self) -> bool:
        return self.launcher == "mpi"


ALONE = Identity(rank=0, size=1, local_rank=0, local_size=1, hostname="localhost")
"""A process that is its own whole job (tests, `rapid train`'s children, a debugger)."""


def tasks_per_node(value: str) -> list[int]:
    """Slurm's tasks per node, one count per node of the step: ``2(x3),1`` is 2, 2, 2 and 1."""
    counts: list[int] = []
    for part in value.split(","):
        found = _TASKS.fullmatch(part.strip())
        if found is None:
            raise LayoutError(f"SLURM_TASKS_PER_NODE={value!r}: expected counts like '2(x3),1'")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def _int(env: Mapping[str, str], name: str, value: str | None = None) -> int:
    """``env[name]`` (or ``value``, a part of it) as a whole number."""
    try:
        return int(env[name] if value is None else value)
    except ValueError:
        what = "a whole number" if value is None else "a list of whole numbers"
        raise LayoutError(f"{name}={env[name]!r} is not {what}") from None


def _named(rank: str, size: str, local_rank: str, local_size: str) -> Callable[[Mapping[str, str]], Any]:
    """A launcher that names all four numbers; a missing local rank or size means one node holds every rank."""
    def read(env: Mapping[str, str]) -> tuple[int, int, int, int] | None:
        if rank not in env or size not in env:
            return None
        r, n = _int(env, rank), _int(env, size)
        local_r = _int(env, local_rank) if local_rank in env else r
        return r, n, local_r, _int(env, local_size) if local_size in env else n
    return read


def _mpi_env(rank: str, size: str, local_rank: str, local_size: str) -> Callable[[Mapping[str, str]], Any]:
    """An MPI launcher's variables count only when all four are there (``srun --mpi=pmi2`` sets PMI_RANK
    without a local rank: Slurm's own variables then tell it)."""
    def read(env: Mapping[str, str]) -> tuple[int, int, int, int] | None:
        if not all(n in env for n in (rank, size, local_rank, local_size)):
            return None
        return _int(env, rank), _int(env, size), _int(env, local_rank), _int(env, local_size)
    return read


def _slurm(env: Mapping[str, str]) -> tuple[int, int, int, int] | None:
    if not all(n in env for n in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")):
        return None
    rank, size, local_rank = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"), _int(env, "SLURM_LOCALID")
    if "SLURM_GTIDS" in env:
        # The global ranks of this node's tasks: exact, in a heterogeneous step too, whose SLURM_NODEID follows
        # the components while SLURM_TASKS_PER_NODE follows the sorted node list.
        on_node = [_int(env, "SLURM_GTIDS", t) for t in env["SLURM_GTIDS"].split(",")]
        if rank not in on_node:
            raise LayoutError(f"SLURM_PROCID={rank} is not among this node's SLURM_GTIDS={env['SLURM_GTIDS']!r}")
        return rank, size, local_rank, len(on_node)
    per_node_var = "SLURM_STEP_TASKS_PER_NODE" if "SLURM_STEP_TASKS_PER_NODE" in env else "SLURM_TASKS_PER_NODE"
    if per_node_var not in env or "SLURM_NODEID" not in env:
        raise LayoutError("SLURM_PROCID is set without SLURM_GTIDS or SLURM_TASKS_PER_NODE and SLURM_NODEID: start "
                          "the ranks with srun, or set RAPID_RANK, RAPID_WORLD_SIZE, RAPID_LOCAL_RANK, "
                          "RAPID_LOCAL_WORLD_SIZE")
    counts, node = tasks_per_node(env[per_node_var]), _int(env, "SLURM_NODEID")
    if not 0 <= node < len(counts):
        raise LayoutError(f"SLURM_NODEID={node} but {per_node_var}={env[per_node_var]!r} names {len(counts)} node(s)")
    return rank, size, local_rank, counts[node]


#: (launcher, reader) in order of preference; see the module's docstring for why this order.
_BEFORE_MPI = (("rapid", _named("RAPID_RANK", "RAPID_WORLD_SIZE", "RAPID_LOCAL_RANK", "RAPID_LOCAL_WORLD_SIZE")),
               ("torchrun", _named("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")))
_AFTER_MPI = (("openmpi", _mpi_env("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                   "OMPI_COMM_WORLD_LOCAL_SIZE")),
              ("mpich", _mpi_env("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")),
              ("slurm", _slurm))


def identity_from_env(env: Mapping[str, str], hostname: str, launchers=_BEFORE_MPI + _AFTER_MPI) -> Identity | None:
    """The identity the first of ``launchers`` whose variables are in ``env`` gives; None if none's are.
    Numbers that contradict each other are a :class:`LayoutError`."""
    for launcher, read in launchers:
        found = read(env)
        if found is None:
            continue
        rank, size, local_rank, local_size = found
        if not (0 <= rank < size and 0 <= local_rank < local_size <= size):
            raise LayoutError(f"{launcher} says rank {rank} of {size}, local rank {local_rank} of {local_size}: "
                              f"these cannot all hold")
        return Identity(rank, size, local_rank, local_size, hostname, launcher)
    return None


def started_by_mpi_launcher(env: Mapping[str, str]) -> bool:
    return any(name in env for name in MPI_LAUNCHER_VARS)


def mpi() -> Any:
    from mpi4py import MPI  # initializes MPI on first import

    return MPI


def _from_mpi() -> Identity:
    MPI = mpi()
    world = MPI.COMM_WORLD
    local = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    try:
        return Identity(world.Get_rank(), world.Get_size(), local.Get_rank(), local.Get_size(),
                        MPI.Get_processor_name(), "mpi")
    finally:
        local.Free()


def detect_identity(use_mpi: bool | None = None) -> Identity:
    """This process's identity, in the order of the module's docstring; rank 0 of 1 without a launcher.

    ``use_mpi=None`` (auto) uses MPI only when mpi4py imports, a launcher's variables are present and neither
    rapid's nor torchrun's variables are; ``True`` forces it (a plain process becomes an MPI singleton),
    ``False`` never touches MPI.
    """
    env, hostname = os.environ, socket.gethostname()
    if use_mpi is not True:
        told = identity_from_env(env, hostname, _BEFORE_MPI)
        if told is not None:
            return told
    if use_mpi is True or (use_mpi is None and started_by_mpi_launcher(env)):
        try:
            return _from_mpi()
        except ImportError:
            if use_mpi is True:
                raise
    return identity_from_env(env, hostname, _AFTER_MPI) or Identity(0, 1, 0, 1, hostname, "none")


def usable_cpus() -> int:
    """The cores this process may run on: its affinity mask, which taskset, a container's cpuset and Slurm's
    binding set, rather than the machine's count (macOS has no mask: the machine's count). A CPU quota
    (``docker --cpus``) is not a mask and is not seen."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1

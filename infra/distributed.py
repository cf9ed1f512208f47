"""MPI and torchrun start-up and the torch.distributed process group of the optimizer ranks.

The same code is an entry point under any launcher (``mpiexec -n 4 rapid-optimizer …``, ``torchrun
--nproc_per_node 8 rapid-optimizer …``, ``srun rapid-optimizer …``) with ``identity = detect_identity()``
(:mod:`rapid.infra.identity` reads the launcher); the example runs it as the one rank of its own job.

Usage::

    >>> import torch
    >>> identity = ALONE                             # in a job: detect_identity()
    >>> model = torch.nn.Linear(2, 1)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with abort_on_error(identity):               # any exception: one line on stderr, then MPI Abort
    ...     with init_process_group(identity, backend="gloo") as dist:   # the ranks meet, check their devices
    ...         dist.broadcast_parameters(model)     # every rank starts from rank 0's weights
    ...         for batch in [torch.ones(4, 2)]:
    ...             loss = model(batch).pow(2).mean()
    ...             loss.backward()
    ...             dist.all_reduce_gradients(model.parameters())    # bucketed SUM / size, in torch.distributed
    ...             optimizer.step()
    ...             stats = dist.all_reduce_scalars({"loss": loss.item(), "samples": 4})   # means over ranks
    >>> dist.rank, dist.size, dist.in_group, stats["samples"]   # one rank: no group, the collectives change nothing
    (0, 1, False, 4.0)

The ranks meet at a torch key-value store: under MPI rank 0 starts it on a free port and broadcasts the
address with mpi4py; otherwise it is torch's ``env://`` (``MASTER_ADDR``/``MASTER_PORT``; torchrun's own store
under torchrun). Before the process group forms, every rank puts its host, backend and GPU there and rank 0
checks them: two ranks on one GPU, or ranks that disagree on the backend, stop every rank with one line.
MPI is used only for identity and that one broadcast: MPICH ranks waiting inside an MPI call spin on the CPU,
so every heavy collective goes through torch.distributed (NCCL on CUDA, gloo on CPU). torch is imported
lazily here so that importing ``rapid.infra`` stays light.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import stat
import struct
import sys
import termios
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rapid.infra.dist_context import DEFAULT_TIMEOUT_S, DistContext
from rapid.infra.identity import ALONE, Identity, LayoutError, detect_identity, mpi

if TYPE_CHECKING:
    import torch

__all__ = ["ALONE", "DEFAULT_TIMEOUT_S", "DistContext", "Identity", "LayoutError", "Placement", "abort_on_error",
           "choose_device_and_backend", "detect_identity", "init_process_group", "placement_problem",
           "wait_until_pipe_read"]

_SHARE_ONE_GPU = ("start at most one rank per GPU, give each rank its own GPU (srun --gpus-per-task=1, "
                  "CUDA_VISIBLE_DEVICES per rank), or set optimizer.device = \"cpu\"")


def choose_device_and_backend(wanted: str, local_rank: int, local_ranks: int, cuda_available: bool,
                              gpu_count: int) -> tuple[str, str]:
    """The device a rank trains on and the backend its collectives use, decided together from ``wanted``
    (``optimizer.device``: auto, cuda or cpu) and the facts this process sees (passed in, so tests need no GPU).

    The backend follows the device: NCCL only takes CUDA tensors, so a CPU learner on a GPU host uses gloo.
    A rank that sees a GPU for every rank of its node takes ``cuda:<local rank>``; one that sees fewer (a
    launcher bound its own GPU to it: ``srun --gpus-per-task=1``, ``CUDA_VISIBLE_DEVICES`` per rank) takes
    ``cuda:0``. Whether two ranks then share a GPU is not decided here, by counting, but by comparing the
    GPUs' UUIDs across ranks (:func:`placement_problem`) when the ranks meet.

    >>> choose_device_and_backend("cpu", 1, 2, cuda_available=True, gpu_count=2)
    ('cpu', 'gloo')
    >>> choose_device_and_backend("auto", 3, 8, cuda_available=True, gpu_count=1)   # one GPU bound per rank
    ('cuda:0', 'nccl')
    """
    if wanted == "cpu" or (wanted == "auto" and not (cuda_available and gpu_count > 0)):
        return "cpu", "gloo"
    if not cuda_available or gpu_count < 1:
        raise LayoutError("optimizer.device='cuda' but CUDA is not available")
    return f"cuda:{local_rank if gpu_count >= local_ranks else 0}", "nccl"


@dataclass(frozen=True)
class Placement:
    """Where one rank trains: its host, backend, device and the device's GPU UUID ("" on the CPU)."""

    rank: int
    host: str
    backend: str
    device: str
    gpu: str = ""


def placement_problem(placements: Sequence[Placement]) -> str:
    """Why these ranks cannot form one process group ("" when they can): ranks on different backends, or two
    ranks on one GPU (NCCL refuses to build a communicator then; the UUID tells GPUs apart whatever each
    process's device numbering).

    >>> placement_problem([Placement(0, "a", "nccl", "cuda:0", "GPU-1"), Placement(1, "a", "nccl", "cuda:0", "GPU-2")])
    ''
    """
    first = placements[0]
    for p in placements:
        if p.backend != first.backend:
            return (f"rank {p.rank} on {p.host} trains on {p.device} ({p.backend}) but rank {first.rank} on "
                    f"{first.host} on {first.device} ({first.backend}): every rank needs the same kind of device")
    seen: dict[str, Placement] = {}
    for p in placements:
        if p.gpu and p.gpu in seen:
            other = seen[p.gpu]
            return (f"ranks {other.rank} ({other.host}, {other.device}) and {p.rank} ({p.host}, {p.device}) would "
                    f"share one GPU ({p.gpu}): {_SHARE_ONE_GPU}")
        seen.setdefault(p.gpu, p)
    return ""


def _gpu_uuid(place: torch.device) -> str:
    import torch

    return str(torch.cuda.get_device_properties(place).uuid) if place.type == "cuda" else ""


def _meeting_store(identity: Identity, timeout: datetime.timedelta) -> Any:
    """The key-value store the ranks meet at (see the module's docstring)."""
    import torch.distributed as dist

    if identity.size == 1:
        return dist.HashStore()
    if identity.under_mpi:
        single_host = identity.local_size == identity.size
        host = "127.0.0.1" if single_host else os.environ.get("RAPID_MASTER_ADDR", identity.hostname)
        if identity.rank == 0:  # port 0: the store binds a free port itself, so no other process can take it first
            store = dist.TCPStore(host, 0, identity.size, is_master=True, timeout=timeout, wait_for_workers=False)
            mpi().COMM_WORLD.bcast(store.port, root=0)
            return store
        port = mpi().COMM_WORLD.bcast(None, root=0)
        return dist.TCPStore(host, port, identity.size, is_master=False, timeout=timeout)
    if not ("MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ):
        raise LayoutError(f"{identity.size} ranks started by {identity.launcher} without MPI need MASTER_ADDR and "
                          f"MASTER_PORT for the rendezvous")
    store, _, _ = next(dist.rendezvous("env://", identity.rank, identity.size, timeout=timeout))
    return store


def check_placements(store: Any, identity: Identity, mine: Placement, read_wait_s: float = 30.0) -> None:
    """Every rank puts its placement in ``store``; rank 0 reads them all and posts the verdict, which every rank
    reads and says it read: three requests per rank, and all stop with the same line or none does. Rank 0 (whose
    process may host the store) leaves only once every rank has read the verdict: a rank reading it from a store
    that is gone would end with a traceback instead of the line."""
    store.set(f"rapid/placement/{identity.rank}", json.dumps(asdict(mine)))
    if identity.rank == 0:
        keys = [f"rapid/placement/{r}" for r in range(identity.size)]
        store.set("rapid/placement/verdict", placement_problem([Placement(**json.loads(v))
                                                                for v in store.multi_get(keys)]))
    verdict = store.get("rapid/placement/verdict").decode()
    read = store.add("rapid/placement/read", 1)
    if identity.rank == 0:
        deadline = time.monotonic() + read_wait_s
        while read < identity.size and time.monotonic() < deadline:
            time.sleep(0.01)
            read = store.add("rapid/placement/read", 0)
    if verdict:
        raise LayoutError(verdict)


def init_process_group(identity: Identity | None = None, backend: str | None = None,
                       timeout: float = DEFAULT_TIMEOUT_S, device: str = "auto",
                       group_for_one: bool = False) -> DistContext:
    """Start torch.distributed for ``identity`` (detected if None) and return its :class:`DistContext`.

    Device and backend come from :func:`choose_device_and_backend` for ``device`` (``optimizer.device``); an
    explicit ``backend`` (``nccl`` or ``gloo``) stands for device cuda or cpu. ``timeout`` bounds every
    collective (``optimizer.collective_timeout_s``). One rank forms no process group unless ``group_for_one``
    (``optimizer.group_for_one``): then its collectives run for real, as in a job of many ranks.
    """
    import torch
    import torch.distributed as dist

    identity = identity or detect_identity()
    wanted = {"nccl": "cuda", "gloo": "cpu"}.get(backend or "", device)
    where, backend = choose_device_and_backend(wanted, identity.local_rank, identity.local_size,
                                               torch.cuda.is_available(), torch.cuda.device_count())
    place = torch.device(where)
    if place.type == "cuda":
        torch.cuda.set_device(place)
    if identity.size == 1 and not group_for_one:
        return DistContext(identity, backend, place, initialized=False, timeout_s=timeout)
    wait = datetime.timedelta(seconds=timeout)
    store = _meeting_store(identity, wait)
    check_placements(store, identity, Placement(identity.rank, identity.hostname, backend, where, _gpu_uuid(place)))
    # torch's first optimizer imports torch._dynamo, and something on that import path keeps a reference to the
    # default process group if one exists then. destroy_process_group could not join gloo's worker threads, and
    # a rank could die in std::terminate at exit when one of them touched a tensor during interpreter teardown.
    import torch._dynamo  # noqa: F401

    dist.init_process_group(backend, store=store, rank=identity.rank, world_size=identity.size, timeout=wait)
    return DistContext(identity, backend, place, initialized=True, timeout_s=timeout)


def wait_until_pipe_read(fd: int, timeout: float = 2.0) -> None:
    """Wait (at most ``timeout`` s) until the reader of pipe ``fd`` has taken all that was written to it.

    A rank's stderr is a pipe to the launcher's proxy, and MPI Abort can end the proxy before it has read the
    rank's last line: about 1 job in 40 lost it on a loaded machine. Not a pipe: returns at once.
    """
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
    except OSError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            unread = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            return
        if unread == 0:
            return
        time.sleep(0.005)


class abort_on_error(contextlib.ContextDecorator):
    """Wrap an MPI entry point so one failing rank ends the whole job instead of hanging the others.

    On an exception (or a non-zero ``sys.exit``): print ``rapid: rank R: <ErrorType>: <message>`` to stderr
    (the traceback too when ``RAPID_TRACEBACK=1``) and call ``MPI.COMM_WORLD.Abort(code)``: the exception's
    ``exit_code`` (2 for a usage error, a layout error), else 1. Outside MPI the exception propagates unchanged.
    """

    def __init__(self, identity: Identity | None = None):
        self.identity = identity

    def __enter__(self) -> abort_on_error:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
            return
        identity = self.identity or detect_identity()
        if not identity.under_mpi:
            return
        if os.environ.get("RAPID_TRACEBACK") == "1":
            traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
        message = " ".join(str(exc).split())
        print(f"rapid: rank {identity.rank}: {type(exc).__name__}: {message}", file=sys.stderr, flush=True)
        wait_until_pipe_read(sys.stderr.fileno())
        code = getattr(exc, "exit_code", 1)  # a usage error's 2 (infra cannot import rapid.errors: duck-typed)
        mpi().COMM_WORLD.Abort(code)
        # pip's MPICH can return from Abort; without this, Python would go on unwinding and print a
        # traceback before the launcher kills the rank.
        os._exit(code)

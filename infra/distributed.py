"""MPI start-up and torch.distributed collectives for optimizer ranks.

The same code is an MPI entry point (e.g. ``mpiexec -n 4 rapid-optimizer …``) with ``identity =
detect_identity()``; the example runs it as the one rank of its own job.

Usage::

    >>> import torch
    >>> identity = ALONE                             # in a job: detect_identity() (mpi4py, or env, or 0 of 1)
    >>> model = torch.nn.Linear(2, 1)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with abort_on_error(identity):               # any exception: one line on stderr, then MPI Abort
    ...     with init_process_group(identity, backend="gloo") as dist:   # rank 0 picks tcp://host:port
    ...         dist.broadcast_parameters(model)     # every rank starts from rank 0's weights
    ...         for batch in [torch.ones(4, 2)]:
    ...             loss = model(batch).pow(2).mean()
    ...             loss.backward()
    ...             dist.all_reduce_gradients(model.parameters())    # bucketed SUM / size, in torch.distributed
    ...             optimizer.step()
    ...             stats = dist.all_reduce_scalars({"loss": loss.item(), "samples": 4})   # means over ranks
    >>> dist.rank, dist.size, stats["samples"]       # one rank: no process group, the collectives change nothing
    (0, 1, 4.0)

MPI is used only for identity and the one rendezvous broadcast: MPICH ranks waiting inside an MPI call
spin on the CPU, so every heavy collective goes through torch.distributed (NCCL on CUDA, gloo on CPU).
Without MPI and with one rank no process group is created and the collectives are no-ops. torch is imported
lazily here so that importing ``rapid.infra`` stays light.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import socket
import stat
import struct
import sys
import termios
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Environment variables that only exist when a process was started by an MPI launcher (MPICH/Hydra,
#: Open MPI, PMIx, Slurm's PMI). Without them, mpi4py would make a singleton: we don't initialize MPI.
_MPI_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
# (rank, size, local rank, local size) variable names, in order of preference, when MPI is not used.
_ENV_IDENTITIES = (
    ("RAPID_RANK", "RAPID_WORLD_SIZE", "RAPID_LOCAL_RANK", "RAPID_LOCAL_WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)
DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


@dataclass(frozen=True)
class Identity:
    """Who this process is among its peers. ``launcher`` says where it came from: mpi, env or none."""

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


def _started_by_mpi_launcher() -> bool:
    return any(name in os.environ for name in _MPI_LAUNCHER_VARS)


def _mpi() -> Any:
    from mpi4py import MPI  # initializes MPI on first import

    return MPI


def detect_identity(use_mpi: bool | None = None) -> Identity:
    """This process's identity: from mpi4py under an MPI launcher, else from env vars, else rank 0 of 1.

    ``use_mpi=None`` (auto) uses MPI only when mpi4py imports and a launcher's variables are present;
    ``True`` forces it (a plain process becomes an MPI singleton), ``False`` never touches MPI.
    """
    forced = use_mpi is True
    if use_mpi is None:
        use_mpi = _started_by_mpi_launcher()
    if use_mpi:
        try:
            MPI = _mpi()
        except ImportError:
            if forced:
                raise
        else:
            world = MPI.COMM_WORLD
            local = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
            try:
                return Identity(world.Get_rank(), world.Get_size(), local.Get_rank(), local.Get_size(),
                                MPI.Get_processor_name(), "mpi")
            finally:
                local.Free()
    hostname = socket.gethostname()
    for rank_var, size_var, local_rank_var, local_size_var in _ENV_IDENTITIES:
        if rank_var in os.environ and size_var in os.environ:
            rank, size = int(os.environ[rank_var]), int(os.environ[size_var])
            local_rank = int(os.environ.get(local_rank_var, rank))
            # SLURM_NTASKS_PER_NODE may read "2(x3)"; the leading number is this node's count.
            local_size = int(os.environ.get(local_size_var, str(size)).split("(")[0].split(",")[0])
            if not 0 <= rank < size:
                raise ValueError(f"{rank_var}={rank} is outside 0..{size - 1} ({size_var}={size})")
            return Identity(rank, size, local_rank, local_size, hostname, "env")
    return Identity(0, 1, 0, 1, hostname, "none")


def _rendezvous_address(identity: Identity) -> str:
    """Rank 0 binds a free port and broadcasts ``tcp://host:port`` to every rank through MPI."""
    MPI = _mpi()
    address = None
    if identity.rank == 0:
        single_host = identity.local_size == identity.size
        host = "127.0.0.1" if single_host else os.environ.get("RAPID_MASTER_ADDR", identity.hostname)
        with socket.socket() as s:
            # The port is released again for torch's TCPStore to bind; the window is a few milliseconds.
            s.bind(("127.0.0.1" if single_host else "", 0))
            port = s.getsockname()[1]
        address = f"tcp://{host}:{port}"
    return MPI.COMM_WORLD.bcast(address, root=0)


class LayoutError(ValueError):
    """A device layout that cannot run (no CUDA, more ranks on a node than GPUs): a usage error, not a bug."""


def choose_device_and_backend(wanted: str, local_rank: int, local_ranks: int, cuda_available: bool,
                              gpu_count: int) -> tuple[str, str]:
    """The device a rank trains on and the backend its collectives use, decided together from ``wanted``
    (``optimizer.device``: auto, cuda or cpu) and the node's facts (passed in, so tests need no GPU).

    The backend follows the device: NCCL only takes CUDA tensors, so a CPU learner on a GPU host uses gloo.
    Each rank gets a GPU of its own; two ranks on one GPU make NCCL fail building its communicator, so a node
    with more ranks than GPUs is refused rather than silently shared.

    >>> choose_device_and_backend("cpu", 1, 2, cuda_available=True, gpu_count=2)
    ('cpu', 'gloo')
    """
    if wanted == "cpu" or (wanted == "auto" and not (cuda_available and gpu_count > 0)):
        return "cpu", "gloo"
    if not cuda_available or gpu_count < 1:
        raise LayoutError("optimizer.device='cuda' but CUDA is not available")
    if local_ranks > gpu_count:
        raise LayoutError(f"{local_ranks} optimizer ranks per node but {gpu_count} GPUs: start at most one rank "
                          f"per GPU, or set optimizer.device = \"cpu\"")
    return f"cuda:{local_rank}", "nccl"


def init_process_group(identity: Identity | None = None, backend: str | None = None,
                       timeout: float = 600.0, device: str = "auto") -> DistContext:
    """Start torch.distributed for ``identity`` (detected if None) and return its :class:`DistContext`.

    Device and backend come from :func:`choose_device_and_backend` for ``device`` (``optimizer.device``); an
    explicit ``backend`` (``nccl`` or ``gloo``) stands for device cuda or cpu. Under MPI the rendezvous address
    comes from rank 0; without MPI and more than one rank, torch's ``env://`` method is used
    (``MASTER_ADDR``/``MASTER_PORT``).
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
    if identity.size == 1:
        return DistContext(identity, backend, place, initialized=False, timeout_s=timeout)
    if identity.under_mpi:
        init_method = _rendezvous_address(identity)
    elif "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        init_method = "env://"
    else:
        raise RuntimeError(f"{identity.size} ranks without MPI need MASTER_ADDR and MASTER_PORT for the rendezvous")
    # torch's first optimizer imports torch._dynamo, and something on that import path keeps a reference to the
    # default process group if one exists then. destroy_process_group could not join gloo's worker threads, and
    # a rank could die in std::terminate at exit when one of them touched a tensor during interpreter teardown.
    import torch._dynamo  # noqa: F401

    dist.init_process_group(backend, init_method=init_method, rank=identity.rank, world_size=identity.size,
                            timeout=datetime.timedelta(seconds=timeout))
    return DistContext(identity, backend, place, initialized=True, timeout_s=timeout)


def _buckets(tensors: list[torch.Tensor], bucket_bytes: int) -> Iterator[list[torch.Tensor]]:
    """Consecutive runs of same dtype/device tensors of about ``bucket_bytes`` each."""
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        if bucket and (size + t.numel() * t.element_size() > bucket_bytes
                       or t.dtype != bucket[0].dtype or t.device != bucket[0].device):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += t.numel() * t.element_size()
    if bucket:
        yield bucket


class DistContext:
    """Collectives over all ranks. With one rank (no process group) they return their input unchanged.
    ``timeout_s``: how long a collective may wait for the slowest rank before the job fails (NCCL's watchdog
    then kills the process): a rank must never wait longer than that for anything else in a collective's
    stead."""

    def __init__(self, identity: Identity, backend: str, device: torch.device, initialized: bool,
                 timeout_s: float = 600.0):
        self.timeout_s = timeout_s
        self.identity = identity
        self.backend = backend
        self.device = device
        self._initialized = initialized

    @property
    def rank(self) -> int:
        return self.identity.rank

    @property
    def size(self) -> int:
        return self.identity.size

    def all_reduce_gradients(self, params: Iterable[torch.Tensor], extra: Iterable[torch.Tensor] = (),
                             bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        """Replace every gradient, and each ``extra`` tensor (on the rank's device), by its mean over ranks.
        A missing grad counts as zeros (and is created), so ranks that did not touch a parameter stay in step
        with ranks that did. The extras ride in the same buckets (one more only where their dtype differs)."""
        if not self._initialized:
            return
        import torch
        import torch.distributed as dist

        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params] + list(extra)
        with torch.no_grad():
            for bucket in _buckets(grads, bucket_bytes):
                flat = torch.cat([g.reshape(-1) for g in bucket])
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                flat.div_(self.size)
                offset = 0
                for g in bucket:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()

    def broadcast_parameters(self, module_or_params: torch.nn.Module | Iterable[torch.Tensor], src: int = 0,
                             bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        """Copy rank ``src``'s parameters (and a module's buffers) to every rank."""
        if not self._initialized:
            return
        import torch
        import torch.distributed as dist

        if isinstance(module_or_params, torch.nn.Module):
            tensors = [*module_or_params.parameters(), *module_or_params.buffers()]
        else:
            tensors = list(module_or_params)
        with torch.no_grad():
            for bucket in _buckets([t.data for t in tensors], bucket_bytes):
                flat = torch.cat([t.reshape(-1) for t in bucket])
                dist.broadcast(flat, src=src)
                offset = 0
                for t in bucket:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

    def all_reduce_mean_(self, tensor: torch.Tensor) -> None:
        """Replace ``tensor`` (on the rank's device) by its mean over ranks, in place. No wait for the device:
        the result is read when the caller next needs it."""
        if not self._initialized:
            return
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor.div_(self.size)

    def all_reduce_scalars(self, values: dict[str, float]) -> dict[str, float]:
        """The mean of each named value over ranks (every rank must pass the same names)."""
        if not self._initialized:
            return {name: float(v) for name, v in values.items()}
        import torch
        import torch.distributed as dist

        names = sorted(values)
        # float64 so means of counters stay exact; NCCL needs the tensor on the rank's device.
        flat = torch.tensor([float(values[n]) for n in names], dtype=torch.float64, device=self.device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        return {n: v / self.size for n, v in zip(names, flat.tolist())}

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, in rank order (sizes may differ). For small documents (league counts), not
        tensors: one collective for the sizes, one for the padded bytes."""
        if not self._initialized:
            return [bytes(data)]
        import torch
        import torch.distributed as dist

        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        sizes = [torch.zeros_like(size) for _ in range(self.size)]
        dist.all_gather(sizes, size)
        longest = max(int(s.item()) for s in sizes)
        mine = torch.zeros(max(longest, 1), dtype=torch.uint8, device=self.device)
        if data:
            mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        gathered = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(gathered, mine)
        return [bytes(g[:int(s.item())].cpu().numpy().tobytes()) for g, s in zip(gathered, sizes)]

    def barrier(self) -> None:
        if self._initialized:
            import torch.distributed as dist

            dist.barrier()

    def shutdown(self) -> None:
        """Tear down the process group (idempotent)."""
        if self._initialized:
            import torch.distributed as dist

            dist.destroy_process_group()
            self._initialized = False

    def abort_on_error(self) -> abort_on_error:
        return abort_on_error(self.identity)

    def __enter__(self) -> DistContext:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # On an error, skip the orderly teardown: destroy_process_group can block on peers still inside a
        # collective, and the failing rank must reach abort_on_error's message and MPI Abort first.
        if exc_type is None:
            self.shutdown()


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
    (the traceback too when ``RAPID_TRACEBACK=1``) and call ``MPI.COMM_WORLD.Abort(1)``. Outside MPI the
    exception propagates unchanged.
    """

    def __init__(self, identity: Identity | None = None):
        self.identity = identity

    def __enter__(self) -> abort_on_error:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
            return False
        identity = self.identity or detect_identity()
        if not identity.under_mpi:
            return False
        if os.environ.get("RAPID_TRACEBACK") == "1":
            traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
        message = " ".join(str(exc).split())
        print(f"rapid: rank {identity.rank}: {exc_type.__name__}: {message}", file=sys.stderr, flush=True)
        wait_until_pipe_read(sys.stderr.fileno())
        _mpi().COMM_WORLD.Abort(1)
        # pip's MPICH can return from Abort; without this, Python would go on unwinding and print a
        # traceback before the launcher kills the rank.
        os._exit(1)

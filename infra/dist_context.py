"""Collectives over the optimizer's ranks (torch.distributed), and their no-op twin for one rank.

:func:`rapid.infra.distributed.init_process_group` builds a :class:`DistContext`; the roles only ever call its
methods, so the same loop runs one rank without a process group, one rank with one (``optimizer.group_for_one``)
and many ranks, on gloo (CPU tensors) or NCCL (CUDA tensors on the rank's device). torch is imported lazily.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from rapid.infra.identity import Identity

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
DEFAULT_TIMEOUT_S = 600.0


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
    """Collectives over all ranks. Without a process group (one rank, unless ``optimizer.group_for_one``) they
    return their input unchanged. ``timeout_s``: how long a collective may wait for the slowest rank before the
    job fails (NCCL's watchdog then kills the process): a rank must never wait longer than that for anything
    else in a collective's stead."""

    def __init__(self, identity: Identity, backend: str, device: torch.device, initialized: bool,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
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

    @property
    def in_group(self) -> bool:
        """Whether the collectives run in a torch.distributed process group (else they change nothing)."""
        return self._initialized

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
        grads: list[torch.Tensor] = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        grads += extra
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

    def __enter__(self) -> DistContext:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # On an error, skip the orderly teardown: destroy_process_group can block on peers still inside a
        # collective, and the failing rank must reach abort_on_error's message and MPI Abort first.
        if exc_type is None:
            self.shutdown()

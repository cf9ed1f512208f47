"""The learner's input pipeline: a batch from host memory onto the learner's device without the host waiting.

On CUDA (:func:`stages_ahead`) a batch is packed into one of two pinned host arenas (a double buffer: a batch is
packed into one while the copies out of the other may still run), with the reset-free runs of each chunk
(:class:`rapid.opt.model.ResetFreeRuns`) beside its rows, and copied to the device on a side stream: one copy
per chunk, the per-step figures of the whole batch riding with the first. The learner's stream waits for a
chunk's copy (an event) before it reads it, and every device arena is marked as used by the learner's stream
(``record_stream``), so the caching allocator never hands its memory out again before the learner is done with
it. Chunk j + 1 is copied while chunk j trains: with ``optimizer.microbatch_samples`` at most two chunks of the
batch, and the first chunk of the next batch, are on the device at once. A learner may pass over the chunks
twice (V-trace's targets, then the losses): a chunk that left the device is copied again from the arena, so the
bound holds in each pass and the second pass costs one copy per chunk but the first.

Elsewhere (the CPU) nothing is copied: a chunk is a view of the numpy arrays and its runs are built on the host;
no memory is pinned, and no stream or thread exists.

Drawn from the experience buffer, a batch is gathered from the buffer's rows straight into the arena
(:meth:`Pipeline.gather`, under the buffer's lock: ``ExperienceBuffer.sample(into=...)``): one host copy of the
batch, where drawing it out of the buffer and then packing it made two.

How the optimizer loop stages ahead: it hands :meth:`rapid.opt.learner.Learner.prefetch` the function that
draws its next batch. The next update calls it once its own kernels are queued (before its one read of the
device), packs what it returns and starts its first copy: the host draws and packs batch k + 1 while the GPU
trains update k, and the copy runs beside update k's kernels. Update k + 1, handed that very batch, finds it
staged. On CUDA the phase timings of update k are read with update k + 1's one wait (:class:`PhaseClock`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from rapid.opt.model import ResetFreeRuns, RunSplit

WHOLE = ("advantages", "returns", "active", "own")  # needed whole before the losses: [S, T] each
VTRACE = ("rewards", "discounts", "bootstrap")  # whole too, where the learner computes V-trace: [S, T], [S]
FIRST_USE = ("reference_logp",)  # whole too, where PPO's ratio is clipped against a sample's first use: [S, T]
CHUNKED = ("obs", "mask", "actions", "logp", "values", "first", "h0", "c0")  # one microbatch at a time
STAGED = WHOLE + CHUNKED  # what an update without V-trace stages
RUNS = ("gather", "scatter", "row", "carry")
ALIGN = 64  # bytes: every region of an arena starts at a multiple (a typed view needs its element size's)

Copier = Callable[[torch.Tensor, torch.Tensor], object]
Batch = Mapping[str, np.ndarray | torch.Tensor]


def stages_ahead(device: torch.device) -> bool:
    """Whether batches go through the pinned double buffer and a side stream: only where the learner's memory
    is not the host's (a CUDA GPU). On the CPU a batch is used where it lies, at no cost."""
    return device.type == "cuda"


def copy_async(dst: torch.Tensor, src: torch.Tensor) -> None:
    """The host-to-device copy: from pinned memory it returns at once and runs on the current stream."""
    dst.copy_(src, non_blocking=True)


class PhaseClock:
    """Phase durations of one update. CUDA kernels launch asynchronously, so a host clock would read launch
    times there (forward and backward ~0, the GPU time landing wherever the host next waits): on CUDA the marks
    are events on the stream, read only once they are known complete (the next update's one wait has passed
    them), so reading them never waits. On the CPU they are ``perf_counter`` readings."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._times: list[float] = []
        self._events: list[torch.cuda.Event] = []

    def mark(self) -> int:
        """The mark's number, for :meth:`seconds`."""
        if not self.cuda:
            self._times.append(time.perf_counter())
            return len(self._times) - 1
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._events.append(event)
        return len(self._events) - 1

    def seconds(self, spans: list[tuple[int, int]]) -> float:
        """The summed durations of ``spans`` (pairs of marks); on CUDA only after a wait that passed them."""
        if not self.cuda:
            return sum(self._times[b] - self._times[a] for a, b in spans)
        # elapsed_time is in milliseconds
        return sum(self._events[a].elapsed_time(self._events[b]) for a, b in spans) / 1000.0


@dataclass(frozen=True)
class Region:
    """A typed array at ``offset`` bytes into a segment."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * torch.empty((), dtype=self.dtype).element_size()

    def view(self, arena: torch.Tensor) -> torch.Tensor:
        return arena[self.offset:self.offset + self.nbytes].view(self.dtype).view(self.shape)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class Segment:
    """One copy: bytes ``start`` to ``end`` of the host arena, holding ``regions`` (named arrays) and the runs
    of its chunk (None: no game starts inside a sample)."""

    start: int
    end: int
    regions: dict[str, Region]
    runs: dict[str, Region] | None


class Slot:
    """One half of the double buffer: a host arena (pinned on CUDA) that grows as batches do, the events of the
    copies read out of it, and a generation count (a staged batch checks its slot still holds it)."""

    def __init__(self) -> None:
        self.arena = torch.empty(0, dtype=torch.uint8)
        self.copies: list[torch.cuda.Event] = []
        self.generation = 0

    def take(self, nbytes: int, pin: bool) -> torch.Tensor:
        """The arena, free to be written: the copies read out of it are done (they were waited for by the update
        that used them: no wait here in the steady state), grown to ``nbytes``."""
        for event in self.copies:
            if not event.query():
                event.synchronize()
        self.copies.clear()
        self.generation += 1
        if self.arena.numel() < nbytes:
            self.arena = torch.empty(nbytes + nbytes // 4, dtype=torch.uint8, pin_memory=pin)
        return self.arena


class Staged:
    """A batch on its way to the learner's device: :meth:`whole`, :meth:`chunk` and ``first`` (where games
    start, in host memory: the update never reads it back). The learner's stream waits for a copy only when
    the update asks for its arrays, not when the batch is staged during the update before."""

    def __init__(self, whole: Callable[[], dict[str, torch.Tensor]], first: np.ndarray, rows: int,
                 chunk_rows: int, chunk: Callable[[int], tuple[dict[str, torch.Tensor], ResetFreeRuns]]):
        self.first, self.rows, self.chunk_rows = first, rows, chunk_rows
        self._whole, self._chunk = whole, chunk

    def whole(self) -> dict[str, torch.Tensor]:
        """The per-step figures of the whole batch (advantages, returns, active, own), ready for the learner."""
        return self._whole()

    def chunk(self, j: int) -> tuple[dict[str, torch.Tensor], ResetFreeRuns]:
        """Chunk ``j``'s arrays and runs, ready for the learner's stream (the next chunk's copy is started)."""
        return self._chunk(j)

    @property
    def chunks(self) -> int:
        return -(-self.rows // self.chunk_rows)


class PackedBatch(dict):
    """A batch gathered straight into the arena: the few per-sample arrays the optimizer loop reads on the host
    (``version``, the buffer's ``slot`` and ``generation``), with the batch itself staged (``staged``)."""

    def __init__(self, host: dict[str, np.ndarray], staged: Staged):
        super().__init__(host)
        self.staged = staged


class Pipeline:
    """Stages batches for one learner. ``staging``: through the pinned double buffer (:func:`stages_ahead`;
    a test may force it on the CPU); ``copier(dst, src)`` makes each host-to-device copy (a test counts them);
    ``whole``: the arrays the learner needs whole (:data:`WHOLE`, and :data:`VTRACE` for V-trace)."""

    def __init__(self, device: torch.device, staging: bool, copier: Copier = copy_async,
                 whole: tuple[str, ...] = WHOLE):
        self.device, self.staging, self.copier = device, staging, copier
        self.whole = whole
        self.cuda = device.type == "cuda"
        self.slots = [Slot(), Slot()]
        self._next = 0
        self.side = torch.cuda.Stream(device) if staging and self.cuda else None

    def stage(self, batch: Batch, chunk_rows: int) -> Staged:
        """``batch`` staged in chunks of ``chunk_rows`` (0: whole); the first chunk's copy is started. A batch from
        no buffer lacks the references a first-use clip needs (:data:`FIRST_USE`): every sample is new, NaN."""
        if isinstance(batch, PackedBatch):
            return batch.staged
        if "reference_logp" in self.whole and "reference_logp" not in batch:
            logp = batch["logp"]
            nan = torch.full_like(logp, float("nan")) if torch.is_tensor(logp) else np.full_like(logp, np.nan)
            batch = {**batch, "reference_logp": nan}
        rows = int(batch["active"].shape[0])
        chunk_rows = chunk_rows or rows
        on_device = all(torch.is_tensor(batch[k]) and batch[k].device == self.device for k in self.whole + CHUNKED)
        if not self.staging or on_device:
            return self._in_place(batch, rows, chunk_rows)
        specs = {k: (tuple(v.shape), _torch_dtype(v)) for k, v in batch.items()}
        return self._packed(specs, _host(batch["first"]), rows, chunk_rows,
                            lambda key, part, out: np.copyto(out, _host(batch[key])[part], casting="no"))

    def _in_place(self, batch: Batch, rows: int, chunk_rows: int) -> Staged:
        """Where the batch lies (the CPU, or a batch already on the device): views, and runs built on the host."""
        tensors = {k: torch.as_tensor(batch[k]).to(self.device) for k in self.whole + CHUNKED}
        first = _host(batch["first"])

        def chunk(j: int) -> tuple[dict[str, torch.Tensor], ResetFreeRuns]:
            part = slice(j * chunk_rows, (j + 1) * chunk_rows)
            return {k: tensors[k][part] for k in CHUNKED}, ResetFreeRuns.of(first[part]).to(self.device)

        return Staged(lambda: {k: tensors[k] for k in self.whole}, first, rows, chunk_rows, chunk)

    def gather(self, arrays: Mapping[str, np.ndarray], chosen: np.ndarray, chunk_rows: int) -> dict[str, np.ndarray]:
        """The rows ``chosen`` of ``arrays`` (an experience buffer's, whose lock the caller holds) as a batch: where
        batches are staged, in chunks of ``chunk_rows`` taken straight into the arena (no batch drawn out first);
        elsewhere, or without the references a first-use clip needs, drawn out as arrays."""
        if not self.staging or ("reference_logp" in self.whole and "reference_logp" not in arrays):
            return {k: v[chosen] for k, v in arrays.items()}
        rows = len(chosen)
        specs = {k: ((rows, *v.shape[1:]), _torch_dtype(v)) for k, v in arrays.items()}
        staged = self._packed(specs, arrays["first"][chosen], rows, chunk_rows or rows,
                              # mode="clip": numpy buffers `out` under the default "raise" (a second copy); the rows
                              # the buffer chose are in range
                              lambda key, part, out: np.take(arrays[key], chosen[part], axis=0, out=out, mode="clip"))
        return PackedBatch({"version": arrays["version"][chosen]}, staged)

    def _packed(self, specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]], first: np.ndarray, rows: int,
                chunk_rows: int, fill: Callable[[str, slice, np.ndarray], object]) -> Staged:
        """The batch of ``specs`` (each array's shape and dtype) packed into the next arena, ``fill(key, rows, out)``
        writing an array's ``rows`` into ``out``, and its first copy started."""
        parts = [slice(s, s + chunk_rows) for s in range(0, rows, chunk_rows)]
        runs = [ResetFreeRuns.of(first[p]).split for p in parts]
        segments, size = _layout(specs, self.whole, parts, runs)
        slot = self.slots[self._next]
        self._next = 1 - self._next
        arena = slot.take(size, pin=self.cuda)
        generation = slot.generation
        host = arena.numpy()
        for segment, part, split in zip(segments, parts, runs):
            for key, region in segment.regions.items():
                fill(key, part if key in CHUNKED else slice(None), _view(host, segment.start, region))
            if split is not None and segment.runs is not None:
                for key, region in segment.runs.items():
                    _view(host, segment.start, region)[...] = getattr(split, key).numpy()
        compute = torch.cuda.current_stream(self.device) if self.side is not None else None
        copied: dict[int, tuple[torch.Tensor, torch.cuda.Event | None]] = {}

        def issue(j: int) -> None:
            """Chunk j's copy, unless it is on the device; one released after an earlier pass over the chunks
            (V-trace's targets, then the losses) is copied again from the arena, which still holds the batch."""
            if j in copied or j >= len(segments):
                return
            if slot.generation != generation:
                raise RuntimeError("a staged batch was used after its host buffer was reused")
            segment = segments[j]
            src = arena[segment.start:segment.end]
            if self.side is None or compute is None:
                dev = torch.empty(segment.end - segment.start, dtype=torch.uint8, device=self.device)
                self.copier(dev, src)
                copied[j] = (dev, None)
                return
            with torch.cuda.stream(self.side):
                dev = torch.empty(segment.end - segment.start, dtype=torch.uint8, device=self.device)
                self.copier(dev, src)
                event = torch.cuda.Event()
                event.record(self.side)
            dev.record_stream(compute)  # allocated on the side stream, read on the learner's
            slot.copies.append(event)
            copied[j] = (dev, event)

        def ready(j: int) -> torch.Tensor:
            issue(j)
            dev, event = copied[j]
            if event is not None and compute is not None:
                compute.wait_event(event)
            return dev

        def chunk(j: int) -> tuple[dict[str, torch.Tensor], ResetFreeRuns]:
            dev = ready(j)
            issue(j + 1)  # copied while this chunk trains
            # Chunks already trained leave the device (the caching allocator keeps their blocks until the learner's
            # stream is past them): at most two chunks and the batch-wide figures (in chunk 0) are held at a time,
            # in every pass over the chunks.
            for done in [k for k in copied if k not in (0, j, j + 1)]:
                del copied[done]
            segment = segments[j]
            arrays = {k: segment.regions[k].view(dev) for k in CHUNKED}
            if segment.runs is None:
                return arrays, ResetFreeRuns()
            r = {k: region.view(dev) for k, region in segment.runs.items()}
            return arrays, ResetFreeRuns(RunSplit(r["gather"], r["scatter"], r["row"], r["carry"]))

        def whole() -> dict[str, torch.Tensor]:
            dev = ready(0)
            return {k: segments[0].regions[k].view(dev) for k in self.whole}

        issue(0)
        return Staged(whole, first, rows, chunk_rows, chunk)


def _host(value: np.ndarray | torch.Tensor) -> np.ndarray:
    return value.cpu().numpy() if torch.is_tensor(value) else np.asarray(value)


def _view(host: np.ndarray, start: int, region: Region) -> np.ndarray:
    """The region of the arena as a numpy array of its dtype and shape."""
    a = start + region.offset
    dtype = torch.empty((), dtype=region.dtype).numpy().dtype
    return host[a:a + region.nbytes].view(dtype).reshape(region.shape)


def _layout(specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]], whole: tuple[str, ...], parts: list[slice],
            runs: list[RunSplit | None]) -> tuple[list[Segment], int]:
    """Where every array (``specs``: its shape and dtype) of every chunk lies in the arena: one segment per chunk,
    the first with the whole batch's figures (``whole``); (segments, bytes)."""
    segments, start = [], 0
    for j, (part, split) in enumerate(zip(parts, runs)):
        offset, regions = 0, {}
        for key in (whole if j == 0 else ()) + CHUNKED:
            shape, dtype = specs[key]
            if key in CHUNKED:
                shape = (len(range(*part.indices(shape[0]))), *shape[1:])
            region = Region(offset, dtype, shape)
            regions[key] = region
            offset = _aligned(offset + region.nbytes)
        run_regions = None
        if split is not None:
            run_regions = {}
            for key in RUNS:
                t = getattr(split, key)
                run_regions[key] = Region(offset, t.dtype, tuple(t.shape))
                offset = _aligned(offset + run_regions[key].nbytes)
        segments.append(Segment(start, start + offset, regions, run_regions))
        start += offset
    return segments, start


def _torch_dtype(value: np.ndarray | torch.Tensor) -> torch.dtype:
    return value.dtype if torch.is_tensor(value) else torch.from_numpy(np.empty(0, value.dtype)).dtype

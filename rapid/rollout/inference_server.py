"""The node's inference server: one process per node decides the actions of every rollout worker of the node,
batched, on the node's GPU where it has one (``rollout.inference = "node"``; the worker's side is
:mod:`rapid.rollout.inference_client`, the wire :mod:`rapid.rollout.inference_wire`).

It keeps every game's LSTM state on its device (a block of rows per worker, freed when the worker goes), plays the
node's latest version (it is the node's only reader of parameters) and the league's past policies the workers
name, and batches requests dynamically: a batch goes as soon as every connected lane is waiting (no more can
come), it holds ``max_batch`` rows, or its oldest request has waited ``max_wait_s``. Rows of one policy run in
one forward pass; sampled actions come from the workers' uniforms, so a seed gives the same games here as on a
worker's own core.

How :func:`rapid.roles.inference.run_inference_server` wires and runs it::

    server = InferenceServer(make_policy, device, params, load_opponent, max_batch, max_wait_s, metrics)
    server.serve(listener, stop)        # until stopped, or idle_s after its last worker left
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from rapid.league.sampling import LATEST
from rapid.opt.model import Policy
from rapid.rollout.inference_batch import Part, Staging, decide
from rapid.rollout.inference_wire import BadMessage, Frames, LaneViews, SharedBlock, SlotLayout, frame

log = logging.getLogger(__name__)
OPPONENTS_KEPT = 16


@dataclass
class Worker:
    sock: socket.socket
    frames: Frames = field(default_factory=Frames)
    shm: SharedBlock | None = None
    views: list[LaneViews] = field(default_factory=list)
    layout: SlotLayout | None = None
    first_row: int = 0
    """Where this worker's rows start in the server's state tensors."""


@dataclass
class Pending:
    worker: Worker
    message: dict
    arrived: float


@dataclass
class BatchStats:
    """What the server did, for the metrics and ``benchmarks/bench_rollout.py``."""

    batches: int = 0
    rows: int = 0
    passes: int = 0
    """Forward passes: one per distinct policy of a batch (the latest, each past opponent its rows play)."""
    busy_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    waits_s: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    """The latest requests' waits: appended per batch without copying the window."""

    def record(self, size: int, waits: list[float], busy_s: float, passes: int = 1) -> None:
        self.batches += 1
        self.rows += size
        self.passes += passes
        self.busy_s += busy_s
        self.waits_s.extend(waits)

    def summary(self) -> dict:
        waits = np.asarray(self.waits_s or [0.0])
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {"batches": self.batches, "rows": self.rows,
                "mean_batch": self.rows / max(self.batches, 1),
                "passes_per_batch": self.passes / max(self.batches, 1),
                "wait_p50_ms": float(np.percentile(waits, 50) * 1e3),
                "wait_p99_ms": float(np.percentile(waits, 99) * 1e3), "busy_s": self.busy_s,
                "busy_share": self.busy_s / elapsed}


class InferenceServer:
    """``params`` has ``take() -> (version, tensors, meta) | None`` and ``behind_s()`` (a
    :class:`rapid.roles.rollout.ParamPoller`); ``load_opponent(member_id)`` returns a past policy's tensors."""

    def __init__(self, make_policy: Callable[[], Policy], device: torch.device, params,
                 load_opponent: Callable[[str], Mapping[str, np.ndarray]], max_batch: int, max_wait_s: float,
                 metrics=None, idle_s: float = 30.0):
        self.make_policy, self.device, self.params = make_policy, device, params
        self.load_opponent, self.max_batch, self.max_wait_s = load_opponent, max_batch, max_wait_s
        self.metrics, self.idle_s = metrics, idle_s
        self.latest = make_policy().to(device).eval()
        self.version: int | None = None
        self.meta: dict = {}
        self.opponents: OrderedDict[str, Policy] = OrderedDict()
        self.workers: dict[int, Worker] = {}
        self.pending: list[Pending] = []
        self.h = torch.zeros(0, self.latest.lstm_size, device=device)
        self.c = torch.zeros(0, self.latest.lstm_size, device=device)
        self.free_blocks: list[tuple[int, int]] = []
        self.stats = BatchStats()
        self.staging = Staging(device)

    # --- the loop ------------------------------------------------------------------------------------------------

    def serve(self, listener: socket.socket, stop) -> None:
        selector = selectors.DefaultSelector()
        listener.setblocking(False)
        selector.register(listener, selectors.EVENT_READ)
        alone_since = time.monotonic()
        while not stop:
            self._take_params()
            timeout = 0.5 if not self.pending else max(0.0, self.pending[0].arrived + self.max_wait_s
                                                       - time.monotonic())
            for key, _ in selector.select(timeout):
                if key.fileobj is listener:
                    self._accept(listener, selector)
                elif key.fd in self.workers:  # not dropped by an earlier event of this round
                    self._read(self.workers[key.fd], selector)
            if self.pending and self._batch_due():
                self._run_batch()
            if self.workers:
                alone_since = time.monotonic()
            elif self.idle_s and time.monotonic() - alone_since > self.idle_s:
                log.info("no rollout worker for %.0fs: the inference server stops", self.idle_s)
                break
        for worker in list(self.workers.values()):
            self._drop(worker, selector, "the server stops")
        selector.close()

    def _batch_due(self) -> bool:
        lanes = sum(w.layout.lanes for w in self.workers.values() if w.layout is not None)
        rows = sum(int(p.message["n"]) for p in self.pending)
        return (len(self.pending) >= lanes or rows >= self.max_batch
                or time.monotonic() - self.pending[0].arrived >= self.max_wait_s)

    def _take_params(self) -> None:
        newer = self.params.take()
        if newer is None:
            return
        version, tensors, meta = newer
        try:
            self.latest.load_tensors(tensors)
        except ValueError as e:
            self.params.reject(version, self.version, str(e))
            return
        self.version, self.meta = version, dict(meta or {})
        if self.metrics is not None:
            self.metrics.param_version(version)

    def _accept(self, listener: socket.socket, selector) -> None:
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(True)
        self.workers[sock.fileno()] = Worker(sock)
        selector.register(sock, selectors.EVENT_READ)
        if self.metrics is not None:
            self.metrics.workers(len(self.workers))

    def _read(self, worker: Worker, selector) -> None:
        try:
            data = worker.sock.recv(1 << 16)
            messages = worker.frames.feed(data) if data else None
        except (OSError, BadMessage) as e:
            self._drop(worker, selector, str(e))
            return
        if messages is None:
            self._drop(worker, selector, "it left")
            return
        for message in messages:
            try:
                self._handle(worker, message)
            except (KeyError, TypeError, ValueError, IndexError, OSError) as e:
                self._answer(worker, {"id": message.get("id"), "error": f"{type(e).__name__}: {e}"})

    def _handle(self, worker: Worker, message: dict) -> None:
        op = message.get("op")
        if op == "act":
            if worker.layout is None:
                raise ValueError("act before hello")
            self.pending.append(Pending(worker, message, time.monotonic()))
        elif op == "value":
            self._answer(worker, {"id": message["id"], **self._value(worker, message)})
        elif op == "hello":
            self._hello(worker, message)
            self._answer(worker, {"id": message["id"], "version": self.version})
        elif op == "opponent":
            self._opponent(str(message["member"]))
            self._answer(worker, {"id": message["id"]})
        elif op == "status":
            # Workers ask every segment and need the version only; the batch figures (percentiles over the window)
            # are computed for whoever asks for them (benchmarks/bench_rollout.py).
            stats = self.stats.summary() if message.get("stats") else {}
            self._answer(worker, {"id": message["id"], "version": self.version, "meta": self.meta,
                                  "behind_s": float(self.params.behind_s()), **stats})
        else:
            raise ValueError(f"unknown op {op!r}")

    def _answer(self, worker: Worker, message: dict) -> None:
        try:
            worker.sock.sendall(frame(message))
        except OSError as e:
            log.warning("cannot answer a worker (%s)", e)

    # --- workers and their rows ------------------------------------------------------------------------------------

    def _hello(self, worker: Worker, message: dict) -> None:
        layout = SlotLayout(*(int(message[k]) for k in ("lanes", "rows", "obs_dim", "mask_dim", "heads", "lstm")))
        if layout.lstm != self.latest.lstm_size or layout.obs_dim != self.latest.obs_dim:
            raise ValueError(f"a worker of another model (obs {layout.obs_dim}, lstm {layout.lstm})")
        path = str(message["shm"])
        if not os.path.basename(path).startswith("rapid-slots-"):
            raise ValueError(f"{path!r} is not a worker's block")
        shm = SharedBlock(path, layout.size, create=False)
        shm.unlink()  # mapped by both: the memory now goes with the last of the two processes
        if shm.size < layout.size:
            shm.close()
            raise ValueError(f"a block of {shm.size} bytes for a layout of {layout.size}")
        worker.shm, worker.layout, worker.views = shm, layout, layout.views(shm.buf)
        worker.first_row = self._allocate(layout.lanes * layout.rows)

    def _allocate(self, n: int) -> int:
        for i, (start, size) in enumerate(self.free_blocks):
            if size == n:
                del self.free_blocks[i]
                self.h[start:start + n] = 0.0
                self.c[start:start + n] = 0.0
                return start
        start = self.h.shape[0]
        grow = torch.zeros(n, self.h.shape[1], device=self.device)
        self.h, self.c = torch.cat([self.h, grow]), torch.cat([self.c, grow])
        return start

    def _drop(self, worker: Worker, selector, why: str) -> None:
        """A worker left (or was killed): its rows and its pending requests go."""
        self.workers.pop(worker.sock.fileno(), None)
        try:
            selector.unregister(worker.sock)
        except (KeyError, ValueError):
            pass
        worker.sock.close()
        self.pending = [p for p in self.pending if p.worker is not worker]
        if worker.layout is not None:
            self.free_blocks.append((worker.first_row, worker.layout.lanes * worker.layout.rows))
        if worker.shm is not None:
            worker.views = []
            worker.shm.close()
        if self.metrics is not None:
            self.metrics.workers(len(self.workers))
        log.info("a worker's slots are free (%s)", why)

    def _opponent(self, member_id: str) -> Policy:
        if member_id in self.opponents:
            self.opponents.move_to_end(member_id)
            return self.opponents[member_id]
        policy = self.make_policy()
        policy.load_tensors(dict(self.load_opponent(member_id)))
        self.opponents[member_id] = policy.to(self.device).eval()
        while len(self.opponents) > OPPONENTS_KEPT:
            self.opponents.popitem(last=False)
        return self.opponents[member_id]

    def _policy(self, key: str) -> Policy:
        return self.latest if key == LATEST else self._opponent(key)

    def _state_rows(self, worker: Worker, lane: int, rows: np.ndarray) -> np.ndarray:
        """``rows`` of the worker's lane as rows of the server's state tensors."""
        assert worker.layout is not None
        if len(rows) and (rows.min() < 0 or rows.max() >= worker.layout.rows):
            raise IndexError("a row outside the worker's block")
        return worker.first_row + lane * worker.layout.rows + rows

    def _resets(self, worker: Worker, message: dict) -> None:
        resets = np.asarray(message.get("resets") or [], dtype=np.int64)
        if len(resets):
            index = torch.from_numpy(self._state_rows(worker, int(message["lane"]), resets)).to(self.device)
            self.h[index] = 0.0
            self.c[index] = 0.0

    # --- deciding ------------------------------------------------------------------------------------------------

    def _value(self, worker: Worker, message: dict) -> dict:
        self._resets(worker, message)
        view = worker.views[int(message["lane"])]
        rows = view.rows[:int(message["n"])].copy()
        index = torch.from_numpy(self._state_rows(worker, int(message["lane"]), rows)).to(self.device)
        obs = torch.from_numpy(view.obs[rows]).to(self.device)
        view.value[:len(rows)] = self.latest.value(obs, (self.h[index], self.c[index])).cpu().numpy()
        return {"version": self.version}

    def _run_batch(self) -> None:
        batch, self.pending = self.pending, []
        started = time.monotonic()
        by_policy: dict[str, list[Part]] = {}
        owners: dict[str, list[Pending]] = {}
        answers = []
        for p in batch:
            try:
                self._resets(p.worker, p.message)
                lane = int(p.message["lane"])
                view = p.worker.views[lane]
                rows = view.rows[:int(p.message["n"])].copy()
                state_rows = self._state_rows(p.worker, lane, rows)
                position = 0
                for key, count in p.message["groups"]:
                    end = position + int(count)
                    by_policy.setdefault(str(key), []).append(Part(view, position, rows[position:end],
                                                                   state_rows[position:end]))
                    owners.setdefault(str(key), []).append(p)
                    position = end
                answers.append(p)
            except (KeyError, TypeError, ValueError, IndexError) as e:
                self._answer(p.worker, {"id": p.message.get("id"), "error": f"{type(e).__name__}: {e}"})
        failed: set[int] = set()
        groups = []
        for key, parts in by_policy.items():
            try:
                groups.append((self._policy(key), parts))
            except (KeyError, ValueError, IndexError, RuntimeError) as e:  # a past policy that cannot be loaded
                log.warning("cannot decide for %s: %s", key, e)
                failed.update(id(p) for p in owners[key])
        try:
            decide(groups, self.h, self.c, self.staging)
        except (KeyError, ValueError, IndexError, RuntimeError) as e:
            log.warning("cannot decide this batch: %s", e)
            failed.update(id(p) for p in answers)
        busy = time.monotonic() - started
        for p in answers:
            reply = ({"id": p.message["id"], "error": "the server could not decide"} if id(p) in failed
                     else {"id": p.message["id"], "version": self.version if self.version is not None else -1})
            self._answer(p.worker, reply)
        size = sum(int(p.message["n"]) for p in batch)
        waits = [started - p.arrived for p in batch]
        self.stats.record(size, waits, busy, passes=len(by_policy))
        if self.metrics is not None:
            self.metrics.batch(size, waits, busy)

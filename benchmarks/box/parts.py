"""Stand-ins of the box model, each for a part of rapid that cannot run in simulated time or whose work is a cost,
not a result. Everything on the data path between them is rapid's own (see ``box.py``).

- :class:`MemStore`: the run's LocalStore, in memory (a local file system's latency is not what the box lacks).
- :class:`IntakeStore`: the store as a process sees it, charging the CPU of what passes: an experience object read
  costs the optimizer process ``intake_s_per_mb`` under its lock, and a decode process ``decode_s_per_mb`` (the
  loader waits for the decode of the object before last: ``decoders`` decodes in flight, as ``DecodePool`` keeps a
  window of them); an experience object written costs the worker ``encode_s_per_mb``.
- :class:`BoxLearner`: ``Learner.update``: the host's part of an update (the H200 loop figures, under the optimizer
  process's lock and on a core) beside its kernels on the GPU.
- :class:`BoxServer` / :class:`ServerLink`: ``InferenceServer.serve`` (real sockets and selectors; the hook it lacks
  is one round as a public step, see ``benchmarks/fleet/node.py``). A worker's segment of decisions is one request,
  laid on the server process's calendar when the segment starts (FIFO, on a core) with its kernels on the GPU; the
  worker's env steps run meanwhile, and the segment ends when both are done. The server's ``ParamPoller`` is rapid's.
- :class:`BoxSource`: ``RolloutWorker.collect``: a segment's env steps are CPU of the worker's process.
"""

from __future__ import annotations

import bisect
import collections
import random

import numpy as np
from fleet.standins import StoreWrapper, weights_of

from rapid.infra.store import KeyNotFound, Store
from rapid.roles.rollout import ParamPoller
from rapid.rollout.inference_client import ServerVersions
from rapid.rollout.worker import Segment
from rapid.run.param_store import ParameterStore

from .cores import GPU, BoxClock
from .costs import AGENT_STEPS_PER_SEGMENT, MB, REAL_SAMPLE_BYTES, BoxCosts, loop_update_s


class MemStore(Store):
    """A store in memory: sorted keys, atomic writes."""

    def __init__(self):
        self.url, self.objects = "mem://box", {}
        self._keys: list[str] = []

    def put(self, key: str, data: bytes) -> None:
        if key not in self.objects:
            bisect.insort(self._keys, key)
        self.objects[key] = bytes(data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if key in self.objects:
            return False
        self.put(key, data)
        return True

    def get(self, key: str, *args, **kwargs) -> bytes:
        if key not in self.objects:
            raise KeyNotFound(key)
        return self.objects[key]

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        lo = bisect.bisect_left(self._keys, prefix)
        if start_after is not None:
            lo = max(lo, bisect.bisect_right(self._keys, start_after))
        out = []
        for key in self._keys[lo:]:
            if not key.startswith(prefix):
                break
            out.append(key)
        return out

    def delete(self, key: str) -> None:
        if self.objects.pop(key, None) is not None:
            self._keys.pop(bisect.bisect_left(self._keys, key))


class Sizes:
    """Real bytes of an object of simulated samples: each simulated sample stands for ``scale`` real ones."""

    def __init__(self, scale: int, bytes_per_sample: float, overhead: float):
        self.scale, self.per_sample, self.overhead = scale, bytes_per_sample, overhead

    def mb(self, n: int) -> float:
        return max(0.0, n - self.overhead) / self.per_sample * self.scale * REAL_SAMPLE_BYTES / MB


class IntakeStore(StoreWrapper):
    """See the module docstring."""

    def __init__(self, inner, clock: BoxClock, costs: BoxCosts, sizes: Sizes, decoders: list[str], pause):
        super().__init__(inner)
        self.pause = pause  # the loader's poll goes on at the time its intake so far took (threaded.py)
        self.clock, self.costs, self.sizes, self.decoders = clock, costs, sizes, decoders
        self._ends: collections.deque[float] = collections.deque()  # when each decode in flight ends
        self._next = 0
        self.mb_in = 0.0

    def get(self, key: str, *args, **kwargs) -> bytes:
        data = self.inner.get(key, *args, **kwargs)
        if key.startswith("experience/"):
            c, mb = self.costs, self.sizes.mb(len(data))
            self.mb_in += mb
            self.clock.cpu(c.intake() * mb, tag="intake")
            if self.decoders:
                if len(self._ends) >= len(self.decoders):  # the window is full: the oldest decode first
                    self.clock.wait_until(self._ends.popleft())
                decoder = self.decoders[self._next % len(self.decoders)]
                self._next += 1
                self._ends.append(self.clock.book(decoder, c.vm(c.decode_s_per_mb) * mb, self.clock.t(), "decode"))
            self.pause()
        return data

    def put(self, key: str, data: bytes) -> None:
        if key.startswith("experience/"):
            self.clock.cpu(self.costs.vm(self.costs.encode_s_per_mb) * self.sizes.mb(len(data)), tag="encode")
        self.inner.put(key, data)


class BoxLearner:
    """``Learner.update`` in simulated time (module docstring); counts what it trained, after ``warm_s``."""

    def __init__(self, clock: BoxClock, costs: BoxCosts, scale: int):
        self.clock, self.costs, self.scale = clock, costs, scale
        self.updates, self.skipped = 0, 0
        self.reference_logp: np.ndarray | None = None
        self.trained = 0  # real samples
        self.sizes: collections.Counter[int] = collections.Counter()  # real batch → updates

    def weights(self) -> dict[str, np.ndarray]:
        return weights_of(self.updates)

    def update(self, arrays: dict, progress: float) -> dict:
        real = int(arrays["version"].shape[0]) * self.scale
        c, start = self.costs, self.clock.t()
        kernels = self.clock.book(GPU, c.learner_gpu_fixed_s + c.learner_gpu_s_per_sample * real, start, "gpu")
        self.clock.cpu(loop_update_s(real), tag="update")
        self.clock.wait_until(kernels)
        self.updates += 1
        self.trained += real
        self.sizes[real] += 1
        return {"skipped": False, "loss": 0.0}


class BoxServer:
    """The node's inference server (module docstring): its ParamPoller is rapid's, on an actor of its process."""

    def __init__(self, box, reads):
        self.box, self.process = box, "server"
        self.version: int | None = None
        self.meta: dict = {}
        self.rows = 0
        self.params = ParameterStore(reads)
        self.poller = ParamPoller(self.params, box.cfg.rollout.param_poll_s, box.quiet, rng=random.Random(box.s.seed))

    def polls(self):
        """The server's poller thread; a new version is taken at its next round."""
        clock = self.box.clock
        while True:
            self.poller.poll_once()
            newer = self.poller.take()
            if newer is not None:
                self.version, _, meta = newer
                self.meta = dict(meta or {})
            yield clock.t() + self.poller.next_wait()

    def status(self, stats: bool = False) -> dict:
        return {"version": self.version, "meta": self.meta, "behind_s": self.poller.behind_s()}

    def decide(self, rows: int, at: float) -> float:
        """A segment's ``rows`` decisions asked at ``at``: when they are all answered."""
        c, clock = self.box.s.costs, self.box.clock
        self.rows += rows
        kernels = clock.book(GPU, c.server_gpu_s_per_row * rows, at, "gpu")
        return max(kernels, clock.book(self.process, c.server_s_per_row * rows, at, "server"))


class BoxSource:
    """A worker's env and policy (``RolloutWorker.collect``): a segment's env steps are CPU of its process while the
    node's server decides; the segment holds ``samples`` simulated samples stamped with the version played."""

    def __init__(self, box, server: BoxServer, samples: int, speed: float = 1.0):
        self.box, self.server, self.speed = box, server, speed
        self.template = {k: v.copy() for k, v in box.template(samples).items()}
        self.version: int | None = None
        self.segments = 0
        self.versions = ServerVersions(server)  # type: ignore[arg-type]  # status() is all it calls

    def set_params(self, version: int, tensors: dict, meta: dict) -> None:
        self.version = version

    def collect(self) -> Segment:
        clock, c = self.box.clock, self.box.s.costs
        answered = self.server.decide(AGENT_STEPS_PER_SEGMENT, clock.t())
        clock.cpu(c.worker_s_per_agent_step * self.speed * AGENT_STEPS_PER_SEGMENT, tag="env")
        clock.wait_until(answered)
        self.segments += 1
        arrays = {k: v.copy() for k, v in self.template.items()}
        arrays["version"][:] = self.version
        return Segment(arrays, ["latest"], [], env_steps=AGENT_STEPS_PER_SEGMENT)

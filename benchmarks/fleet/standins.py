"""What the scale model puts where rapid would run an env, a policy, a learner or a metrics server.

Everything on the data path is rapid's own (loops, uploader, poller, loader, buffer, writer, league keeper,
node cache); these stand-ins only produce samples, take updates and swallow metrics, and charge the simulated
clock what the real thing costs: a segment of env steps (``segment_s``), an update (``update_s`` with a
straggler's spread, plus the gradient all-reduce), and the CPU of decoding, listing, encoding and the pool's
JSON (:class:`Costs`, measured by ``benchmarks/fleet/costs.py``), each charged to the process that spends it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from rapid.errors import FormatError
from rapid.formats.checkpoint import Checkpoint
from rapid.infra.store import Store, StoreError
from rapid.rollout.worker import Segment

from .drive import Links
from .meter import family


def weights_of(updates: int) -> dict[str, np.ndarray]:
    """The stand-in learner's weights after ``updates`` updates: every value is the update count, so the weights
    change with every version and a version that ships old weights shows against its meta's update count."""
    return {"w": np.full(1024, updates, np.float32)}


PARAM_TENSORS = weights_of(0)


def check_weights(tensors: dict, meta: dict | None = None) -> bool:
    """Raises ValueError for tensors that are not the stand-in's (as a policy refuses them); True when they are
    the weights ``meta``'s update count says (always, without a meta)."""
    if set(tensors) != set(PARAM_TENSORS):
        raise ValueError("parameters do not match the model")
    return meta is None or bool(np.all(tensors["w"] == meta.get("updates")))

SAMPLE_ID = (slice(None), 0, 0)
"""Where a sample carries its id (``obs[:, 0, 0]``, exact in float32 below 2**24): the ledger follows each one
from the source that made it through the store to the learner that trained it."""
FIXED_SHARE = 0.75  # of the stand-in learner's update time at its smallest batch, paid whatever the batch


@dataclass
class Costs:
    """CPU seconds of the work the model does with small objects standing in for big ones (per modelled MB,
    per LIST page). Defaults: this machine's figures (``python benchmarks/fleet/costs.py``; BENCHMARKS.md)."""

    decode_s_per_mb: float = 1.9e-3
    list_page_s: float = 0.048
    encode_s_per_mb: float = 2.2e-3
    pool_json_s_per_kb: float = 1.6e-4


class StoreWrapper(Store):
    """A store that passes every call to ``inner``; a subclass changes what it must."""

    def __init__(self, inner):
        self.inner, self.url = inner, inner.url

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.put_if_absent(key, data)

    def get(self, key: str, *args, **kwargs) -> bytes:
        return self.inner.get(key, *args, **kwargs)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        return self.inner.list(prefix, start_after=start_after)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def describe(self) -> str:
        return self.inner.describe()


class CpuCharged(StoreWrapper):
    """A store as one process sees it: every answer costs that process CPU (a LIST page parsed, a params or
    checkpoint PUT encoded, the pool's JSON parsed or written), except an experience object's decoding, which
    an optimizer rank does in its decode worker processes (``optimizer.decode_workers``): that CPU is the
    ``decoder`` process's, and the GET's caller waits for it."""

    def __init__(self, inner, clock, latency, costs: Costs, decoder: object = None):
        super().__init__(inner)
        self.clock, self.latency, self.costs, self.decoder = clock, latency, costs, decoder

    def _mb(self, key: str, n: int) -> float:
        return self.latency.bytes(key, n) / 1e6

    def _cpu(self, key: str, n: int, writing: bool) -> None:
        fam, c = family(key), self.costs
        if fam == "experience" and not writing:
            self.clock.cpu(c.decode_s_per_mb * self._mb(key, n), self.decoder)
        elif fam in ("params", "checkpoints", "league/snapshots") and writing:
            self.clock.cpu(c.encode_s_per_mb * self._mb(key, n))
        elif fam == "league/pool":
            self.clock.cpu(c.pool_json_s_per_kb * n / 1e3)

    def put(self, key: str, data: bytes) -> None:
        self._cpu(key, len(data), True)
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._cpu(key, len(data), True)
        return self.inner.put_if_absent(key, data)

    def get(self, key: str, *args, **kwargs) -> bytes:
        data = self.inner.get(key, *args, **kwargs)
        self._cpu(key, len(data), False)
        return data

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        keys = self.inner.list(prefix, start_after=start_after)
        self.clock.cpu(self.costs.list_page_s * max(1, -(-len(keys) // 1000)))
        return keys



class SimLearner:
    """The learner's place in ``OptimizerLoop``: an update of ``batch`` samples takes ``update_s × (FIXED_SHARE +
    (1 − FIXED_SHARE) × batch / nominal_batch)`` (on a GPU most of an update's time is paid once: kernel launches,
    the optimizer step, the all-reduce; a batch 4× as large took 1.5–2× as long in BENCHMARKS' learner figures),
    spread by a rank's straggling (lognormal ``spread``), plus the gradient all-reduce of ``grad_bytes``.
    ``busy_s`` and ``samples`` sum the time spent updating and the samples updated on from ``measure_from``
    (simulated seconds) to ``measure_to``.

    It draws ahead as rapid's ``Learner`` does (``prefetch``): the loop's ``draw`` runs once during the next
    update, as its kernels are queued (its start, in simulated time), and the update after trains that very
    batch. ``ahead_used`` counts the updates that did; ``ahead_dropped`` the samples of batches drawn ahead that
    the next update did not train (a batch drawn ahead is marked used in the buffer: no other update takes it)."""

    def __init__(self, clock, rng, update_s: float, nominal_batch: int, spread: float, ranks: int,
                 grad_bytes: float, links: Links, measure_from: float, measure_to: float,
                 version_now: Callable[[], int] | None = None):
        self.clock, self.rng, self.update_s, self.spread = clock, rng, update_s, spread
        self.nominal_batch = nominal_batch
        self.allreduce_s = links.all_reduce_s(ranks, grad_bytes)
        self.measure_from, self.measure_to = measure_from, measure_to
        self.updates = 0
        self.skipped = 0
        self.reference_logp: np.ndarray | None = None  # clipped against the behaviour: ppo.proximal's default
        self.busy_s = 0.0
        self.samples = 0
        self.trained: set[int] = set()  # ids of the samples this rank's updates took (read by the ledger)
        self._draw: Callable[[], dict | None] | None = None
        self._ahead: dict | None = None  # the batch the last draw returned
        self.ahead_used = self.ahead_dropped = 0
        self.version_now = version_now  # the loop's version: each batch's staleness as trained, beside the report's
        self.stale_sum = self.stale_max = 0
        self.drawn = 0  # samples trained on, a sample once per update that took it (÷ len(trained): the reuse)

    def weights(self) -> dict[str, np.ndarray]:
        return weights_of(self.updates)

    def prefetch(self, draw: Callable[[], dict | None]) -> None:
        self._draw = draw

    def update(self, arrays: dict, progress: float) -> dict:
        start = self.clock.t()
        if self._ahead is not None:
            self.ahead_used += int(arrays is self._ahead)
            self.ahead_dropped += 0 if arrays is self._ahead else len(self._ahead["version"])
        draw, self._draw = self._draw, None
        self._ahead = draw() if draw is not None else None
        spread = float(self.rng.lognormal(0.0, self.spread)) if self.spread else 1.0
        batch = int(arrays["version"].shape[0])
        self.clock.cpu(self.update_s * spread * (FIXED_SHARE + (1 - FIXED_SHARE) * batch / self.nominal_batch))
        self.clock.charge(self.allreduce_s)
        self.updates += 1
        self.trained.update(arrays["obs"][SAMPLE_ID].astype(np.int64).tolist())
        self.drawn += batch
        if self.version_now is not None:
            staleness = self.version_now() - arrays["version"]
            self.stale_sum += int(staleness.sum())
            self.stale_max = max(self.stale_max, int(staleness.max(initial=0)))
        if self.measure_from <= start < self.measure_to:
            self.busy_s += self.clock.t() - start
            self.samples += batch
        return {"skipped": False, "loss": 0.0}


def checkpoint_of(version: int, updates: int) -> Checkpoint:
    """A checkpoint of the stand-in's weights with a real Adam state (one step of torch's Adam over them)."""
    w = torch.nn.Parameter(torch.zeros(PARAM_TENSORS["w"].shape))
    adam = torch.optim.Adam([w])
    w.grad = torch.ones_like(w)
    adam.step()
    return Checkpoint.from_torch(version, updates, weights_of(updates), adam.state_dict())


class SimReport:
    """The optimizer's report, counting: versions made (and when) and updates reported (no metrics server, no
    log)."""

    def __init__(self, clock):
        self.clock = clock
        self.versions, self.updates, self.failures = 0, 0, []
        self.staleness: dict[int, int] = {}
        self.stale_sum = 0  # the staleness reported, summed over every sample (against SimLearner.stale_sum)
        self.version_at: dict[int, float] = {}  # version → when the loop made it (and queued its publish)

    def version(self, version: int) -> None:
        self.versions = version
        self.version_at[version] = self.clock.t()

    def update(self, updates, version, stats, staleness, decision, wait_s) -> None:
        self.updates = updates
        self.stale_sum += int(np.asarray(staleness).sum())
        for s in np.asarray(staleness).tolist():
            self.staleness[int(s)] = self.staleness.get(int(s), 0) + 1

    def update_failed(self, error: BaseException) -> None:
        self.failures.append(repr(error))

    def loader_failed(self, failure: str) -> None:
        self.failures.append(failure)

    def skipped_nonfinite(self, total: int) -> None:
        """Never: the stand-in learner's losses are finite."""

    def writer_done(self, job: str, seconds: float) -> None:
        """Timed by the model from the writer's actor instead."""


class NullMetrics:
    """A role's metrics object that records nothing (4,096 Prometheus registries would measure the model)."""

    def __getattr__(self, name: str):
        return _ignore


def _ignore(*args, **kwargs) -> None:
    return None


class SimSource:
    """The rollout worker's place in ``RolloutLoop``: ``collect`` takes ``segment_s`` of simulated time and gives
    a segment of samples stamped with the version it plays, and the games that ended in it, each against an
    opponent the real league sampler chose at the game's start (a snapshot's weights loaded as the real
    worker does). Each sample carries a fleet-wide id (``next_ids``); ``produced`` keeps this source's, and
    ``swaps`` when each version began to play; ``wrong_weights`` counts versions whose weights are not the ones
    their meta's update count says (under node inference the server counts them: it holds the weights)."""

    def __init__(self, clock, rng, template: dict, sampler, segment_s: float, games_per_segment: float,
                 on_snapshot_failure, next_ids, play=None):
        self.clock, self.rng, self.template, self.sampler = clock, rng, template, sampler
        self.play = play  # under node inference: a segment's steps beside the node's server (fleet/node.py)
        self.segment_s, self.games_per_segment = segment_s, games_per_segment
        self.on_snapshot_failure, self.next_ids = on_snapshot_failure, next_ids
        self.version: int | None = None
        self.games_due = 0.0
        self.games = 0
        self.produced: list[int] = []
        self.swaps: list[tuple[float, int]] = []
        self.wrong_weights = 0

    def set_params(self, version: int, tensors: dict, meta: dict) -> None:
        if self.play is None:  # under node inference the server holds the weights (and checks them)
            self.wrong_weights += int(not check_weights(tensors, meta))
        self.version = version
        self.swaps.append((self.clock.t(), version))

    def collect(self) -> Segment:
        if self.play is None:
            self.clock.charge(self.segment_s)
        else:
            self.play(self.segment_s)
        self.sampler.refresh()
        self.games_due += self.games_per_segment
        n_games, self.games_due = int(self.games_due), self.games_due - int(self.games_due)
        games = [self.sampler.choose(self.rng) for _ in range(n_games)]
        for g in games:
            if g.kind == "snapshot":
                try:
                    self.sampler.load_params(g.id)
                except (StoreError, FormatError, ValueError, KeyError):  # rapid's worker plays the latest instead
                    self.on_snapshot_failure()
        opponents = sorted({g.id for g in games}) or ["latest"]
        arrays = {k: v.copy() for k, v in self.template.items()}
        arrays["version"][:] = self.version
        ids = self.next_ids(len(arrays["version"]))
        arrays["obs"][SAMPLE_ID] = ids
        self.produced.extend(ids.tolist())
        arrays["opponent"][:] = np.arange(len(arrays["opponent"])) % len(opponents)
        episodes = [{"learner_version": self.version, "opponent": g.id, "learner_side": i % 2,
                     "winner": ("learner", "opponent", "draw")[int(self.rng.integers(3))], "length": 1000,
                     "learner_return": 0.0} for i, g in enumerate(games)]
        self.games += len(episodes)
        return Segment(arrays, opponents, episodes, env_steps=16 * len(arrays["version"]))

"""Issue 33, items 2 and 3, in-process: the real OptimizerLoop of several ranks driven in lock step, as a process
group would (each rank's own simulated clock; a collective answers once every rank asked, at the last arrival),
with stand-ins for the learner, buffer, loader and store. Sub-second; the real ranks under mpiexec are in
tests/test_ranks_agree_mpi.py.

- A rank 0 whose background writer is stuck (the store down) for three collective timeouts holds no rank in a
  collective past the timeout: every rank keeps agreeing and training, and the held versions are stored once
  the writer runs again.
- The balancer's decision is rank 0's, carried by the agreement: every rank trains the same batch size even when
  their backlogs differ.
"""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest

from rapid.formats.checkpoint import Checkpoint
from rapid.infra.store import LocalStore
from rapid.league import Tally
from rapid.optimizer.checkpoints import checkpoint_versions
from rapid.optimizer.publisher import BackgroundWriter
from rapid.roles.lockstep import Agreement, wait_round_s
from rapid.roles.optimizer_loop import OptimizerLoop, Timing
from rapid.roles.optimizer_parts import Parts
from rapid.roles.startup import StopFlag
from rapid.roles.steps import AllGather, AllReduce, Sleep, Until
from rapid.run.config_files import load_config

TIMEOUT_S = 4.0
LOG = logging.getLogger("test-ranks-agree")


class Clock:
    """One rank's simulated clock."""

    def __init__(self):
        self.t = 0.0

    def time(self) -> float:
        return 1.7e9 + self.t

    def monotonic(self) -> float:
        return self.t


class Learner:
    """Takes ``update_s`` of its rank's clock per update; remembers each batch's size."""

    def __init__(self, clock: Clock, update_s: float = 0.1):
        self.clock, self.update_s = clock, update_s
        self.updates = self.skipped = 0
        self.batches: list[int] = []
        self.reference_logp = None  # clipped against the behaviour: ppo.proximal's default

    def update(self, arrays, progress: float) -> dict:
        self.clock.t += self.update_s
        self.updates += 1
        self.batches.append(len(arrays["obs"]))
        return {"skipped": False}


class Buffer:
    """Always has a batch; reports a fixed backlog (what the balancer reads); records the sizes it grows to."""

    def __init__(self, backlog: int, capacity: int = 4096):
        self.backlog, self.consumed = backlog, 0
        self.capacity, self.grown = capacity, []

    def grow(self, capacity: int) -> bool:
        if capacity <= self.capacity:
            return False
        self.capacity = capacity
        self.grown.append(capacity)
        return True

    def sample(self, batch, version, rng, max_reuse, timeout=0.0, into=None):
        self.consumed += batch
        return {"obs": np.zeros((batch, 1), np.float32)}, np.zeros(batch, np.int64)

    def stats(self):
        return SimpleNamespace(received=self.consumed + self.backlog, consumed=self.consumed, dropped_stale=0,
                               evicted_unused=0, unused=self.backlog)

    def remember(self, batch, reference_logp):
        """Nothing to keep: these tests' learners clip against the behaviour (ppo.proximal's default)."""


class Recorder:
    """Stands in for the report, the params store, the league and the store's name."""

    def __init__(self):
        self.decisions: list = []
        self.published: list[int] = []
        self.checkpoints: list[int] = []

    def update(self, updates, version, stats, staleness, decision, wait_s):
        self.decisions.append(decision)

    def version(self, version):
        pass

    def publish(self, version, tensors, meta):
        self.published.append(version)

    def prune(self, version, keep):
        pass

    def after_publish(self, version, tensors):
        pass

    def fold(self, tally):
        pass


def make_rank(rank: int, size: int, cfg, store, backlog: int = 0, sample_bytes: int = 0):
    clock = Clock()
    learner, rec = Learner(clock), Recorder()
    lead = rank == 0
    writer = BackgroundWriter(start=False) if lead else None
    loader = SimpleNamespace(failure=None, stats=SimpleNamespace(objects=1), take_tally=Tally, mark_soon=lambda: None)
    parts = Parts(learner, Buffer(backlog), loader, writer, params=rec, league=rec if lead else None, report=rec,
                  tensors=lambda: {"w": np.zeros(1, np.float32)},
                  checkpoint=lambda v: Checkpoint(v, learner.updates, {"w": np.zeros(1, np.float32)},
                                                  {"state": {}, "param_groups": []}), store=store)
    stop = StopFlag(install_signals=False)
    loop = OptimizerLoop(cfg, parts, Timing(round_s=wait_round_s(TIMEOUT_S), sample_wait_s=0.0, idle_s=0.25),
                         stop, LOG, lead, grouped=True, version=0, rng=np.random.default_rng(rank), clock=clock,
                         sample_bytes=sample_bytes)
    return SimpleNamespace(loop=loop, gen=loop.run(), clock=clock, learner=learner, rec=rec, writer=writer,
                           buffer=parts.buffer)


def in_step(ranks, tick=lambda rank, t: None) -> float:
    """Drive every rank's loop to its end in lock step; ``tick(rank, t)`` runs as a rank's clock passes ``t``.
    Returns the longest a rank waited in a collective for the others; fails once one would wait past the
    timeout (gloo raises, NCCL's watchdog kills the job)."""
    n, longest = len(ranks), 0.0
    replies: list = [None] * n
    done = [False] * n
    while not all(done):
        asked: dict[int, tuple[object, float]] = {}
        for r in reversed(range(n)):  # rank 0 last: it sees how long the others have been waiting for it
            while not done[r]:
                try:
                    request = ranks[r].gen.send(replies[r])
                except StopIteration:
                    done[r] = True
                    break
                replies[r] = None
                clock = ranks[r].clock
                if isinstance(request, Sleep):
                    clock.t += request.seconds
                elif isinstance(request, Until):
                    end = clock.t + request.timeout_s
                    while not request.ready() and clock.t < end:
                        clock.t = min(end, clock.t + 0.05)
                        tick(r, clock.t)
                else:
                    asked[r] = (request, clock.t)
                    break
                tick(r, clock.t)
                if asked and clock.t - min(t for _, t in asked.values()) > TIMEOUT_S:
                    pytest.fail(f"rank {r} kept the others waiting in a collective for more than {TIMEOUT_S}s")
        if not asked:
            continue
        assert len(asked) == n and not any(done), f"only ranks {sorted(asked)} of {n} asked for a collective"
        requests = [asked[r][0] for r in range(n)]
        arrival = max(t for _, t in asked.values())
        longest = max(longest, arrival - min(t for _, t in asked.values()))
        if isinstance(requests[0], AllReduce):  # a process group answers means; the agreement takes either
            answer = {k: math.fsum(q.values[k] for q in requests) / n for k in requests[0].values}
            replies = [dict(answer) for _ in range(n)]
        else:
            assert all(isinstance(q, AllGather) for q in requests)
            replies = [[q.blob for q in requests] for _ in range(n)]
        for rank in ranks:
            rank.clock.t = arrival
        tick(0, arrival)
    return longest


def config(*extra: str):
    return load_config(None, ["metrics.enabled=false", "optimizer.checkpoint_every=5", *extra])


@pytest.mark.parametrize("size", [2, 4])
def test_a_stuck_writer_holds_no_rank_past_the_collective_timeout(size, caplog, tmp_path):
    """The store is down for three collective timeouts from rank 0's second publish: its writer runs no job.
    Today's loop waited for room on the writer inside the round, so its peers waited in the next agreement
    past the timeout."""
    cfg = config("run.minutes=0.3", "optimizer.balance=false", "optimizer.publish_every=2")
    store = LocalStore(tmp_path)
    ranks = [make_rank(r, size, cfg, store) for r in range(size)]
    writer, outage = ranks[0].writer, {"from": None}

    def store_up(rank: int, t: float) -> None:
        """The writer runs its jobs while the store is up; the outage starts at the second publish."""
        if rank != 0:
            return
        if outage["from"] is None and len(ranks[0].rec.published) >= 1:
            outage["from"] = t
        if outage["from"] is None or t >= outage["from"] + 3 * TIMEOUT_S:
            while writer.run_next():
                pass

    with caplog.at_level(logging.INFO, logger=LOG.name):
        longest = in_step(ranks, store_up)
    writer.close()
    assert longest <= TIMEOUT_S
    updates = {rank.learner.updates for rank in ranks}
    assert len(updates) == 1 and updates.pop() > 100, "every rank trained through the outage, in step"
    lead = ranks[0]
    assert 17.9 <= lead.clock.t < 19.0, "the run ended at its time limit"
    assert lead.rec.published == list(range(1, lead.loop.version + 1)), "every version stored, in order, once"
    held = [r.getMessage() for r in caplog.records if "writer" in r.getMessage()]
    # two jobs queued behind the stuck store, then one line when a version is held and one when it is queued
    assert len(held) == 2 and "waits for rank 0's writer" in held[0] and "queued after 12s" in held[1], held
    assert checkpoint_versions(store)[-1] >= lead.loop.version - 5
    assert 3 * TIMEOUT_S - 1 <= lead.loop.held_publish_s <= 3 * TIMEOUT_S + 1


def test_every_rank_trains_rank_0s_batch_size(tmp_path):
    """Rank 0 has a large backlog and rank 1 none: today each rank's own balancer chose its own batch size."""
    cfg = config("run.minutes=0.2", "optimizer.batch_samples=32", "optimizer.max_batch_samples=256",
                 "optimizer.buffer_samples=4096", "optimizer.publish_interval_s=1.0")
    store = LocalStore(tmp_path)
    ranks = [make_rank(0, 2, cfg, store, backlog=20_000), make_rank(1, 2, cfg, store, backlog=0)]

    def writer_runs(rank: int, t: float) -> None:
        while rank == 0 and ranks[0].writer.run_next():
            pass

    in_step(ranks, writer_runs)
    a, b = (rank.learner.batches for rank in ranks)
    assert a == b and len(set(a)) > 1, "the batch changed, on every rank on the same update"
    assert max(a) > 32
    # every rank reports the decision it trains by: rank 0's, as the agreement carried it
    assert [d.batch for d in ranks[1].rec.decisions[1:]] == [d.batch for d in ranks[0].rec.decisions[:-1]]


def test_every_rank_grows_its_buffer_to_the_room_rank_0_asks_for(tmp_path, caplog):
    """Samples arrive at ~2,500/s per rank (a batch of 256 every 0.1 s), a pace takes 5 s to show: 4,096 samples
    hold under 2 s of it. Every rank grows to rank 0's room, on the same update, within max_buffer_mb."""
    cfg = config("run.minutes=0.5", "optimizer.batch_samples=256", "optimizer.max_batch_samples=256",
                 "optimizer.buffer_samples=4096", "optimizer.publish_interval_s=1.0", "optimizer.max_buffer_mb=20")
    store = LocalStore(tmp_path)
    ranks = [make_rank(r, 2, cfg, store, backlog=300, sample_bytes=1000) for r in range(2)]

    def writer_runs(rank: int, t: float) -> None:
        while rank == 0 and ranks[0].writer.run_next():
            pass

    with caplog.at_level(logging.INFO, LOG.name):
        in_step(ranks, writer_runs)
    a, b = (rank.buffer.grown for rank in ranks)
    assert a == b and a, "every rank grew, to the same sizes"
    assert 10_000 < a[-1] <= 20 * 2**20 // 1000, f"room for ~10 s of arrivals, within 20 MiB: {a}"
    assert "experience buffer grown to" in caplog.text
    cfg_fixed = config("run.minutes=0.5", "optimizer.batch_samples=256", "optimizer.max_batch_samples=256",
                       "optimizer.buffer_samples=4096", "optimizer.publish_interval_s=1.0",
                       "optimizer.pace_rollouts=false")
    ranks = [make_rank(r, 2, cfg_fixed, store, backlog=300, sample_bytes=1000) for r in range(2)]
    in_step(ranks, writer_runs)
    assert not ranks[0].buffer.grown, "without the pace the buffer keeps its size"


def test_the_agreement_carries_rank_0s_values_whether_the_collective_sums_or_averages():
    def ask(lead: bool, batch: float, backlog: float):
        return Agreement(grouped=True, lead=lead).decide(False, lead, True, lead_values={"batch": batch},
                                                         mean_values={"backlog": backlog})

    asks = [(True, 96.0, 30.0), (False, 7.0, 10.0), (False, 5.0, 20.0)]
    for scale in (1.0, 1.0 / 3):  # the collective sums (a simulation), then averages (a process group)
        gens = [ask(*a) for a in asks]
        requests = [next(g) for g in gens]
        merged = {k: scale * sum(q.values[k] for q in requests) for k in requests[0].values}
        for g in gens:
            with pytest.raises(StopIteration) as end:
                g.send(merged)
            v = end.value.value
            assert v.publish and v.everyone_ready and not v.leave
            assert v.lead_values["batch"] == pytest.approx(96.0) and v.mean_values["backlog"] == pytest.approx(20.0)


class Short(Buffer):
    """A rank's buffer with no fresh sample: it has a batch only for a draw that may reuse (``max_reuse`` > 1)."""

    def sample(self, batch, version, rng, max_reuse, timeout=0.0, into=None):
        return super().sample(batch, version, rng, max_reuse) if max_reuse > 1 else None


def test_a_rank_short_of_fresh_samples_reuses_rather_than_holding_its_peers(tmp_path):
    """Objects reach the ranks unevenly: rank 1 has none fresh while rank 0 has thousands. Today rank 1 held
    both ranks back every round; now it may reuse up to optimizer.max_reuse while the ranks' mean backlog holds a
    batch, and both train."""
    cfg = config("run.minutes=0.1", "optimizer.batch_samples=32", "optimizer.target_reuse=1.0",
                 "optimizer.max_reuse=2.0", "optimizer.publish_interval_s=1.0")
    store = LocalStore(tmp_path)
    ranks = [make_rank(0, 2, cfg, store, backlog=5_000), make_rank(1, 2, cfg, store)]
    ranks[1].loop.p.buffer = Short(backlog=0)

    def writer_runs(rank: int, t: float) -> None:
        while rank == 0 and ranks[0].writer.run_next():
            pass

    in_step(ranks, writer_runs)
    assert ranks[0].learner.updates == ranks[1].learner.updates > 20


def test_games_are_pooled_for_the_league_every_half_publish_interval_trained_or_not(tmp_path):
    """No rank has a batch (the rollouts paused), yet the games the ranks loaded reach the league every half
    publish interval. Today they were pooled only at a publish, which needs an update: not before the stop."""
    cfg = config("run.minutes=1.1", "optimizer.publish_interval_s=60.0")
    store = LocalStore(tmp_path)
    ranks = [make_rank(r, 2, cfg, store) for r in range(2)]
    folds: list[tuple[float, int]] = []
    for rank in ranks:
        rank.loop.p.buffer = Short(backlog=0)  # never a draw at target_reuse 1, and the mean backlog is 0
        rank.loop.p.loader.take_tally = lambda: Tally({"latest": [1, 0, 0]})
    ranks[0].rec.fold = lambda tally: folds.append((ranks[0].clock.t, tally.games))
    in_step(ranks)
    assert sum(r.learner.updates for r in ranks) == 0
    during = [t for t, games in folds if games and t < 60.0]
    assert during and min(during) == pytest.approx(30.0, abs=2.0), folds

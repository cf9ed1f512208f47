"""One optimizer rank's update loop: sample → agree → update → publish → league → checkpoint → balance.

The loop is an object whose clock, store, collectives, learner and background writer are given to it, and its
body is a generator of requests (:mod:`rapid.roles.steps`): :func:`rapid.roles.optimizer.run_optimizer` wires
it and drives it with threads and real time; the scale model (``benchmarks/bench_fleet.py``) drives this very
object for hundreds of ranks in simulated time, with a stand-in learner.

How :func:`rapid.roles.optimizer.run_optimizer` wires and drives it::

    parts = Parts(learner, buffer, loader, writer, params, league, report, tensors, checkpoint, store)
    loop = OptimizerLoop(cfg, parts, Timing(round_s=5.0), stop, log, lead=True, grouped=ctx is not None,
                         version=0, rng=np.random.default_rng(0))
    exit_code = drive(loop.run(), ctx, stop.wait)

Every rank runs it in lock step: one all-reduce a round (:class:`rapid.roles.lockstep.Agreement`) decides
whether to leave, publish and update, and carries rank 0's balancer decision, so every rank trains the same
batch size; no rank waits for a batch longer than ``Timing.round_s``, so its peers never wait in a collective
past NCCL's watchdog. Only rank 0 (``lead``) publishes and checkpoints, on its background writer, and never
waits for it: a version that finds the writer still busy (the store slow or down, for any length of time) is
held, and the ranks go on training and agreeing until the writer has room. A learner that stages batches
(:class:`rapid.roles.optimizer_parts.Prefetching`, the product's) draws the next batch during each update
(:meth:`OptimizerLoop._draw_ahead`), so on a GPU it is packed and copied while the update trains.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rapid.errors import FormatError
from rapid.infra.store import StoreError
from rapid.league import Tally
from rapid.optimizer.balance import Balancer, Decision, interval_mark, publish_due
from rapid.optimizer.checkpoints import save_checkpoint
from rapid.optimizer.publisher import BackgroundWriter
from rapid.roles.lockstep import Agreement, WaitNotice, balance_inputs, decision_of, decision_values
from rapid.roles.optimizer_parts import Gathering, Parts, Prefetching
from rapid.roles.optimizer_settings import balance_settings, run_progress, version_meta
from rapid.roles.steps import AllGather, Sleep, Until
from rapid.run.config import Config
from rapid.run.lease import LEASE_LOST

MAX_FAILED_IN_ROW = 50  # a bad batch is skipped; this many in a row is a broken learner, not bad data


@dataclass
class Timing:
    """How the loop waits. ``round_s``: the longest wait for a batch between two agreements. ``sample_wait_s``:
    how long one draw from the buffer may block for samples to arrive (a thread: 0.5 s on the buffer's
    condition; a simulation cannot block: 0). ``idle_s``: the pause between two draws that found nothing
    (0 where the draw itself waited)."""

    round_s: float
    sample_wait_s: float = 0.5
    idle_s: float = 0.0


class OptimizerLoop:
    def __init__(self, cfg: Config, parts: Parts, timing: Timing, stop, log, lead: bool, grouped: bool,
                 version: int, rng, clock=time, gpu: bool = False, sample_bytes: int = 0):
        """``gpu``: the learner trains on a GPU (its batch may grow larger: :func:`balance_settings`);
        ``sample_bytes``: one sample's arrays (the buffer may grow to optimizer.max_buffer_mb of them; 0: it keeps
        its size)."""
        self.cfg, self.p, self.timing, self.stop, self.log, self.lead = cfg, parts, timing, stop, log, lead
        self.clock, self.rng = clock, rng
        self.version = version
        """The newest version published (the loader reads it: experience from a later one is refused)."""
        self.agree = Agreement(grouped, lead)
        self.settings = balance_settings(cfg, gpu, sample_bytes)
        self.sample_bytes = sample_bytes
        self.balancer = Balancer(self.settings, clock.monotonic()) if lead else None
        """Rank 0's only: its decision, carried by the agreement, is every rank's."""
        self.decision = Decision(self.settings.batch, self.settings.publish_interval_s, 0.0, 0.0, 0.0, 0.0, False,
                                 self.settings.target_reuse)
        """The balancer's newest decision: rank 0's own; on the other ranks, rank 0's as the agreement carried it."""
        self.batch = self.settings.batch
        """The batch size every rank draws: rank 0's decision, adopted by all on the same iteration."""
        self.started, self.last_publish = clock.time(), clock.monotonic()
        o = cfg.optimizer
        self.pool_interval_s = o.fold_interval_s or (self.settings.publish_interval_s / 2 if o.balance else 0.0)
        """Rank 0 has the ranks pool their games for the league this often (0: at each publish)."""
        self.last_pool = clock.monotonic()
        self.peers_backlog = 0.0
        """The ranks' mean count of unused samples, as the last agreement carried it."""
        self.last_ckpt_updates = self.published_updates = parts.learner.updates
        self.deadline = self.started + 60 * cfg.run.minutes if cfg.run.minutes else math.inf
        self.failed_in_row, self.exit_code = 0, 0
        self.held: tuple[str, Callable[[], None], float] | None = None
        """Rank 0's writer job that found no room within a round (the store slow or down): its name, the job and
        when it began to wait. It is queued at the first round with room; no version is due meanwhile."""
        self.held_publish_s = 0.0
        """The longest a version waited for rank 0's writer; past a round the ranks trained and agreed meanwhile."""
        self.waiting = WaitNotice(log, parts.store.describe(), clock.monotonic())
        self.prefetching = parts.learner if isinstance(parts.learner, Prefetching) else None
        """The learner, where it draws the next batch during an update (the product's; the scale model's stand-in)."""
        self.gather = parts.learner.gather if isinstance(parts.learner, Gathering) else None
        """How a batch is taken out of the buffer: the learner's (one host copy where it stages), or the buffer's."""
        self.ahead: tuple[dict, Any] | None = None
        """The batch drawn during the last update and its staleness then: the next one to train on."""
        self.ahead_version = version

    def run(self):
        """The loop, to its end: yields requests (:mod:`rapid.roles.steps`), returns the exit code."""
        pending, t_wait = None, None  # a batch held while another rank has none yet; when the wait began
        p = self.p
        while True:
            # 1. sample: a batch of fresh experience, waiting at most a round (stops on request or limits)
            t_wait = t_wait or self.clock.monotonic()
            batch = pending or self._take_ahead() or (yield from self._wait_for_batch())
            self._check_limits()
            writer = self._lead_writer()
            if writer is not None and not self.stop:  # once stopping, a store failure is run_optimizer's to report
                writer.check()  # a job that failed ends the role here, as it would at the next submit
            self._queue_held()
            lead_values = {**decision_values(self.decision), "pool": float(self._pool_due())}
            verdict = yield from self.agree.decide(bool(self.stop), self._publish_due(), batch is not None,
                                                   lead_values=lead_values,
                                                   mean_values=balance_inputs(p.buffer.stats()))
            self.peers_backlog = verdict.mean_values.get("backlog", 0.0)
            if verdict.leave:
                self.stop.set("another rank stopped")  # no-op when this rank asked
                yield from self._finish()
                return self.exit_code
            if verdict.lead_values["pool"] > 0.5:  # league: every rank's games, pooled; rank 0 folds them off-loop
                self.last_pool = interval_mark(self.last_pool, self.clock.monotonic(), self.pool_interval_s)
                yield from self._pool_games()
            if not verdict.everyone_ready:
                pending = batch
                self.waiting.still(p.loader.stats.objects, self.clock.monotonic())
                continue
            pending = None
            self.waiting.over(self.clock.monotonic())
            arrays, staleness = batch
            wait_s, t_wait = self.clock.monotonic() - t_wait, None
            # Every rank drew this batch at self.batch; from the next draw on, all take rank 0's newest decision.
            carried = decision_of(verdict.lead_values)
            self.batch = carried.batch
            self._grow_buffer(carried)
            if not self.lead:
                self.decision = carried
            # 2. update: one bad batch is skipped, never the end of the job
            t_update = self.clock.monotonic()
            if self.prefetching is not None and not self._last_update():
                self.prefetching.prefetch(self._draw_ahead)
            try:
                stats = p.learner.update(arrays, run_progress(self.cfg, self._elapsed(), p.learner.updates))
            except Exception as e:
                if self.agree.grouped:  # the other ranks wait in this update's all-reduce: end the job instead
                    raise
                p.report.update_failed(e)
                self.failed_in_row += 1
                if self.failed_in_row >= MAX_FAILED_IN_ROW:
                    self.log.error("%d updates in a row failed (last: %s: %s); stopping the optimizer",
                                   self.failed_in_row, type(e).__name__, e)
                    self.exit_code = 1
                    return self.exit_code
                continue
            self.failed_in_row = 0
            p.buffer.remember(arrays, p.learner.reference_logp)  # ppo.proximal = "first_use"
            busy_s = self.clock.monotonic() - t_update
            if stats["skipped"]:
                p.report.skipped_nonfinite(p.learner.skipped)
                continue
            # 3. publish (rank 0, on the background writer; the loop goes on training)
            if verdict.publish:
                # the grid counts from the agreement that decided this version, not from its update's end
                self.last_publish = interval_mark(self.last_publish, t_update, self.settings.publish_interval_s)
                self.published_updates = p.learner.updates
                yield from self._publish(checkpoint=self._checkpoint_due())
                if not self.pool_interval_s:  # 4. league: the games pooled at each version (no interval of its own)
                    yield from self._pool_games()
            # 5. checkpoint (rank 0, background), when the writer has room now: the loop never waits for one
            elif self._checkpoint_due() and self.held is None and writer is not None and writer.can_submit():
                writer.submit(f"checkpoint v{self.version}", self._checkpoint_job())
            # 6. balance: rank 0 decides on the ranks' mean counts; the next agreement carries it to every rank
            if self.balancer is not None:  # rank 0's
                self.decision = self.balancer.step(self.clock.monotonic(), **verdict.mean_values, busy_s=busy_s)
            p.report.update(p.learner.updates, self.version, stats, staleness, self.decision, wait_s)

    def _grow_buffer(self, decision: Decision) -> None:
        """Every rank's buffer to the room rank 0's balancer asked for (it holds what arrives while a pace takes to
        show: :func:`rapid.optimizer.balance.buffer_wanted`)."""
        # capacity first: once grown, every decision carries the room, and grow() takes the loader's lock
        if decision.buffer > self.p.buffer.capacity and self.p.buffer.grow(decision.buffer) and self.lead:
            self.log.info("experience buffer grown to %s samples per rank (%.0f MiB): what arrives at %s samples/s "
                          "while a change of pace takes to show", f"{decision.buffer:,}",
                          decision.buffer * self.sample_bytes / 2**20, f"{decision.arrival_per_s:,.0f}")

    def _check_limits(self) -> None:
        """Ask to stop (the agreement then makes every rank leave) when the loader died or the run's budget is
        spent: its updates (the same count on every rank) or, by rank 0's clock, its minutes."""
        p = self.p
        if p.loader.failure and not self.stop:
            p.report.loader_failed(p.loader.failure)
            self.stop.set("loader thread died")
            self.exit_code = 1
        if self.cfg.run.updates and p.learner.updates >= self.cfg.run.updates:
            self.stop.set("updates")
        if self.lead and self.cfg.run.minutes and self.clock.time() >= self.deadline:
            self.stop.set("minutes")  # rank 0's clock, as for a version's publishing: the others leave with it

    def _elapsed(self) -> float:
        return self.clock.time() - self.started

    def _lead_writer(self) -> BackgroundWriter | None:
        """Rank 0's writer; None on the other ranks, which store nothing."""
        return self.p.writer if self.lead else None

    def _publish_due(self) -> bool:
        """Rank 0's view: a version is due (by time, or every ``publish_every`` updates without balancing), and
        none is held for the writer."""
        if not self.lead or self.held is not None:
            return False
        o = self.cfg.optimizer
        if o.balance:
            return publish_due(self.clock.monotonic(), self.last_publish, self.settings.publish_interval_s)
        return self.p.learner.updates + 1 - self.published_updates >= o.publish_every

    def _draw_cap(self) -> float:
        """How often a sample may be drawn: the target reuse. One rank of several that is short of fresh samples
        while the ranks hold a batch's worth on average may draw up to ``optimizer.max_reuse`` (fresh samples
        first) rather than hold every peer back a round: objects reach the ranks unevenly, and the balancer
        holds the ranks' mean reuse at the target. Where every rank is short, all wait, as one rank does."""
        target = self.settings.target_reuse
        if self.agree.grouped and self.peers_backlog >= self.batch:
            return max(target, self.cfg.optimizer.max_reuse)
        return target

    def _pool_due(self) -> bool:
        """Rank 0's view: the ranks' game tallies are due to be pooled (every ``pool_interval_s``, trained or not)."""
        return (self.lead and self.pool_interval_s > 0
                and self.clock.monotonic() - self.last_pool >= self.pool_interval_s)

    def _checkpoint_due(self) -> bool:
        return self.lead and self.p.learner.updates - self.last_ckpt_updates >= self.cfg.optimizer.checkpoint_every

    def _checkpoint_job(self):
        """A host copy of the state now, and the job that stores it."""
        p, o = self.p, self.cfg.optimizer
        ckpt = p.checkpoint(self.version)
        self.last_ckpt_updates = p.learner.updates
        # The loader notes what it has loaded at its next poll: after a kill, the resumed optimizer then never
        # loads again an object whose samples trained this checkpoint (only ones whose updates the kill discarded).
        p.loader.mark_soon()
        return lambda: self._until_stored(f"checkpoint v{ckpt.version}",
                                          lambda: save_checkpoint(p.store, ckpt, o.keep_checkpoints))

    def _draw_ahead(self) -> dict | None:
        """The next batch, drawn during this update (never waiting: None if there is none yet), at its batch size
        and version: trained after this update's publish, it may be a version staler (reported as at training)."""
        self.ahead = self.p.buffer.sample(self.batch, self.version, self.rng, self._draw_cap(), timeout=0.0,
                                          into=self.gather)
        self.ahead_version = self.version
        return None if self.ahead is None else self.ahead[0]

    def _take_ahead(self) -> tuple[dict, Any] | None:
        """The batch drawn ahead, its staleness counted at the version now."""
        ahead, self.ahead = self.ahead, None
        return None if ahead is None else (ahead[0], ahead[1] + (self.version - self.ahead_version))

    def _last_update(self) -> bool:
        """No batch is drawn ahead once stopping or for the last update of the run's budget."""
        return bool(self.stop) or bool(self.cfg.run.updates and self.p.learner.updates + 1 >= self.cfg.run.updates)

    def _wait_for_batch(self):
        """A batch, or None at the end of the round (or of the run), once asked to stop, or when the loader is
        gone."""
        p, t = self.p, self.timing
        until = min(self.deadline, self.clock.time() + t.round_s)
        while not self.stop and p.loader.failure is None and self.clock.time() < until:
            batch = p.buffer.sample(self.batch, self.version, self.rng, self._draw_cap(), timeout=t.sample_wait_s,
                                    into=self.gather)
            if batch is not None:
                return batch
            if t.idle_s:
                yield Sleep(min(t.idle_s, max(0.0, until - self.clock.time())))
        return None

    def _finish(self):
        """Leaving: the last games to the league (the last collective), then, on rank 0 alone, the held version
        and what is unpublished, so the final checkpoint holds a published version. Rank 0 may wait for room on
        its writer here: no rank waits for it any more. A writer that failed (the store down at the stop) takes
        nothing more: run_optimizer says so in one line."""
        yield from self._pool_games()
        writer = self._lead_writer()
        if writer is not None and self.stop.reason == LEASE_LOST:  # another optimizer holds the run now
            self.log.warning("another optimizer took the run's lease: %d update(s) since v%d are not published",
                             self.p.learner.updates - self.published_updates, self.version)
            return
        while writer is not None and self.held is not None and not writer.failed:
            if not self._queue_held():
                yield Until(lambda: writer.can_submit() or writer.failed, self.timing.round_s, writer.wait_for_room)
        if self.p.learner.updates > self.published_updates and not (writer is not None and writer.failed):
            yield from self._publish(wait_s=math.inf)

    def _publish(self, checkpoint: bool = False, wait_s: float | None = None):
        """Version ``self.version + 1`` (a copy of the weights) queued on rank 0's writer: the object, then LATEST,
        then the league snapshot; versions older than the newest ``optimizer.keep_versions`` are deleted. With
        ``checkpoint``, the same job then stores a checkpoint of this version, so the two are never split by a
        full writer. It waits for room at most ``wait_s`` (a round); then the job is held (:meth:`_queue_held`)."""
        self.version += 1
        version, p = self.version, self.p
        writer = self._lead_writer()
        if writer is not None:
            league = p.league
            tensors = p.tensors()
            meta = {**version_meta(self.cfg, p.learner.updates, self._elapsed()), "pace": self.decision.pace}
            keep = self.cfg.optimizer.keep_versions
            store_checkpoint = self._checkpoint_job() if checkpoint else None

            def job() -> None:
                self._until_stored(f"publishing v{version}", lambda: p.params.publish(version, tensors, meta))
                if league is not None:
                    league.after_publish(version, tensors)
                try:
                    p.params.prune(version, keep)
                except StoreError as e:  # an old version left behind costs storage only: the next prune retries
                    self.log.warning("old parameter versions not deleted yet: %s", e)
                if store_checkpoint:
                    store_checkpoint()
            yield from self._submit(writer, f"publish v{version}" + (" and checkpoint" if checkpoint else ""), job,
                                    self.timing.round_s if wait_s is None else wait_s)
        p.report.version(version)

    def _submit(self, writer: BackgroundWriter, name: str, job: Callable[[], None], wait_s: float):
        """Queue ``job`` on rank 0's ``writer``, waiting at most ``wait_s`` for room (a round: the other ranks may be
        waiting in the next collective); a job that finds none is held, and the ranks go on."""
        t0 = self.clock.monotonic()
        deadline = t0 + wait_s
        while not writer.can_submit() and self.clock.monotonic() < deadline:
            yield Until(writer.can_submit, min(self.timing.round_s, deadline - self.clock.monotonic()),
                        writer.wait_for_room)
        self.held = (name, job, t0)
        if not self._queue_held() and not writer.failed:
            self.log.warning("%s waits for rank 0's writer, still storing the last ones (%s is slow or down); "
                             "the ranks train on and no version is due until it is queued", name,
                             self.p.store.describe())

    def _queue_held(self) -> bool:
        """Queue the held job if the writer has room now (never waiting); True when nothing is held any more."""
        writer = self._lead_writer()  # a job is only ever held on rank 0
        if self.held is None or writer is None or writer.failed or not writer.can_submit():
            return self.held is None
        name, job, since = self.held
        waited = self.clock.monotonic() - since
        self.held_publish_s = max(self.held_publish_s, waited)
        if waited > self.timing.round_s:
            self.log.info("%s queued after %.0fs: the writer has room again", name, waited)
        writer.submit(name, job)
        self.held = None
        return True

    def _pool_games(self):
        """Every rank's tally of games loaded since the last call, summed on rank 0 for the league (a collective:
        every rank asks on the same iteration)."""
        mine = self.p.loader.take_tally().encode()
        blobs = (yield AllGather(mine)) if self.agree.grouped else [mine]
        if self.p.league is None or self.stop.reason == LEASE_LOST:  # the league is the new holder's to keep
            return
        tallies = []
        for rank, blob in enumerate(blobs):
            try:
                tallies.append(Tally.decode(blob))
            except FormatError as e:
                self.log.warning("rank %d's game tally is unreadable, skipped: %s", rank, e)
        self.p.league.fold(Tally.merge(tallies))

    def _until_stored(self, what: str, write) -> object:
        return until_stored(what, write, self.stop, self.log, clock=self.clock)


def until_stored(what: str, write, stop, log, first_wait_s: float = 1.0, max_wait_s: float = 30.0, clock=time):
    """Retry ``write`` through a store outage of any length, with doubling waits: botocore's own retries cover
    seconds, an outage can last minutes, and giving up would lose the version (or crash the job). It runs on
    rank 0's writer, which the update loop never waits for (a version that finds the writer busy is held, see
    :meth:`OptimizerLoop._publish_due`), so with ``run.minutes = 0`` it may retry until the role is stopped.
    Once asked to stop, the next failure is raised instead (the role then ends with one line, never hangs)."""
    wait = first_wait_s
    while True:
        try:
            return write()
        except StoreError as e:
            if stop:
                raise
            log.warning("%s failed, retrying in %.0fs: %s", what, wait, e)
        stop.wait(wait)
        wait = min(2 * wait, max_wait_s)

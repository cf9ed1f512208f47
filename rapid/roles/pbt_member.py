"""A population member's optimizer side (docs/pbt.md): where its state comes from, how it takes a leader's, and
the thread on rank 0 that decides rounds, notices its own loss and brings the other members into its league.

What ``run_optimizer`` does for a member::

    pops = open_population(cfg, log)
    pop = ensure_population(pops, cfg)
    apply_exploit(pops, pop, cfg.pbt.member, store, keep, log)      # rank 0, under the lease, before the start
    start = agree_on_start(...)                                       # loads the newest checkpoint: maybe the copy
    state = MemberState.of(start.meta, pop, cfg.pbt.member)           # its round, hyperparameters and lineage
    learner.ppo = state.ppo(cfg.ppo)
    watch = PbtWatch(pops, pop, state, cfg, League(store), stop, log); watch.keep()   # stop("exploit") on a loss

An exploit is one checkpoint: the leader's weights, Adam state and normalizer with the member's new
hyperparameters and lineage in its meta, saved as the member's next version. Until ``checkpoints/LATEST`` names
it the member is wholly itself; after, wholly the copy; a crash between the two redoes the copy.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from rapid.errors import FormatError, UsageError
from rapid.formats.checkpoint import Checkpoint
from rapid.infra.store import KeyNotFound, Store, StoreError
from rapid.league import League
from rapid.league.population import Population, decide, initial_hparams
from rapid.opt.config import PPOConfig
from rapid.optimizer.checkpoints import load_checkpoint, load_latest_checkpoint, newest_version_in_use, save_checkpoint
from rapid.roles.startup import StopFlag, open_run_store
from rapid.run.config import Config
from rapid.run.pbt_config import member_folder
from rapid.run.population import PopulationStore, hparams_now, newest_loss
from rapid.run.store_map import PARAMS_LATEST, params_key, read_version_pointer

EXPLOIT = "exploit"
"""The stop reason of a member that must take a leader's state: it exits with ``restarts.EXPLOITED``."""


def open_population(cfg: Config, log: logging.Logger) -> PopulationStore:
    """The population's store: a member's population_url, or the population's own store (pbt.member = -1)."""
    derived = cfg.derive()
    root = derived.population_url or derived.store_url
    return PopulationStore(open_run_store(cfg, url=root), lambda m: open_run_store(cfg, url=member_folder(root, m)),
                           log)


def ensure_population(pops: PopulationStore, cfg: Config, now: float | None = None) -> Population:
    """The population as stored, written from ``cfg`` by the first member to start (UsageError for a store
    that holds another population)."""
    p = cfg.pbt
    base = {k: float(getattr(cfg.ppo, k)) for k in p.search}
    proposed = Population(p.members, time.time() if now is None else now, p.interval_s, dict(p.search),
                          initial_hparams(base, p.search, p.members, np.random.default_rng(cfg.run.seed + 4099)))
    try:
        return pops.ensure(proposed)
    except FormatError as e:
        raise UsageError(f"{e}: set pbt.members and pbt.search as that population has them, or use a new run") from e


@dataclass
class MemberState:
    """What a member is now: the round its state comes from, its hyperparameters and where its weights came
    from (``[round, leader, leader's checkpoint]`` for each copy). Carried in each checkpoint's meta."""

    round: int
    hparams: dict[str, float]
    lineage: list[list[int]] = field(default_factory=list)

    @staticmethod
    def of(meta: dict, pop: Population, member: int) -> MemberState:
        """From a checkpoint's meta (a resumed member), else the population's start."""
        doc = meta.get("pbt") if isinstance(meta, dict) else None
        if isinstance(doc, dict) and isinstance(doc.get("hparams"), dict) and set(doc["hparams"]) == set(pop.search):
            return MemberState(int(doc.get("round", 0)), {k: float(v) for k, v in doc["hparams"].items()},
                               [list(map(int, step)) for step in doc.get("lineage", [])])
        return MemberState(0, dict(pop.initial[member]))

    def meta(self) -> dict:
        return {"pbt": {"round": self.round, "hparams": dict(self.hparams), "lineage": self.lineage}}

    def ppo(self, base: PPOConfig) -> PPOConfig:
        return dataclasses.replace(base, **self.hparams)  # type: ignore[arg-type]  # searched fields are floats


def apply_exploit(pops: PopulationStore, pop: Population, member: int, store: Store, keep: int,
                  log: logging.Logger) -> int | None:
    """Copy the leader of the newest round that told ``member`` to, unless its state already comes from that
    round; the version of the copy, or None. Idempotent: run it at every start, before the start point."""
    rounds = pops.rounds(pop)
    lost = newest_loss(rounds, member)
    if lost is None:
        return None
    try:
        own = load_latest_checkpoint(store)
    except FormatError:
        own = None  # the resume falls back past it; the copy below is newer than anything in use anyway
    if own is not None and MemberState.of(own.meta, pop, member).round >= lost.round:
        if pops.applied(lost.round, member) is None:  # copied, then stopped before the record
            pops.write_applied(lost.round, member, {"version": own.version, "time": time.time()})
        return None
    move = next(m for m in lost.moves if m.member == member)
    leader = pops.member_store(move.leader)
    ckpt: Checkpoint | None
    try:
        ckpt = load_checkpoint(leader, move.checkpoint)
    except (KeyNotFound, FormatError):  # retention removed it since: the leader's newest
        ckpt = load_latest_checkpoint(leader)
        if ckpt is None:
            log.warning("round %d: leader m%d has no checkpoint to copy; member m%d keeps its own state",
                        lost.round, move.leader, member)
            return None
    theirs = MemberState.of(ckpt.meta, pop, move.leader)
    mine = MemberState(lost.round, lost.hparams[member], [*theirs.lineage, [lost.round, move.leader, ckpt.version]])
    version = (newest_version_in_use(store) or 0) + 1
    save_checkpoint(store, Checkpoint(version, ckpt.updates, ckpt.model, ckpt.adam, mine.meta()), keep)
    pops.write_applied(lost.round, member, {"version": version, "leader": move.leader, "from": ckpt.version,
                                            "time": time.time()})
    log.info("round %d: took m%d's checkpoint v%d as v%d; hyperparameters %s", lost.round, move.leader,
             ckpt.version, version, mine.hparams)
    return version


class PbtWatch:
    """Rank 0's thread beside the update loop: :meth:`tick` decides the round that is due (if no member has),
    stops this member when a round tells it to copy a leader, and adds the other members' newest versions to its
    league as snapshots (``m<K>-v<version>``) every ``league.snapshot_every`` versions."""

    def __init__(self, pops: PopulationStore, pop: Population, state: MemberState, cfg: Config, league: League,
                 stop: StopFlag, log: logging.Logger, clock=time.time):
        self.pops, self.pop, self.state, self.cfg = pops, pop, state, cfg
        self.member = cfg.pbt.member
        self.league, self.stop, self.log, self.clock = league, stop, log, clock
        self.rng = np.random.default_rng(cfg.run.seed + 31 * self.member)
        self.shared: dict[int, int] = {}
        """Each other member's version this member last added to its league."""
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        rounds = self.pops.rounds(self.pop)
        due = self.pop.round_at(self.clock())
        if due >= 1 and all(r.round != due for r in rounds):
            p = self.cfg.pbt
            checkpoints = {m: v for m in range(self.pop.members) if (v := self.pops.newest_checkpoint(m)) is not None}
            proposal = decide(self.pop, due, self.clock(), self.pops.usable_fitness(self.pop, rounds),
                              hparams_now(self.pop, rounds), checkpoints, perturb=p.perturb,
                              exploit_fraction=p.exploit_fraction, min_gap_sigma=p.min_gap_sigma, rng=self.rng)
            stored = self.pops.propose(self.pop, proposal)
            if stored is not None:
                rounds.append(stored)
                self.log.info("pbt round %d: %s", stored.round, ", ".join(
                    f"m{m.member} takes m{m.leader}'s v{m.checkpoint}" for m in stored.moves) or "no moves")
        lost = newest_loss(rounds, self.member)
        if lost is not None and lost.round > self.state.round:
            self.stop.set(EXPLOIT)
            return
        self._share()

    def _share(self) -> None:
        every = self.cfg.league.snapshot_every
        if not every:
            return
        for m in range(self.pop.members):
            if m == self.member:
                continue
            other = self.pops.member_store(m)
            version = read_version_pointer(other, PARAMS_LATEST)
            if version is None or version < self.shared.get(m, -every) + every:
                continue
            member_id = f"m{m}-v{version:012d}"
            if member_id not in self.league.read_or_empty().members:
                self.league.add_snapshot_bytes(other.get(params_key(version)), member_id=member_id,
                                               max_snapshots=self.cfg.league.max_snapshots or None,
                                               keep_retired=self.cfg.league.keep_retired
                                               if self.cfg.league.keep_retired >= 0 else None)
            self.shared[m] = version

    def keep(self, period_s: float | None = None) -> None:
        """Tick on a daemon thread until the stop flag is set; a store error is logged and tried next tick."""
        period = min(10.0, self.pop.interval_s / 10) if period_s is None else period_s

        def run() -> None:
            while not self.stop.wait(period):
                try:
                    self.tick()
                except (StoreError, FormatError, KeyNotFound) as e:
                    self.log.warning("pbt: %s: %s; trying again in %.0f s", type(e).__name__, e, period)

        self._thread = threading.Thread(target=run, name="pbt-watch", daemon=True)
        self._thread.start()

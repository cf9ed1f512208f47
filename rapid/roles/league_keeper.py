"""Optimizer rank 0's league duties, on a thread of their own: snapshots every ``snapshot_every`` versions,
and the games every rank tallied folded into quality scores. Nothing here ever makes the update loop wait:
``after_publish`` and ``fold`` only hand work over; while the thread is busy (a slow store, a pool commit
that lost a race) tallies merge into one pending tally and the next commit carries them all. League trouble
is logged, never fatal to training. With ``start=False`` no thread is started and the owner calls ``step``
whenever ``has_work`` (the scale model does, in simulated time).

Usage::

    >>> import tempfile
    >>> from rapid.run.config import Config
    >>> from rapid.infra.store import LocalStore
    >>> keeper = LeagueKeeper(LocalStore(tempfile.mkdtemp()), Config())
    >>> keeper.fold(Tally({"latest": [3, 1, 0]}))        # rank 0, every fold interval, with every rank's games
    >>> keeper.close()                                    # at the end: what is pending is written
    >>> keeper.league.read().latest_games
    4
"""

from __future__ import annotations

import threading
import time

from rapid.errors import FormatError
from rapid.formats.params import ParamsObject
from rapid.infra.store import StoreError
from rapid.league import League, PoolConflict, Tally, bot_ids, ensure_bots, fold_tally
from rapid.roles.startup import setup_logging
from rapid.run.config import Config
from rapid.run.store_map import LEGACY_RESULTS_PREFIX

LEAGUE_ERRORS = (StoreError, FormatError, PoolConflict, ValueError, ArithmeticError)
RETRY_S = 5.0


class LeagueKeeper:
    def __init__(self, store, cfg: Config, start: bool = True, clock=time):
        self.league = League(store, clock=clock.time)
        self.cfg = cfg
        self.log = setup_logging("league")
        self.folded_games = 0
        self._tally = Tally()
        self._snapshots: list[ParamsObject] = []
        self._closing = False
        self._wake = threading.Condition()
        # The pool exists from the start (empty if need be): readers of a missing pool list its revisions.
        bots = bot_ids(cfg.league.bots + cfg.league.warmup_bots)
        if bots or not self.league.exists():
            self.league.update(lambda s: ensure_bots(s, bots, clock.time()))
        self._say_if_legacy_results(store)
        self._thread = threading.Thread(target=self._run, name="league", daemon=True) if start else None
        if self._thread:
            self._thread.start()

    def after_publish(self, version: int, tensors) -> None:
        """Version ``version`` is published: a snapshot joins the pool every ``snapshot_every`` versions."""
        every = self.cfg.league.snapshot_every
        if every and version % every == 0:
            with self._wake:
                self._snapshots.append(ParamsObject(version, tensors, {"source": "optimizer"}))
                self._wake.notify()

    def fold(self, tally: Tally) -> None:
        """Queue games (every rank's, pooled) for the next pool commit; returns at once."""
        if not tally.counts:
            return
        with self._wake:
            self._tally = Tally.merge([self._tally, tally])
            self._wake.notify()

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is pending (within ``timeout_s``) and stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread:
            self._thread.join(timeout_s)
        else:
            self.step()

    def has_work(self) -> bool:
        return bool(self._snapshots or self._tally.counts)

    def step(self) -> float | None:
        """Add the queued snapshots and fold the pending games in one pool commit; the seconds after which to
        try again if the commit failed (the games are kept), else None."""
        with self._wake:
            snapshots, self._snapshots = self._snapshots, []
            tally, self._tally = self._tally, Tally()
        for snapshot in snapshots:
            self._add_snapshot(snapshot)
        if tally.counts and not self._fold_now(tally):
            with self._wake:
                self._tally = Tally.merge([tally, self._tally])  # kept for the next try
            return RETRY_S
        return None

    def _run(self) -> None:
        while True:
            with self._wake:
                while not (self.has_work() or self._closing):
                    self._wake.wait()
                closing = self._closing
            retry = self.step()
            if closing:
                return
            if retry is not None:
                time.sleep(retry)

    def _add_snapshot(self, snapshot: ParamsObject) -> None:
        lg = self.cfg.league
        try:
            self.league.add_snapshot(snapshot, max_snapshots=lg.max_snapshots or None,
                                     keep_retired=lg.keep_retired if lg.keep_retired >= 0 else None)
            self.log.info("snapshot of v%d joined the pool", snapshot.version)
        except LEAGUE_ERRORS as e:
            self.log.warning("snapshot of v%d not added: %s", snapshot.version, e)

    def _fold_now(self, tally: Tally) -> bool:
        try:
            self.league.update(lambda s: fold_tally(s, tally, self.cfg.league.eta))
        except LEAGUE_ERRORS as e:
            self.log.warning("%d games not folded into the league yet: %s", tally.games, e)
            return False
        self.folded_games += tally.games
        return True

    def _say_if_legacy_results(self, store) -> None:
        """Match-result objects of an older rapid are no longer read: say so once, delete nothing."""
        try:
            left = len(store.list(LEGACY_RESULTS_PREFIX))
        except StoreError:
            return
        if left:
            self.log.warning("%s holds %d match-result object(s) of an older rapid; games now travel inside "
                             "experience objects, so these are not folded (delete the prefix to reclaim them)",
                             LEGACY_RESULTS_PREFIX, left)

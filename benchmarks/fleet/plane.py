"""Which data plane the model drives, and how each is wired: the only place that knows the APIs of rapid's
uploader, loader and league keeper, so the simulation itself is the same for both versions of the code.

``TodayPlane`` is the data plane before issue 23 (commit 7fc42d4): experience under
``experience/<worker>/``, every rank listing the whole prefix each poll, a match-results object per upload
(``ResultReporter``) folded one object at a time by rank 0's background writer (``LeagueKeeper.fold_if_due``).

``ShardedPlane`` is the data plane of issue 23: ``layout.json`` names the shard count, workers upload into
shards, each rank lists its own shards from a cursor (``ExperienceLoader`` with several downloads in flight)
and tallies the games the objects carry; at each publish the tallies are pooled across ranks
(``_pool_games``) and rank 0's ``LeagueKeeper`` folds them on a thread of its own.

Two workarounds, both because the fleet runs in one thread in simulated time:
- the loader's download pool (a ThreadPoolExecutor) is replaced by :class:`InlineDownloads`, which runs each
  download at once and charges it 1/k of its latency for k downloads in flight;
- the LeagueKeeper's thread is stopped right after it starts (``close()`` with nothing queued) and its loop
  (``LeagueKeeper._run``: take the queued snapshots and tally, add, fold, on failure keep the tally and retry
  after ``RETRY_S``) is run as a simulated actor calling the keeper's own ``_add_snapshot``/``_fold_now``.
"""

from __future__ import annotations

import functools
import inspect
import logging
from concurrent.futures import Future

from rapid.config import Config, LeagueConfig, OptimizerConfig
from rapid.loader import ExperienceLoader
from rapid.uploader import Uploader

QUIET = logging.getLogger("fleet.quiet")
QUIET.setLevel(logging.CRITICAL)  # thousands of simulated processes: failures are counted, not logged


class TodayPlane:
    name = "today (whole-prefix LIST, one results object per upload folded by rank 0)"

    def __init__(self):
        from rapid.opponents import ResultReporter
        from rapid.roles.optimizer import LeagueKeeper, _publish, _until_stored

        self._reporter, self._keeper = ResultReporter, LeagueKeeper
        self.publish, self.until_stored = _publish, _until_stored

    def start(self, fleet) -> None:
        self.fleet = fleet

    def uploader(self, store, worker: str, s) -> Uploader:
        return Uploader(store, worker, s.upload_s, s.max_backlog, on_episodes=self._reporter(store, worker))

    def loader(self, store, shape, buffer, rank: int, s, version) -> ExperienceLoader:
        return ExperienceLoader(store, shape, buffer, rank, s.ranks, s.poll_s, s.retention_s, decode_workers=0,
                                current_version=version)

    def next_wait(self, loader) -> float:
        return self.fleet.s.poll_s

    def keeper(self, store, s):
        return self._keeper(store, Config(league=LeagueConfig(snapshot_every=s.snapshot_every)))

    def after_update(self, optimizer) -> None:
        optimizer.writer.try_submit("league", optimizer.keeper.fold_if_due)  # as the update loop does

    def after_publish(self, optimizer) -> None:
        """Today the league folds from the writer after updates, not at a publish."""

    def after_writer_job(self) -> None:
        self.fleet.observe_pool()  # a fold may have committed games


class InlineDownloads:
    """The loader's download pool, run inline; ``streams`` downloads in flight overlap, so each is charged
    1/streams of its modelled latency."""

    def __init__(self, clock, streams: int):
        self.clock, self.streams = clock, max(1, streams)

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self.clock.streams = self.streams
        try:
            future.set_result(fn(*args))
        except BaseException as e:  # the loader reads it from the future, as from a pool thread
            future.set_exception(e)
        finally:
            self.clock.streams = 1
        return future

    def shutdown(self, **_) -> None:
        """Nothing runs in the background."""


class ShardedPlane:
    name = "sharded (own shards listed from a cursor, games pooled at each publish, league thread)"

    def __init__(self):
        from rapid.league import Tally
        from rapid.roles.league_keeper import RETRY_S, LeagueKeeper
        from rapid.roles.optimizer import _pool_games, _publish, _until_stored
        from rapid.store_map import read_layout, write_layout

        self._keeper, self._pool_games, self._tally, self.retry_s = LeagueKeeper, _pool_games, Tally, RETRY_S
        self.cfg = OptimizerConfig()
        # Old versions pruned after each publish (optimizer.keep_versions), where the code does it.
        keep = {"keep": self.cfg.keep_versions} if "keep" in inspect.signature(_publish).parameters else {}
        self.publish, self.until_stored = functools.partial(_publish, **keep), _until_stored
        self._read_layout, self._write_layout = read_layout, write_layout

    def start(self, fleet) -> None:
        """The optimizer writes the layout before its first version (workers wait for that version)."""
        self.fleet = fleet
        self._write_layout(fleet.store, fleet.s.shards or fleet.s.ranks)

    def uploader(self, store, worker: str, s) -> Uploader:
        return Uploader(store, worker, s.upload_s, s.max_backlog, shards=self._read_layout(store) or 1,
                        clock=self.fleet.clock.time)

    def loader(self, store, shape, buffer, rank: int, s, version) -> ExperienceLoader:
        o = self.cfg
        optional = {"mark_s": getattr(o, "mark_s", None)}  # the loader's progress marks, where the code has them
        optional = {k: v for k, v in optional.items() if k in inspect.signature(ExperienceLoader).parameters}
        loader = ExperienceLoader(store, shape, buffer, rank, s.ranks, self._read_layout(store) or 1, s.poll_s,
                                  s.retention_s, decode_workers=0, current_version=version,
                                  poll_max_s=max(s.poll_s, o.poll_max_s), lookback_s=o.list_lookback_s,
                                  sweep_s=o.sweep_s, download_threads=o.download_threads,
                                  clock=self.fleet.clock.time, **optional)
        loader.downloads = InlineDownloads(self.fleet.clock, o.download_threads)
        return loader

    def next_wait(self, loader) -> float:
        return loader.next_wait()

    def keeper(self, store, s):
        keeper = self._keeper(store, Config(league=LeagueConfig(snapshot_every=s.snapshot_every)))
        keeper.close()  # its thread ends (nothing queued yet); the simulated actor below runs its loop
        keeper._closing = False
        self._actor = self.fleet.sched.start(self.fleet.actor("league", self._league_loop(keeper)), 0.0)
        return keeper

    def _league_loop(self, keeper):
        clock = self.fleet.clock
        while True:
            with keeper._wake:
                snapshots, keeper._snapshots = keeper._snapshots, []
                tally, keeper._tally = keeper._tally, self._tally()
            if not snapshots and not tally.counts:
                yield None  # woken by after_publish
                continue
            for snapshot in snapshots:
                keeper._add_snapshot(snapshot)
            if tally.counts and not keeper._fold_now(tally):
                with keeper._wake:
                    keeper._tally = self._tally.merge([tally, keeper._tally])
                yield clock.t() + self.retry_s
                continue
            self.fleet.observe_pool()
            yield clock.t()

    def after_update(self, optimizer) -> None:
        """The league is folded at publishes only."""

    def after_writer_job(self) -> None:
        self.fleet.sched.wake(self._actor, self.fleet.clock.t())  # a publish job may have queued a snapshot

    def after_publish(self, optimizer) -> None:
        """Every rank's tally since the last version, pooled on rank 0 (the all-gather simulated), then the
        keeper's thread woken, as ``after_publish``/``fold`` notify it."""
        ranks = self.fleet.ranks

        class Gather:
            @staticmethod
            def all_gather_bytes(mine: bytes) -> list[bytes]:
                return [mine] + [r.loader.take_tally().encode() for r in ranks[1:]]

        self._pool_games(ranks[0].loader, Gather, optimizer.keeper, QUIET)
        self.fleet.sched.wake(self._actor, self.fleet.clock.t())


def detect():
    """The plane of the code on the import path."""
    try:
        import rapid.roles.league_keeper  # noqa: F401  (the sharded data plane's module)
    except ImportError:
        return TodayPlane()
    return ShardedPlane()

"""Which data plane the model drives, and how each is wired: the only place that knows the APIs of rapid's
uploader, loader and league keeper, so the simulation itself stays the same across versions of the code.

``today`` is the data plane before issue 23: experience under ``experience/<worker>/``, every rank listing the
whole prefix each poll, match results written as ``league/results/`` objects and folded one object at a time
by rank 0's background writer (``LeagueKeeper.fold_if_due``).
"""

from __future__ import annotations

import logging

from rapid.config import Config, LeagueConfig
from rapid.loader import ExperienceLoader
from rapid.uploader import Uploader

QUIET = logging.getLogger("fleet.quiet")
QUIET.setLevel(logging.CRITICAL)  # thousands of simulated processes: failures are counted, not logged


class TodayPlane:
    name = "today (whole-prefix LIST, one results object per upload folded by rank 0)"

    def __init__(self):
        from rapid.opponents import ResultReporter
        from rapid.roles.optimizer import FOLD_EVERY_S, LeagueKeeper, _publish, _until_stored

        self._reporter, self._keeper = ResultReporter, LeagueKeeper
        self.publish, self.until_stored, self.fold_every_s = _publish, _until_stored, FOLD_EVERY_S

    def uploader(self, store, worker: str, s) -> Uploader:
        return Uploader(store, worker, s.upload_s, s.max_backlog, on_episodes=self._reporter(store, worker))

    def loader(self, store, shape, buffer, rank: int, world: int, s, version) -> ExperienceLoader:
        return ExperienceLoader(store, shape, buffer, rank, world, s.poll_s, s.retention_s, decode_workers=0,
                                current_version=version)

    def keeper(self, store, s):
        cfg = Config(league=LeagueConfig(snapshot_every=s.snapshot_every))
        return self._keeper(store, cfg)

    def fold_job(self, keeper):
        """What rank 0 hands the writer after each update (``writer.try_submit("league", …)``)."""
        return keeper.fold_if_due


def detect():
    """The plane of the code on the import path."""
    return TodayPlane()

"""The league: opponent pool, opponent sampling, match results and TrueSkill ratings.

Who calls what:

- rollout worker: ``OpponentSampler.choose(rng)`` at each game start, ``load_params(id)`` for a
  snapshot opponent; its finished games go out inside its experience objects;
- optimizer ranks: a ``Tally`` of the games in the experience each loaded, pooled at each publish;
- optimizer rank 0: ``League.update(lambda s: ensure_bots(s, bots, now))`` once, then after each
  publish ``League.add_snapshot(...)`` every ``snapshot_every`` versions and
  ``League.update(lambda s: fold_tally(s, pooled, eta))``;
- evaluator / ``rapid league rate``: ``League.update(lambda s: rate_games(...))``;
- CLI: ``rapid.league.cli.build_parser`` and ``run``.

This package handles numpy arrays only (no torch), so importing it stays light.
"""

from rapid.league.pool import League
from rapid.league.ratings import conservative, rate_games, rating_of
from rapid.league.results import Tally, fold_tally
from rapid.league.sampling import LATEST, OpponentChoice, OpponentSampler
from rapid.league.state import (
                                Member,
                                PoolConflict,
                                PoolFormatError,
                                PoolMissing,
                                PoolState,
                                Rating,
                                bot_ids,
                                ensure_bots,
                                version_id,
)

__all__ = [
    "LATEST", "League", "Member", "OpponentChoice", "OpponentSampler", "PoolConflict",
    "PoolFormatError", "PoolMissing", "PoolState", "Rating", "Tally",
    "bot_ids", "conservative", "ensure_bots", "fold_tally", "rate_games", "rating_of",
    "version_id",
]

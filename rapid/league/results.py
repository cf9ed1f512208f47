"""Match results as counts: finished games travel inside the experience objects that hold their samples;
each optimizer rank tallies the games of the objects it loads, the ranks pool their tallies at each publish
(one small all-gather), and rank 0 folds the sum into the pool in one commit. No per-game objects, and no
rank reads what another rank loaded.

Usage::

    >>> from rapid.league.state import PoolState, ensure_bots
    >>> game = {"learner_version": 42, "opponent": "bot:lane", "learner_side": 0, "winner": "learner",
    ...         "length": 311, "learner_return": 1.0}           # an episode record of an experience object
    >>> mine = Tally()
    >>> mine.add([game, {**game, "opponent": "latest", "winner": "draw"}])
    >>> pooled = Tally.merge([Tally.decode(mine.encode()), Tally()])   # every rank's, after the all-gather
    >>> pooled.games, pooled.counts["bot:lane"]
    (2, [1, 0, 0])
    >>> state = fold_tally(ensure_bots(PoolState(), ["bot:lane"], 0.0), pooled, eta=0.01)   # rank 0
    >>> state.members["bot:lane"].wins, state.latest_games
    (1, 1)

The counts of a fold that rank 0 could not commit (a crash in between) are lost: they are quality-score
bookkeeping, not training data, and OpenAI Five's update is a small step per game anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rapid.errors import FormatError
from rapid.formats import codec
from rapid.league.sampling import LATEST, quality_probabilities, quality_update
from rapid.league.state import PoolState

FORMAT = "rapid.match_tally"
FORMAT_VERSION = 1
WINNERS = ("learner", "opponent", "draw")
MAX_OPPONENTS = 10_000
MAX_ID = 128
LIMITS = codec.Limits(max_bytes=4 << 20, max_array_bytes=1 << 20, max_elements=MAX_OPPONENTS)


@dataclass
class Tally:
    """Learner wins, losses and draws per opponent id (``latest``, a snapshot id or a bot id)."""

    counts: dict[str, list[int]] = field(default_factory=dict)

    @property
    def games(self) -> int:
        return sum(sum(c) for c in self.counts.values())

    def add(self, episodes: list[dict]) -> None:
        """Count decoded episode records (``rapid.formats.experience`` checked their fields)."""
        for ep in episodes:
            opponent = ep["opponent"]
            if opponent not in self.counts and len(self.counts) >= MAX_OPPONENTS:
                continue  # more distinct opponents than a pool holds: bounded, not trusted
            self.counts.setdefault(opponent, [0, 0, 0])[WINNERS.index(ep["winner"])] += 1

    def encode(self) -> bytes:
        return codec.encode(FORMAT, FORMAT_VERSION, {"counts": self.counts})

    @staticmethod
    def decode(data: bytes) -> Tally:
        """A tally from another rank; :class:`FormatError` for anything malformed."""
        tree = codec.decode(data, FORMAT, (FORMAT_VERSION,), LIMITS)
        counts = codec.require(tree, "counts", dict, "match tally")
        for opponent, row in counts.items():
            ok = isinstance(opponent, str) and 0 < len(opponent) <= MAX_ID and isinstance(row, list) and len(row) == 3
            if not ok or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 40 for n in row):
                raise FormatError(f"match tally: bad entry for {str(opponent)[:MAX_ID]!r}")
        return Tally({k: list(v) for k, v in counts.items()})

    @staticmethod
    def merge(tallies: list[Tally]) -> Tally:
        out = Tally()
        for t in tallies:
            for opponent, row in t.counts.items():
                mine = out.counts.setdefault(opponent, [0, 0, 0])
                for i, n in enumerate(row):
                    mine[i] += n
        return out


def fold_tally(state: PoolState, tally: Tally, eta: float = 0.01) -> PoolState:
    """``state`` with the tally's games counted and quality scores updated.

    For each game the learner won against snapshot i: q_i ← q_i − η/(N·p_i), with p_i the sampling
    probability among the N active snapshots *when the games were played*, i.e. before this fold, so w wins
    move q_i by w·η/(N·p_i). Recomputing p_i after each win would feed back (smaller p, larger step…) and drive
    q to −∞ within one fold; with p fixed, the expected step per fold is bounded (games against i ∝ p_i).
    Games against unknown or retired members are not credited to anyone.
    """
    state = state.clone()
    snapshots = state.snapshots()
    probabilities = quality_probabilities(snapshots)
    for opponent, (wins, losses, draws) in sorted(tally.counts.items()):
        if opponent == LATEST:
            state.latest_games += wins + losses + draws
            continue
        m = state.members.get(opponent)
        if m is None:
            continue  # a member removed since the game was played (e.g. imported over): nothing to credit
        m.games += wins + losses + draws
        m.wins, m.losses, m.draws = m.wins + wins, m.losses + losses, m.draws + draws
        if wins and m.kind == "snapshot" and m.id in probabilities:
            step = m.quality - quality_update(m.quality, probabilities[m.id], len(snapshots), eta)
            m.quality -= wins * step
    return state

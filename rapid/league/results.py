"""Match results: small objects from rollout workers, folded into the pool by optimizer rank 0.

Format ``rapid.match_results`` v1 (rapid.formats.codec envelope: name, version, checksum) holding
``{"results": [{learner_version, opponent_id, winner, length, worker, time}, …]}`` under
``league/results/<worker>/<seq:012d>.rmr``. Usage::

    >>> import tempfile
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.league.state import ensure_bots
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> writer = ResultWriter(store, "w3", clock=lambda: 0.0)      # rollout worker
    >>> writer.write([MatchResult(42, "bot:lane", "learner", 311, "w3", 0.0),
    ...               MatchResult(42, "latest", "draw", 500, "w3", 0.0)])
    'league/results/w3/000000000000.rmr'
    >>> league = League(store)
    >>> state = league.update(lambda s: ensure_bots(s, ["bot:lane"], 0.0))
    >>> folder = ResultFolder(league, eta=0.01)                     # optimizer rank 0, e.g. after each publish
    >>> folder.fold_pending()
    FoldReport(objects=1, games=2, bad_objects=0)
    >>> state = league.read()
    >>> state.members["bot:lane"].wins, state.latest_games, store.list("league/results/")
    (1, 1, [])

Folding is exactly-once across crashes: the keys of the folded objects are committed in the same pool
revision as their effect and deleted afterwards; a key already in ``folded_keys`` is never folded
again, and keys leave that list once their objects are gone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from rapid.errors import FormatError
from rapid.formats import codec
from rapid.infra.store import BadObject, InvalidKey, KeyNotFound, Store
from rapid.league.pool import League
from rapid.league.sampling import LATEST, quality_probabilities, quality_update
from rapid.league.state import PoolState
from rapid.store_map import RESULTS_PREFIX, results_key

FORMAT = "rapid.match_results"
FORMAT_VERSION = 1
WINNERS = ("learner", "opponent", "draw")
MAX_RESULTS = 100_000
LIMITS = codec.Limits(max_bytes=64 << 20, max_array_bytes=1 << 20, max_elements=MAX_RESULTS)
_FIELDS = {"learner_version": int, "opponent_id": str, "winner": str, "length": int, "worker": str,
           "time": (int, float)}


@dataclass(frozen=True)
class MatchResult:
    learner_version: int
    opponent_id: str  # "latest", a snapshot id or a bot id
    winner: str  # "learner" | "opponent" | "draw"
    length: int  # steps
    worker: str
    time: float


def _check(r: MatchResult, where: str) -> MatchResult:
    if r.learner_version < 0 or r.length < 0:
        raise FormatError(f"{where}: negative learner_version or length")
    if r.winner not in WINNERS:
        raise FormatError(f"{where}: winner {r.winner!r} is not one of {WINNERS}")
    if not r.opponent_id or len(r.opponent_id) > 128 or not r.worker or len(r.worker) > 128:
        raise FormatError(f"{where}: empty or overlong opponent_id/worker")
    if not math.isfinite(r.time):
        raise FormatError(f"{where}: non-finite time")
    return r


def encode_results(results: list[MatchResult]) -> bytes:
    if len(results) > MAX_RESULTS:
        raise ValueError(f"at most {MAX_RESULTS} results per object")
    rows = []
    for i, r in enumerate(results):
        try:
            _check(r, f"result {i}")
        except FormatError as e:  # the caller built a bad record: a programming error, not bad data
            raise ValueError(str(e)) from e
        rows.append({"learner_version": int(r.learner_version), "opponent_id": r.opponent_id,
                     "winner": r.winner, "length": int(r.length), "worker": r.worker, "time": float(r.time)})
    return codec.encode(FORMAT, FORMAT_VERSION, {"results": rows})


def decode_results(data: bytes) -> list[MatchResult]:
    """The results in an object; :class:`FormatError` for anything malformed."""
    tree = codec.decode(data, FORMAT, (FORMAT_VERSION,), LIMITS)
    rows = codec.require(tree, "results", list, "match results")
    out = []
    for i, row in enumerate(rows):
        where = f"match result {i}"
        if not isinstance(row, dict) or set(row) != set(_FIELDS):
            raise FormatError(f"{where}: expected fields {sorted(_FIELDS)}")
        values = {k: codec.require(row, k, kind, where) for k, kind in _FIELDS.items()}
        values["time"] = float(values["time"])
        out.append(_check(MatchResult(**values), where))
    return out


class ResultWriter:
    """Writes one worker's result batches. Sequence numbers start at the clock in milliseconds, so a
    restarted worker never reuses a key that rank 0 may still remember as folded."""

    def __init__(self, store: Store, worker: str, clock: Callable[[], float] = time.time):
        results_key(worker, 0)  # InvalidKey now rather than at the first write
        self.store = store
        self.worker = worker
        self.seq = int(clock() * 1000)

    def write(self, results: list[MatchResult]) -> str | None:
        """Upload a batch (nothing for an empty one); returns the key."""
        if not results:
            return None
        data = encode_results(results)
        while True:
            key = results_key(self.worker, self.seq)
            self.seq += 1
            if self.store.put_if_absent(key, data):
                return key


def fold_results(state: PoolState, results: list[MatchResult], eta: float = 0.01) -> PoolState:
    """``state`` with games and learner wins/losses/draws counted and quality scores updated.

    When the learner beats snapshot i: q_i ← q_i − η/(N·p_i), with p_i the sampling probability among
    the N active snapshots *when the batch was played*, i.e. before this fold. Recomputing p_i after each
    win would feed back (smaller p, larger step, smaller p…) and drive q to −∞ within one batch; with p
    fixed, the expected step per batch is bounded (games against i are proportional to p_i).
    Results against unknown or retired members only count as games.
    """
    state = state.clone()
    snapshots = state.snapshots()
    probabilities = quality_probabilities(snapshots)
    for r in results:
        if r.opponent_id == LATEST:
            state.latest_games += 1
            continue
        m = state.members.get(r.opponent_id)
        if m is None:
            continue  # a member removed since the game was played (e.g. imported over): nothing to credit
        m.games += 1
        if r.winner == "learner":
            m.wins += 1
            if m.kind == "snapshot" and m.id in probabilities:
                m.quality = quality_update(m.quality, probabilities[m.id], len(snapshots), eta)
        elif r.winner == "opponent":
            m.losses += 1
        else:
            m.draws += 1
    return state


@dataclass(frozen=True)
class FoldReport:
    objects: int
    games: int
    bad_objects: int


class ResultFolder:
    """Optimizer rank 0: folds every pending result object into the pool, then deletes them."""

    def __init__(self, league: League, eta: float = 0.01, max_objects: int = 10_000):
        self.league = league
        self.eta = eta
        self.max_objects = max_objects
        self.unreadable: set[str] = set()

    def fold_pending(self) -> FoldReport:
        store = self.league.store
        listed = [k for k in store.list(RESULTS_PREFIX) if k.endswith(".rmr")]
        pending: dict[str, list[MatchResult]] = {}
        bad = []
        unnamed = 0
        remembered = set(self.league.read_or_empty().folded_keys)
        for key in listed:
            if key in remembered or key in self.unreadable:
                continue
            if len(pending) >= self.max_objects:
                break
            try:
                pending[key] = decode_results(store.get(key, max_bytes=LIMITS.max_bytes))
            except KeyNotFound:
                continue
            except (InvalidKey, BadObject):
                # A file no writer could have made (an odd name, a giant, a FIFO, a link put there by hand):
                # the store refuses to read it, so count it once and never look at it again.
                self.unreadable.add(key)
                unnamed += 1
            except FormatError:
                bad.append(key)  # counted and dropped: a corrupt object would otherwise be re-read forever
        present = set(listed)

        def fold(state: PoolState) -> PoolState:
            already = set(state.folded_keys)
            fresh = [k for k in pending if k not in already]
            state = fold_results(state, [r for k in fresh for r in pending[k]], self.eta)
            # Forget keys whose objects are gone; remember the new ones until they are deleted.
            state.folded_keys = [k for k in state.folded_keys if k in present] + fresh
            return state

        if pending or remembered:
            self.league.update(fold)
        for key in [*pending, *remembered, *bad]:
            store.delete(key)
        return FoldReport(len(pending), sum(len(v) for v in pending.values()), len(bad) + unnamed)

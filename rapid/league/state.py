"""The pool's state: members, ratings, history; the pure functions that update it; and its JSON document.

Everything here is plain data and pure functions (no store): ``rapid.league.pool.League`` reads and commits
these states, sampling and result folding compute on them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field, replace

from rapid.errors import FormatError
from rapid.run.store_map import load_json

POOL_FORMAT = "rapid.league_pool"
POOL_SCHEMA = 1
HISTORY_LIMIT = 5_000

"""Rating history points kept in the pool document; the oldest go first so the document stays small."""

KINDS = ("snapshot", "bot")
SNAPSHOT_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")  # also a store key segment
VERSION_ID = re.compile(r"^v([0-9]{12})$")
BOT_ID = re.compile(r"^bot:[A-Za-z0-9_][A-Za-z0-9._-]{0,59}$")


class PoolFormatError(FormatError):
    """A pool document that is corrupt, of an unknown schema, or inconsistent."""


class PoolMissing(KeyError):
    """No pool has been committed in this store yet."""


class PoolConflict(RuntimeError):
    """An update kept losing races with other writers and gave up."""


class SnapshotConflict(PoolConflict):
    """A snapshot id already names other weights (in this pool, or this run's learner version ``v…``)."""


def version_id(version: int) -> str:
    """The id of a learner version, rated or pooled: ``v000000000042``."""
    return f"v{int(version):012d}"


def foreign_id(member_id: str, blob: bytes) -> str:
    """The id under which weights from another run join this pool: ``v…`` ids name this run's own learner
    versions, so another run's ``v000000000042`` becomes ``ext-<sha256 of its bytes, 8>-v000000000042``
    (the same on every import of the same weights, so importing twice adds nothing)."""
    return f"ext-{hashlib.sha256(blob).hexdigest()[:8]}-{member_id}"[:64]



def check_member_id(member_id: str, kind: str) -> str:
    pattern = BOT_ID if kind == "bot" else SNAPSHOT_ID
    if kind not in KINDS or not isinstance(member_id, str) or not pattern.match(member_id):
        raise ValueError(f"invalid {kind} member id {member_id!r}"
                         + (" (bots are named bot:<name>)" if kind == "bot" else ""))
    return member_id


@dataclass
class Member:
    id: str
    kind: str  # "snapshot" | "bot"
    version: int | None  # the learner version a snapshot copies; None for bots
    quality: float = 0.0
    games: int = 0
    wins: int = 0  # wins of the learner against this member
    losses: int = 0
    draws: int = 0
    pinned: bool = False  # pinned members are never retired
    retired: bool = False  # retired members stay listed but are never sampled
    added_at: float = 0.0

    @property
    def active(self) -> bool:
        return not self.retired

    def learner_win_rate(self) -> float | None:
        """The learner's score against this member (draws count half); None before any game."""
        return (self.wins + 0.5 * self.draws) / self.games if self.games else None


@dataclass(frozen=True)
class Rating:
    mu: float
    sigma: float
    games: int = 0


@dataclass(frozen=True)
class RatingPoint:
    time: float
    id: str
    mu: float
    sigma: float


@dataclass
class PoolState:
    revision: int = 0  # 0: nothing committed yet
    members: dict[str, Member] = field(default_factory=dict)
    ratings: dict[str, Rating] = field(default_factory=dict)
    history: list[RatingPoint] = field(default_factory=list)
    latest_games: int = 0  # games played against the latest policy (not a member)
    folded_keys: list[str] = field(default_factory=list)  # result objects folded, deletion pending
    updated_at: float = 0.0

    def clone(self) -> PoolState:
        """A copy that update functions may change without touching the original (cheap: no deepcopy)."""
        return replace(self, members={k: replace(m) for k, m in self.members.items()},
                       ratings=dict(self.ratings), history=list(self.history),
                       folded_keys=list(self.folded_keys))

    def snapshots(self) -> list[Member]:
        """Active snapshots, in insertion order."""
        return [m for m in self.members.values() if m.kind == "snapshot" and m.active]

    def bots(self) -> list[Member]:
        return [m for m in self.members.values() if m.kind == "bot" and m.active]

    def member(self, member_id: str) -> Member:
        try:
            return self.members[member_id]
        except KeyError:
            raise KeyError(f"no league member {member_id!r}") from None


# --- pure update functions --------------------------------------------------------------------------

def joining_quality(state: PoolState) -> float:
    """A new snapshot's quality: the pool's maximum (0 for an empty pool), as OpenAI Five."""
    return max((m.quality for m in state.snapshots()), default=0.0)


def add_member(state: PoolState, member: Member) -> PoolState:
    """``state`` with ``member`` added; re-adding the same id is a no-op (retries are idempotent)."""
    check_member_id(member.id, member.kind)
    if member.id in state.members:
        return state
    state = state.clone()
    state.members[member.id] = member
    return state


def bot_ids(names: list[str]) -> list[str]:
    """The pool ids of the config's bot names: 'random' and 'bot:random' both name 'bot:random'.

    >>> bot_ids(["random", "bot:lookahead"])
    ['bot:random', 'bot:lookahead']
    """
    return [n if n.startswith("bot:") else f"bot:{n}" for n in names]


def ensure_bots(state: PoolState, bots: list[str], now: float) -> PoolState:
    """Scripted bots from the config join the pool (quality 0) if they are not members yet."""
    for name in bots:
        state = add_member(state, Member(id=name, kind="bot", version=None, added_at=now))
    return state


def set_flag(state: PoolState, member_id: str, *, pinned: bool | None = None,
             retired: bool | None = None) -> PoolState:
    """Pin/unpin or retire/restore one member; KeyError for unknown ids, ValueError to retire a pinned one."""
    state = state.clone()
    m = state.member(member_id)
    if pinned is not None:
        m.pinned = pinned
    if retired is not None:
        if retired and m.pinned:
            raise ValueError(f"{member_id} is pinned; unpin it before retiring it")
        m.retired = retired
    return state


def retire_overflow(state: PoolState, max_snapshots: int | None) -> PoolState:
    """Retire the lowest-quality unpinned snapshots until at most ``max_snapshots`` are active."""
    if max_snapshots is None:
        return state
    state = state.clone()
    candidates = sorted((m for m in state.snapshots() if not m.pinned), key=lambda m: (m.quality, m.added_at))
    for m in candidates[:max(0, len(state.snapshots()) - max_snapshots)]:
        m.retired = True
    return state


def forget_retired(state: PoolState, keep_retired: int, keep_ratings: int) -> tuple[PoolState, list[str]]:
    """The pool without its oldest retired, unpinned snapshots beyond ``keep_retired`` (their ratings go too),
    and without ratings of non-members beyond the newest ``keep_ratings`` ids: a long run's pool document
    stops growing. Returns the forgotten member ids (their snapshot objects can go once this is committed)."""
    state = state.clone()
    retired = sorted((m for m in state.members.values() if m.kind == "snapshot" and m.retired and not m.pinned),
                     key=lambda m: m.added_at)
    forgotten = [m.id for m in retired[:max(0, len(retired) - keep_retired)]]
    for member_id in forgotten:
        del state.members[member_id]
        state.ratings.pop(member_id, None)
    others = sorted(k for k in state.ratings if k not in state.members)  # v… ids sort by version
    for rating_id in others[:max(0, len(others) - keep_ratings)]:
        del state.ratings[rating_id]
    gone = set(forgotten)
    state.history = [p for p in state.history if p.id not in gone]
    return state, forgotten


# --- the document -----------------------------------------------------------------------------------

def dump_pool(state: PoolState) -> bytes:
    """The state's document; PoolFormatError (and no bytes) for one that :func:`load_pool` would refuse."""
    doc = {
        "format": POOL_FORMAT,
        "schema": POOL_SCHEMA,
        "revision": state.revision,
        "updated_at": state.updated_at,
        "latest_games": state.latest_games,
        "members": [asdict(m) for m in state.members.values()],
        "ratings": {k: [r.mu, r.sigma, r.games] for k, r in state.ratings.items()},
        "history": [[p.time, p.id, p.mu, p.sigma] for p in state.history],
        "folded_keys": list(state.folded_keys),
    }
    _state(doc, "pool document to write")  # the reader's rules, on the document as JSON will carry it
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


_NUM = (int, float)
_MEMBER_FIELDS = {"id": str, "kind": str, "version": (int, type(None)), "quality": _NUM, "games": int,
                  "wins": int, "losses": int, "draws": int, "pinned": bool, "retired": bool,
                  "added_at": _NUM}


def _typed(value, kind, where: str):
    # bool is an int subclass: accept it only where a bool is asked for.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise PoolFormatError(f"{where} has type {type(value).__name__}")
    # What load_json refuses, refused here too, so that a writer checking its document refuses it.
    if isinstance(value, float) and not math.isfinite(value) or isinstance(value, int) and abs(value) >= 1 << 63:
        raise PoolFormatError(f"{where} is out of range")
    return value


def load_pool(data: bytes, where: str = "pool document") -> PoolState:
    """Parse and validate a pool document; :class:`PoolFormatError` for anything wrong."""
    try:
        doc = load_json(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PoolFormatError(f"{where}: not JSON ({e})") from e
    return _state(doc, where)


def _state(doc, where: str) -> PoolState:
    if not isinstance(doc, dict) or doc.get("format") != POOL_FORMAT:
        raise PoolFormatError(f"{where}: not a {POOL_FORMAT} document")
    if doc.get("schema") != POOL_SCHEMA:
        raise PoolFormatError(f"{where}: schema {doc.get('schema')!r} not supported (expected {POOL_SCHEMA})")
    try:
        members = {}
        for i, raw in enumerate(_typed(doc["members"], list, f"{where}: members")):
            _typed(raw, dict, f"{where}: member {i}")
            if set(raw) != set(_MEMBER_FIELDS):
                raise PoolFormatError(f"{where}: member {i} has fields {sorted(raw)}")
            for name, kind in _MEMBER_FIELDS.items():
                _typed(raw[name], kind, f"{where}: member {i} {name}")
            m = Member(**raw)
            check_member_id(m.id, m.kind)
            if m.id in members or min(m.games, m.wins, m.losses, m.draws) < 0:
                raise PoolFormatError(f"{where}: member {m.id!r} is duplicated or has negative counts")
            members[m.id] = m
        ratings = {}
        for k, v in _typed(doc["ratings"], dict, f"{where}: ratings").items():
            if not (isinstance(k, str) and isinstance(v, list) and len(v) == 3):
                raise PoolFormatError(f"{where}: rating of {k!r} is not [mu, sigma, games]")
            ratings[k] = Rating(float(_typed(v[0], _NUM, f"{where}: mu of {k!r}")),
                                float(_typed(v[1], _NUM, f"{where}: sigma of {k!r}")),
                                _typed(v[2], int, f"{where}: games of {k!r}"))
        history = []
        for p in _typed(doc["history"], list, f"{where}: history"):
            if not (isinstance(p, list) and len(p) == 4):
                raise PoolFormatError(f"{where}: history point is not [time, id, mu, sigma]")
            history.append(RatingPoint(float(_typed(p[0], _NUM, f"{where}: history time")),
                                       _typed(p[1], str, f"{where}: history id"),
                                       float(_typed(p[2], _NUM, f"{where}: history mu")),
                                       float(_typed(p[3], _NUM, f"{where}: history sigma"))))
        folded = _typed(doc["folded_keys"], list, f"{where}: folded_keys")
        for k in folded:
            _typed(k, str, f"{where}: folded key")
        return PoolState(revision=_typed(doc["revision"], int, f"{where}: revision"),
                         members=members, ratings=ratings, history=history,
                         latest_games=_typed(doc["latest_games"], int, f"{where}: latest_games"),
                         folded_keys=folded,
                         updated_at=float(_typed(doc["updated_at"], _NUM, f"{where}: updated_at")))
    except KeyError as e:
        raise PoolFormatError(f"{where}: missing {e.args[0]!r}") from e
    except ValueError as e:  # a bad member id; PoolFormatError is a ValueError and passes unchanged
        if isinstance(e, PoolFormatError):
            raise
        raise PoolFormatError(f"{where}: {e}") from e

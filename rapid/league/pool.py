"""The opponent pool: members, the pool document in the store, and conflict-free updates (SPEC §6).

Usage::

    league = League(store)
    league.update(lambda s: ensure_bots(s, ["bot:random"], now))   # rank 0 at start; creates the pool
    league.add_snapshot_from_params(42)              # immutable copy of params/000000000042.rpm joins
    state = league.update(lambda s: fold_results(s, results))      # read, apply a pure function, commit
    state = league.read()                            # PoolState; PoolMissing before the first commit
    obj = league.load_snapshot("v000000000042")      # the snapshot's ParamsObject

Store layout. Every committed state is a new object ``league/pool/<revision:012d>.json`` written with
``put_if_absent``, the only atomic primitive both the local store and S3 give: two writers that read the
same revision cannot both commit revision+1, so the loser re-reads and re-applies its (pure) update
function and no update is lost. ``league/pool.json`` is a copy of a recent revision (the pointer) for
humans and for reads that cost one GET; it may lag behind a crashed or slow writer, so readers probe
forward from it. Revisions older than ``keep_revisions`` behind the head are deleted.

Snapshots are copies of a parameter object's bytes under ``league/snapshots/<id>.rpm``, never aliases
of ``params/``: retention of ``params/`` or changes to live arrays cannot alter them.

Ratings live in one table keyed by id (``PoolState.ratings``), not inside members: learner versions
that never join the pool are rated too, and a snapshot ``v000000000042`` shares the rating of the
learner version 42 it copies.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from rapid.errors import FormatError
from rapid.infra.store import KeyNotFound, Store
from rapid.params import ParameterStore, ParamsObject, decode_params, encode_params, params_key

POOL_FORMAT = "rapid.league_pool"
POOL_SCHEMA = 1
POINTER_KEY = "league/pool.json"
REVISIONS_PREFIX = "league/pool/"
SNAPSHOTS_PREFIX = "league/snapshots/"
HISTORY_LIMIT = 20_000
"""Rating history points kept in the pool document; the oldest go first so the document stays small."""

KINDS = ("snapshot", "bot")
_SNAPSHOT_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")  # also a store key segment
_VERSION_ID = re.compile(r"^v([0-9]{12})$")
_BOT_ID = re.compile(r"^bot:[A-Za-z0-9_][A-Za-z0-9._-]{0,59}$")


class PoolFormatError(FormatError):
    """A pool document that is corrupt, of an unknown schema, or inconsistent."""


class PoolMissing(KeyError):
    """No pool has been committed in this store yet."""


class PoolConflict(RuntimeError):
    """An update kept losing races with other writers and gave up."""


def version_id(version: int) -> str:
    """The id of a learner version, rated or pooled: ``v000000000042``."""
    return f"v{int(version):012d}"


def revision_key(revision: int) -> str:
    return f"{REVISIONS_PREFIX}{revision:012d}.json"


def snapshot_key(member_id: str) -> str:
    return f"{SNAPSHOTS_PREFIX}{member_id}.rpm"


def check_member_id(member_id: str, kind: str) -> str:
    pattern = _BOT_ID if kind == "bot" else _SNAPSHOT_ID
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


# --- the document -----------------------------------------------------------------------------------

def dump_pool(state: PoolState) -> bytes:
    doc = {
        "format": POOL_FORMAT,
        "schema": POOL_SCHEMA,
        "revision": state.revision,
        "updated_at": state.updated_at,
        "latest_games": state.latest_games,
        "members": [asdict(m) for m in state.members.values()],
        "ratings": {k: [r.mu, r.sigma, r.games] for k, r in state.ratings.items()},
        "history": [[p.time, p.id, p.mu, p.sigma] for p in state.history],
        "folded_keys": state.folded_keys,
    }
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


_NUM = (int, float)
_MEMBER_FIELDS = {"id": str, "kind": str, "version": (int, type(None)), "quality": _NUM, "games": int,
                  "wins": int, "losses": int, "draws": int, "pinned": bool, "retired": bool,
                  "added_at": _NUM}


def _typed(value, kind, where: str):
    # bool is an int subclass: accept it only where a bool is asked for.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise PoolFormatError(f"{where} has type {type(value).__name__}")
    return value


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")  # NaN or ±Infinity would poison sampling


def load_pool(data: bytes, where: str = "pool document") -> PoolState:
    """Parse and validate a pool document; :class:`PoolFormatError` for anything wrong."""
    try:
        doc = json.loads(data, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PoolFormatError(f"{where}: not JSON ({e})") from e
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
            if not (isinstance(v, list) and len(v) == 3):
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


# --- the store-backed pool --------------------------------------------------------------------------

class League:
    """The pool in a store: read the head revision, commit updates with optimistic concurrency."""

    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time, keep_revisions: int = 64,
                 max_attempts: int = 200):
        self.store = store
        self.clock = clock
        self.keep_revisions = keep_revisions
        self.max_attempts = max_attempts

    def exists(self) -> bool:
        return self._head() is not None

    def read(self) -> PoolState:
        state = self._head()
        if state is None:
            raise PoolMissing(f"no league pool in {self.store.describe()} ({POINTER_KEY} is missing)")
        return state

    def read_or_empty(self) -> PoolState:
        return self._head() or PoolState()

    def update(self, fn: Callable[[PoolState], PoolState]) -> PoolState:
        """Apply ``fn`` to the head state and commit it as the next revision; re-apply on conflict.

        ``fn`` must be a pure function of the state it is given (it may run several times); exceptions
        it raises propagate and nothing is committed.
        """
        use_listing = False
        for attempt in range(self.max_attempts):
            base = self._head(use_listing=use_listing) or PoolState()
            new = replace(fn(base.clone()), revision=base.revision + 1, updated_at=self.clock())
            blob = dump_pool(new)
            if not self.store.put_if_absent(revision_key(new.revision), blob):
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # jitter: racing writers spread out
                continue
            if base.revision and not self.store.exists(revision_key(base.revision)):
                # Our base revision was already garbage-collected (we read a pointer that lagged far
                # behind), so revision+1 was a deleted hole, not the head: undo and re-read by listing.
                self.store.delete(revision_key(new.revision))
                use_listing = True
                continue
            self.store.put(POINTER_KEY, blob)
            if new.revision % 16 == 0:
                self._collect(new.revision)
            return new
        raise PoolConflict(f"league pool update lost {self.max_attempts} races in a row")

    def _head(self, use_listing: bool = False) -> PoolState | None:
        state = None
        if not use_listing:
            try:
                state = load_pool(self.store.get(POINTER_KEY), POINTER_KEY)
            except KeyNotFound:
                pass
            except PoolFormatError:
                state = None  # a damaged pointer is only a cache: fall back to the revisions
        if state is None:
            revisions = self._revisions()
            if not revisions:
                return None
            state = self._load_revision(revisions[-1], self.store.get(revision_key(revisions[-1])))
        # The pointer may lag (a writer died before updating it, or a slow one rewrote an older copy).
        while True:
            try:
                blob = self.store.get(revision_key(state.revision + 1))
            except KeyNotFound:
                return state
            state = self._load_revision(state.revision + 1, blob)

    @staticmethod
    def _load_revision(revision: int, blob: bytes) -> PoolState:
        state = load_pool(blob, revision_key(revision))
        if state.revision != revision:
            raise PoolFormatError(f"{revision_key(revision)} holds revision {state.revision}")
        return state

    def _revisions(self) -> list[int]:
        out = []
        for key in self.store.list(REVISIONS_PREFIX):
            name = key[len(REVISIONS_PREFIX):]
            if name.endswith(".json") and name[:-5].isdigit():
                out.append(int(name[:-5]))
        return sorted(out)

    def _collect(self, head: int) -> None:
        for rev in self._revisions():
            if rev < head - self.keep_revisions:
                self.store.delete(revision_key(rev))

    # --- snapshots ----------------------------------------------------------------------------------

    def add_snapshot_from_params(self, version: int, *, member_id: str | None = None, pinned: bool = False,
                                 max_snapshots: int | None = None) -> Member:
        """Copy a published params version into the pool (quality = the pool's maximum)."""
        blob = self.store.get(params_key(version))  # KeyNotFound if it was never published
        return self.add_snapshot_bytes(blob, member_id=member_id, pinned=pinned, max_snapshots=max_snapshots)

    def add_snapshot(self, obj: ParamsObject, *, member_id: str | None = None, pinned: bool = False,
                     max_snapshots: int | None = None) -> Member:
        """Snapshot in-memory weights (encoding copies them, so later changes to the arrays don't leak)."""
        return self.add_snapshot_bytes(encode_params(obj), member_id=member_id, pinned=pinned,
                                       max_snapshots=max_snapshots)

    def add_snapshot_bytes(self, blob: bytes, *, member_id: str | None = None, pinned: bool = False,
                           max_snapshots: int | None = None) -> Member:
        """Store an encoded params object as a snapshot, then commit the member (in that order, so a
        crash in between leaves only an unreferenced object, never a member without weights)."""
        obj = decode_params(blob)  # FormatError for anything that is not a valid params object
        member_id = check_member_id(member_id or version_id(obj.version), "snapshot")
        key = snapshot_key(member_id)
        if not self.store.put_if_absent(key, bytes(blob)) and self.store.get(key) != bytes(blob):
            raise FileExistsError(f"snapshot {member_id} already exists with different weights")
        now = self.clock()

        def join(state: PoolState) -> PoolState:
            state = add_member(state, Member(id=member_id, kind="snapshot", version=obj.version,
                                             quality=joining_quality(state), pinned=pinned, added_at=now))
            return retire_overflow(state, max_snapshots)

        return self.update(join).members[member_id]

    def load_snapshot(self, member_id: str) -> ParamsObject:
        return decode_params(self.store.get(snapshot_key(check_member_id(member_id, "snapshot"))))

    def load_policy(self, rated_id: str) -> ParamsObject:
        """Weights for an id an evaluator plays: a snapshot member, or ``v…`` of any published version."""
        if _SNAPSHOT_ID.match(rated_id) and self.store.exists(snapshot_key(rated_id)):
            return self.load_snapshot(rated_id)
        match = _VERSION_ID.match(rated_id)
        if match is None:
            raise KeyNotFound(rated_id)
        return ParameterStore(self.store).fetch(int(match.group(1)))

    def snapshot_bytes(self, member_id: str) -> bytes:
        return self.store.get(snapshot_key(check_member_id(member_id, "snapshot")))


"""The opponent pool in the store: the pool document's revisions, snapshots, and conflict-free updates
(docs/architecture.md). The state itself and its pure updates are in ``rapid.league.state``.

Usage::

    >>> import tempfile
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.league.results import Tally, fold_tally
    >>> from rapid.league.state import ensure_bots
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> ParameterStore(store).publish(42, {"w": np.zeros(2, np.float32)})
    >>> league = League(store, clock=lambda: 0.0)
    >>> league.read()                                # PoolMissing before the first commit
    Traceback (most recent call last):
    rapid.league.state.PoolMissing: ...
    >>> state = league.update(lambda s: ensure_bots(s, ["bot:random"], 0.0))   # rank 0 at start; creates the pool
    >>> league.add_snapshot_from_params(42).id      # immutable copy of params/000000000042.rpm joins
    'v000000000042'
    >>> games = Tally({"v000000000042": [1, 0, 0]})   # one win of the learner against the snapshot
    >>> state = league.update(lambda s: fold_tally(s, games))          # read, apply a pure function, commit
    >>> state = league.read()                        # PoolState
    >>> state.revision, sorted(state.members), state.members["v000000000042"].wins
    (3, ['bot:random', 'v000000000042'], 1)
    >>> league.load_snapshot("v000000000042").version   # the snapshot's ParamsObject
    42

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

import random
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from rapid.formats.params import ParamsObject, decode_params, encode_params
from rapid.infra.store import KeyNotFound, Store
from rapid.league.state import (
    SNAPSHOT_ID,
    VERSION_ID,
    Member,
    PoolConflict,
    PoolFormatError,
    PoolMissing,
    PoolState,
    SnapshotConflict,
    add_member,
    check_member_id,
    dump_pool,
    forget_retired,
    joining_quality,
    load_pool,
    retire_overflow,
    version_id,
)
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import (
    POOL_POINTER,
    POOL_REVISIONS_PREFIX,
    params_key,
    parse_pool_revision_key,
    pool_revision_key,
    snapshot_key,
)

KEEP_RATINGS = 1_000
"""Ratings kept of ids outside the pool (learner versions the evaluator rated), newest first."""

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
            raise PoolMissing(f"no league pool in {self.store.describe()} ({POOL_POINTER} is missing)")
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
            if not self.store.put_if_absent(pool_revision_key(new.revision), blob):
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # jitter: racing writers spread out
                continue
            if base.revision and not self.store.exists(pool_revision_key(base.revision)):
                # Our base revision was already garbage-collected (we read a pointer that lagged far
                # behind), so revision+1 was a deleted hole, not the head: undo and re-read by listing.
                self.store.delete(pool_revision_key(new.revision))
                use_listing = True
                continue
            self.store.put(POOL_POINTER, blob)
            if new.revision % 16 == 0:
                self._collect(new.revision)
            return new
        raise PoolConflict(f"league pool update lost {self.max_attempts} races in a row")

    def _head(self, use_listing: bool = False) -> PoolState | None:
        state = None
        if not use_listing:
            try:
                state = load_pool(self.store.get(POOL_POINTER), POOL_POINTER)
            except KeyNotFound:
                pass
            except PoolFormatError:
                state = None  # a damaged pointer is only a cache: fall back to the revisions
        if state is None:
            revisions = self._revisions()
            if not revisions:
                return None
            state = self._load_revision(revisions[-1], self.store.get(pool_revision_key(revisions[-1])))
        # The pointer may lag (a writer died before updating it, or a slow one rewrote an older copy).
        while True:
            try:
                blob = self.store.get(pool_revision_key(state.revision + 1))
            except KeyNotFound:
                return state
            state = self._load_revision(state.revision + 1, blob)

    @staticmethod
    def _load_revision(revision: int, blob: bytes) -> PoolState:
        state = load_pool(blob, pool_revision_key(revision))
        if state.revision != revision:
            raise PoolFormatError(f"{pool_revision_key(revision)} holds revision {state.revision}")
        return state

    def _revisions(self) -> list[int]:
        return sorted(r for r in map(parse_pool_revision_key, self.store.list(POOL_REVISIONS_PREFIX)) if r is not None)

    def _collect(self, head: int) -> None:
        for rev in self._revisions():
            if rev < head - self.keep_revisions:
                self.store.delete(pool_revision_key(rev))

    # --- snapshots ----------------------------------------------------------------------------------

    def add_snapshot_from_params(self, version: int, *, member_id: str | None = None, pinned: bool = False,
                                 max_snapshots: int | None = None) -> Member:
        """Copy a published params version into the pool (quality = the pool's maximum)."""
        blob = self.store.get(params_key(version))  # KeyNotFound if it was never published
        return self.add_snapshot_bytes(blob, member_id=member_id, pinned=pinned, max_snapshots=max_snapshots)

    def add_snapshot(self, obj: ParamsObject, *, member_id: str | None = None, pinned: bool = False,
                     max_snapshots: int | None = None, keep_retired: int | None = None) -> Member:
        """Snapshot in-memory weights (encoding copies them, so later changes to the arrays don't leak)."""
        return self.add_snapshot_bytes(encode_params(obj), member_id=member_id, pinned=pinned,
                                       max_snapshots=max_snapshots, keep_retired=keep_retired)

    def add_snapshot_bytes(self, blob: bytes, *, member_id: str | None = None, pinned: bool = False,
                           max_snapshots: int | None = None, keep_retired: int | None = None) -> Member:
        """Store an encoded params object as a snapshot, then commit the member (in that order, so a
        crash in between leaves only an unreferenced object, never a member without weights). With
        ``keep_retired``, the same commit forgets the oldest retired snapshots beyond it
        (``state.forget_retired``), whose objects are deleted after the commit."""
        obj = decode_params(blob)  # FormatError for anything that is not a valid params object
        member_id = check_member_id(member_id or version_id(obj.version), "snapshot")
        self._check_learner_id(member_id, obj)
        key = snapshot_key(member_id)
        if not self.store.put_if_absent(key, bytes(blob)) and self.store.get(key) != bytes(blob):
            raise SnapshotConflict(f"snapshot {member_id} already exists with different weights")
        now = self.clock()

        forgotten: list[str] = []

        def join(state: PoolState) -> PoolState:
            state = add_member(state, Member(id=member_id, kind="snapshot", version=obj.version,
                                             quality=joining_quality(state), pinned=pinned, added_at=now))
            state = retire_overflow(state, max_snapshots)
            if keep_retired is not None:
                state, forgotten[:] = forget_retired(state, keep_retired, KEEP_RATINGS)  # the committed run's
            return state

        member = self.update(join).members[member_id]
        for old in forgotten:
            self.store.delete(snapshot_key(old))
        return member

    def is_learner_version(self, member_id: str, obj: ParamsObject) -> bool:
        """True when ``member_id`` is ``v<N>`` and ``obj`` holds the weights this run published as version N."""
        match = VERSION_ID.match(member_id)
        if match is None or obj.version != int(match.group(1)):
            return False
        try:
            published = ParameterStore(self.store).fetch(obj.version).tensors
        except KeyNotFound:
            return False
        return published.keys() == obj.tensors.keys() and all(
            np.array_equal(published[k], obj.tensors[k]) for k in published)

    def _check_learner_id(self, member_id: str, obj: ParamsObject) -> None:
        """``v<N>`` is the evaluator's name for this run's version N: only those weights may take it."""
        if VERSION_ID.match(member_id) and not self.is_learner_version(member_id, obj):
            raise SnapshotConflict(f"{member_id} names this run's learner version, and these weights are not "
                                   "it (give the snapshot another id)")

    def load_snapshot(self, member_id: str) -> ParamsObject:
        return decode_params(self.store.get(snapshot_key(check_member_id(member_id, "snapshot"))))

    def load_policy(self, rated_id: str) -> ParamsObject:
        """Weights for an id an evaluator plays: a snapshot member, or ``v…`` of any published version."""
        if SNAPSHOT_ID.match(rated_id) and self.store.exists(snapshot_key(rated_id)):
            return self.load_snapshot(rated_id)
        match = VERSION_ID.match(rated_id)
        if match is None:
            raise KeyNotFound(rated_id)
        return ParameterStore(self.store).fetch(int(match.group(1)))

    def snapshot_bytes(self, member_id: str) -> bytes:
        return self.store.get(snapshot_key(check_member_id(member_id, "snapshot")))


"""The map of a run's store: every key and pointer the roles use to talk to each other.

The roles share no memory and no sockets; everything between them goes through these keys::

    rollout worker ──put──▶ experience/s<shard:04d>/<ms:013d>-<worker>-<incarnation>-<seq:08d>.rxp
                                  ──list (from a cursor, own shards only)/get──▶ optimizer loader
          ▲                                                                                  │ (buffer, learner)
          └──get── params/<version:012d>.rpm ◀──put_if_absent── optimizer rank 0 ◀────────────┘
                   params/LATEST (pointer, moved after the version object exists)
                   checkpoints/<version:012d>.rck, checkpoints/LATEST   (optimizer rank 0; --resume)
    finished games ride inside experience objects; each rank tallies its share, rank 0 folds the pooled counts
    optimizer rank 0 ──put_if_absent──▶ layout.json (how many experience shards the run has; read by workers)
    optimizer ranks ──put──▶ loader/s<shard>-<i>of<n>.json (what is loaded: a restarted rank skips it)
    optimizer rank 0, evaluator, `rapid league` ──▶ league/pool.json (pointer copy of the newest revision)
                                                    league/pool/<revision:012d>.json (put_if_absent: the lock)
                                                    league/snapshots/<member>.rpm (immutable copies of params)
    optimizer rank 0 ──put_if_absent──▶ optimizer/lease/<epoch:012d>.json (who owns the run, until when)
    population-based training (docs/pbt.md): each member is a run under members/m<K>/; every member's optimizer
    rank 0 ──put_if_absent──▶ pbt/population.json, pbt/rounds/<round:06d>.json (the round's decision: the lock)
    a member's evaluator ──put──▶ pbt/fitness/m<K>.json;  a member that copied ──put──▶ pbt/applied/<round>-m<K>.json
    `rapid surgery` ──▶ surgery/<version:012d>/… (staged objects), surgery/<version:012d>.json (put_if_absent: the
                        commit), surgery/<version:012d>.done (every pointer moved; read by --resume)

Formats (``rapid.formats``) encode and decode the objects; this module names where they live and reads and
writes the ``LATEST`` pointers.

Usage::

    >>> params_key(7)
    'params/000000000007.rpm'
    >>> experience_key(shard=5, created_ms=1700000000123, worker="w0", incarnation="a1b2", seq=3)
    'experience/s0005/1700000000123-w0-a1b2-00000003.rxp'
    >>> shard_owner(5, world=4), owned_shards(rank=1, world=4, shards=8)
    (1, [1, 5])
    >>> parse_params_key("params/000000000007.rpm"), parse_params_key("params/\u00b2\u00b3.rpm")
    (7, None)

Every name that carries a number is parsed here with ASCII-only patterns: ``str.isdigit`` and ``\\d`` accept
Unicode digits (``²``, ``٣``), which ``int`` then rejects or, worse, reads as a different version.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid

from rapid.errors import FormatError
from rapid.infra.store import KeyNotFound, Store, validate_key

EXPERIENCE_PREFIX = "experience/"
MAX_SHARDS = 65_536
PARAMS_PREFIX = "params/"
PARAMS_LATEST = "params/LATEST"
CHECKPOINTS_PREFIX = "checkpoints/"
CHECKPOINTS_LATEST = "checkpoints/LATEST"
POOL_POINTER = "league/pool.json"
POOL_REVISIONS_PREFIX = "league/pool/"
SNAPSHOTS_PREFIX = "league/snapshots/"
LEGACY_RESULTS_PREFIX = "league/results/"
"""Match-result objects of rapid before the sharded layout: no longer written or folded."""
LAYOUT = "layout.json"
RUN_OWNER = "owner.json"
"""Which run a store holds (its name and game), written once by the first optimizer: rapid/run/run_owner.py."""
LOADER_MARKS_PREFIX = "loader/"
MAX_MARK_BYTES = 1 << 20
LEASE_PREFIX = "optimizer/lease/"
SURGERY_PREFIX = "surgery/"
PBT_POPULATION = "pbt/population.json"
PBT_ROUNDS_PREFIX = "pbt/rounds/"


def experience_key(shard: int, created_ms: int, worker: str, incarnation: str, seq: int) -> str:
    """Keys of a shard sort by the uploader's clock, so a reader lists only what is newer than its cursor."""
    return validate_key(f"{experience_shard_prefix(shard)}{int(created_ms):013d}-{worker}-{incarnation}-{seq:08d}.rxp")


def experience_shard_prefix(shard: int) -> str:
    return f"{EXPERIENCE_PREFIX}s{int(shard):04d}/"


def experience_cursor(shard: int, since_ms: int) -> str:
    """The ``start_after`` of a listing that returns this shard's keys named at or after ``since_ms``."""
    return f"{experience_shard_prefix(shard)}{max(0, int(since_ms)) - 1:013d}~"


_EXPERIENCE_SHARD = re.compile(re.escape(EXPERIENCE_PREFIX) + r"s([0-9]{4,5})/[^/]+", re.ASCII)


def parse_experience_shard(key: str) -> int | None:
    """The shard of an ``experience/s<shard>/…`` key; None for any other key."""
    return _parse(_EXPERIENCE_SHARD, key)


_EXPERIENCE_MS = re.compile(re.escape(EXPERIENCE_PREFIX) + r"s[0-9]{4,5}/([0-9]{13})-[^/]+", re.ASCII)


def parse_experience_ms(key: str) -> int | None:
    """The upload time (ms) in an experience key's name; None for a name an uploader did not make."""
    return _parse(_EXPERIENCE_MS, key)


def loader_mark_key(shard: int, index: int = 0, count: int = 1) -> str:
    """Where a loader notes how far it has loaded a shard (its part ``index`` of ``count``), for a restart."""
    return f"{LOADER_MARKS_PREFIX}s{int(shard):04d}-{index}of{count}.json"


def read_loader_mark(store: Store, key: str) -> tuple[int, set[str]] | None:
    """(t, keys): every object of the shard named before t (ms) was loaded, and so were ``keys`` named after
    it; None if there is no mark, FormatError if it is garbled."""
    found, doc = get_document(store, key, MAX_MARK_BYTES)
    return _loader_mark(doc, key) if found else None


def write_loader_mark(store: Store, key: str, through_ms: int, loaded_after: list[str]) -> None:
    """FormatError, and nothing written, for a mark that :func:`read_loader_mark` would refuse. A time before
    0 (a clock that starts at 0, less the look-back) says the same as 0: no key is named before either."""
    doc = {"loaded_through_ms": max(0, int(through_ms)), "loaded_after": sorted(loaded_after)}
    _loader_mark(doc, key)
    data = json.dumps(doc).encode()
    if len(data) > MAX_MARK_BYTES:
        raise FormatError(f"{key}: a loader mark of {len(data)} bytes, limit {MAX_MARK_BYTES}")
    store.put(key, data)


def _loader_mark(doc, key: str) -> tuple[int, set[str]]:
    """The reader's rules, which the writer runs too."""
    mark, loaded = None, None
    if isinstance(doc, dict):
        mark, loaded = doc.get("loaded_through_ms"), doc.get("loaded_after", [])
    if (not isinstance(mark, int) or isinstance(mark, bool) or not 0 <= mark < 1 << 63 or not isinstance(loaded, list)
            or not all(isinstance(k, str) for k in loaded)):
        raise FormatError(f"{key} is not a loader mark")
    return mark, set(loaded)


def shard_of(name: str, shards: int) -> int:
    """The shard an object goes to: a stable, well-mixed hash of its name, so one worker's consecutive
    objects spread over every shard (and so over every rank)."""
    digest = hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % max(1, shards)


def object_shard(uploader: str, seq: int, shards: int) -> int:
    """The shard of an uploader's ``seq``-th object: its objects go round the shards from a start its name hashes
    to, so over any ``shards`` consecutive uploads each shard gets one. A rank's share of the experience then
    never drifts from another's by more than about an upload per worker, however long the run: ranks in lock
    step train alike, and a rank that got more would waste the rest (hashing each object alone lets the shares
    wander apart like a random walk).

    >>> [object_shard("w7-inc", seq, 4) for seq in range(6)]
    [3, 0, 1, 2, 3, 0]
    """
    return (shard_of(uploader, shards) + seq) % max(1, shards)


def shard_owner(shard: int, world: int) -> int:
    """The optimizer rank that lists and loads a shard."""
    return shard % world


def owned_shards(rank: int, world: int, shards: int) -> list[int]:
    """The shards rank ``rank`` of ``world`` lists: about shards / world of them, disjoint across ranks; with
    more ranks than shards (a resume on more ranks), one shard shared with others (see ``shard_split``)."""
    return list(range(rank, shards, world)) if world <= shards else [rank % shards]


def shard_split(rank: int, world: int, shards: int) -> tuple[int, int]:
    """(i, n): rank ``rank`` takes the keys of its shards whose ``shard_of(key, n)`` is i. n is 1 unless
    there are more ranks than shards, when the n ranks listing one shard split its keys between them.

    >>> [shard_split(r, world=5, shards=2) for r in range(5)]
    [(0, 3), (0, 2), (1, 3), (1, 2), (2, 3)]
    """
    if world <= shards:
        return 0, 1
    return rank // shards, len(range(rank % shards, world, shards))


def params_key(version: int) -> str:
    return f"{PARAMS_PREFIX}{version:012d}.rpm"


def checkpoint_key(version: int) -> str:
    return f"{CHECKPOINTS_PREFIX}{version:012d}.rck"


def pool_revision_key(revision: int) -> str:
    return f"{POOL_REVISIONS_PREFIX}{revision:012d}.json"


def snapshot_key(member_id: str) -> str:
    return f"{SNAPSHOTS_PREFIX}{member_id}.rpm"


def pbt_round_key(round_: int) -> str:
    return f"{PBT_ROUNDS_PREFIX}{int(round_):06d}.json"


def pbt_fitness_key(member: int) -> str:
    return f"pbt/fitness/m{int(member)}.json"


def pbt_applied_key(round_: int, member: int) -> str:
    return f"pbt/applied/{int(round_):06d}-m{int(member)}.json"


_NUMBER = "([0-9]{1,18})"  # ASCII digits only; 18 keep the value well inside int64
_PARAMS_KEY = re.compile(re.escape(PARAMS_PREFIX) + _NUMBER + r"\.rpm", re.ASCII)
_CHECKPOINT_KEY = re.compile(re.escape(CHECKPOINTS_PREFIX) + _NUMBER + r"\.rck", re.ASCII)
_POOL_REVISION_KEY = re.compile(re.escape(POOL_REVISIONS_PREFIX) + _NUMBER + r"\.json", re.ASCII)
_PBT_ROUND_KEY = re.compile(re.escape(PBT_ROUNDS_PREFIX) + _NUMBER + r"\.json", re.ASCII)
_LEASE_KEY = re.compile(re.escape(LEASE_PREFIX) + _NUMBER + r"\.json", re.ASCII)
_VERSION_TEXT = re.compile(r"v?" + _NUMBER, re.ASCII)
_POINTER = re.compile(_NUMBER, re.ASCII)


def _parse(pattern: re.Pattern, text: str) -> int | None:
    match = pattern.fullmatch(text) if isinstance(text, str) else None
    return int(match.group(1)) if match else None


def parse_params_key(key: str) -> int | None:
    """The version of a ``params/<version>.rpm`` key; None for any other key."""
    return _parse(_PARAMS_KEY, key)


def parse_checkpoint_key(key: str) -> int | None:
    """The version of a ``checkpoints/<version>.rck`` key; None for any other key."""
    return _parse(_CHECKPOINT_KEY, key)


def parse_pool_revision_key(key: str) -> int | None:
    """The revision of a ``league/pool/<revision>.json`` key; None for any other key."""
    return _parse(_POOL_REVISION_KEY, key)


def parse_pbt_round_key(key: str) -> int | None:
    return _parse(_PBT_ROUND_KEY, key)


def parse_version_text(text: str) -> int | None:
    """A version a person typed: ``12`` or ``v12`` in ASCII digits; None for anything else (``²``, ``٣``)."""
    return _parse(_VERSION_TEXT, text)


def lease_key(epoch: int) -> str:
    return f"{LEASE_PREFIX}{epoch:012d}.json"


def parse_lease_key(key: str) -> int | None:
    """The epoch of an ``optimizer/lease/<epoch>.json`` key; None for any other key."""
    return _parse(_LEASE_KEY, key)


def surgery_key(version: int) -> str:
    """The record of the surgery that made ``version``: its existence is the surgery's commit."""
    return f"{SURGERY_PREFIX}{version:012d}.json"


def surgery_done_key(version: int) -> str:
    """Written once every pointer of the surgery that made ``version`` has moved."""
    return f"{SURGERY_PREFIX}{version:012d}.done"


def surgery_stage_prefix(version: int) -> str:
    """Where the surgery that makes ``version`` stages its objects before it commits."""
    return f"{SURGERY_PREFIX}{version:012d}/"


_SURGERY_KEY = re.compile(re.escape(SURGERY_PREFIX) + _NUMBER + r"\.(json|done)", re.ASCII)


def surgery_states(store: Store) -> dict[int, bool]:
    """Committed surgeries of the run: version → whether it completed (every pointer moved).

    >>> from rapid.infra.store import LocalStore
    >>> import tempfile
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> store.put(surgery_key(7), b"{}"); store.put(surgery_done_key(7), b""); store.put(surgery_key(9), b"{}")
    >>> store.put(surgery_stage_prefix(9) + "checkpoint.rck", b"")
    >>> surgery_states(store)
    {7: True, 9: False}
    """
    committed: set[int] = set()
    done: set[int] = set()
    for key in store.list(SURGERY_PREFIX):
        match = _SURGERY_KEY.fullmatch(key)
        if match:
            (committed if match.group(2) == "json" else done).add(int(match.group(1)))
    return {version: version in done for version in sorted(committed)}


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as infinity without ever spelling "Infinity"
        raise ValueError(f"number {text[:32]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text) > 20 or abs(value := int(text)) >= 1 << 63:  # would overflow a float or an int64 downstream
        raise ValueError(f"integer {text[:32]} is out of range")
    return value


def load_json(data: bytes):
    """A JSON document from the store with only finite numbers (no NaN, no ±Infinity, no 1e999, no 64-bit
    overflow); ValueError otherwise. Every JSON document read from a store goes through here."""
    return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int)


def get_document(store: Store, key: str, max_bytes: int) -> tuple[bool, object]:
    """(found, document) of a small JSON object: (False, None) when there is none, (True, None) for bytes that
    are not JSON (the caller's checks refuse it), never more than ``max_bytes`` read."""
    try:
        raw = store.get(key, max_bytes=max_bytes)
    except KeyNotFound:
        return False, None
    try:
        return True, load_json(raw)
    except (ValueError, UnicodeDecodeError):
        return True, None


def write_version_pointer(store: Store, key: str, version: int) -> None:
    """A ``LATEST``-style pointer: the version number as ASCII text (FormatError, and nothing written, for one
    that :func:`read_version_pointer` would refuse)."""
    text = str(int(version))
    if _parse(_POINTER, text) is None:
        raise FormatError(f"{key}: {text[:32]} is not a version number")
    store.put(key, text.encode("ascii"))


def read_version_pointer(store: Store, key: str) -> int | None:
    """The version a pointer names; None when there is no pointer yet, FormatError for garbage."""
    try:
        raw = store.get(key, max_bytes=64)  # a number: never read a planted giant
    except KeyNotFound:
        return None
    try:
        version = _parse(_POINTER, raw.decode("ascii").strip())
    except UnicodeDecodeError:
        version = None
    if version is None:
        raise FormatError(f"{key} is not a version number")
    return version


LAYOUT_FORMAT = "rapid.layout"
_RUN_ID = re.compile(r"[0-9a-f]{0,32}", re.ASCII)


def write_layout(store: Store, shards: int) -> int:
    """Record the run's experience shard count and a run id once (the first writer wins); returns the count in
    force. FormatError, and nothing written, for a count that :func:`read_run` would refuse."""
    doc = _layout(int(shards), uuid.uuid4().hex)
    if store.put_if_absent(LAYOUT, json.dumps(doc).encode()):
        return int(shards)
    found = read_layout(store)
    return int(shards) if found is None else found


def read_run(store: Store) -> tuple[int, str | None] | None:
    """The run's experience shard count and id (a fresh id for every run, even in a reused store; None in a
    layout of an older rapid); None before the optimizer wrote it, FormatError for garbage."""
    found, doc = get_document(store, LAYOUT, 4096)
    if not found:
        return None
    shards = doc.get("experience_shards") if isinstance(doc, dict) and doc.get("format") == LAYOUT_FORMAT else None
    run_id = doc.get("run_id", "") if isinstance(doc, dict) else None
    shards, run_id = _check_layout(shards, run_id)
    return shards, run_id or None


def _layout(shards: int, run_id: str) -> dict:
    """A layout document, checked with the reader's rules."""
    _check_layout(shards, run_id)
    return {"format": LAYOUT_FORMAT, "version": 1, "experience_shards": shards, "run_id": run_id}


def _check_layout(shards: object, run_id: object) -> tuple[int, str]:
    if (not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= MAX_SHARDS
            or not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id)):
        raise FormatError(f"{LAYOUT} is not a rapid layout document")
    return shards, run_id


def renew_run_id(store: Store) -> str | None:
    """Give the run a fresh id (its shard count stays): after surgery has rewritten snapshots in place, rollout
    processes started from now on use a new node-cache folder and never read a node's copy of the old shape.
    None for a run without a layout (an older rapid's: its workers use no node cache)."""
    run = read_run(store)
    if run is None:
        return None
    run_id = uuid.uuid4().hex
    store.put(LAYOUT, json.dumps(_layout(run[0], run_id)).encode())
    return run_id


def read_layout(store: Store) -> int | None:
    """The run's experience shard count; None before the optimizer wrote it, FormatError for garbage."""
    run = read_run(store)
    return None if run is None else run[0]

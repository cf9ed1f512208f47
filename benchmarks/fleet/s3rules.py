"""The rules by which the S3 model answers a request: what a reader sees while writes are in flight
(:class:`Objects`), per-prefix partitions that split under sustained load (:class:`Partitions`, the source of
503 SlowDown) and botocore's ``standard`` retry mode (:class:`Retry`), which every client of the model
follows as ``S3Store``'s botocore does.

All are bookkeeping on simulated seconds: the store charges the latency and the waits to the simulated clock.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import math
import random
from dataclasses import dataclass, field

WRITE_LIMIT, READ_LIMIT = 3500.0, 5500.0
"""Requests a second one S3 partition serves (PUT/COPY/POST/DELETE; GET/HEAD, LIST counted as a read)."""
RECENT = 256
"""Keys a partition remembers to choose where it splits."""


class Objects:
    """The bucket's objects over simulated time. A write (PUT, or DELETE: ``None``) takes effect when its
    request completes; a reader at time t sees the newest version complete by t, so an overwritten key
    serves its old bytes until the new PUT completes, as S3 does (strong read-after-write consistency, no
    window in which the key is missing)."""

    def __init__(self):
        self._data: dict[str, bytes] = {}  # what every reader sees from the last settled time on
        # key → versions not yet settled, as (completes at, seq, bytes or None), in order of completion
        self._pending: dict[str, list] = {}
        self._due: list = []  # heap of (completes at, seq, key): what settle folds into _data
        self._seq = 0
        self._keys: list[str] = []  # sorted keys in _data or _pending: a listing is a bisect and a slice

    def settle(self, now: float) -> None:
        """Fold the versions complete by ``now`` into what every reader sees: call it with the scheduler's
        time, which never goes back (every later step reads at or after it)."""
        while self._due and self._due[0][0] <= now:
            _, _, key = heapq.heappop(self._due)
            versions = self._pending.get(key)
            n = bisect.bisect_right(versions, now, key=lambda v: v[0]) if versions else 0
            if versions is None or not n:
                continue
            data = versions[n - 1][2]
            del versions[:n]
            if data is None:
                self._data.pop(key, None)
            else:
                self._data[key] = data
            if not versions:
                del self._pending[key]
                if data is None:
                    del self._keys[bisect.bisect_left(self._keys, key)]

    def read(self, key: str, at: float) -> bytes | None:
        for due, _, data in reversed(self._pending.get(key, ())):
            if due <= at:
                return data
        return self._data.get(key)

    def newest(self, key: str) -> bytes | None:
        """The last bytes written, complete or not."""
        versions = self._pending.get(key)
        return versions[-1][2] if versions else self._data.get(key)

    def write(self, key: str, data: bytes | None, at: float) -> None:
        """A version of ``key`` (None: deleted) that takes effect at ``at``, when its request completes."""
        if key not in self._data and key not in self._pending:
            bisect.insort(self._keys, key)
        self._seq += 1
        bisect.insort(self._pending.setdefault(key, []), (at, self._seq, data), key=lambda v: v[:2])
        heapq.heappush(self._due, (at, self._seq, key))

    def keys(self, prefix: str, start_after: str | None, at: float) -> list[str]:
        """The keys under ``prefix`` (after ``start_after``) that a reader at ``at`` sees, sorted."""
        lo = bisect.bisect_left(self._keys, prefix)
        if start_after is not None:
            lo = max(lo, bisect.bisect_right(self._keys, start_after))
        hi = bisect.bisect_left(self._keys, prefix[:-1] + chr(ord(prefix[-1]) + 1)) if prefix else len(self._keys)
        keys = self._keys[lo:hi]
        if self._pending:
            keys = [k for k in keys if k not in self._pending or self.read(k, at) is not None]
        return keys

    def all_keys(self) -> list[str]:
        return list(self._keys)


def prefix_of(key: str) -> str:
    """The prefix S3 partitions by: the key up to its last '/'."""
    return key.rsplit("/", 1)[0] if "/" in key else ""


@dataclass
class Partition:
    lo: str  # the first key of its range ("" for the prefix's first partition)
    counts: collections.Counter = field(default_factory=collections.Counter)  # (kind, second) → admitted
    hot: set = field(default_factory=set)  # seconds in which it carried at least hot_share of a limit
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RECENT))


class Partitions:
    """S3 scales a prefix's request rate by splitting it into partitions of a key range, each serving
    ``write_limit`` writes/s and ``read_limit`` reads/s, and answers 503 SlowDown past a partition's limit.

    Every prefix starts as one partition. A partition that carried at least ``hot_share`` of a limit (or
    refused a request) in ``split_after_s`` distinct seconds of the last ``2 × split_after_s`` splits in two
    at the median of the keys asked of it lately; a partition whose demand is one key cannot split, and keys
    that grow with time (an experience shard's) keep landing above every split point, so splits do not
    spread their writes. AWS publishes no rule beyond "gradually, over minutes"; ``split_after_s`` is the
    assumption (0: never split).

    Seconds are counted apart (actors' steps interleave them), and counts older than a minute before the
    newest second seen are dropped.
    """

    def __init__(self, write_limit: float = WRITE_LIMIT, read_limit: float = READ_LIMIT,
                 split_after_s: float = 0.0, hot_share: float = 0.5):
        self.limit = {"write": write_limit, "read": read_limit}
        self.hot_at = {kind: max(1, math.ceil(hot_share * limit)) for kind, limit in self.limit.items()}
        self.split_after_s = split_after_s
        self._parts: dict[str, list[Partition]] = {}  # prefix → its partitions, ordered by ``lo``
        self.splits: list[tuple[int, str, str]] = []  # (second, prefix, first key of the new partition)
        self._next_prune = 0

    def find(self, key: str) -> Partition:
        parts = self._parts.setdefault(prefix_of(key), [Partition("")])
        i = len(parts) - 1
        while parts[i].lo > key:  # few partitions a prefix: a scan from the top is cheap
            i -= 1
        return parts[i]

    def admit(self, kind: str, key: str, second: int) -> bool:
        """Count one request of ``kind`` ("read" or "write") on ``key`` in ``second``; False: SlowDown."""
        self._prune(second)
        part = self.find(key)
        part.recent.append(key)  # the demand, served or not, is what a split spreads
        n = part.counts[kind, second]
        if n >= self.limit[kind]:
            self._heat(part, key, second)
            return False
        part.counts[kind, second] = n + 1
        if n + 1 == self.hot_at[kind]:
            self._heat(part, key, second)
        return True

    def count(self) -> dict[str, int]:
        """Prefix → partitions it has now (prefixes that were ever requested)."""
        return {prefix: len(parts) for prefix, parts in self._parts.items()}

    def _heat(self, part: Partition, key: str, second: int) -> None:
        if not self.split_after_s or second in part.hot:
            return
        part.hot.add(second)
        window = 2 * self.split_after_s
        part.hot = {s for s in part.hot if s > second - window}
        if len(part.hot) >= self.split_after_s:
            self._split(part, key, second)

    def _split(self, part: Partition, key: str, second: int) -> None:
        keys = sorted(part.recent)
        lo = keys[len(keys) // 2]
        if lo == keys[0]:  # at least half the traffic is the lowest key: split just above it
            lo = next((k for k in keys if k > keys[0]), None)
            if lo is None:
                return  # one hot key: S3 cannot spread it either
        prefix = prefix_of(key)
        parts = self._parts[prefix]
        # Both halves keep the seconds counted so far: a split adds capacity from the next second on.
        upper = Partition(lo, counts=part.counts.copy(),
                          recent=collections.deque((k for k in part.recent if k >= lo), maxlen=RECENT))
        part.recent = collections.deque((k for k in part.recent if k < lo), maxlen=RECENT)
        part.hot = set()
        parts.insert(parts.index(part) + 1, upper)
        self.splits.append((second, prefix, lo))

    def _prune(self, second: int) -> None:
        if second < self._next_prune:
            return
        for parts in self._parts.values():
            for part in parts:
                for old in [k for k in part.counts if k[1] < second - 60]:
                    del part.counts[old]
        self._next_prune = second + 60


THROTTLE = "SlowDown"


class Retry:
    """botocore's ``standard`` retry mode (botocore/retries/standard.py and quota.py, as installed):

    - ``attempts`` attempts in all (``S3Store``'s ``max_attempts``, 5);
    - before attempt i + 1, a wait of rand(0, 1) × min(scale × 2^(i − 1), 20) s, scale 1 s after a throttle
      (SlowDown) and 50 ms after another transient error (500 InternalError, a connection reset);
    - a retry quota per client of 500: a retry takes 5 after a throttle and 14 otherwise; a success gives
      back what its last retry took (1 if it needed none); with too little left the error is raised at once.

    A client is the actor that makes the request (one botocore client a simulated process).
    """

    CAPACITY, THROTTLE_COST, COST, NO_RETRY_REFUND, MAX_WAIT_S = 500, 5, 14, 1, 20.0

    def __init__(self, attempts: int, rng: random.Random):
        self.attempts, self.rng = attempts, rng
        self._quota: dict[object, int] = {}

    def wait(self, attempt: int, code: str) -> float:
        scale = 1.0 if code == THROTTLE else 0.05
        return self.rng.random() * min(scale * 2 ** (attempt - 1), self.MAX_WAIT_S)

    def take(self, client: object, code: str) -> int:
        """Quota for one retry after ``code``: what it took, or 0 when too little is left."""
        cost = self.THROTTLE_COST if code == THROTTLE else self.COST
        left = self._quota.get(client, self.CAPACITY)
        if left < cost:
            return 0
        self._quota[client] = left - cost
        return cost

    def succeeded(self, client: object, last_taken: int) -> None:
        left = self._quota.get(client, self.CAPACITY)
        if left < self.CAPACITY:
            self._quota[client] = min(self.CAPACITY, left + (last_taken or self.NO_RETRY_REFUND))

    def quota(self, client: object) -> int:
        return self._quota.get(client, self.CAPACITY)

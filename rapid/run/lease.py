"""The optimizer's lease on a run: one optimizer at a time publishes, checkpoints and keeps the league.

Usage (optimizer rank 0, before it writes anything)::

    >>> import tempfile
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.roles.startup import StopFlag
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> lease = RunLease(store, host="node-a")
    >>> lease.acquire().held              # LeaseHeld (a UsageError: one line, exit 2) if another one holds it
    True
    >>> RunLease(store, host="node-b").acquire()
    Traceback (most recent call last):
    rapid.run.lease.LeaseHeld: another optimizer holds this run (node-a pid ...); stop it first, or if it died, ...
    >>> stop = StopFlag(install_signals=False)
    >>> lease.keep(stop)                  # renews on a thread; sets ``stop`` ("lease lost") if another one took it
    >>> if lease.held:
    ...     pass                          # save the final checkpoint
    >>> lease.release()                   # the next optimizer (e.g. --resume) starts at once
    >>> RunLease(store, host="node-b").acquire().held
    True

The lease is a chain of immutable objects ``optimizer/lease/<epoch>.json`` (owner, host, pid, expiry), each
written with ``put_if_absent`` — the one atomic primitive both the local store and S3 give, so no
compare-and-swap is needed: of two processes that read epoch E, only one can write E+1. Taking, renewing
and releasing each write the next epoch, so a holder that finds its next epoch taken has lost the lease and
stops. A lease can be taken over when it was released, has expired (``ttl_s`` after its last renewal), or
names a process on this host that is gone (so ``--resume`` after a crash need not wait for the expiry).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from rapid.errors import UsageError
from rapid.infra.store import KeyNotFound, Store, StoreError
from rapid.run.store_map import LEASE_PREFIX, lease_key, load_json, parse_lease_key

LEASE_LOST = "lease lost"
"""The stop reason of an optimizer whose lease another one took: it writes nothing more to the run."""
TTL_S = 60.0
"""How long a lease lasts without renewal: a holder on another host that died is replaced after this."""
KEEP_EPOCHS = 4

log = logging.getLogger(__name__)


class LeaseHeld(UsageError):
    """Another live optimizer holds the run."""


@dataclass(frozen=True)
class Holder:
    owner: str
    host: str
    pid: int
    expires: float
    released: bool = False

    def line(self) -> str:
        return f"{self.host} pid {self.pid}"


def _decode(data: bytes) -> Holder | None:
    """A lease document; None for anything malformed (treated as free: a bad object must not lock a run)."""
    try:
        doc = load_json(data)
        holder = Holder(str(doc["owner"]), str(doc["host"]), int(doc["pid"]), float(doc["expires"]),
                        doc.get("released") is True)
    except (ValueError, KeyError, TypeError):
        return None
    return holder


def _process_gone(holder: Holder) -> bool:
    """The holder ran on this host and its process no longer exists (or this process reuses its pid)."""
    if holder.host != socket.gethostname():
        return False
    if holder.pid == os.getpid():
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False


def _epochs(store: Store) -> list[int]:
    return sorted(e for e in map(parse_lease_key, store.list(LEASE_PREFIX)) if e is not None)


def read_head(store: Store) -> tuple[int, Holder | None]:
    """The newest lease epoch of the run (0: none yet) and its holder (None: no lease, or a malformed one).
    Any role may read it: rollout workers and the evaluator ask whether the run still has an optimizer."""
    epochs = _epochs(store)
    for epoch in reversed(epochs):
        try:
            return epoch, _decode(store.get(lease_key(epoch)))
        except KeyNotFound:  # collected between list and get: an older one is not the head either
            continue
    return (epochs[-1] if epochs else 0), None


class RunLease:
    """One optimizer's claim on a run's store (see the module docstring)."""

    def __init__(self, store: Store, ttl_s: float = TTL_S, clock: Callable[[], float] = time.time,
                 host: str | None = None, pid: int | None = None):
        self.store, self.ttl_s, self.clock = store, ttl_s, clock
        self.host, self.pid = host or socket.gethostname(), pid or os.getpid()
        self.owner = uuid.uuid4().hex
        self.epoch: int | None = None
        self.lost = False
        self._thread: threading.Thread | None = None
        self._done = threading.Event()

    @property
    def held(self) -> bool:
        return self._held_epoch() is not None

    def _held_epoch(self) -> int | None:
        """The epoch this holder wrote last, or None when it holds no lease (never acquired, lost, released)."""
        return None if self.lost else self.epoch

    def _doc(self, released: bool = False) -> bytes:
        holder = Holder(self.owner, self.host, self.pid, self.clock() + self.ttl_s, released)
        return json.dumps(asdict(holder)).encode()

    def _epochs(self) -> list[int]:
        return _epochs(self.store)

    def _head(self) -> tuple[int, Holder | None]:
        return read_head(self.store)

    def acquire(self, attempts: int = 5) -> RunLease:
        """Take the lease, or raise LeaseHeld naming the holder. Nothing else is written either way."""
        for _ in range(attempts):
            epoch, holder = self._head()
            if holder and holder.owner != self.owner and not holder.released and holder.expires > self.clock() \
                    and not _process_gone(holder):
                wait = holder.expires - self.clock()
                raise LeaseHeld(f"another optimizer holds this run ({holder.line()}, lease {lease_key(epoch)}); "
                                f"stop it first, or if it died, retry in {wait:.0f}s")
            if self.store.put_if_absent(lease_key(epoch + 1), self._doc()):
                self.epoch = epoch + 1
                for old in self._epochs():
                    if old <= self.epoch - KEEP_EPOCHS:
                        self.store.delete(lease_key(old))
                return self
        raise LeaseHeld("another optimizer is taking this run's lease at the same moment")

    def renew(self) -> bool:
        """Write the next epoch; False (and ``lost``) if another process wrote it first."""
        epoch = self._held_epoch()
        if epoch is None:
            return False
        if not self.store.put_if_absent(lease_key(epoch + 1), self._doc()):
            self.lost = True
            return False
        epoch += 1
        self.epoch = epoch
        if epoch > KEEP_EPOCHS:
            self.store.delete(lease_key(epoch - KEEP_EPOCHS))
        return True

    def tick(self, stop) -> bool:
        """One renewal of :meth:`keep`: False once the lease is lost, with ``stop`` set ("lease lost"). A store
        outage is retried at the next tick: the holder keeps running, as it would without a lease."""
        try:
            if not self.renew():
                log.error("another optimizer took this run's lease; stopping without a final checkpoint")
                stop.set(LEASE_LOST)
                return False
        except StoreError as e:
            log.warning("lease not renewed yet: %s", e)
        return True

    def keep(self, stop) -> None:
        """:meth:`tick` every ``ttl_s / 4`` on a daemon thread, until the lease is lost or released."""

        def loop() -> None:
            while not self._done.wait(self.ttl_s / 4) and self.tick(stop):
                pass

        self._thread = threading.Thread(target=loop, name="run-lease", daemon=True)
        self._thread.start()

    def abandon(self) -> None:
        """Undo :meth:`acquire` of a holder that never started: remove the epoch it wrote."""
        epoch = self._held_epoch()
        if epoch is not None and self._thread is None:
            self.store.delete(lease_key(epoch))
        self.epoch = None

    def release(self) -> None:
        """Stop renewing and mark the lease free (best effort: an unreleased lease expires anyway)."""
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        epoch = self._held_epoch()
        if epoch is not None:
            try:
                if self.store.put_if_absent(lease_key(epoch + 1), self._doc(released=True)):
                    self.epoch = epoch + 1
            except StoreError as e:
                log.warning("lease not released (it expires in %.0fs): %s", self.ttl_s, e)
        self.epoch = None

"""Which run a store holds: its name and game, written once by the run's first optimizer (``owner.json``).

``rapid optimizer --resume auto`` (what a restarted cluster job runs) resumes the run in its store and starts fresh
in an empty one; the owner is how it refuses a store that holds another run instead of taking that run's weights
for its own. Every explicit ``--resume`` refuses a store of another game.

Usage::

    >>> import tempfile
    >>> from rapid.infra.store import LocalStore
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> read_owner(store) is None              # a new store, or a run of an older rapid: nobody can tell
    True
    >>> write_owner(store, Owner("c4", "pettingzoo.classic.connect_four_v3"))
    >>> write_owner(store, Owner("other", "moba"))       # the first writer wins
    >>> read_owner(store)
    Owner(name='c4', env='pettingzoo.classic.connect_four_v3')
    >>> check_owner(store, Owner("c4-copy", "pettingzoo.classic.connect_four_v3"), auto=False)   # renamed: allowed
    >>> check_owner(store, Owner("c4-copy", "pettingzoo.classic.connect_four_v3"), auto=True)
    Traceback (most recent call last):
    rapid.errors.UsageError: --resume auto: the store ... holds run 'c4' (pettingzoo...), not run 'c4-copy' ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rapid.errors import FormatError, UsageError
from rapid.infra.store import Store
from rapid.run.store_map import RUN_OWNER, get_document

FORMAT = "rapid.owner"
MAX_BYTES = 4096


@dataclass(frozen=True)
class Owner:
    name: str
    """run.name"""
    env: str
    """env.name"""


def write_owner(store: Store, owner: Owner) -> None:
    """Record the run's owner unless one is recorded (the first optimizer's stays)."""
    doc = {"format": FORMAT, "version": 1, "name": owner.name, "env": owner.env}
    data = json.dumps(doc).encode()
    if len(data) > MAX_BYTES:  # what the reader would refuse is never written
        raise FormatError(f"{RUN_OWNER}: {len(data)} bytes is over {MAX_BYTES}")
    store.put_if_absent(RUN_OWNER, data)


def read_owner(store: Store) -> Owner | None:
    """The run's owner; None when none is recorded, FormatError for garbage."""
    found, doc = get_document(store, RUN_OWNER, MAX_BYTES)
    if not found:
        return None
    if (not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("name"), str)
            or not isinstance(doc.get("env"), str)):
        raise FormatError(f"{RUN_OWNER} is not a rapid owner document")
    return Owner(doc["name"], doc["env"])


def check_owner(store: Store, mine: Owner, auto: bool) -> None:
    """UsageError unless the store's run can be this config's: the same game always, the same name with ``auto``
    (a store holding another run's weights is never taken for this one's). A store without an owner passes."""
    try:
        found = read_owner(store)
    except FormatError as e:
        raise UsageError(f"{e} in {store.describe()}: restore it, or start a new run elsewhere") from None
    if found is None:
        return
    flag = "--resume auto" if auto else "--resume"
    if found.env != mine.env or (auto and found.name != mine.name):
        raise UsageError(f"{flag}: the store {store.describe()} holds run {found.name!r} ({found.env}), not run "
                         f"{mine.name!r} ({mine.env}): give this run a store of its own")

"""A population's documents in its store (docs/pbt.md): written as the lease is, read as every reader reads.

No server decides: the population document and each round's decision are written with ``put_if_absent``, so the
first member to get there decides and every member (on any node, or restarted) reads the same decision back. A
member's store is a whole run of its own under ``members/m<K>/`` (``rapid.run.pbt_config.member_folder``).

Usage::

    >>> import tempfile
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.league.population import Fitness, Population
    >>> root = LocalStore(tempfile.mkdtemp())
    >>> pops = PopulationStore(root, lambda m: LocalStore(f"{root.root}/members/m{m}"))
    >>> pop = pops.ensure(Population(2, 0.0, 60.0, {"lr": (1e-4, 1e-2)}, [{"lr": 1e-3}, {"lr": 2e-3}]))
    >>> pops.write_fitness(0, Fitness(3, 120.0, 30.0, 50.0))
    >>> pops.usable_fitness(pop, [])            # member 1 has not been rated yet
    {0: Fitness(version=3, rating=120.0, sigma=30.0, time=50.0), 1: None}
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from rapid.errors import FormatError
from rapid.infra.store import Store
from rapid.league.population import (
    Fitness,
    Population,
    Round,
    dump_population,
    dump_round,
    load_fitness,
    load_population,
    load_round,
)
from rapid.run.store_map import (
    CHECKPOINTS_LATEST,
    PBT_POPULATION,
    PBT_ROUNDS_PREFIX,
    get_document,
    parse_pbt_round_key,
    pbt_applied_key,
    pbt_fitness_key,
    pbt_round_key,
    read_version_pointer,
)

MAX_DOC_BYTES = 1 << 20


class PopulationStore:
    """The population's documents in its ``root`` store; ``member_store(k)`` opens member k's run store."""

    def __init__(self, root: Store, member_store: Callable[[int], Store], log: logging.Logger | None = None):
        self.root = root
        self.member_store = member_store
        self.log = log or logging.getLogger("rapid.pbt")
        self._decided: dict[int, Round] = {}
        """Rounds read so far: a decided round never changes, so a watch's tick lists rounds but reads only new ones."""

    def ensure(self, proposed: Population) -> Population:
        """The population as stored: ``proposed`` if it is the first; FormatError for one of another size."""
        self.root.put_if_absent(PBT_POPULATION, json.dumps(dump_population(proposed)).encode())
        pop = self.population()
        if pop is None:
            raise FormatError(f"{PBT_POPULATION} vanished just after it was written")
        if pop.members != proposed.members or set(pop.search) != set(proposed.search):
            raise FormatError(f"{PBT_POPULATION} holds a population of {pop.members} members searching "
                              f"{sorted(pop.search)}, not {proposed.members} searching {sorted(proposed.search)}")
        return pop

    def population(self) -> Population | None:
        found, doc = get_document(self.root, PBT_POPULATION, MAX_DOC_BYTES)
        return load_population(doc) if found else None

    def rounds(self, pop: Population) -> list[Round]:
        """Every decided round, oldest first; a corrupt one is logged and skipped (it decided nothing)."""
        out = []
        for r in sorted(n for n in map(parse_pbt_round_key, self.root.list(PBT_ROUNDS_PREFIX)) if n is not None):
            decided = self.read_round(pop, r)
            if decided is not None:
                out.append(decided)
        return out

    def read_round(self, pop: Population, r: int) -> Round | None:
        if r in self._decided:
            return self._decided[r]
        found, doc = get_document(self.root, pbt_round_key(r), MAX_DOC_BYTES)
        if not found:
            return None
        try:
            self._decided[r] = load_round(doc, pop)
        except FormatError as e:
            self.log.warning("%s is not usable, skipped: %s", pbt_round_key(r), e)
            return None
        return self._decided[r]

    def propose(self, pop: Population, decided: Round) -> Round | None:
        """Write ``decided`` unless its round is decided already; the round as stored (the first writer's)."""
        self.root.put_if_absent(pbt_round_key(decided.round), json.dumps(dump_round(decided)).encode())
        return self.read_round(pop, decided.round)

    def fitness(self, member: int) -> Fitness | None:
        found, doc = get_document(self.root, pbt_fitness_key(member), MAX_DOC_BYTES)
        if not found:
            return None
        try:
            return load_fitness(doc)
        except ValueError as e:
            self.log.warning("%s is not usable, skipped: %s", pbt_fitness_key(member), e)
            return None

    def write_fitness(self, member: int, fit: Fitness) -> None:
        self.root.put(pbt_fitness_key(member), json.dumps(fit.__dict__).encode())

    def applied(self, r: int, member: int) -> dict[str, Any] | None:
        """The record of member ``member`` having copied its leader of round ``r`` (None: not yet)."""
        found, doc = get_document(self.root, pbt_applied_key(r, member), MAX_DOC_BYTES)
        if not found or not isinstance(doc, dict) or not isinstance(doc.get("version"), int):
            return None
        return doc

    def write_applied(self, r: int, member: int, record: dict[str, Any]) -> None:
        self.root.put(pbt_applied_key(r, member), json.dumps(record).encode())

    def newest_checkpoint(self, member: int) -> int | None:
        try:
            return read_version_pointer(self.member_store(member), CHECKPOINTS_LATEST)
        except FormatError:
            return None

    def usable_fitness(self, pop: Population, rounds: list[Round]) -> dict[int, Fitness | None]:
        """Each member's rating if it rates what the member is now: after a member copied a leader, only a
        rating of a version made from the copy counts (None until then, and while the copy is not applied)."""
        out: dict[int, Fitness | None] = {}
        for m in range(pop.members):
            fit = self.fitness(m)
            moved = [r.round for r in rounds if any(mv.member == m for mv in r.moves)]
            if fit is not None and moved:
                record = self.applied(moved[-1], m)
                if record is None or fit.version < record["version"]:
                    fit = None
            out[m] = fit
        return out


def hparams_now(pop: Population, rounds: list[Round]) -> list[dict[str, float]]:
    """Every member's hyperparameters as the newest decided round left them (the initial ones before any)."""
    return [dict(h) for h in (rounds[-1].hparams if rounds else pop.initial)]


def newest_loss(rounds: list[Round], member: int) -> Round | None:
    """The newest round in which ``member`` was told to copy a leader."""
    lost = [r for r in rounds if any(m.member == member for m in r.moves)]
    return lost[-1] if lost else None

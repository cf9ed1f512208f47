"""The node's inference server in the scale model (``--inference node``; docs/architecture.md): one per node of
``workers_per_node`` workers, the node's one reader of parameters, deciding every local worker's actions.

Rapid's own parts: each server's ``ParamPoller`` (through the node cache, stepped on an actor of the server's
process, as its thread would run it), each worker's ``ServerVersions`` (the rollout loop's parameter source under
node inference: the worker fetches no parameters itself), the server's ``BatchStats``, and the worker's
``InferenceLost`` (a server that died mid-request: the worker's games restart and it connects again, to a server
started afresh). Stand-in: the server's socket loop. ``InferenceServer.serve`` selects on real sockets and
batches in private methods, so it cannot be stepped in simulated time (the hook it lacks: one round as a public
step with the selector and clock injected, as ``ParamPoller.poll_once`` is). A request here is one worker's
segment of decisions; requests that arrive while the server decides make its next batch
(``rollout.inference_max_wait_ms = 0``), and a batch costs ``pass_s`` for each step of a segment plus ``row_s``
a decision: ``benchmarks/bench_rollout.py`` measured ~1.9 ms a pass of ~1,410 rows on the H200 with the 64-unit
moba 5v5 model (BENCHMARKS "The rollout worker and node inference"); the split between the two is an assumption.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field

from rapid.roles.rollout import ParamPoller
from rapid.rollout.inference import InferenceLost
from rapid.rollout.inference_client import ServerVersions
from rapid.rollout.inference_server import BatchStats
from rapid.run.param_store import ParameterStore

from .sched import Actor

QUIET = logging.getLogger("fleet.quiet")


@dataclass
class Batch:
    start: float
    end: float
    rows: int = 0
    waits: list[float] = field(default_factory=list)


@dataclass
class Ticket:
    """A worker's request: answered at its batch's end by the server of ``generation``."""

    batch: Batch
    generation: int


class NodeServer:
    """One node's inference server (see the module docstring)."""

    def __init__(self, fleet, node: int, reads):
        self.fleet, self.node, self.reads = fleet, node, reads
        self.process = f"server{node}"
        self.generation = 0
        self.kills = 0
        self.dies_at = math.inf  # the server-killed fault: when this server's process dies
        self.wrong_weights = 0  # versions whose weights are not their meta's update count
        self.busy_s = 0.0
        self.stats = BatchStats()
        self._start(0.0)

    def _start(self, at: float) -> None:
        """A server process starts (at the run's start, or when a worker finds the node's server gone)."""
        fleet, s = self.fleet, self.fleet.s
        self.generation += 1
        self.alive_at = at  # it answers from here: a process that imports torch and loads its policy
        self.version: int | None = None
        self.meta: dict = {}
        self.last: Batch | None = None  # the batch deciding, or the one that decided last
        self.waiting: Batch | None = None  # the next batch: what arrives while the server decides
        self.params = ParamPoller(ParameterStore(self.reads), s.param_poll_s, QUIET,
                                  on_failure=fleet.poller_failed, rng=random.Random(fleet.s.seed * 7 + self.node))
        generation = self.generation
        fleet.sched.start(Actor(f"{self.process}-poller", self._polls(generation), process=self.process), at)

    def _polls(self, generation: int):
        """The server's poller thread; each new version is taken as the server's next round would take it."""
        clock = self.fleet.clock
        while generation == self.generation:
            self.params.poll_once()
            newer = self.params.take()
            if newer is not None:
                version, tensors, meta = newer
                self.wrong_weights += int(not (tensors["w"] == meta.get("updates")).all())
                self.version, self.meta = version, dict(meta or {})
            yield clock.t() + self.params.next_wait()

    def current(self) -> int:
        """The generation serving now (negative: none, the last one died). A worker's step is atomic, so a death
        is planned (``dies_at``) and happens when a step first looks past it: a request that was in flight then is
        lost with the process, its LSTM states and its version."""
        if self.fleet.clock.t() >= self.dies_at:
            self.dies_at = math.inf
            self.kills += 1
            self.generation = -self.generation
            self.last = self.waiting = None
        return self.generation

    def connect(self) -> int:
        """A worker's client connects; a dead server is started again (``NodeClient``'s spawn)."""
        if self.current() < 0:
            self.generation = -self.generation
            self._start(self.fleet.clock.t() + self.fleet.s.server_start_s)
        return self.generation

    def status(self, generation: int) -> dict:
        if generation != self.current():
            raise InferenceLost("the inference server closed the connection")
        return {"version": self.version, "meta": self.meta, "behind_s": self.params.behind_s()}

    def submit(self, generation: int, decisions: int) -> Ticket:
        """A worker's segment of ``decisions``: it joins the batch waiting for the server, or starts one."""
        if generation != self.generation:
            raise InferenceLost("cannot reach the inference server")
        s, t = self.fleet.s, self.fleet.clock.t()
        if self.waiting is not None and t >= self.waiting.start:  # the waiting batch has begun: it is closed
            self._begin(self.waiting)
        if self.waiting is not None:
            batch = self.waiting
        elif self.last is not None and self.last.end > t:  # busy: the next batch starts when it is free
            batch = self.waiting = Batch(self.last.end, self.last.end + s.steps_per_segment * s.server_pass_s)
        else:
            start = max(t, self.alive_at)
            batch = Batch(start, start + s.steps_per_segment * s.server_pass_s)
            self._begin(batch)
        batch.rows += decisions
        batch.end += decisions * s.server_row_s
        batch.waits.append(max(0.0, batch.start - t))
        return Ticket(batch, generation)

    def _begin(self, batch: Batch) -> None:
        if batch is self.waiting:
            self.waiting = None
        if self.last is not None and self.last is not batch:
            self._record(self.last)
        self.last = batch

    def _record(self, batch: Batch) -> None:
        self.stats.record(batch.rows, batch.waits, batch.end - batch.start)
        if batch.start < self.fleet.s.sim_s:
            self.busy_s += batch.end - batch.start

    def answer(self, ticket: Ticket) -> float:
        """When the request's answer is there; raises InferenceLost if its server died meanwhile."""
        if ticket.generation != self.current():
            raise InferenceLost("the inference server that had this request is gone")
        return ticket.batch.end

    def finish(self) -> None:
        for batch in (self.last, self.waiting):
            if batch is not None:
                self._record(batch)


class ServerLink:
    """A worker's connection to its node's server: what ``NodeClient`` gives ``ServerVersions`` and the worker's
    lanes (``status``, a request and its answer), with the connection's generation."""

    def __init__(self, server: NodeServer):
        self.server, self.generation = server, 0
        self.versions = ServerVersions(self)  # type: ignore[arg-type]  # a NodeClient's status() is all it calls
        self.restarts = 0  # segments whose games restarted: their server died while it had their request
        self.waits: list[float] = []  # simulated seconds a segment waited for its answers beyond its env steps

    def ensure(self) -> None:
        if self.generation != self.server.current():
            self.generation = self.server.connect()

    def status(self, stats: bool = False) -> dict:
        try:
            self.ensure()
            return self.server.status(self.generation)
        except InferenceLost:
            self.generation = 0  # the next request connects again
            raise

    def request(self, decisions: int) -> Ticket:
        self.ensure()
        return self.server.submit(self.generation, decisions)

    def answered_at(self, ticket: Ticket) -> float:
        try:
            return self.server.answer(ticket)
        except InferenceLost:
            self.generation = 0
            raise

    def play(self, segment_s: float, decisions: int) -> None:
        """One segment: the worker steps its env for ``segment_s`` while the server decides its ``decisions``
        (one half of its games steps while the other half is inferred), then waits for what is still undecided.
        A server lost meanwhile costs the segment: the games restart and are played again, on a new server."""
        clock = self.server.fleet.clock
        while True:
            ticket = self.request(decisions)
            clock.charge(segment_s)
            try:
                ready = self.answered_at(ticket)
            except InferenceLost:
                self.restarts += 1
                continue
            wait = max(0.0, ready - clock.t())
            clock.charge(wait)
            self.waits.append(wait)
            return


def figures(fleet, reached: float) -> dict:
    """The busiest server's share of the run spent deciding; the longest a worker's segment waited for its answers
    beyond its own env steps; segments whose games restarted because their server died. 0 under local inference."""
    for server in fleet.servers:
        server.finish()
    links = [w.link for w in fleet.all_workers if w.link is not None]
    run_s = max(1e-9, min(reached, fleet.s.sim_s))
    return {"server_busy_share": max((n.busy_s / run_s for n in fleet.servers), default=0.0),
            "server_wait_max_s": max((max(link.waits, default=0.0) for link in links), default=0.0),
            "inference_restarts": sum(link.restarts for link in links),
            "server_batches": {"batches": sum(n.stats.batches for n in fleet.servers),
                               "rows": sum(n.stats.rows for n in fleet.servers),
                               "kills": sum(n.kills for n in fleet.servers)}}

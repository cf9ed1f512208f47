"""How the optimizer's ranks keep in lock step: they agree on every iteration whether to leave, to publish
and to update, and on rank 0's batch size, and no rank waits for a batch longer than a round, so its peers
never wait in a collective longer than its timeout (NCCL's watchdog kills the process; gloo raises).

Usage::

    >>> from rapid.roles.steps import drive
    >>> agree = Agreement(grouped=False, lead=True)   # one process: its own answers; with ranks, one all-reduce
    >>> v = drive(agree.decide(local_stop=False, publish_due=True, ready=False, lead_values={"batch": 64.0},
    ...                        mean_values={"backlog": 10.0}))
    >>> v.leave, v.publish, v.everyone_ready, v.lead_values, v.mean_values
    (False, True, False, {'batch': 64.0}, {'backlog': 10.0})
    >>> wait_round_s(collective_timeout_s=600.0)    # the longest wait for a batch between two agreements
    5.0

The update loop of each rank (:class:`rapid.roles.optimizer_loop.OptimizerLoop`) asks once a round, after
waiting at most ``wait_round_s`` for a batch; the agreement is a request of the loop's
(:mod:`rapid.roles.steps`), answered by one all-reduce that also carries rank 0's balancer decision (every rank
trains the batch size it says) and each rank's buffer counts (rank 0's balancer decides on their mean)::

    verdict = yield from agree.decide(bool(stop), due, batch is not None, lead_values=..., mean_values=...)
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from rapid.opt.buffer import BufferStats
from rapid.optimizer.balance import Decision
from rapid.roles.steps import AllReduce

WAIT_ROUND_S = 5.0  # longest wait for a batch between two agreements of the ranks
QUIET_WAIT_S = 15.0  # waiting this long for a batch gets a line, then one every NOTICE_EVERY_S
NOTICE_EVERY_S = 60.0


@dataclass(frozen=True)
class Verdict:
    leave: bool
    publish: bool
    everyone_ready: bool
    """Every rank has a batch: they all update on this iteration."""
    lead_values: dict[str, float]
    """Rank 0's ``lead_values``, the same on every rank."""
    mean_values: dict[str, float]
    """Each ``mean_values`` key averaged over the ranks."""


class Agreement:
    """Every rank must leave the update loop, update, and publish on the same iteration, or the others hang in
    a collective; rank 0's clock decides when a version is due, and a rank without a batch yet holds every
    rank back for a round. One all-reduce per round carries all of it, and rank 0's values (its balancer's
    decision) to every rank.

    Rank 0's values travel as sums in which the other ranks put 0, divided by the sum of a 1 that only rank 0
    puts in; the means divide by the sum of a 1 from every rank. So the answer does not depend on whether the
    all-reduce returns sums or means (a process group returns means, a simulation may sum)."""

    def __init__(self, grouped: bool, lead: bool):
        self.grouped, self.lead = grouped, lead

    def decide(self, local_stop: bool, publish_due: bool, ready: bool = True,
               lead_values: dict[str, float] | None = None, mean_values: dict[str, float] | None = None):
        """A :class:`Verdict`: a generator, since with ranks it is a collective. Every rank passes the same
        keys in ``lead_values`` (only rank 0's values count) and ``mean_values``."""
        lead_values, mean_values = dict(lead_values or {}), dict(mean_values or {})
        if not self.grouped:
            return Verdict(local_stop, publish_due, ready, lead_values, mean_values)
        mine = self.lead
        merged = yield AllReduce({"stop": float(local_stop), "publish": float(mine and publish_due),
                                  "waiting": float(not ready), "lead": float(mine), "ranks": 1.0,
                                  **{f"lead.{k}": float(v) if mine else 0.0 for k, v in lead_values.items()},
                                  **{f"mean.{k}": float(v) for k, v in mean_values.items()}})
        return Verdict(merged["stop"] > 0.0, merged["publish"] > 0.0, merged["waiting"] == 0.0,
                       {k: merged[f"lead.{k}"] / merged["lead"] for k in lead_values},
                       {k: merged[f"mean.{k}"] / merged["ranks"] for k in mean_values})


def decision_values(d: Decision) -> dict[str, float]:
    """A decision as the agreement carries it (numbers only; the overload line stays with rank 0's log)."""
    return {k: float(v) for k, v in asdict(d).items() if k != "message"}


def decision_of(values: dict[str, float]) -> Decision:
    fields: dict[str, Any] = {k: v for k, v in values.items() if k in Decision.__dataclass_fields__}
    return Decision(**{**fields, "batch": round(values["batch"]), "overloaded": values["overloaded"] > 0.5,
                       "buffer": round(values.get("buffer", 0.0))})


def balance_inputs(b: BufferStats) -> dict[str, float]:
    return {"received": b.received, "consumed": b.consumed, "wasted": b.dropped_stale + b.evicted_unused,
            "backlog": b.unused}


def wait_round_s(collective_timeout_s: float) -> float:
    """How long a rank waits for a batch before it checks in with the others: well inside the collective
    timeout, which its peers spend waiting for it in the agreement (NCCL's watchdog would kill them).

    >>> wait_round_s(600.0), wait_round_s(8.0)
    (5.0, 2.0)
    """
    return min(WAIT_ROUND_S, collective_timeout_s / 4)


class WaitNotice:
    """A line when the optimizer has waited ``QUIET_WAIT_S`` for a batch (then one a minute), and one when the
    wait ends: an optimizer started before its rollout workers must not sit in silence."""

    def __init__(self, log: logging.Logger, store: str, now: float):
        self.log, self.store = log, store
        self.since: float | None = now
        self.next_line = now + QUIET_WAIT_S
        self.spoke = False

    def still(self, objects_loaded: int, now: float) -> None:
        if self.since is None:
            self.since, self.next_line = now, now + QUIET_WAIT_S
        if now < self.next_line:
            return
        self.next_line, self.spoke = now + NOTICE_EVERY_S, True
        waited = now - self.since
        if objects_loaded == 0:
            self.log.info("waiting for experience for %.0fs: none in %s yet (are rollout workers running "
                          "against this store?)", waited, self.store)
        else:
            self.log.info("waiting for a batch for %.0fs: %d experience object(s) loaded by this rank so far",
                          waited, objects_loaded)

    def over(self, now: float) -> None:
        if self.spoke and self.since is not None:
            self.log.info("experience arrived after %.0fs; training", now - self.since)
        self.since, self.spoke = None, False

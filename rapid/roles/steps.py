"""What a role's loop waits for, and the driver that answers with threads and real time.

A role's loop (the rollout worker's :class:`rapid.roles.rollout_loop.RolloutLoop`, an optimizer rank's
:class:`rapid.roles.optimizer_loop.OptimizerLoop`) is a generator: it does its work and ``yield``s a request
whenever it must wait (:class:`Sleep`, :class:`Until`) or meet the other ranks (:class:`AllReduce`,
:class:`AllGather`); what the ``yield`` returns is the answer. The loop never sleeps, blocks on another
thread or calls a collective itself, so the same object runs two ways:

- in a role, :func:`drive` answers each request at once with real time and the process group;
- in the scale model (``benchmarks/fleet``), a discrete-event scheduler answers them in simulated time, and
  a collective is answered once every rank has asked, as a real one returns.

Usage::

    >>> def loop():
    ...     yield Sleep(0.0)
    ...     merged = yield AllReduce({"stop": 1.0})
    ...     return merged["stop"]
    >>> drive(loop(), ctx=None)          # one rank: a collective is its own answer
    1.0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass


@dataclass(frozen=True)
class Sleep:
    """Come back after ``seconds`` (0: at once; the loop only lets its driver look at the clock)."""

    seconds: float


@dataclass(frozen=True)
class Until:
    """Come back once ``ready()`` holds or ``timeout_s`` has passed. ``block(timeout)`` is how a thread waits for
    it without spinning (a condition variable's wait); a simulation re-checks ``ready`` as its time passes."""

    ready: Callable[[], bool]
    timeout_s: float
    block: Callable[[float], object]


@dataclass(frozen=True)
class AllReduce:
    """Every rank's ``values`` summed, key by key (a collective: every rank asks on the same iteration)."""

    values: dict[str, float]


@dataclass(frozen=True)
class AllGather:
    """Every rank's ``blob``, in rank order (a collective)."""

    blob: bytes


Request = Sleep | Until | AllReduce | AllGather
Loop = Generator[Request, object, int]


def answer(request: Request, ctx, wait: Callable[[float], object] = time.sleep) -> object:
    """The answer a role gives ``request`` with real time and the process group ``ctx`` (None: one rank)."""
    if isinstance(request, Sleep):
        if request.seconds > 0:
            wait(request.seconds)
        return None
    if isinstance(request, Until):
        deadline = time.monotonic() + request.timeout_s
        while not request.ready() and time.monotonic() < deadline:
            request.block(max(0.0, deadline - time.monotonic()))
        return None
    if isinstance(request, AllReduce):
        return dict(request.values) if ctx is None else ctx.all_reduce_scalars(request.values)
    if isinstance(request, AllGather):
        return [request.blob] if ctx is None else ctx.all_gather_bytes(request.blob)
    raise TypeError(f"not a loop request: {request!r}")


def drive(loop: Generator[Request, object, int], ctx=None, wait: Callable[[float], object] = time.sleep):
    """Run ``loop`` to its end, answering every request here and now; returns what the loop returns. ``wait``
    is how a :class:`Sleep` passes (a role passes its stop flag's ``wait``, so a stop cuts it short)."""
    reply: object = None
    while True:
        try:
            request = loop.send(reply)
        except StopIteration as end:
            return end.value
        reply = answer(request, ctx, wait)

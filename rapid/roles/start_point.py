"""Where the optimizer ranks start: one point, chosen by rank 0, loaded by every rank, and proven the same.

Rank 0 alone chooses: a fresh run, or on ``--resume`` :func:`rapid.optimizer.checkpoints.resume_point` (the newest
usable checkpoint; with none, published weights and a fresh Adam); ``--resume auto`` resumes when the store holds a
run (of this name and game: :mod:`rapid.run.run_owner`) and starts fresh when it holds none. It sends its choice to
every rank, and each other rank loads exactly that one (:func:`rapid.optimizer.checkpoints.load_resume_point`),
never one of its own. Then the ranks compare a digest of what they hold: parameters and buffers, Adam's state and
hyperparameters, the update count and the version. A rank that cannot load the point, or a digest that differs,
stops every rank with the same one line (UsageError, exit code 2) that names the rank and the cause; no rank is left
waiting in a collective.

Usage (one rank, no process group; with ranks ``ctx`` is the :class:`~rapid.infra.distributed.DistContext`)::

    >>> import logging, tempfile
    >>> from rapid.infra.store import LocalStore
    >>> from rapid.opt.model import Policy
    >>> policy = Policy(obs_dim=4, action_heads=(3,), hidden=8)
    >>> adam = torch.optim.Adam(policy.parameters())
    >>> start = agree_on_start(None, LocalStore(tempfile.mkdtemp()), policy, adam, resume=False, rank=0,
    ...                        log=logging.getLogger("doctest"))
    >>> start.version, start.updates, start.source, start.resumed, len(start.digest)
    (0, 0, 'a fresh run', False, 64)

Two messages each way, before the update loop starts: rank 0's choice (all-gather of one small JSON document:
the others send nothing) and every rank's verdict with its digest.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import torch

from rapid.errors import UsageError
from rapid.infra.store import Store
from rapid.opt.model import Policy
from rapid.optimizer.checkpoints import LOAD_TRIES, ResumePoint, load_resume_point, newest_version_in_use, resume_point
from rapid.run.run_owner import Owner, check_owner

Resume = bool | Literal["auto"]
"""False: a fresh run (refused where one is stored); True: resume (refused where none is); "auto": either."""


@dataclass(frozen=True)
class Start:
    version: int
    """The newest version in use: the next publish is ``version + 1`` (0 on a fresh run, published first)."""
    updates: int
    source: str
    digest: str
    """sha256 of this rank's state (:func:`state_digest`); every rank's is the same."""
    resumed: bool = False
    """Whether it continues a stored run (else version 0 is still to be published)."""
    meta: dict = field(default_factory=dict)
    """The meta of the checkpoint it loaded (empty for a fresh run or published weights)."""


def state_digest(policy: Policy, adam: torch.optim.Optimizer, updates: int, version: int) -> str:
    """sha256 over the parameters and buffers, Adam's moments, step counts and hyperparameters, the update count
    and the version: equal only if each is bit-identical."""
    h = hashlib.sha256(json.dumps({"updates": updates, "version": version}).encode())
    adam_state = adam.state_dict()
    tensors = {f"model.{k}": v for k, v in policy.tensors().items()}
    tensors |= {f"adam.{i}.{k}": v.detach().cpu().numpy() for i, s in adam_state["state"].items()
                for k, v in s.items() if torch.is_tensor(v)}
    for name in sorted(tensors):
        value = np.ascontiguousarray(tensors[name])
        h.update(f"{name}:{value.dtype.str}:{value.shape}".encode())
        h.update(value.tobytes())
    h.update(json.dumps(adam_state["param_groups"], sort_keys=True, default=str).encode())
    return h.hexdigest()


def agree_on_start(ctx, store: Store, policy: Policy, adam: torch.optim.Optimizer, resume: Resume, rank: int,
                   log: logging.Logger, prepare: Callable[[bool], None] | None = None, tries: int = LOAD_TRIES,
                   wait_s: float = 1.0, owner: Owner | None = None) -> Start:
    """Load the one start point into ``policy`` and ``adam`` on every rank (see the module docstring).
    ``prepare``: rank 0's work once it has chosen (the run's layout), given whether it resumes, before the other
    ranks read the store; its failure stops every rank like a failed load. ``tries``/``wait_s``: of a load through
    transient errors. ``owner``: this config's run, checked against the store's on a resume."""
    choice: dict = {}
    if rank == 0:
        try:
            choice = _choose(store, policy, adam, resume, log, tries, wait_s, owner)
        except Exception as e:  # sent to the others first, so they stop with it instead of waiting for a choice
            _exchange(ctx, {"error": f"rank 0: {_line(e)}"})
            raise
    choice = _exchange(ctx, choice)[0]
    if "error" in choice:
        raise UsageError(choice["error"])
    point = ResumePoint(**choice["point"]) if "point" in choice else None
    problem = ""
    try:
        if point is None and ctx is not None:
            ctx.broadcast_parameters(policy, src=0)  # a fresh run starts from rank 0's initial weights
        elif point is not None and rank != 0:
            load_resume_point(store, point, policy, adam, log, tries=tries, wait_s=wait_s)
    except Exception as e:  # any rank's failure stops every rank together (below), not one while others wait
        problem = f"rank {rank} could not load {point.source if point else 'the start point'}, which rank 0 " \
                  f"chose: {_line(e)}"
    if rank == 0 and prepare is not None:
        try:
            prepare(point is not None)
        except Exception as e:  # as above
            problem = f"rank 0: {_line(e)}"
    version, updates = (point.version, point.updates) if point else (0, 0)
    digest = state_digest(policy, adam, updates, version)
    verdicts = _exchange(ctx, {"problem": problem, "digest": digest})
    for v in verdicts:
        if v["problem"]:
            raise UsageError(v["problem"])
    differ = [r for r, v in enumerate(verdicts) if v["digest"] != verdicts[0]["digest"]]
    if differ:
        raise UsageError(f"the optimizer ranks would start from different states (parameters, Adam state or "
                         f"counters): rank 0 holds {verdicts[0]['digest'][:12]}, rank {differ[0]} "
                         f"{verdicts[differ[0]]['digest'][:12]} ({len(differ)} rank(s) differ); not starting")
    source = point.source if point else "a fresh run"
    return Start(version, updates, source, digest, resumed=point is not None, meta=point.meta if point else {})


def _choose(store: Store, policy, adam, resume: Resume, log: logging.Logger, tries: int, wait_s: float,
            owner: Owner | None) -> dict:
    """Rank 0's choice, loaded into its own ``policy`` and ``adam``."""
    if resume == "auto" and newest_version_in_use(store) is None:
        log.info("--resume auto: %s holds no run yet; starting a fresh one", store.describe())
        return {}
    if resume:
        if owner is not None:
            check_owner(store, owner, auto=resume == "auto")
        return {"point": asdict(resume_point(store, policy, adam, log, tries=tries, wait_s=wait_s))}
    if newest_version_in_use(store) is not None:
        raise UsageError(f"{store.describe()} already holds published parameters; use --resume or a new run dir")
    return {}


def _exchange(ctx, doc: dict) -> list[dict]:
    """Every rank's ``doc``, in rank order (one all-gather; without a process group, this rank's own)."""
    blob = json.dumps(doc).encode()
    blobs = [blob] if ctx is None else ctx.all_gather_bytes(blob)
    return [json.loads(b) for b in blobs]


def _line(error: BaseException) -> str:
    """An error as one line: a UsageError says it all; anything else is named by its type."""
    text = " ".join(str(error).split())
    return text if isinstance(error, UsageError) else f"{type(error).__name__}: {text}"

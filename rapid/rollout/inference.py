"""Where a rollout worker's policy runs: on the worker's own core (``local``) or on the node's inference server
(``node``, :mod:`rapid.rollout.inference_client`). Both take the same requests and give the same answers, so the worker
(:class:`rapid.rollout.worker.RolloutWorker`) never knows which it has.

Usage (what a worker does every step, for the agent rows that move)::

    >>> import numpy as np, torch
    >>> from rapid.opt.model import Policy
    >>> policy = Policy(obs_dim=3, action_heads=(4,), hidden=8, lstm=8)
    >>> inference = LocalInference(policy, rows=4)
    >>> inference.set_params(7, policy.tensors())
    >>> request = ActRequest(obs=np.zeros((4, 3), np.float32), mask=np.ones((4, 4), bool),
    ...                      uniforms=np.full((4, 1), 0.5, np.float32), groups=[Group(LATEST, np.array([0, 2]))])
    >>> inference.submit(request)          # a node's server works on it meanwhile; local: done already
    >>> result = inference.result()
    >>> result.actions.shape, result.h_before.shape, result.version   # rows 0 and 2, in the groups' order
    ((2, 1), (2, 8), 7)
    >>> inference.reset(np.array([2]))     # row 2's game is over: its next decision starts from a zero state

A request names its rows by controller (:class:`Group`): the latest policy (``LATEST``) or a past policy by its
league id. A worker's own core plays a past policy from the ``Policy`` the group carries; the node's server loads
it by id (:meth:`Inference.load_opponent`). Sampled actions come from the request's ``uniforms`` (one per row and
action head, from the worker's own random stream, :func:`rapid.opt.model.sample_heads`): the same seed gives the
same actions wherever the policy runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from rapid.league.sampling import LATEST
from rapid.opt.model import Policy

MODES = ("local", "node", "auto")


# The fewest usable cores for which `auto` runs node inference on a GPU box. From BENCHMARKS.md "Node inference
# against local" (2026-11-26): a node worker made 1.12x a local worker's agent-steps/s on the H200 box (64 units,
# 14 workers on 16 cores; 1.03x with 256 units), and the server needs a core of its own (two workers and the server
# on the 2-core VM lost 34%). With c cores for rollouts, node runs c - 1 workers at 1.12x against local's c:
# node gains only where (c - 1) * 1.12 > c, i.e. c >= 10. Between 2 and 16 cores nothing was measured.
NODE_MIN_CORES = 10


def inference_mode(setting: str, cuda_available: bool, cores: int) -> str:
    """``rollout.inference`` as it runs on a machine with ``cores`` usable cores: ``auto`` is ``node`` where a GPU is
    visible and there are at least :data:`NODE_MIN_CORES` cores (the server takes one of them), else ``local``.

    >>> inference_mode("auto", True, 16), inference_mode("auto", True, 2), inference_mode("auto", False, 64)
    ('node', 'local', 'local')
    >>> inference_mode("node", False, 2)
    'node'
    """
    if setting == "auto":
        return "node" if cuda_available and cores >= NODE_MIN_CORES else "local"
    return setting


@dataclass
class Group:
    """Rows one controller acts for in a step. ``policy`` is a past policy's weights for local inference (the
    node's server loads its own by ``key``)."""

    key: str
    rows: np.ndarray
    policy: Policy | None = None


@dataclass
class ActRequest:
    obs: np.ndarray
    """[rows, obs_dim] float32: every row of the lane (only the groups' rows are read)."""
    mask: np.ndarray
    """[rows, mask_dim] bool."""
    uniforms: np.ndarray
    """[rows, heads] float32 in [0, 1): the draws that pick the sampled actions."""
    groups: list[Group]


@dataclass
class ActResult:
    """For the groups' rows in order: actions [N, heads], log-probability and value [N], the LSTM state before the
    decision [N, lstm] (a sample starts from it), and the version that decided."""

    actions: np.ndarray
    logp: np.ndarray
    value: np.ndarray
    h_before: np.ndarray
    c_before: np.ndarray
    version: int


class InferenceLost(RuntimeError):
    """The node's server went away mid-request: its LSTM states are gone, so the worker restarts its games."""


class Inference(Protocol):
    """One lane of a worker: its rows' LSTM states and the policies that step them."""

    def set_params(self, version: int, tensors: Mapping[str, np.ndarray]) -> None:
        """Play ``version`` (local: these weights; node: the server serves the node's latest itself)."""

    def submit(self, request: ActRequest) -> None:
        """Start deciding for the request's rows; :meth:`result` waits for the answer."""

    def result(self) -> ActResult:
        """The answer to the last :meth:`submit` (raises :class:`InferenceLost` if the server died)."""

    def value(self, rows: np.ndarray, obs: np.ndarray) -> np.ndarray:
        """The latest policy's value of ``obs`` [len(rows), obs_dim] from the rows' current states, advancing
        nothing: the bootstrap where a game is cut at a time limit."""

    def reset(self, rows: np.ndarray) -> None:
        """The rows' games are over: their next decision starts from a zero state."""

    def load_opponent(self, member_id: str) -> None:
        """Make the past policy ``member_id`` playable by key (raises what loading it raises)."""


def concat_rows(groups: list[Group]) -> np.ndarray:
    return np.concatenate([g.rows for g in groups]) if groups else np.zeros(0, np.int64)


class LocalInference:
    """The policy on the worker's own core; the states of its ``rows`` in torch tensors beside it."""

    def __init__(self, policy: Policy, rows: int):
        self.policy = policy
        self.h, self.c = policy.initial_state(rows)
        self.version = -1
        self._result: ActResult | None = None

    def set_params(self, version: int, tensors: Mapping[str, np.ndarray]) -> None:
        self.policy.load_tensors(dict(tensors))
        self.version = version

    def submit(self, request: ActRequest) -> None:
        parts = [self._act(g, request) for g in request.groups]
        if not parts:
            heads = request.uniforms.shape[1]
            empty = np.zeros((0, self.h.shape[1]), np.float32)
            self._result = ActResult(np.zeros((0, heads), np.int64), np.zeros(0, np.float32),
                                     np.zeros(0, np.float32), empty, empty, self.version)
            return
        actions, logp, value, h, c = (np.concatenate(column) for column in zip(*parts))
        self._result = ActResult(actions, logp, value, h, c, self.version)

    def _act(self, group: Group, request: ActRequest) -> tuple[np.ndarray, ...]:
        if group.key == LATEST:
            net = self.policy
        elif group.policy is not None:
            net = group.policy
        else:  # the opponent sources give every past opponent of a local worker a policy
            raise RuntimeError(f"opponent {group.key} has no policy to play locally")
        rows = torch.from_numpy(group.rows)
        before = (self.h[rows], self.c[rows])  # indexing copies: kept as the state before the decision
        out = net.act(torch.from_numpy(request.obs[group.rows]), torch.from_numpy(request.mask[group.rows]), before,
                      uniforms=torch.from_numpy(request.uniforms[group.rows]))
        self.h[rows], self.c[rows] = out.state
        return (out.actions.numpy(), out.logp.numpy(), out.value.numpy(), before[0].numpy(), before[1].numpy())

    def result(self) -> ActResult:
        if self._result is None:
            raise RuntimeError("result() without a submit()")
        result, self._result = self._result, None
        return result

    def value(self, rows: np.ndarray, obs: np.ndarray) -> np.ndarray:
        index = torch.from_numpy(rows)
        return self.policy.value(torch.from_numpy(obs), (self.h[index], self.c[index])).numpy()

    def reset(self, rows: np.ndarray) -> None:
        index = torch.from_numpy(rows)
        self.h[index] = 0.0
        self.c[index] = 0.0

    def load_opponent(self, member_id: str) -> None:
        """Nothing to do: a local worker's opponents carry their own policy."""

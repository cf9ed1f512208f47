"""A batch of the node's inference server (:mod:`rapid.rollout.inference_server`): one forward pass for the rows
each policy acts for. Every row's inputs, whatever policy it plays, are gathered from the workers' slots straight
into one staging buffer per array (pinned host memory on CUDA, reused from batch to batch) and copied to the device
once per array; each policy runs on its slice, and all the answers are packed on the device into one tensor and
copied back once: the batch's one wait for the device, however many policies it holds.

    >>> import numpy as np, torch
    >>> from rapid.rollout.inference_wire import SlotLayout
    >>> from rapid.opt.model import Policy
    >>> policy = Policy(obs_dim=3, action_heads=(4,), hidden=8, lstm=8)
    >>> view = SlotLayout(1, 4, 3, 4, 1, 8).views(bytearray(SlotLayout(1, 4, 3, 4, 1, 8).size))[0]
    >>> view.mask[:] = True
    >>> h, c = torch.zeros(4, 8), torch.zeros(4, 8)
    >>> decide([(policy, [Part(view, position=0, rows=np.array([1, 3]), state_rows=np.array([1, 3]))])], h, c,
    ...        Staging(torch.device("cpu")))
    >>> bool(h[1].abs().sum() > 0), bool(h[0].abs().sum() == 0)     # rows 1 and 3 stepped, the others kept
    (True, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rapid.opt.model import Policy
from rapid.rollout.inference_wire import LaneViews


@dataclass
class Part:
    """A request's rows for one policy."""

    view: LaneViews
    position: int
    """Where these rows' answers go in the request's answer slots."""
    rows: np.ndarray
    """The rows in the worker's lane."""
    state_rows: np.ndarray
    """The same rows in the server's state tensors."""


class Staging:
    """Host buffers for one pass's inputs, grown as needed and reused; pinned on CUDA, so that the copies to the
    device are asynchronous (each pass ends with the one copy back, so a buffer is free again by the next pass)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pinned = device.type == "cuda"
        self._buffers: dict[str, torch.Tensor] = {}

    def buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        size = int(np.prod(shape))
        held = self._buffers.get(name)
        if held is None or held.numel() < size or held.dtype != dtype:
            held = torch.empty(max(size, 1) * 2, dtype=dtype, pin_memory=self.pinned)
            self._buffers[name] = held
        return held[:size].view(shape)

    def gather(self, name: str, sources: list[tuple[np.ndarray, np.ndarray]], dtype: torch.dtype) -> torch.Tensor:
        """Rows ``rows`` of each ``array``, one after the other, on the device."""
        n = sum(len(rows) for _, rows in sources)
        width = sources[0][0].shape[1:]
        staged = self.buffer(name, (n, *width), dtype)
        out, start = staged.numpy(), 0
        for array, rows in sources:
            np.take(array, rows, axis=0, out=out[start:start + len(rows)])
            start += len(rows)
        return staged.to(self.device, non_blocking=True) if self.pinned else staged

    def put(self, name: str, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        staged = self.buffer(name, array.shape, dtype)
        staged.numpy()[...] = array
        return staged.to(self.device, non_blocking=True) if self.pinned else staged


def decide(groups: list[tuple[Policy, list[Part]]], h: torch.Tensor, c: torch.Tensor, staging: Staging) -> None:
    """Decide for every part's rows with its group's policy, stepping their states in ``h``, ``c`` (the server's, on
    its device) and writing the answers into the parts' slots."""
    parts = [p for _, group in groups for p in group]
    if not parts:
        return
    obs = staging.gather("obs", [(p.view.obs, p.rows) for p in parts], torch.float32)
    mask = staging.gather("mask", [(p.view.mask, p.rows) for p in parts], torch.bool)
    uniforms = staging.gather("uniforms", [(p.view.uniforms, p.rows) for p in parts], torch.float32)
    index = staging.put("index", np.concatenate([p.state_rows for p in parts]), torch.int64)
    packs, start = [], 0
    for policy, group in groups:
        end = start + sum(len(p.rows) for p in group)
        rows, at = slice(start, end), index[start:end]
        before = (h[at], c[at])
        out = policy.act(obs[rows], mask[rows], before, uniforms=uniforms[rows])
        h[at], c[at] = out.state
        # Actions are small integers, exact in float32: every answer of the batch travels back in one copy.
        packs.append(torch.cat([out.actions.float(), out.logp[:, None], out.value[:, None], before[0], before[1]], 1))
        start = end
    answers = torch.cat(packs).cpu().numpy()
    heads, lstm = out.actions.shape[1], h.shape[1]
    start = 0
    for p in parts:
        block = answers[start:start + len(p.rows)]
        start += len(p.rows)
        target = slice(p.position, p.position + len(p.rows))
        p.view.actions[target] = block[:, :heads]
        p.view.logp[target] = block[:, heads]
        p.view.value[target] = block[:, heads + 1]
        p.view.h[target] = block[:, heads + 2:heads + 2 + lstm]
        p.view.c[target] = block[:, heads + 2 + lstm:]

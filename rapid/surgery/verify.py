"""Function preservation: the old and the new policy, run side by side over the same sequences with their LSTM
state carried from step to step, must give the same action log-probabilities, values and greedy actions.

A multi-step rollout matters: a wrong weight from a new LSTM unit into an old one changes nothing on the first
step (the new units start from zero state) and everything from the second on.

    >>> from rapid.surgery.shapes import PolicyShape
    >>> old = PolicyShape(4, (3, 2), 8, 1, 6).build()
    >>> inputs = random_inputs(PolicyShape.of(old), samples=3, steps=5, rng=np.random.default_rng(0))
    >>> compare(old, old, inputs).ok()
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rapid.opt.model import Policy
from rapid.surgery.shapes import PolicyShape, head_offsets, logit_map

TOLERANCE = 1e-5
"""Largest difference allowed in a log-probability or a value (float32)."""


@dataclass
class Inputs:
    """Sequences for the old and the new policy: [N, T, …]; ``h0``/``c0`` the old policy's state at step 0."""

    obs_old: np.ndarray
    obs_new: np.ndarray
    mask_old: np.ndarray
    mask_new: np.ndarray
    first: np.ndarray
    h0: np.ndarray
    c0: np.ndarray
    actions: np.ndarray | None = None
    """Actions taken (old indices, which keep their meaning in the new heads); None: the old greedy ones."""


@dataclass
class Preservation:
    decisions: int
    max_logp_diff: float
    max_value_diff: float
    greedy_same: int
    greedy_total: int

    def ok(self, tolerance: float = TOLERANCE) -> bool:
        return (self.max_logp_diff <= tolerance and self.max_value_diff <= tolerance
                and self.greedy_same == self.greedy_total)

    def line(self) -> str:
        return (f"{self.decisions} decisions: max |Δ log-prob| {self.max_logp_diff:.1e}, max |Δ value| "
                f"{self.max_value_diff:.1e}, greedy actions {self.greedy_same}/{self.greedy_total} the same")

    @staticmethod
    def merge(parts: list[Preservation]) -> Preservation:
        return Preservation(sum(p.decisions for p in parts), max(p.max_logp_diff for p in parts),
                            max(p.max_value_diff for p in parts), sum(p.greedy_same for p in parts),
                            sum(p.greedy_total for p in parts))


def widen(old: PolicyShape, new: PolicyShape, obs_old: np.ndarray, mask_old: np.ndarray,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The new policy's inputs for recorded old ones: new observation features random (what they hold must
    not matter), new actions allowed (the strictest case: their logits take part in every softmax)."""
    lead = obs_old.shape[:-1]
    obs = rng.normal(0.0, 2.0, (*lead, new.obs_dim)).astype(np.float32)
    obs[..., :old.obs_dim] = obs_old
    mask = np.ones((*lead, sum(new.action_heads)), bool)
    mask[..., logit_map(old.action_heads, new.action_heads)] = mask_old
    return obs, mask


def random_inputs(old: PolicyShape, samples: int, steps: int, rng: np.random.Generator,
                  new: PolicyShape | None = None) -> Inputs:
    """Random observations and masks (every head keeps an allowed action), some game starts, a random state."""
    obs = rng.normal(0.0, 2.0, (samples, steps, old.obs_dim)).astype(np.float32)
    mask = rng.random((samples, steps, sum(old.action_heads))) < 0.7
    for offset, n in zip(head_offsets(old.action_heads), old.action_heads):
        np.put_along_axis(mask, offset + rng.integers(0, n, (samples, steps, 1)), True, axis=-1)
    first = rng.random((samples, steps)) < 0.1
    h0, c0 = (rng.normal(0.0, 0.5, (samples, old.lstm)).astype(np.float32) for _ in range(2))
    obs_new, mask_new = widen(old, new or old, obs, mask, rng)
    return Inputs(obs, obs_new, mask, mask_new, first, h0, c0)


def _pad(state: torch.Tensor, size: int) -> torch.Tensor:
    """An old state with zeros for the new units (old units do not read them)."""
    return torch.nn.functional.pad(state, (0, size - state.shape[-1]))


@torch.no_grad()
def compare(old: Policy, new: Policy, inputs: Inputs) -> Preservation:
    """Step both policies through the sequences (state zeroed where a game starts, as rollout workers do)
    comparing every allowed action's log-probability, the value head and each head's greedy action; then the
    learner's path (``Policy.evaluate``) on the actions taken."""
    old.eval(), new.eval()
    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in vars(inputs).items() if v is not None}
    N, T = inputs.first.shape
    shape_old, shape_new = PolicyShape.of(old), PolicyShape.of(new)
    columns = torch.from_numpy(logit_map(shape_old.action_heads, shape_new.action_heads))
    offsets = head_offsets(shape_old.action_heads)
    state_old = (t["h0"], t["c0"])
    state_new = (_pad(t["h0"], new.lstm_size), _pad(t["c0"], new.lstm_size))
    logp_diff = value_diff = 0.0
    same = total = 0
    greedy = torch.zeros(N, T, len(shape_old.action_heads), dtype=torch.int64)
    for step in range(T):
        keep = (~t["first"][:, step]).float().unsqueeze(-1)
        state_old = (state_old[0] * keep, state_old[1] * keep)
        state_new = (state_new[0] * keep, state_new[1] * keep)
        # _core and _log_probs are what Policy.act runs: here every action's log-probability is compared.
        state_old = old._core(t["obs_old"][:, step], state_old)
        state_new = new._core(t["obs_new"][:, step], state_new)
        lp_old = torch.cat(old._log_probs(state_old[0], t["mask_old"][:, step]), -1)
        lp_new_all = new._log_probs(state_new[0], t["mask_new"][:, step])
        lp_new = torch.cat(lp_new_all, -1)[:, columns]
        gap = (lp_old - lp_new).abs().masked_fill(~t["mask_old"][:, step], 0.0)  # forbidden: ~-1e9 in both
        logp_diff = max(logp_diff, float(gap.max()))
        value_diff = max(value_diff, float((old.value_head(state_old[0]) - new.value_head(state_new[0])).abs().max()))
        for k, (offset, n) in enumerate(zip(offsets, shape_old.action_heads)):
            greedy[:, step, k] = lp_old[:, offset:offset + n].argmax(-1)
            same += int((greedy[:, step, k] == lp_new_all[k].argmax(-1)).sum())
            total += N
    actions = t.get("actions", greedy)
    logp_o, _, value_o = old.evaluate(t["obs_old"], t["mask_old"], actions, t["h0"], t["c0"], t["first"])
    logp_n, _, value_n = new.evaluate(t["obs_new"], t["mask_new"], actions, _pad(t["h0"], new.lstm_size),
                                      _pad(t["c0"], new.lstm_size), t["first"])
    logp_diff = max(logp_diff, float((logp_o - logp_n).abs().max()))
    value_diff = max(value_diff, float((value_o - value_n).abs().max()))
    return Preservation(N * T, logp_diff, value_diff, same, total)

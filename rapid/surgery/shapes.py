"""The shape of a policy and the plan that grows one shape into another, tensor by tensor.

A plan is a list of :class:`Growth` entries, one per tensor of the state dict: where each old index goes in
the new tensor (one index map per axis) and how the new entries start. The maps say everything about
preservation: every weight whose row is an old unit and whose column is a new one (a new observation
feature, a new encoder unit, a new LSTM unit) is left at zero, so old units never see new ones.

    >>> from dataclasses import replace
    >>> old = PolicyShape(obs_dim=4, action_heads=(3,), hidden=8, encoder_layers=1, lstm=6)
    >>> new = PolicyShape(obs_dim=5, action_heads=(3,), hidden=8, encoder_layers=1, lstm=12)
    >>> [g.line() for g in plan_growth(old, new) if g.grows][:3]
    ['obs_norm.mean [4] → [5]', 'obs_norm.var [4] → [5]', 'encoder.0.weight [8, 4] → [8, 5]']
    >>> plan_growth(new, replace(old, lstm=12))
    Traceback (most recent call last):
    rapid.surgery.shapes.SurgeryRefused: observation features removed (obs_dim 5 → 4): surgery only adds features
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from rapid.errors import UsageError
from rapid.opt.model import GridInput, Policy

GATES = 4
"""nn.LSTM stacks its input, forget, cell and output gates' rows, ``lstm`` rows each, in that order."""


class SurgeryRefused(UsageError):
    """A change surgery cannot make while computing the same function (one line, exit code 2)."""


@dataclass(frozen=True)
class PolicyShape:
    """Everything that fixes the sizes of a :class:`~rapid.opt.model.Policy`'s tensors (and ``obs_clip``, which
    changes its function)."""

    obs_dim: int
    action_heads: tuple[int, ...]
    hidden: int
    encoder_layers: int
    lstm: int
    obs_clip: float = 5.0
    grid: tuple[int, int, int] | None = None
    conv_channels: tuple[int, ...] = ()

    @property
    def conv_grid(self) -> tuple[int, int, int] | None:
        """The grid the convolutions read, or None when the policy does not convolve."""
        return self.grid if self.conv_channels else None

    @property
    def convolves(self) -> bool:
        return self.conv_grid is not None

    @staticmethod
    def of(policy: Policy) -> PolicyShape:
        """The shape of a built policy, read from its modules."""
        linears = [m for m in policy.encoder if isinstance(m, nn.Linear)]
        convs = [m for m in policy.encoder if isinstance(m, nn.Conv2d)]
        grids = [m.grid for m in policy.encoder if isinstance(m, GridInput)]
        return PolicyShape(policy.obs_dim, policy.action_heads, linears[0].out_features, len(linears),
                           policy.lstm_size, policy.obs_norm.clip, grids[0] if grids else None,
                           tuple(c.out_channels for c in convs))

    def build(self) -> Policy:
        return Policy(self.obs_dim, self.action_heads, hidden=self.hidden, encoder_layers=self.encoder_layers,
                      lstm=self.lstm, obs_clip=self.obs_clip, grid=self.grid, conv_channels=self.conv_channels)

    def encoder_linears(self) -> list[str]:
        """State-dict prefixes of the encoder's fully connected layers (``encoder.<i>``): after the grid input,
        each convolution and its ReLU, and the flatten when the policy convolves."""
        start = 2 + 2 * len(self.conv_channels) if self.convolves else 0
        return [f"encoder.{start + 2 * j}" for j in range(self.encoder_layers)]

    def encoder_input(self) -> int:
        """Inputs of the first fully connected layer: the observation, or the flattened convolution output."""
        grid = self.conv_grid
        if grid is None:
            return self.obs_dim
        height, width, _ = grid
        return self.conv_channels[-1] * height * width


@dataclass(frozen=True)
class Growth:
    """One tensor of the plan: ``maps[k]`` holds the new index of every old index along axis k."""

    name: str
    old_shape: tuple[int, ...]
    new_shape: tuple[int, ...]
    maps: tuple[np.ndarray, ...]
    new_rows: str = "zero"
    """How the rows of new units start: "random" (a layer's new units: their incoming weights) or "zero"."""
    fill: float = 0.0
    """Every other new entry: 0 for weights (so old units ignore new inputs), a bias's starting value."""

    @property
    def grows(self) -> bool:
        return self.old_shape != self.new_shape

    def line(self) -> str:
        return f"{self.name} {list(self.old_shape)} → {list(self.new_shape)}"

    def new_row_indices(self) -> np.ndarray:
        return np.setdiff1d(np.arange(self.new_shape[0]), self.maps[0])


def _same(name: str, shape: tuple[int, ...]) -> Growth:
    return Growth(name, shape, shape, tuple(np.arange(n) for n in shape))


def head_offsets(heads: tuple[int, ...]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(heads)[:-1]]).astype(np.int64)


def logit_map(old_heads: tuple[int, ...], new_heads: tuple[int, ...]) -> np.ndarray:
    """Where each old logit goes: each head's old actions keep their indices, new ones follow them."""
    return np.concatenate([o + np.arange(n) for o, n in zip(head_offsets(new_heads), old_heads)])


def gate_map(old_lstm: int, new_lstm: int) -> np.ndarray:
    """Where each old row of a gate-stacked LSTM tensor goes: unit u of gate g is row g·L + u."""
    return np.concatenate([g * new_lstm + np.arange(old_lstm) for g in range(GATES)])


def refusals(old: PolicyShape, new: PolicyShape) -> list[str]:
    """Every change between the shapes that surgery cannot make, as phrases; empty when all can be made."""
    why = []
    if new.obs_dim < old.obs_dim:
        why.append(f"observation features removed (obs_dim {old.obs_dim} → {new.obs_dim}): surgery only adds "
                   "features")
    if new.hidden < old.hidden:
        why.append(f"encoder units removed (model.hidden {old.hidden} → {new.hidden})")
    if new.lstm < old.lstm:
        why.append(f"LSTM units removed (model.lstm {old.lstm} → {new.lstm})")
    if new.encoder_layers != old.encoder_layers:
        why.append(f"a different number of encoder layers (model.encoder_layers {old.encoder_layers} → "
                   f"{new.encoder_layers})")
    if len(new.action_heads) != len(old.action_heads):
        why.append(f"a different number of action heads ({len(old.action_heads)} → {len(new.action_heads)})")
    elif any(n < o for o, n in zip(old.action_heads, new.action_heads)):
        why.append(f"action choices removed (heads {list(old.action_heads)} → {list(new.action_heads)})")
    if new.obs_clip != old.obs_clip:
        why.append(f"a different observation clip (ppo.obs_clip {old.obs_clip} → {new.obs_clip}) changes what "
                   "the policy computes")
    if old.convolves or new.convolves:
        if old.conv_channels != new.conv_channels or old.convolves != new.convolves:
            why.append(f"a changed convolution trunk (model.conv_channels {list(old.conv_channels)} → "
                       f"{list(new.conv_channels)})")
        elif old.grid != new.grid:
            why.append(f"a changed observation grid under the convolutions ({old.grid} → {new.grid})")
    return why


def plan_growth(old: PolicyShape, new: PolicyShape, new_action_bias: float = -30.0) -> list[Growth]:
    """The growth of every tensor from ``old`` to ``new``; SurgeryRefused naming every unsupported change."""
    why = refusals(old, new)
    if why:
        raise SurgeryRefused("; ".join(why))
    obs = np.arange(old.obs_dim)
    hid, units = np.arange(old.hidden), np.arange(old.lstm)
    plan = [Growth("obs_norm.mean", (old.obs_dim,), (new.obs_dim,), (obs,)),
            Growth("obs_norm.var", (old.obs_dim,), (new.obs_dim,), (obs,), fill=1.0),
            _same("obs_norm.count", ()), _same("return_scale", ())]
    old_grid = old.conv_grid
    if old_grid is not None:
        size = old_grid[2]
        for i, out in enumerate(old.conv_channels):
            conv = f"encoder.{1 + 2 * i}"
            plan += [_same(f"{conv}.weight", (out, size, 3, 3)), _same(f"{conv}.bias", (out,))]
            size = out
    inputs = np.arange(old.encoder_input())
    for j, prefix in enumerate(old.encoder_linears()):
        fan_old, fan_new = (old.encoder_input(), new.encoder_input()) if j == 0 else (old.hidden, new.hidden)
        plan += [Growth(f"{prefix}.weight", (old.hidden, fan_old), (new.hidden, fan_new), (hid, inputs), "random"),
                 Growth(f"{prefix}.bias", (old.hidden,), (new.hidden,), (hid,))]
        inputs = hid
    gates = gate_map(old.lstm, new.lstm)
    rows_old, rows_new = (GATES * old.lstm,), (GATES * new.lstm,)
    plan += [Growth("lstm.weight_ih_l0", (*rows_old, old.hidden), (*rows_new, new.hidden), (gates, hid), "random"),
             Growth("lstm.weight_hh_l0", (*rows_old, old.lstm), (*rows_new, new.lstm), (gates, units), "random"),
             Growth("lstm.bias_ih_l0", rows_old, rows_new, (gates,)),
             Growth("lstm.bias_hh_l0", rows_old, rows_new, (gates,))]
    logits = logit_map(old.action_heads, new.action_heads)
    actions_old, actions_new = sum(old.action_heads), sum(new.action_heads)
    plan += [Growth("logits.weight", (actions_old, old.lstm), (actions_new, new.lstm), (logits, units)),
             Growth("logits.bias", (actions_old,), (actions_new,), (logits,), fill=new_action_bias),
             Growth("value_head.weight", (1, old.lstm), (1, new.lstm), (np.arange(1), units)),
             _same("value_head.bias", (1,))]
    return plan


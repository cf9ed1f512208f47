"""The LSTM policy shared by all agents of a side.

Observation normalization and the return scale are buffers of the model, so they travel with every
published parameter version; only the learner updates them.

Acting (rollout workers, evaluation; no grad, all agents of all games in one batch)::

    out = policy.act(obs, mask, state)          # obs [N, D], mask [N, M] bool, state (h, c) [N, L]
    out.actions, out.logp, out.value, out.state

Training (the learner; BPTT over samples of T steps from each sample's stored initial state)::

    logp, entropy, value = policy.evaluate(obs, mask, actions, h0, c0, first)   # [S, T] each
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rapid.opt import losses

NEG_INF = -1e9


def _summed(terms: Iterable[torch.Tensor]) -> torch.Tensor:
    """The heads' terms added in order, as ``sum`` adds them (``sum``'s int start would type the result int)."""
    return functools.reduce(operator.add, terms)


class RunningNorm(nn.Module):
    """Running mean/variance (Chan et al. parallel update), applied as a clipped z-score.

    With ``channels`` (a channels-last grid flattened, dim = cells × channels) the statistics are kept per
    feature but applied pooled per channel: a pattern scales alike on every cell, as convolutions need."""

    # Buffers (register_buffer), declared so that type checkers see tensors, not nn.Module's attribute lookup.
    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, dim: int, clip: float, channels: int = 0):
        super().__init__()
        self.clip = clip
        self.channels = channels
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).double()
        self.set(*self.merged(x.mean(0), x.var(0, unbiased=False), x.shape[0]))

    @torch.no_grad()
    def merged(self, batch_mean: torch.Tensor, batch_var: torch.Tensor, n: torch.Tensor | float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(count, mean, var) after pooling with a batch of n observations; the buffers are not changed."""
        n = torch.as_tensor(n, dtype=torch.float64, device=self.mean.device)
        count, mean, m2 = losses.merge_moments(self.count, self.mean, self.var * self.count, n,
                                               batch_mean.double(), batch_var.double() * n)
        return count, mean, m2 / count

    @torch.no_grad()
    def set(self, count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> None:
        self.count.copy_(count)
        self.mean.copy_(mean)
        self.var.copy_(var)

    def applied(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, var) per feature as applied: pooled over the cells of each channel for a grid (every cell has
        the same count, so the pooled moments are exact)."""
        if not self.channels:
            return self.mean, self.var
        mean, var = self.mean.view(-1, self.channels), self.var.view(-1, self.channels)
        pooled_mean = mean.mean(0)
        pooled_var = (var + (mean - pooled_mean) ** 2).mean(0)
        cells = mean.shape[0]
        return pooled_mean.repeat(cells), pooled_var.repeat(cells)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, var = self.applied()
        z = (x - mean.float()) / (var.float().sqrt() + 1e-8)
        return z.clamp(-self.clip, self.clip)


def sample_heads(heads: list[torch.Tensor], uniforms: torch.Tensor) -> torch.Tensor:
    """Actions [N, heads] drawn by inverse CDF: head i's action is the first whose cumulative probability passes
    ``uniforms[:, i]`` times the head's total (so float rounding never reaches past the last allowed action; a
    forbidden action has probability exactly 0 and an empty interval).

    >>> lp = torch.tensor([[0.25, 0.75]]).log()
    >>> [int(sample_heads([lp], torch.tensor([[u]]))) for u in (0.0, 0.2, 0.3, 0.99)]
    [0, 0, 1, 1]
    """
    picks = []
    for i, lp in enumerate(heads):
        cdf = lp.exp().cumsum(-1)
        threshold = uniforms[:, i:i + 1].to(cdf.dtype) * cdf[:, -1:]
        picks.append((cdf <= threshold).sum(-1).clamp(max=lp.shape[-1] - 1))
    return torch.stack(picks, -1)


@dataclass
class ActOutput:
    actions: torch.Tensor
    logp: torch.Tensor
    value: torch.Tensor
    """In return units (the normalized head output times the return scale)."""
    state: tuple[torch.Tensor, torch.Tensor]


@dataclass
class RunSplit:
    """The runs of a :class:`ResetFreeRuns` as rows of a [runs, T] batch."""

    gather: torch.Tensor
    """Each run's steps in the flat [S·T] batch."""
    scatter: torch.Tensor
    """Where each step's output goes back in the flat batch."""
    row: torch.Tensor
    """The sample each run belongs to."""
    carry: torch.Tensor
    """1.0 for a run that starts at step 0 (it keeps the stored state), else 0.0."""


@dataclass
class ResetFreeRuns:
    """How one fused LSTM call covers [S, T] samples with game starts inside some of them.

    A game start zeroes the state, so each sample splits at its game starts into runs that are independent
    sequences: a run at step 0 starts from the sample's stored state, the others from zero. The runs become
    the rows of a [runs, T] batch (a run shorter than T repeats its last step; the LSTM is causal, so the
    padding changes nothing before it): ``split.gather`` takes their steps from the flat [S·T] batch,
    ``split.scatter`` puts the outputs back. Without a game start after step 0, ``split`` is None and the batch
    runs as it is. Built on the host from the stored flags, so the device never waits for it. (Padding rather
    than a PackedSequence: ATen's packed LSTM on CPU is an op-by-op loop several times slower than its fused one.)
    """

    split: RunSplit | None = None

    @staticmethod
    def of(first: np.ndarray) -> ResetFreeRuns:
        S, T = first.shape
        starts = np.array(first, dtype=bool)
        starts[:, 0] = True
        if not starts[:, 1:].any():
            return ResetFreeRuns()
        flat = starts.ravel()
        begin = np.flatnonzero(flat)
        length = np.diff(np.append(begin, S * T))
        gather = begin[:, None] + np.minimum(np.arange(T)[None, :], length[:, None] - 1)
        run = np.cumsum(flat) - 1                              # the run of every step of the batch
        scatter = run * T + np.arange(S * T) - begin[run]
        carry = torch.from_numpy((begin % T == 0).astype(np.float32))
        return ResetFreeRuns(RunSplit(torch.from_numpy(gather.ravel()), torch.from_numpy(scatter),
                                      torch.from_numpy(begin // T), carry))

    def to(self, device: torch.device) -> ResetFreeRuns:
        split = self.split
        if split is None:
            return self
        return ResetFreeRuns(RunSplit(split.gather.to(device), split.scatter.to(device), split.row.to(device),
                                      split.carry.to(device)))


# Parameter names of the LSTMCell that earlier versions stored: checkpoints and snapshots of old runs still load.
_OLD_NAMES = {f"lstm.{kind}": f"lstm.{kind}_l0" for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}


class GridInput(nn.Module):
    """Flat channels-last observations [N, H·W·C] as images [N, C, H, W] for the convolutions."""

    def __init__(self, grid: tuple[int, int, int]):
        super().__init__()
        height, width, channels = grid
        self.grid = (int(height), int(width), int(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Contiguous: ATen's CPU convolutions train about a fifth faster on NCHW than on the permuted view.
        return x.reshape(-1, *self.grid).permute(0, 3, 1, 2).contiguous()


def conv_layers(grid: tuple[int, int, int], channels: tuple[int, ...]) -> tuple[list[nn.Module], int]:
    """3×3 same-padded convolutions with ReLU over a grid, flattened: (layers, output size). Weights are shared
    over the cells, so a pattern learnt in one place of a board is known everywhere."""
    height, width, size = grid
    layers: list[nn.Module] = [GridInput(grid)]
    for out in channels:
        layers += [nn.Conv2d(size, out, 3, padding=1), nn.ReLU()]
        size = out
    return layers + [nn.Flatten()], size * height * width


class Policy(nn.Module):
    """``grid`` (height, width, channels) with ``conv_channels``: the observation is a flattened channels-last
    grid, encoded by convolutions before the fully connected layers."""

    return_scale: torch.Tensor  # a buffer (see RunningNorm)

    def __init__(self, obs_dim: int, action_heads: tuple[int, ...], hidden: int = 128, encoder_layers: int = 2,
                 lstm: int = 128, obs_clip: float = 5.0, grid: tuple[int, int, int] | None = None,
                 conv_channels: tuple[int, ...] = ()):
        super().__init__()
        self.obs_dim = obs_dim
        self.action_heads = tuple(int(n) for n in action_heads)
        self.lstm_size = lstm
        conv_grid = grid if conv_channels else None
        if conv_grid is not None and math.prod(conv_grid) != obs_dim:
            raise ValueError(f"grid {grid} does not hold {obs_dim} observation values")
        self.obs_norm = RunningNorm(obs_dim, obs_clip, channels=conv_grid[2] if conv_grid is not None else 0)
        self.register_buffer("return_scale", torch.ones((), dtype=torch.float64))
        layers: list[nn.Module] = []
        size = obs_dim
        if conv_grid is not None:
            layers, size = conv_layers(conv_grid, tuple(conv_channels))
        for _ in range(encoder_layers):
            layers += [nn.Linear(size, hidden), nn.ReLU()]
            size = hidden
        self.encoder = nn.Sequential(*layers)
        # nn.LSTM rather than a cell: the learner runs whole sequences in one cuDNN/ATen call.
        self.lstm = nn.LSTM(size, lstm, batch_first=True)
        self.logits = nn.Linear(lstm, sum(self.action_heads))
        self.value_head = nn.Linear(lstm, 1)
        nn.init.orthogonal_(self.logits.weight, gain=0.01)
        nn.init.zeros_(self.logits.bias)
        nn.init.orthogonal_(self.value_head.weight, gain=1.0)
        nn.init.zeros_(self.value_head.bias)

    def initial_state(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero state for n agents, on the model's device."""
        device = self.return_scale.device
        return torch.zeros(n, self.lstm_size, device=device), torch.zeros(n, self.lstm_size, device=device)

    def _lstm(self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor):
        """The LSTM in float32, outside any autocast (the encoder and heads may run in bf16). Under bf16 autocast
        cuDNN's fused LSTM is, by torch version, missing, replaced by a slow per-step loop or cast to fp16 with
        no gradient scaler; and the recurrence would compound bf16 rounding over every step of a sequence."""
        with torch.autocast(x.device.type, enabled=False):
            return self.lstm(x.float(), (h0.float(), c0.float()))

    def _core(self, obs: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        x = self.encoder(self.obs_norm(obs)).unsqueeze(1)
        _, (h, c) = self._lstm(x, state[0].unsqueeze(0), state[1].unsqueeze(0))
        return h[0], c[0]

    def _log_probs(self, h: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """Normalized log-probabilities of each action head; forbidden actions get ~-1e9."""
        logits = self.logits(h).masked_fill(~mask, NEG_INF)
        return [part.float().log_softmax(-1) for part in logits.split(self.action_heads, -1)]

    @torch.no_grad()
    def act(self, obs: torch.Tensor, mask: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor],
            greedy: bool = False, uniforms: torch.Tensor | None = None) -> ActOutput:
        """``uniforms`` [N, heads] in [0, 1) choose the sampled actions (:func:`sample_heads`): the same uniforms
        give the same actions wherever the policy runs (a worker's own core or a node's inference server)."""
        h, c = self._core(obs, state)
        heads = self._log_probs(h, mask)
        if greedy:
            actions = torch.stack([lp.argmax(-1) for lp in heads], -1)
        else:
            if uniforms is None:
                uniforms = torch.rand(h.shape[0], len(heads), device=h.device)
            actions = sample_heads(heads, uniforms)
        logp = _summed(lp.gather(-1, actions[:, i:i + 1]).squeeze(-1) for i, lp in enumerate(heads))
        value = self.value_head(h).squeeze(-1) * self.return_scale.float()
        return ActOutput(actions, logp, value, (h, c))

    @torch.no_grad()
    def value(self, obs: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Value (return units) of ``obs`` without advancing anyone's state: the bootstrap where a game is cut."""
        h, _ = self._core(obs, state)
        return self.value_head(h).squeeze(-1) * self.return_scale.float()

    def evaluate(self, obs: torch.Tensor, mask: torch.Tensor, actions: torch.Tensor, h0: torch.Tensor,
                 c0: torch.Tensor, first: torch.Tensor, runs: ResetFreeRuns | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probs, entropies and normalized values [S, T] of the stored actions, by BPTT over T.

        The state is zeroed before every step that starts a game (``first``), as the worker did. ``runs``
        (``ResetFreeRuns.of(first)`` on the host, moved to the device) saves reading ``first`` back here.
        """
        S, T = obs.shape[:2]
        runs = ResetFreeRuns.of(first.cpu().numpy()).to(obs.device) if runs is None else runs
        x = self.encoder(self.obs_norm(obs).reshape(S * T, -1)).reshape(S, T, -1)
        keep = (~first[:, 0]).unsqueeze(-1).to(h0.dtype)
        h0, c0 = h0 * keep, c0 * keep
        split = runs.split
        if split is None:
            hidden, _ = self._lstm(x, h0.unsqueeze(0), c0.unsqueeze(0))
        else:
            rows = x.reshape(S * T, -1)[split.gather].reshape(-1, T, x.shape[-1])
            carry = split.carry.unsqueeze(-1)
            out, _ = self._lstm(rows, (h0[split.row] * carry).unsqueeze(0), (c0[split.row] * carry).unsqueeze(0))
            hidden = out.reshape(-1, out.shape[-1])[split.scatter]
        # The heads in float32 outside autocast, as the LSTM and as the workers act: under bf16 the logits'
        # rounding alone would put the PPO ratio of fresh data up to ~1e-2 away from 1.
        with torch.autocast(hidden.device.type, enabled=False):
            hidden = hidden.reshape(S * T, -1).float()
            heads = self._log_probs(hidden, mask.reshape(S * T, -1))
            flat_actions = actions.reshape(S * T, -1)
            logp = _summed(lp.gather(-1, flat_actions[:, i:i + 1]).squeeze(-1) for i, lp in enumerate(heads))
            entropy = _summed(-(lp.exp() * lp).sum(-1) for lp in heads)
            value = self.value_head(hidden).squeeze(-1)
        return logp.reshape(S, T), entropy.reshape(S, T), value.reshape(S, T)

    # --- parameters as plain arrays (the params format carries numpy, never pickle) -------------

    def tensors(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy().copy() for k, v in self.state_dict().items()}

    def load_tensors(self, tensors: dict[str, np.ndarray]) -> None:
        tensors = {_OLD_NAMES.get(k, k): v for k, v in tensors.items()}
        own = self.state_dict()
        if set(own) != set(tensors):
            missing, extra = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
            raise ValueError(f"parameters do not match the model (missing {missing[:3]}, unexpected {extra[:3]})")
        for key, value in own.items():
            if tuple(tensors[key].shape) != tuple(value.shape):
                raise ValueError(f"parameter {key} has shape {tensors[key].shape}, model expects {tuple(value.shape)}")
        self.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()})

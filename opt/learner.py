"""One PPO update on a batch of samples: truncated BPTT, clipped losses, all-reduced gradients, Adam.

Usage::

    learner = Learner(policy, LearnerSettings(...), all_reduce=ctx.all_reduce_gradients)
    stats = learner.update(batch)        # batch: dict of [S, T, ...] arrays (see rapid.formats.experience)
    if stats["skipped"]: ...             # non-finite loss or gradients: nothing was applied

With several ranks every rank calls ``update`` in lock step; ``all_reduce`` averages the gradients, so
the parameters stay identical everywhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from rapid.opt import losses
from rapid.opt.model import Policy


@dataclass
class LearnerSettings:
    lr: float = 3e-4
    clip: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    entropy_final: float = -1.0
    entropy_anneal_updates: int = 0
    max_grad_norm: float = 5.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-5
    microbatch: int = 0
    normalize_returns: bool = True


class Learner:
    def __init__(self, policy: Policy, settings: LearnerSettings, device: torch.device | str = "cpu",
                 all_reduce: Callable[[list[torch.nn.Parameter]], None] | None = None,
                 all_reduce_scalars: Callable[[dict[str, float]], dict[str, float]] | None = None):
        self.policy = policy.to(device)
        self.settings = settings
        self.device = torch.device(device)
        self.all_reduce = all_reduce
        self.all_reduce_scalars = all_reduce_scalars
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.adam = torch.optim.Adam(self.params, lr=settings.lr, betas=settings.betas, eps=settings.eps)
        self.updates = 0
        self.skipped = 0

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array, device=self.device)

    def _update_normalizers(self, batch: dict[str, np.ndarray]) -> None:
        """Observation and return statistics, averaged over ranks so every rank keeps the same."""
        obs = batch["obs"].reshape(-1, batch["obs"].shape[-1])
        mean, var = obs.mean(0), obs.var(0)
        ret_sq = float(np.mean(batch["returns"] ** 2))
        if self.all_reduce_scalars is not None:
            merged = self.all_reduce_scalars({"ret_sq": ret_sq, **{f"m{i}": float(m) for i, m in enumerate(mean)},
                                              **{f"v{i}": float(v) for i, v in enumerate(var)}})
            ret_sq = merged["ret_sq"]
            mean = np.array([merged[f"m{i}"] for i in range(mean.size)])
            var = np.array([merged[f"v{i}"] for i in range(var.size)])
        self.policy.obs_norm.update_moments(torch.as_tensor(mean), torch.as_tensor(var), obs.shape[0])
        if self.settings.normalize_returns:
            # Slow exponential average of the return's RMS: the scale the value head predicts in.
            scale = self.policy.return_scale
            scale.copy_(torch.sqrt(0.99 * scale**2 + 0.01 * max(ret_sq, 1e-8)).clamp(min=1e-3))

    def _buffers_finite(self) -> bool:
        return all(bool(torch.isfinite(b).all()) for b in self.policy.buffers() if b.is_floating_point())

    def _agree_finite(self, finite: bool) -> bool:
        """Every rank must skip the same updates, or their parameters drift apart."""
        if self.all_reduce_scalars is None:
            return finite
        return self.all_reduce_scalars({"nonfinite": float(not finite)})["nonfinite"] == 0.0

    def _restore(self, saved: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, b in self.policy.named_buffers():
                b.copy_(saved[name])

    def _skip(self, saved: dict[str, torch.Tensor], t0: float) -> dict[str, float]:
        """Non-finite normalizer statistics: nothing is applied, the forward pass is not even run."""
        self._restore(saved)
        self.skipped += 1
        nan = float("nan")
        return {"policy_loss": nan, "value_loss": nan, "entropy": nan, "approx_kl": nan, "clip_fraction": nan,
                "grad_norm": nan, "explained_variance": nan, "entropy_coef": self.entropy_coef(),
                "lr": self.settings.lr, "skipped": 1.0, "update_s": time.perf_counter() - t0,
                "forward_s": 0.0, "backward_s": 0.0, "allreduce_s": 0.0, "step_s": 0.0}

    def entropy_coef(self) -> float:
        s = self.settings
        return losses.linear_schedule(s.entropy_coef, s.entropy_final, s.entropy_anneal_updates, self.updates)

    def update(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        s = self.settings
        timings = {}
        t0 = time.perf_counter()
        # A skipped update must leave no trace: the normalizers are buffers of the model and would otherwise
        # carry an overflow (extreme but finite experience) into every later update and published version.
        saved = {name: b.detach().clone() for name, b in self.policy.named_buffers()}
        self._update_normalizers(batch)
        if not self._agree_finite(self._buffers_finite()):
            return self._skip(saved, t0)
        scale = float(self.policy.return_scale)
        S = batch["obs"].shape[0]
        chunk = s.microbatch or S
        active = self._tensor(batch["active"]).float()
        adv_all = losses.normalize_advantages(self._tensor(batch["advantages"]), active)
        ent_coef = self.entropy_coef()
        self.adam.zero_grad(set_to_none=True)
        totals = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "approx_kl": 0.0, "clip_fraction": 0.0}
        values_pred = []
        t_forward = t_backward = 0.0
        for start in range(0, S, chunk):
            part = slice(start, start + chunk)
            ta = time.perf_counter()
            logp, entropy, value = self.policy.evaluate(
                self._tensor(batch["obs"][part]), self._tensor(batch["mask"][part]),
                self._tensor(batch["actions"][part]), self._tensor(batch["h0"][part]),
                self._tensor(batch["c0"][part]), self._tensor(batch["first"][part]))
            w = active[part]
            pg, diag = losses.ppo_policy_loss(logp, self._tensor(batch["logp"][part]), adv_all[part], s.clip, w)
            vl = losses.value_loss(value, self._tensor(batch["returns"][part]) / scale, torch.ones_like(w))
            ent = losses.masked_mean(entropy, w)
            loss = (pg + s.value_coef * vl - ent_coef * ent) * (min(chunk, S - start) / S)
            tb = time.perf_counter()
            loss.backward()
            t_forward += tb - ta
            t_backward += time.perf_counter() - tb
            frac = min(chunk, S - start) / S
            for key, val in (("policy_loss", pg), ("value_loss", vl), ("entropy", ent),
                             ("approx_kl", diag["approx_kl"]), ("clip_fraction", diag["clip_fraction"])):
                totals[key] += float(val.detach()) * frac
            values_pred.append(value.detach().cpu().numpy() * scale)
        timings["forward_s"], timings["backward_s"] = t_forward, t_backward
        ta = time.perf_counter()
        if self.all_reduce is not None:
            self.all_reduce(self.params)
        timings["allreduce_s"] = time.perf_counter() - ta
        ta = time.perf_counter()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, s.max_grad_norm))
        finite = self._agree_finite(math.isfinite(grad_norm) and all(math.isfinite(v) for v in totals.values()))
        if finite:
            self.adam.step()
            self.updates += 1
        else:
            self.skipped += 1
            self._restore(saved)
        self.adam.zero_grad(set_to_none=True)
        timings["step_s"] = time.perf_counter() - ta
        ev = losses.explained_variance(np.concatenate(values_pred).ravel(), batch["returns"].ravel())
        return {**totals, "grad_norm": grad_norm, "explained_variance": ev, "entropy_coef": ent_coef,
                "lr": s.lr, "skipped": float(not finite), "update_s": time.perf_counter() - t0, **timings}

"""One PPO update on a batch of samples: truncated BPTT, clipped losses, all-reduced gradients, Adam.

With several ranks the learner is built with ``all_reduce=ctx.all_reduce_gradients,
all_reduce_mean=ctx.all_reduce_mean_, world_size=ctx.size`` (``rapid.infra.distributed``); one process needs
none of them.

Usage::

    >>> import numpy as np
    >>> from rapid.run.config import Config, ModelConfig, RolloutConfig
    >>> from rapid.envs.registry import make_env
    >>> from rapid.roles.startup import build_policy
    >>> from rapid.rollout.worker import RolloutSettings, RolloutWorker, SelfPlay
    >>> cfg = Config(model=ModelConfig(hidden=16, lstm=16), rollout=RolloutConfig(bptt=4, samples_per_segment=2))
    >>> env = make_env(cfg.env.name, num_games=2)
    >>> worker = RolloutWorker(env, build_policy(cfg, env.spec), RolloutSettings.of(cfg, env.spec), SelfPlay())
    >>> segments = [worker.collect() for _ in range(4)]   # a segment holds the samples completed meanwhile
    >>> batch = {k: np.concatenate([s.arrays[k] for s in segments]) for k in segments[0].arrays}   # [S, T, ...]
    >>> learner = Learner(build_policy(cfg, env.spec), cfg.ppo, "cpu", microbatch_samples=0)
    >>> stats = learner.update(batch)     # with MPI: all_reduce=ctx.all_reduce_gradients, all_reduce_mean=…
    >>> stats["skipped"], learner.updates, sorted(k for k in stats if k.endswith("loss"))
    (0.0, 1, ['policy_loss', 'value_loss'])
    >>> learner.prefetch(lambda: batch)   # the next update draws and stages the one after it meanwhile
    >>> learner.update(batch)["skipped"]  # (CUDA: packed into pinned memory, copied on a side stream)
    0.0
    >>> batch["advantages"][:] = np.nan
    >>> learner.update(batch)["skipped"], learner.skipped   # non-finite loss, gradients or statistics: nothing applied
    (1.0, 1)

With several ranks every rank calls ``update`` in lock step; ``all_reduce`` averages the gradients and
``all_reduce_mean`` pools the batch statistics, so the parameters and normalizers stay identical everywhere
and equal to one process training on the union of the batches.

One update costs two collectives and one wait of the host for the device: the collectives carry the advantage
and return sums (before the losses), then the gradients together with the observation sums and a "this rank's
losses were not finite" flag (after the backward passes); the wait reads every figure back at the end (with
``ppo.proximal = "first_use"`` the batch's reference log-probs are copied back after it, waiting for nothing). The
batch reaches the device through :mod:`rapid.opt.pipeline` (on CUDA: pinned memory, a side stream, one copy per
chunk, the next batch staged while this one trains). With ``microbatch_samples`` at most two chunks of the batch
(the one training and the next, being copied) and the next batch's first are on the device at once, and the
statistics are summed chunk by chunk, so the peak memory follows the chunk, not the batch.

The losses are computed with the normalizers the data was collected with; the normalizers move only
afterwards, with the same update (so fresh data has a PPO ratio of exactly 1).

With ``ppo.off_policy = "vtrace"`` the update does not train on the worker's GAE advantages and returns: a first
pass over the chunks, without gradients and under the same autocast as the losses, evaluates the learner's
policy on the batch (BPTT from each sample's stored state, as the loss pass does) and computes V-trace's value
targets and advantages (:func:`rapid.opt.losses.vtrace`, ρ̄ ``ppo.vtrace_rho_bar``, c̄ ``ppo.vtrace_c_bar``,
λ ``ppo.gae_lambda``) chunk by chunk: each sample carries its own bootstrap. Everything after is as without it
(the advantages normalized over ranks and chunks, PPO's ratio clipped against the behaviour's log-probs). It
costs one more forward pass per update, and with microbatches on CUDA a second copy of every chunk but the
first (the bound on the chunks held on the device stays). Two approximations: a sample bootstraps from the
behaviour's value of the decision after it, as the worker stored it (the sample does not hold the next
observation); and an inactive step (a dead or stunned agent, whose action the game ignores) counts as
on-policy, ratio 1, so it cuts no trace.

With ``ppo.proximal = "first_use"`` (decoupled PPO, Hilton et al. 2021) PPO's ratio is clipped against the
learner's own log-probs of the sample's first use, not against the policy that played: a sample that arrives
many updates late would otherwise sit outside the clip and train nothing. The batch carries them
(``reference_logp``, NaN where the sample is new, :class:`rapid.opt.buffer.ExperienceBuffer` keeps them); a new
sample's reference is this update's own log-probs (ratio 1), or with ``ppo.proximal_every = N`` those of
:attr:`Learner.proximal`, a copy of the policy refreshed every N updates (one more forward pass, without
gradients, under the same autocast), so that a sample used once is clipped too. :attr:`Learner.reference_logp`
hands them back for the buffer to keep. Each step's surrogate is weighed by π_first/π_behav, capped at
``ppo.proximal_rho_bar`` (:func:`rapid.opt.losses.proximal_weights`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from rapid.opt import losses
from rapid.opt.config import PPOConfig
from rapid.opt.model import Policy
from rapid.opt.pipeline import (
    FIRST_USE,
    VTRACE,
    WHOLE,
    Batch,
    Copier,
    PhaseClock,
    Pipeline,
    Staged,
    copy_async,
    stages_ahead,
)

DIAGNOSTICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")


def bf16_native(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 in hardware: a CUDA GPU from Ampere on, or a CPU with AVX-512 BF16
    or AMX tiles (oneDNN's fast bf16 paths). Elsewhere bfloat16 is emulated and slower than float32."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type == "cpu":
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        # torch.cpu's probes are private: a torch without them counts as no bfloat16 units.
        return any(getattr(torch.cpu, name, lambda: False)() for name in probes)
    return False


def precision_settings(precision: str, device: torch.device) -> tuple[bool, bool]:
    """(bf16 autocast, TF32 allowed) for ``optimizer.precision`` on ``device``. TF32 follows bf16: in float32 the
    learner's log-probs must match the CPU workers' to about 1e-5, and TF32 matmuls and convolutions (cuDNN's
    default is on) would make that about 1e-3; under bf16 the agreement is 1e-2 anyway and TF32 is free speed."""
    bf16 = precision == "bf16" or (precision == "auto" and bf16_native(device))
    return bf16, bf16


def allow_tf32(allowed: bool) -> None:
    """Set both TF32 switches explicitly (process-wide): torch's defaults differ, matmul off and cuDNN on."""
    torch.backends.cuda.matmul.allow_tf32 = allowed
    torch.backends.cudnn.allow_tf32 = allowed


def fused_adam(device: torch.device) -> bool:
    """Whether Adam runs as torch's fused kernel: on CUDA, where it replaces a launch per parameter and per
    operation by a few. The CPU keeps the loop it has always run (nothing measured says fused is faster there)."""
    return device.type == "cuda"


def indexed(device: torch.device | str) -> torch.device:
    """``device`` with its index: ``cuda`` is ``cuda:<current device>``. Tensors always carry their index and
    ``torch.device("cuda") != torch.device("cuda:0")``, so an index-less learner device would take its own
    batches for foreign ones."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        # torch's stubs type device.index as int; it is None for a bare "cuda"
        return torch.device("cuda", torch.cuda.current_device())  # type: ignore[unreachable]
    return device


PHASES = ("forward", "backward", "allreduce", "step")


@dataclass
class _Queued:
    """An update queued on the device up to its read: the figures to read (the skip decision first), the moved
    normalizers to apply if it is not skipped, and its clock's spans."""

    figures: torch.Tensor
    new_norm: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    new_scale: torch.Tensor
    clock: PhaseClock
    spans: dict[str, list[tuple[int, int]]]
    step_from: int
    """The mark the step phase (gradient norm, checks, the read, Adam) starts at."""
    reference: torch.Tensor | None
    """The batch's reference log-probs (``ppo.proximal = "first_use"``), read after the figures."""


class Learner:
    """``microbatch_samples``: gradient accumulation chunk (0: the whole batch at once); the gradient is the
    same either way. ``bf16``: the encoder's forward and backward under bfloat16 autocast, on CUDA or CPU (faster
    where the device has bfloat16 units: :func:`bf16_native`; the LSTM and the heads stay float32, so fresh data
    still has a PPO ratio of 1 up to the encoder's rounding). ``all_reduce(params, extra)`` replaces the
    gradients and the ``extra`` tensors by their means over ranks, ``all_reduce_mean(tensor)`` one tensor, in
    place; ``world_size`` is the number of ranks. ``staging`` (default :func:`rapid.opt.pipeline.stages_ahead`)
    and ``copier`` are the input pipeline's (:mod:`rapid.opt.pipeline`); tests force and count them."""

    def __init__(self, policy: Policy, ppo: PPOConfig, device: torch.device | str = "cpu",
                 microbatch_samples: int = 0, bf16: bool = False,
                 all_reduce: Callable[..., None] | None = None,
                 all_reduce_mean: Callable[[torch.Tensor], None] | None = None,
                 world_size: int = 1, staging: bool | None = None, copier: Copier = copy_async):
        self.device = indexed(device)
        self.policy = policy.to(self.device)
        self.ppo = ppo
        self.microbatch_samples = microbatch_samples
        self.bf16 = bf16
        self.all_reduce = all_reduce
        self.all_reduce_mean = all_reduce_mean
        self.world_size = world_size
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.adam = torch.optim.Adam(self.params, lr=ppo.lr, betas=(ppo.adam_beta1, ppo.adam_beta2), eps=ppo.adam_eps,
                                     fused=fused_adam(self.device))
        self.vtrace = ppo.off_policy == "vtrace"
        self.first_use = ppo.proximal == "first_use"
        self.proximal = (copy.deepcopy(self.policy).requires_grad_(False)
                         if self.first_use and ppo.proximal_every > 0 else None)
        """The copy of the policy a new sample's reference comes from (``ppo.proximal_every``): a copy of the
        policy at this learner's first update (after any checkpoint has loaded), then every ``proximal_every``
        updates; every rank counts the same updates, so every rank holds the same. None: the policy itself."""
        self._proximal_due = 0
        """The update count at which the copy is next refreshed (0: at this learner's first update)."""
        self.reference_logp: np.ndarray | None = None
        """With ``ppo.proximal = "first_use"``: the reference log-probs of the last update's batch [S, T], the
        first use's for every sample now, for the buffer to keep."""
        self.pipeline = Pipeline(self.device, stages_ahead(self.device) if staging is None else staging, copier,
                                 whole=WHOLE + (VTRACE if self.vtrace else ()) + (FIRST_USE if self.first_use else ()))
        self.updates = 0
        self.skipped = 0
        self._draw: Callable[[], Batch | None] | None = None
        self._ahead: tuple[Batch, Staged] | None = None
        """The batch the loop drew during the last update and its staged copy."""
        self._last_phases: tuple[PhaseClock, dict[str, list[tuple[int, int]]]] | None = None
        """The last update's clock, read at the next update's one wait (CUDA)."""

    def schedule(self, progress: float) -> tuple[float, float]:
        """(learning rate, entropy bonus) when ``progress`` (0 to 1 of the run's budget) is done; the learning
        rate is 0 before update ``ppo.settle_until_update`` (Adam's moments settle, the weights stay)."""
        s = self.ppo
        lr = 0.0 if self.updates < s.settle_until_update else losses.linear_schedule(s.lr, s.lr_final, progress)
        return lr, losses.linear_schedule(s.entropy_coef, s.entropy_final, progress, s.entropy_begin)

    def clip(self) -> float:
        """PPO's ratio clip for the next update: ``ppo.warmup_clip`` through the warm-up, else ``ppo.clip``."""
        return self.ppo.clip_at(self.updates)

    def stage(self, batch: Batch) -> Staged:
        """The batch on its way to the learner's device (on CUDA: packed into pinned memory, copied on a side
        stream; :mod:`rapid.opt.pipeline`). ``update`` takes the result as it takes numpy arrays."""
        return self.pipeline.stage(batch, self.microbatch_samples)

    def gather(self, arrays: dict[str, np.ndarray], chosen: np.ndarray) -> dict[str, np.ndarray]:
        """The rows ``chosen`` of an experience buffer's ``arrays`` (its ``sample(into=...)``, under its lock) as a
        batch: staged straight from them where the learner stages (one host copy), else drawn out as arrays."""
        return self.pipeline.gather(arrays, chosen, self.microbatch_samples)

    def prefetch(self, draw: Callable[[], Batch | None]) -> None:
        """``draw()`` is called once during the next update, after its kernels are queued and before its one
        read; the batch it returns is staged meanwhile, and an update handed that very batch uses the staged copy."""
        self._draw = draw

    def update(self, batch: Batch | Staged, progress: float = 0.0) -> dict[str, float]:
        """One step on ``batch``; ``progress`` (the share of the run's budget done) sets the learning rate and
        the entropy bonus."""
        t0 = time.perf_counter()
        if isinstance(batch, Staged):
            staged = batch
        else:
            staged = self._ahead[1] if self._ahead is not None and self._ahead[0] is batch else self.stage(batch)
        self._ahead = None
        lr, ent_coef = self.schedule(progress)
        if self.proximal is not None and self.updates >= self._proximal_due:
            self.proximal.load_state_dict(self.policy.state_dict())
            self._proximal_due = self.updates + self.ppo.proximal_every
        clip, warmup = self.clip(), self.ppo.in_warmup(self.updates)
        queued = self._queue(staged, lr, ent_coef, clip)
        draw, self._draw = self._draw, None
        if draw is not None:  # the host draws and packs the next batch while the device trains this one
            ahead = draw()
            self._ahead = None if ahead is None else (ahead, self.stage(ahead))
        # The update's one wait for the device: the decision and every figure in one read.
        figures = queued.figures.tolist()
        finite = figures[0] == 1.0
        # The device has finished the references: the read above waited for every kernel.
        self.reference_logp = queued.reference.cpu().numpy() if queued.reference is not None and finite else None
        if finite:
            self.adam.step()
            self._move_normalizers(queued.new_norm, queued.new_scale)
            self.updates += 1
        else:
            self.skipped += 1
        self.adam.zero_grad(set_to_none=True)
        queued.spans["step"].append((queued.step_from, queued.clock.mark()))
        stats = dict(zip((*DIAGNOSTICS, "grad_norm", "explained_variance"), figures[1:]))
        return {**stats, "entropy_coef": ent_coef, "lr": lr, "clip": clip, "warmup": float(warmup),
                "skipped": float(not finite),
                "update_s": time.perf_counter() - t0, **self._phase_seconds(queued.clock, queued.spans)}

    def _phase_seconds(self, clock: PhaseClock, spans: dict[str, list[tuple[int, int]]]) -> dict[str, float]:
        """The phase durations: this update's on the CPU; on CUDA the last update's, whose events this update's
        read has passed (so reading them waits for nothing; the first update reports zeros)."""
        if clock.cuda:
            (clock, spans), self._last_phases = self._last_phases or (clock, {}), (clock, spans)
        return {f"{name}_s": clock.seconds(spans.get(name, [])) for name in PHASES}

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, torch.bfloat16, enabled=self.bf16)

    @torch.no_grad()
    def targets(self, staged: Staged) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, value targets) [S, T] in return units that an update of ``staged`` trains on: the worker's
        GAE ones, or with ``ppo.off_policy = "vtrace"`` V-trace's from the learner's own policy (a pass over
        the chunks without gradients; see the module's docstring)."""
        w = staged.whole()
        if not self.vtrace:
            return w["advantages"], w["returns"]
        s, policy = self.ppo, self.policy
        scale = policy.return_scale.float()
        advantages, returns = [], []
        for j in range(staged.chunks):
            part = slice(j * staged.chunk_rows, (j + 1) * staged.chunk_rows)
            b, runs = staged.chunk(j)
            with self._autocast():
                logp, _, value = policy.evaluate(b["obs"], b["mask"], b["actions"], b["h0"], b["c0"], b["first"],
                                                 runs)
            # The game ignores an inactive step's action (a dead or stunned agent): on-policy, ratio 1.
            logp = torch.where(w["active"][part], logp, b["logp"])
            ret, adv = losses.vtrace(b["logp"], logp, w["rewards"][part], w["discounts"][part], value * scale,
                                     w["bootstrap"][part], s.vtrace_rho_bar, s.vtrace_c_bar, s.gae_lambda)
            advantages.append(adv)
            returns.append(ret)
        return torch.cat(advantages), torch.cat(returns)

    def _queue(self, staged: Staged, lr: float, ent_coef: float, clip: float) -> _Queued:
        """Everything of the update up to its one read, queued on the device: losses, backward passes, the
        collectives, the gradient norm and the checks."""
        s = self.ppo
        policy, norm = self.policy, self.policy.obs_norm
        w = staged.whole()  # per-step figures, a small fraction of the observations' bytes
        advantages, returns = self.targets(staged)
        active = w["active"].float()
        # The value head learns every step of the learner's rows, inactive ones too (a dead hero in a parallel
        # game): GAE bootstraps through their values. Turn-based samples hold the agent's decisions only.
        own = w["own"].float()
        # The step counts that normalize the losses (so microbatches and ranks add up to the batch mean), the
        # advantage moments and the returns' mean square, pooled over ranks before the losses.
        pooled = torch.cat([losses.weighted_sums(advantages, active), losses.weighted_sums(returns, own)])
        if self.all_reduce_mean is not None:
            self.all_reduce_mean(pooled)
        adv_sums, ret_sums = pooled[:3], pooled[3:]
        total, own_total = adv_sums[0].float(), ret_sums[0].float()
        adv = losses.normalize_advantages(advantages, active, adv_sums)
        scale = policy.return_scale.float()
        for group in self.adam.param_groups:
            group["lr"] = lr
        autocast = self._autocast()
        self.adam.zero_grad(set_to_none=True)
        diag = torch.zeros(len(DIAGNOSTICS), device=self.device)
        obs_sums = torch.zeros(3, norm.mean.numel(), dtype=torch.float64, device=self.device)
        values, references = [], []
        clock = PhaseClock(self.device)
        spans: dict[str, list[tuple[int, int]]] = {name: [] for name in PHASES}
        for j in range(staged.chunks):
            part = slice(j * staged.chunk_rows, (j + 1) * staged.chunk_rows)
            ta = clock.mark()
            b, runs = staged.chunk(j)
            with autocast:
                logp, entropy, value = policy.evaluate(b["obs"], b["mask"], b["actions"], b["h0"], b["c0"],
                                                       b["first"], runs)
            wa = active[part]
            reference, importance = b["logp"], None
            if self.first_use:
                stored = w["reference_logp"][part]
                if self.proximal is None:
                    fresh = logp.detach()
                else:
                    with torch.no_grad(), autocast:
                        fresh = self.proximal.evaluate(b["obs"], b["mask"], b["actions"], b["h0"], b["c0"],
                                                       b["first"], runs)[0]
                reference = torch.where(stored.isnan(), fresh.float(), stored)
                importance = losses.proximal_weights(reference, b["logp"], s.proximal_rho_bar)
                references.append(reference)
            pg, kl = losses.ppo_policy_loss(logp, reference, adv[part], clip, wa, total, importance)
            vl = losses.value_loss(value, returns[part] / scale, own[part], own_total,
                                   old=b["values"] / scale, clip=s.value_clip)
            ent = losses.masked_mean(entropy, wa, total)
            tb = clock.mark()
            (pg + s.value_coef * vl - ent_coef * ent).backward()
            spans["forward"].append((ta, tb))
            spans["backward"].append((tb, clock.mark()))
            diag += torch.stack([pg, vl, ent, kl["approx_kl"], kl["clip_fraction"]]).detach()
            values.append(value.detach())
            # The normalizer moves after the losses, on these sums: chunk by chunk, so float64 copies of the
            # observations never exist for more than one chunk.
            obs_sums += losses.shifted_sums(b["obs"], torch.ones(b["obs"].shape[:-1], device=self.device), norm.mean)
        # Every rank must skip the same updates, or their parameters drift apart: a rank whose losses were not
        # finite says so in the gradients' collective, and the rest of the checks read pooled values.
        local_flags = torch.cat([obs_sums.reshape(-1), (~diag.isfinite().all()).double().reshape(1)])
        ta = clock.mark()
        if self.all_reduce is not None:
            self.all_reduce(self.params, extra=[local_flags])
        tb = clock.mark()
        spans["allreduce"].append((ta, tb))
        obs_sums, nonfinite = local_flags[:-1].reshape(3, -1), local_flags[-1]
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, s.max_grad_norm)
        count, mean, m2 = losses.moments_of_sums(obs_sums, norm.mean)
        new_norm = norm.merged(mean, m2 / count.clamp(min=1e-12), count * self.world_size)
        ret_sq = ret_sums[2] / ret_sums[0].clamp(min=1.0)
        # Slow exponential average of the return's RMS: the scale the value head predicts in.
        new_scale = (torch.sqrt(0.99 * policy.return_scale**2 + 0.01 * ret_sq.clamp(min=1e-8)).clamp(min=1e-3)
                     if s.normalize_returns else policy.return_scale)
        # The normalizers are used in float32: they must be finite there too.
        checks = torch.stack([grad_norm.isfinite(), nonfinite == 0, new_norm[1].float().isfinite().all(),
                              new_norm[2].float().isfinite().all(), new_scale.float().isfinite()]).all()
        ev = losses.explained_variance(torch.cat(values) * scale, returns, own)
        figures = torch.cat([checks.float().reshape(1), diag, grad_norm.reshape(1).float(), ev.reshape(1).float()])
        return _Queued(figures, new_norm, new_scale, clock, spans, step_from=tb,
                       reference=torch.cat(references) if references else None)

    @torch.no_grad()
    def _move_normalizers(self, new_norm: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                          new_scale: torch.Tensor) -> None:
        policy = self.policy
        policy.obs_norm.set(*new_norm)
        ratio = (policy.return_scale / new_scale).float()
        if self.ppo.preserve_value_outputs:
            policy.value_head.weight.mul_(ratio)
            policy.value_head.bias.mul_(ratio)
        policy.return_scale.copy_(new_scale)

"""What one update costs a GPU, checked on the CPU: how often the host waits for the device, how much of the
batch is on the device at once, and that a rank's non-finite losses reach every rank without a collective of
their own."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from rapid.opt import losses, pipeline
from rapid.opt.config import PPOConfig
from rapid.opt.learner import Learner
from tests.learner_data import make_policy, played_batch

torch.set_num_threads(1)

# Every way a tensor's value reaches Python: on a GPU each one waits for the device to finish its queue.
READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy")


@contextlib.contextmanager
def counted_reads(monkeypatch, learner: Learner):
    """Counts the reads during ``learner``'s update, except Adam's own: its step counts live in host memory
    (torch keeps ``step`` on the CPU unless the optimizer is capturable or fused), so reading them waits for
    nothing."""
    counts = {name: 0 for name in READS}
    in_adam = []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, __original=original, __name=name, **kwargs):
            counts[__name] += not in_adam
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    step = learner.adam.step

    def uncounted_step(*args, **kwargs):
        in_adam.append(True)
        try:
            return step(*args, **kwargs)
        finally:
            in_adam.pop()

    monkeypatch.setattr(learner.adam, "step", uncounted_step)
    yield counts
    monkeypatch.undo()


class MeanOfTwo:
    """Collectives of a two-rank job whose other rank holds ``other``'s values: means, like the real ones."""

    def __init__(self, other_nonfinite: bool = False):
        self.other_nonfinite = other_nonfinite
        self.calls = 0

    def gradients(self, params, extra=()):
        self.calls += 1
        for t in extra:  # the other rank's observation sums equal ours; its loss flag is given
            other = t.clone()
            other[-1] = float(self.other_nonfinite)
            t.add_(other).div_(2)

    def mean(self, tensor):
        self.calls += 1


@pytest.mark.parametrize("microbatch", [0, 4])
def test_an_update_reads_the_device_once(monkeypatch, microbatch):
    learner = Learner(make_policy(), PPOConfig(lr=1e-3), microbatch_samples=microbatch)
    batch = played_batch(make_policy(), S=12)
    learner.update(batch)  # warm-up: lazy state (Adam's moments) is not what is counted
    with counted_reads(monkeypatch, learner) as counts:
        stats = learner.update(batch)
    assert stats["skipped"] == 0.0
    assert sum(counts.values()) == 1, counts
    assert counts["tolist"] == 1, counts


def test_a_staged_batch_is_read_once(monkeypatch):
    """Where games start stays in host memory with the staged batch: the update reads nothing back for it."""
    learner = Learner(make_policy(), PPOConfig(lr=1e-3))
    staged = learner.stage(played_batch(make_policy()))
    with counted_reads(monkeypatch, learner) as counts:
        learner.update(staged)
    assert counts["tolist"] == 1 and sum(counts.values()) == 1, counts


def test_microbatches_put_one_chunk_of_observations_on_the_device_at_a_time(monkeypatch):
    """Each chunk's observations are staged and summed on their own (copied chunk by chunk on a GPU: at most the
    chunk training and the next are there), and the update is the same as the whole batch's."""
    summed_rows = []
    shifted_sums = losses.shifted_sums

    def recording_sums(x, weights, shift):
        summed_rows.append(x.shape[0])
        return shifted_sums(x, weights, shift)

    monkeypatch.setattr(losses, "shifted_sums", recording_sums)
    copies = []

    def counting(dst, src):  # the copies a GPU would make, made on the CPU
        copies.append(dst.numel())
        dst.copy_(src)

    whole = Learner(make_policy(), PPOConfig(lr=1e-3))
    chunked = Learner(make_policy(), PPOConfig(lr=1e-3), microbatch_samples=4, staging=True, copier=counting)
    batch = played_batch(make_policy(), S=12)
    whole.update(batch)
    assert summed_rows == [12]
    summed_rows.clear()
    chunked.update(batch)
    assert summed_rows == [4, 4, 4]
    staged_bytes = sum(batch[k].nbytes for k in pipeline.STAGED)
    # one copy per chunk (the first with the per-step figures), none of the whole batch
    assert len(copies) == 3 and sum(copies) >= staged_bytes and max(copies) < staged_bytes, copies
    for a, b in zip(whole.policy.parameters(), chunked.policy.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the same update either way
    torch.testing.assert_close(whole.policy.obs_norm.var, chunked.policy.obs_norm.var, rtol=1e-6, atol=1e-9)


def test_staging_keeps_only_what_a_chunk_needs_besides_per_step_figures():
    batch = played_batch(make_policy(), S=12)
    chunked = getattr(pipeline, "CHUNKED", ())
    per_step_bytes = sum(batch[k].nbytes for k in batch if k not in chunked)
    assert "obs" in chunked and per_step_bytes < batch["obs"].nbytes


@pytest.mark.parametrize("other_nonfinite", [False, True])
def test_another_ranks_nonfinite_losses_skip_the_update_here_too(other_nonfinite):
    collectives = MeanOfTwo(other_nonfinite)
    learner = Learner(make_policy(), PPOConfig(lr=1e-3), all_reduce=collectives.gradients,
                      all_reduce_mean=collectives.mean, world_size=2)
    before = [p.detach().clone() for p in learner.policy.parameters()]
    stats = learner.update(played_batch(make_policy()))
    assert collectives.calls == 2  # the pooled sums before the losses; gradients, sums and flag after
    assert stats["skipped"] == float(other_nonfinite) and learner.skipped == int(other_nonfinite)
    changed = any(not torch.equal(a, b) for a, b in zip(before, learner.policy.parameters()))
    assert changed != other_nonfinite


def test_nonfinite_losses_here_skip_the_update():
    batch = played_batch(make_policy())
    batch["logp"] = np.full_like(batch["logp"], np.nan)
    learner = Learner(make_policy(), PPOConfig(lr=1e-3))
    assert learner.update(batch)["skipped"] == 1.0


@pytest.mark.cuda
def test_microbatches_bound_the_peak_gpu_memory():
    """On a GPU the peak of an update follows the chunk: an eighth of the batch per chunk needs well under
    half the memory of the whole batch at once (what only a GPU's allocator can show)."""
    batch = played_batch(make_policy(), S=512, T=8)
    peaks = {}
    for chunk in (0, 64):
        learner = Learner(make_policy(0, "cuda"), PPOConfig(lr=1e-3), "cuda", microbatch_samples=chunk)
        learner.update(batch)  # Adam's moments exist from here on
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        learner.update(batch)
        peaks[chunk] = torch.cuda.max_memory_allocated() - base
    assert peaks[64] < 0.5 * peaks[0], peaks

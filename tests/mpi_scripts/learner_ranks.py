"""Run under ``mpiexec -n 2``: each rank updates a learner on its own batch (observations centred at 0 and
at 4) with the real collectives; the normalizer must hold the pooled count, mean and variance, and every rank
the parameters of one process that trained on both batches. Rank 0 prints ``OK`` when every check holds."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from rapid.infra.distributed import abort_on_error, detect_identity, init_process_group
from rapid.opt.config import PPOConfig
from rapid.opt.learner import Learner

S, T = 16, 8  # 128 observations a rank


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for tests.learner_data
    from tests.learner_data import make_policy, played_batch

    def batch_of(rank: int) -> dict[str, np.ndarray]:
        return played_batch(make_policy(), S=S, T=T, seed=10 + rank, obs_mean=4.0 * rank, obs_scale=1.0)

    torch.set_num_threads(1)
    identity = detect_identity()
    with abort_on_error(identity), init_process_group(identity, backend="gloo", timeout=60) as dist:
        settings = PPOConfig(lr=1e-2)
        learner = Learner(make_policy(), settings, all_reduce=dist.all_reduce_gradients,
                          all_reduce_mean=dist.all_reduce_mean_, world_size=dist.size)
        batches = [batch_of(r) for r in range(dist.size)]
        learner.update(batches[dist.rank])
        norm = learner.policy.obs_norm
        obs = np.concatenate([b["obs"] for b in batches]).reshape(-1, batches[0]["obs"].shape[-1]).astype(float)
        n = obs.shape[0]
        assert float(norm.count) == np.float64(1e-4) + n, float(norm.count)
        np.testing.assert_allclose(norm.mean.numpy(), obs.mean(0) * n / (n + 1e-4), rtol=1e-6)
        np.testing.assert_allclose(norm.var.numpy(), obs.var(0), rtol=1e-4)
        assert norm.var.numpy().mean() > 4.0  # the spread between the ranks' centres is kept (≈ 5)
        union = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
        reference = Learner(make_policy(), settings)
        reference.update(union)
        for (name, p), q in zip(learner.policy.named_parameters(), reference.policy.parameters()):
            assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), f"{name} differs from one process on the union"
        torch.testing.assert_close(learner.policy.return_scale, reference.policy.return_scale)
        if dist.rank == 0:
            print("OK", flush=True)


if __name__ == "__main__":
    main()

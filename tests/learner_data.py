"""Batches for learner tests, played by the policy itself (so the stored log-probs are the worker's)."""

from __future__ import annotations

import numpy as np
import torch

from rapid.opt.model import Policy

OBS, HEADS, LSTM = 6, (3, 4), 8

# On CUDA, compare against the CPU worker in full float32 (cuDNN's default may use TF32 for the LSTM).
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


def make_policy(seed: int = 0, device: str = "cpu") -> Policy:
    """A clearly non-uniform policy: logits far from zero, as after some training."""
    torch.manual_seed(seed)
    policy = Policy(OBS, HEADS, hidden=16, encoder_layers=2, lstm=LSTM)
    with torch.no_grad():
        policy.logits.weight.normal_(0, 2.0)
        policy.logits.bias.normal_(0, 1.0)
    return policy.to(device)


def played_batch(policy: Policy, S: int = 12, T: int = 8, seed: int = 0, obs_mean: float = 3.0,
                 obs_scale: float = 2.0, reset_prob: float = 0.15) -> dict[str, np.ndarray]:
    """A batch as a rollout worker stores it: the policy acts step by step from each sample's state."""
    rng = np.random.default_rng(seed)
    device = policy.obs_norm.mean.device
    obs = (rng.normal(size=(S, T, OBS)) * obs_scale + obs_mean).astype(np.float32)
    mask = rng.random((S, T, sum(HEADS))) < 0.7
    off = 0
    for k in HEADS:
        mask[np.arange(S)[:, None], np.arange(T)[None, :], off + rng.integers(0, k, (S, T))] = True
        off += k
    first = rng.random((S, T)) < reset_prob
    first[0, 0] = True
    h0 = rng.normal(size=(S, LSTM)).astype(np.float32) * ~first[:, :1]
    c0 = rng.normal(size=(S, LSTM)).astype(np.float32) * ~first[:, :1]
    h, c = torch.from_numpy(h0).to(device), torch.from_numpy(c0).to(device)
    actions, logp, values = [], [], []
    for t in range(T):
        keep = torch.from_numpy(~first[:, t]).to(device).float().unsqueeze(-1)
        out = policy.act(torch.from_numpy(obs[:, t]).to(device), torch.from_numpy(mask[:, t]).to(device),
                         (h * keep, c * keep))
        h, c = out.state
        actions.append(out.actions.cpu().numpy())
        logp.append(out.logp.cpu().numpy())
        values.append(out.value.cpu().numpy())
    active = rng.random((S, T)) < 0.75
    batch = {"obs": obs, "mask": mask, "actions": np.stack(actions, 1), "logp": np.stack(logp, 1).astype(np.float32),
             "values": np.stack(values, 1).astype(np.float32), "first": first, "active": active,
             "own": active.copy(), "h0": h0, "c0": c0,
             "advantages": rng.normal(size=(S, T)).astype(np.float32),
             "returns": (rng.normal(size=(S, T)) * 2).astype(np.float32),
             "version": np.zeros(S, np.int64), "opponent": np.zeros(S, np.int32)}
    # What V-trace is computed from: a game ends with the step before the next one's first (or with the sample's
    # last step, by chance), and a sample whose game ended bootstraps from nothing.
    ended = np.concatenate([first[:, 1:], rng.random((S, 1)) < reset_prob], 1)
    batch["rewards"] = rng.normal(size=(S, T)).astype(np.float32)
    batch["discounts"] = (0.97 * ~ended).astype(np.float32)
    batch["bootstrap"] = (rng.normal(size=S) * ~ended[:, -1]).astype(np.float32)
    return batch

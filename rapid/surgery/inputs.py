"""What surgery checks preservation on: the run's own experience objects, and games played fresh in the old and
the new env side by side (which also shows that the env change only appends observation columns, and gives the
normalizer its first statistics of the new features)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rapid.envs.base import VecMultiAgentEnv
from rapid.errors import FormatError
from rapid.formats.experience import LIMITS, Shape, decode_experience
from rapid.infra.store import KeyNotFound, Store
from rapid.opt.model import Policy
from rapid.run.store_map import EXPERIENCE_PREFIX, parse_experience_ms
from rapid.surgery.shapes import PolicyShape, SurgeryRefused, logit_map
from rapid.surgery.verify import Inputs, widen

MIN_VAR = 1e-2
"""Floor of a new feature's variance: a feature that did not move in the games played is scaled by at most 10."""


def experience_inputs(store: Store, shape: Shape, old: PolicyShape, new: PolicyShape, rng: np.random.Generator,
                      max_samples: int = 256, max_objects: int = 8) -> Inputs | None:
    """Up to ``max_samples`` samples of the newest experience objects that decode in the run's current shape
    (older ones, e.g. from before an earlier surgery, are passed over); None when there are none."""
    keys = sorted(store.list(EXPERIENCE_PREFIX), key=lambda k: parse_experience_ms(k) or 0, reverse=True)
    parts, count = [], 0
    for key in keys[:4 * max_objects]:
        try:
            batch = decode_experience(store.get(key, max_bytes=LIMITS.max_bytes), shape)
        except (KeyNotFound, FormatError):  # deleted by retention meanwhile, or not of this shape
            continue
        parts.append(batch.arrays)
        count += batch.num_samples
        if count >= max_samples or len(parts) >= max_objects:
            break
    if not parts:
        return None
    a = {name: np.concatenate([p[name] for p in parts])[:max_samples] for name in
         ("obs", "mask", "first", "h0", "c0", "actions")}
    obs_new, mask_new = widen(old, new, a["obs"], a["mask"], rng)
    return Inputs(a["obs"], obs_new, a["mask"], mask_new, a["first"], a["h0"], a["c0"], a["actions"])


@dataclass
class Played:
    inputs: Inputs
    new_mean: np.ndarray
    """Mean of each new observation feature over the games played."""
    new_var: np.ndarray


@torch.no_grad()
def play_side_by_side(old_env: VecMultiAgentEnv, new_env: VecMultiAgentEnv, policy: Policy, old: PolicyShape,
                      new: PolicyShape, steps: int, seed: int) -> Played:
    """Step the old and the new env with the same seed and the same actions (the old policy's, sampled) and
    record both views. SurgeryRefused if the new env's first columns, masks or rewards differ from the old
    env's: its change does more than append observation features or actions."""
    torch.manual_seed(seed)
    a, b = old_env.reset(seed=seed), new_env.reset(seed=seed)
    games, agents = a.obs.shape[:2]
    columns = logit_map(old.action_heads, new.action_heads)
    state = policy.initial_state(games * agents)
    first = np.ones(games, bool)
    record: dict[str, list[np.ndarray]] = {k: [] for k in ("obs_old", "obs_new", "mask_old", "mask_new", "first")}
    for step in range(steps):
        _same_view(a, b, columns, old.obs_dim, step)
        keep = torch.from_numpy(np.repeat(~first, agents)).float().unsqueeze(-1)
        state = (state[0] * keep, state[1] * keep)
        for key, value in (("obs_old", a.obs), ("obs_new", b.obs), ("mask_old", a.action_mask),
                           ("mask_new", b.action_mask), ("first", np.repeat(first[:, None], agents, 1))):
            record[key].append(value.reshape(games * agents, *value.shape[2:]))
        out = policy.act(torch.from_numpy(record["obs_old"][-1]), torch.from_numpy(record["mask_old"][-1]), state)
        state = out.state
        actions = out.actions.numpy().reshape(games, agents, -1)
        a, b = old_env.step(actions), new_env.step(actions)
        if not np.array_equal(a.rewards, b.rewards) or not np.array_equal(a.done, b.done):
            raise SurgeryRefused(f"the new env plays a different game (rewards or game ends differ at step "
                                 f"{step + 1} of the same actions): surgery carries only added observations "
                                 "and actions")
        first = a.done
    arrays = {k: np.stack(v, axis=1) for k, v in record.items()}  # [N, T, …]
    extra = arrays["obs_new"][..., old.obs_dim:].reshape(games * agents * steps, -1).astype(np.float64)
    zeros = np.zeros((games * agents, old.lstm), np.float32)
    inputs = Inputs(arrays["obs_old"], arrays["obs_new"], arrays["mask_old"], arrays["mask_new"], arrays["first"],
                    zeros, zeros)
    return Played(inputs, extra.mean(0), np.maximum(extra.var(0), MIN_VAR))


def _same_view(a, b, columns: np.ndarray, old_dim: int, step: int) -> None:
    if not np.array_equal(b.obs[..., :old_dim], a.obs):
        column = int(np.flatnonzero((b.obs[..., :old_dim] != a.obs).reshape(-1, old_dim).any(0))[0])
        raise SurgeryRefused(f"the new env options change what observation column {column} holds (step {step}): "
                             "surgery carries only features appended at the end of the observation")
    if not np.array_equal(b.action_mask[..., columns], a.action_mask):
        raise SurgeryRefused(f"the new env options change which existing actions are allowed (step {step}): "
                             "surgery carries only actions appended to a head")

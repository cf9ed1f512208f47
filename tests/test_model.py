"""The LSTM policy: acting and training paths agree, masks are honoured, normalizers and parameter I/O."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rapid.opt.model import Policy, RunningNorm
from tests.learner_data import make_policy as played_policy
from tests.learner_data import played_batch

torch.set_num_threads(1)

OBS, HEADS, LSTM = 6, (3, 4), 8


def make_policy(seed=0, **kw) -> Policy:
    torch.manual_seed(seed)
    p = Policy(OBS, HEADS, hidden=16, encoder_layers=2, lstm=LSTM, **kw)
    # Make the logits non-trivial (the default init is nearly uniform) and normalizers non-identity.
    with torch.no_grad():
        p.logits.weight.normal_(0, 1.0)
        p.logits.bias.normal_(0, 0.5)
        p.obs_norm.mean.copy_(torch.linspace(-1, 1, OBS, dtype=torch.float64))
        p.obs_norm.var.copy_(torch.linspace(0.5, 2, OBS, dtype=torch.float64))
        p.return_scale.fill_(2.5)
    return p


def random_mask(rng, n):
    mask = np.zeros((n, sum(HEADS)), bool)
    off = 0
    for k in HEADS:
        m = rng.random((n, k)) < 0.6
        m[np.arange(n), rng.integers(0, k, n)] = True  # at least one allowed per head
        mask[:, off:off + k] = m
        off += k
    return mask


@pytest.mark.parametrize("grid", [None, (3, 2, 1)], ids=["fully-connected", "convolutions"])
def test_evaluate_reproduces_act_with_game_start_inside_sample(grid):
    rng = np.random.default_rng(0)
    policy = make_policy(grid=grid, conv_channels=(4, 5) if grid else ())
    S, T = 5, 7
    obs = torch.from_numpy(rng.normal(size=(S, T, OBS)).astype(np.float32) * 2)
    mask = torch.from_numpy(np.stack([random_mask(rng, S) for _ in range(T)], 1))
    first = torch.zeros(S, T, dtype=torch.bool)
    first[0, 0] = True       # the sample starts a game
    first[1, 3] = True       # a game starts mid-sample
    first[2, 2] = first[2, 5] = True
    # A non-zero starting state, as a sample that continues a game carries.
    h0 = torch.from_numpy(rng.normal(size=(S, LSTM)).astype(np.float32))
    c0 = torch.from_numpy(rng.normal(size=(S, LSTM)).astype(np.float32))
    h0[0] = 0.0  # a game start has zero state (the worker stores what it used)
    c0[0] = 0.0

    state = (h0.clone(), c0.clone())
    acts, logps, vals = [], [], []
    for t in range(T):
        h, c = state
        zero = first[:, t]
        h, c = h.clone(), c.clone()
        h[zero] = 0.0  # what the worker does at a game start
        c[zero] = 0.0
        out = policy.act(obs[:, t], mask[:, t], (h, c))
        acts.append(out.actions)
        logps.append(out.logp)
        vals.append(out.value)
        state = out.state
    actions = torch.stack(acts, 1)
    act_logp = torch.stack(logps, 1)
    act_value = torch.stack(vals, 1)

    logp, entropy, value = policy.evaluate(obs, mask, actions, h0, c0, first)
    assert logp.shape == entropy.shape == value.shape == (S, T)
    torch.testing.assert_close(logp, act_logp, rtol=1e-5, atol=1e-5)
    # evaluate gives normalized values; act gives them in return units (× return_scale)
    torch.testing.assert_close(value * 2.5, act_value, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(value, act_value)  # the scale really differs
    assert (entropy > 0).all()
    # evaluate must differentiate
    (logp.sum() + value.sum()).backward()
    assert policy.logits.weight.grad is not None and policy.lstm.weight_hh_l0.grad.abs().sum() > 0

    # Ignoring `first` (not zeroing the state) would give different log-probs for row 1 after t=3:
    logp_nofirst, _, _ = policy.evaluate(obs, mask, actions, h0, c0, torch.zeros_like(first))
    assert not torch.allclose(logp_nofirst[1, 3:], act_logp[1, 3:], atol=1e-5)
    torch.testing.assert_close(logp_nofirst[1, :3], act_logp[1, :3], rtol=1e-5, atol=1e-5)


def test_masked_actions_never_sampled():
    rng = np.random.default_rng(1)
    policy = make_policy(1)
    n = 64
    mask_np = random_mask(rng, n)
    mask = torch.from_numpy(mask_np)
    obs = torch.from_numpy(rng.normal(size=(n, OBS)).astype(np.float32))
    state = policy.initial_state(n)
    seen = np.zeros_like(mask_np)
    for _ in range(300):
        out = policy.act(obs, mask, state)
        off = 0
        for h, k in enumerate(HEADS):
            a = out.actions[:, h].numpy()
            assert ((0 <= a) & (a < k)).all()
            assert mask_np[np.arange(n), off + a].all(), "a forbidden action was sampled"
            seen[np.arange(n), off + a] = True
            off += k
        assert torch.isfinite(out.logp).all()
    # the draws are random, not always the same allowed action
    assert seen.sum() > n * len(HEADS) * 1.5
    greedy = policy.act(obs, mask, state, greedy=True).actions
    off = 0
    for h, k in enumerate(HEADS):
        assert mask_np[np.arange(n), off + greedy[:, h].numpy()].all()
        off += k


def test_entropy_of_uniform_masked_heads_is_log_allowed():
    policy = make_policy(2)
    with torch.no_grad():
        policy.logits.weight.zero_()
        policy.logits.bias.zero_()
    rng = np.random.default_rng(2)
    S, T = 4, 3
    mask_np = np.stack([random_mask(rng, S) for _ in range(T)], 1)
    mask = torch.from_numpy(mask_np)
    obs = torch.from_numpy(rng.normal(size=(S, T, OBS)).astype(np.float32))
    actions = torch.zeros(S, T, len(HEADS), dtype=torch.int64)
    off = 0
    for h, k in enumerate(HEADS):  # pick the first allowed action of each head
        actions[..., h] = torch.from_numpy(mask_np[..., off:off + k].argmax(-1))
        off += k
    zeros = torch.zeros(S, LSTM)
    logp, entropy, _ = policy.evaluate(obs, mask, actions, zeros, zeros, torch.zeros(S, T, dtype=torch.bool))
    n1 = mask_np[..., :3].sum(-1)
    n2 = mask_np[..., 3:].sum(-1)
    np.testing.assert_allclose(entropy.detach().numpy(), np.log(n1) + np.log(n2), rtol=1e-5)
    np.testing.assert_allclose(logp.detach().numpy(), -np.log(n1) - np.log(n2), rtol=1e-5)


def test_running_norm_matches_numpy_over_several_updates():
    rng = np.random.default_rng(3)
    norm = RunningNorm(4, clip=5.0)
    seen = []
    for i, n in enumerate([7, 100, 1, 33, 250]):
        x = rng.normal(loc=[1, -2, 10, 0], scale=[1, 3, 0.1, 5], size=(n, 4))
        seen.append(x)
        norm.update(torch.from_numpy(x))
        allx = np.concatenate(seen)
        # Exact: the data pooled with the initial pseudo-observation (mean 0, var 1, weight 1e-4).
        n0, N = 1e-4, allx.shape[0]
        m, v = allx.mean(0), allx.var(0)
        ref_mean = N * m / (N + n0)
        ref_var = (n0 * 1.0 + N * v + m**2 * n0 * N / (N + n0)) / (N + n0)
        np.testing.assert_allclose(norm.mean.numpy(), ref_mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(norm.var.numpy(), ref_var, rtol=1e-9, atol=1e-12)
        # ... which is numpy's mean/var up to that tiny prior
        np.testing.assert_allclose(norm.mean.numpy(), m, rtol=1e-4, atol=1e-4)
        if N > 100:
            np.testing.assert_allclose(norm.var.numpy(), v, rtol=1e-3, atol=2e-4)
    assert float(norm.count) == pytest.approx(391, abs=1e-3)
    # forward: clipped z-score
    x = torch.tensor([[1.0, -2.0, 10.0, 1e6]])
    z = norm(x)
    mean, std = norm.mean.float(), norm.var.float().sqrt()
    expected = ((x - mean) / (std + 1e-8)).clamp(-5, 5)
    torch.testing.assert_close(z, expected)
    assert float(z[0, 3]) == 5.0
    # leading dimensions are flattened ([S, T, D])
    norm2 = RunningNorm(4, clip=5.0)
    x3 = rng.normal(size=(3, 5, 4))
    norm2.update(torch.from_numpy(x3))
    np.testing.assert_allclose(norm2.mean.numpy(), x3.reshape(-1, 4).mean(0), rtol=1e-4, atol=1e-4)


def test_grid_normalizer_scales_every_cell_of_a_channel_alike():
    """Statistics are kept per feature (ranks pool them exactly) but applied pooled per channel, so a piece
    on a rare cell is not scaled up against one on a common cell; the pooled moments are exact."""
    rng = np.random.default_rng(3)
    cells, channels = 12, 2
    x = (rng.random((500, cells, channels)) < np.linspace(0.05, 0.9, cells)[None, :, None]).astype(np.float32)
    x[..., 1] *= 3.0
    norm = RunningNorm(cells * channels, clip=50.0, channels=channels)
    norm.update(torch.from_numpy(x.reshape(500, -1)))
    z = norm(torch.from_numpy(x.reshape(500, -1))).numpy().reshape(500, cells, channels)
    for c in range(channels):
        flat = x[..., c].ravel()
        expected = (x[..., c] - flat.mean()) / np.sqrt(flat.var())
        np.testing.assert_allclose(z[..., c], expected, rtol=1e-3, atol=1e-3)
    per_feature = RunningNorm(cells * channels, clip=50.0)
    per_feature.update(torch.from_numpy(x.reshape(500, -1)))
    one_piece = torch.from_numpy(np.tile([1.0, 0.0], cells).astype(np.float32))[None]
    assert float(norm(one_piece)[0, ::2].std()) < 1e-6 < float(per_feature(one_piece)[0, ::2].std())


def test_tensors_round_trip_and_mismatches():
    src = make_policy(4)
    with torch.no_grad():
        src.obs_norm.count.fill_(123.0)
    tensors = src.tensors()
    assert all(isinstance(v, np.ndarray) for v in tensors.values())
    assert {"return_scale", "obs_norm.mean", "obs_norm.var", "obs_norm.count"} <= set(tensors)
    # tensors() is a copy, not a view of live weights
    tensors["logits.bias"][:] = 99.0
    assert not torch.all(src.logits.bias == 99.0)
    tensors = src.tensors()

    dst = Policy(OBS, HEADS, hidden=16, encoder_layers=2, lstm=LSTM)
    dst.load_tensors(tensors)
    for k, v in dst.tensors().items():
        np.testing.assert_array_equal(v, tensors[k])
        assert v.dtype == tensors[k].dtype
    rng = np.random.default_rng(4)
    obs = torch.from_numpy(rng.normal(size=(10, OBS)).astype(np.float32))
    mask = torch.ones(10, sum(HEADS), dtype=torch.bool)
    torch.testing.assert_close(src.value(obs, src.initial_state(10)), dst.value(obs, dst.initial_state(10)))

    bad = dict(tensors)
    bad["logits.weight"] = np.zeros((1, 1), np.float32)
    with pytest.raises(ValueError, match="logits.weight"):
        dst.load_tensors(bad)
    missing = dict(tensors)
    del missing["value_head.bias"]
    with pytest.raises(ValueError):
        dst.load_tensors(missing)
    extra = dict(tensors, bogus=np.zeros(1, np.float32))
    with pytest.raises(ValueError):
        dst.load_tensors(extra)
    # a model of another size rejects these parameters
    other = Policy(OBS, HEADS, hidden=32, encoder_layers=2, lstm=LSTM)
    with pytest.raises(ValueError):
        other.load_tensors(tensors)
    del mask


def test_act_state_advances_and_value_does_not():
    policy = make_policy(5)
    obs = torch.randn(3, OBS)
    mask = torch.ones(3, sum(HEADS), dtype=torch.bool)
    state = policy.initial_state(3)
    out = policy.act(obs, mask, state)
    assert out.state[0].shape == (3, LSTM) and not torch.all(out.state[0] == 0)
    assert torch.all(state[0] == 0)  # the caller's state is not modified in place
    v = policy.value(obs, state)
    torch.testing.assert_close(v, out.value)
    assert math.isfinite(float(v.sum()))


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
def test_worker_and_learner_log_probs_agree_across_devices(device):
    """Workers act on CPU, the learner evaluates on its device: the same log-probs and values."""
    worker = played_policy(3)
    batch = played_batch(worker, S=10, T=9, seed=3, reset_prob=0.2)
    learner_policy = played_policy(3, device)
    on = {k: torch.from_numpy(batch[k]).to(device) for k in ("obs", "mask", "actions", "h0", "c0", "first")}
    logp, _, value = learner_policy.evaluate(on["obs"], on["mask"], on["actions"], on["h0"], on["c0"], on["first"])
    assert logp.device.type == device
    np.testing.assert_allclose(logp.detach().cpu().numpy(), batch["logp"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(value.detach().cpu().numpy() * float(learner_policy.return_scale), batch["values"],
                               rtol=1e-4, atol=1e-4)
    # acting on the device gives what the CPU worker gave
    on_device = played_batch(played_policy(3, device), S=10, T=9, seed=3, reset_prob=0.2)
    np.testing.assert_array_equal(on_device["first"], batch["first"])
    np.testing.assert_allclose(on_device["values"], batch["values"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_running_norm_on_device(device):
    rng = np.random.default_rng(8)
    norm = RunningNorm(3, clip=5.0).to(device)
    x = rng.normal(2.0, 3.0, size=(200, 3))
    norm.update(torch.from_numpy(x).to(device))
    count, mean, var = norm.merged(torch.zeros(3, dtype=torch.float64, device=device),
                                   torch.ones(3, dtype=torch.float64, device=device), 50)
    assert {t.device.type for t in (norm.mean, norm.var, norm.count, count, mean, var)} == {device}
    np.testing.assert_allclose(norm.mean.cpu().numpy(), x.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.var.cpu().numpy(), x.var(0), rtol=1e-5)
    assert norm(torch.zeros(4, 3, device=device)).device.type == device


@pytest.mark.parametrize("device", DEVICES)
def test_tensors_round_trip_from_a_device_policy(device):
    src = make_policy(6).to(device)
    tensors = src.tensors()
    assert all(isinstance(v, np.ndarray) for v in tensors.values())  # plain CPU arrays for publish/checkpoint
    on_cpu = Policy(OBS, HEADS, hidden=16, encoder_layers=2, lstm=LSTM)
    on_cpu.load_tensors(tensors)
    back = Policy(OBS, HEADS, hidden=16, encoder_layers=2, lstm=LSTM).to(device)
    back.load_tensors(tensors)
    assert {p.device.type for p in [*back.parameters(), *back.buffers()]} == {device}
    obs = torch.randn(5, OBS)
    torch.testing.assert_close(back.value(obs.to(device), back.initial_state(5)).cpu(),
                               on_cpu.value(obs, on_cpu.initial_state(5)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reset_prob", [0.0, 0.1, 0.6])
def test_fused_runs_reproduce_the_worker_whatever_the_game_starts(reset_prob):
    """No game start after step 0 (one fused call), a few, and many (consecutive ones, at the last step)."""
    worker = played_policy(4)
    batch = played_batch(worker, S=9, T=7, seed=int(reset_prob * 10), reset_prob=reset_prob)
    if reset_prob:
        batch["first"][1, -1] = batch["first"][2, 3] = batch["first"][2, 4] = True
        batch = _replay(worker, batch)
    t = {k: torch.from_numpy(batch[k]) for k in ("obs", "mask", "actions", "h0", "c0", "first")}
    logp, _, value = worker.evaluate(t["obs"], t["mask"], t["actions"], t["h0"], t["c0"], t["first"])
    np.testing.assert_allclose(logp.detach().numpy(), batch["logp"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(value.detach().numpy() * float(worker.return_scale), batch["values"], rtol=1e-5,
                               atol=1e-5)


def _replay(policy, batch):
    """The stored log-probs and values of ``batch``'s actions, stepped one at a time as the worker does."""
    S, T = batch["first"].shape
    h, c = torch.from_numpy(batch["h0"]), torch.from_numpy(batch["c0"])
    logps, values = [], []
    for t in range(T):
        keep = torch.from_numpy(~batch["first"][:, t]).float().unsqueeze(-1)
        h, c = h * keep, c * keep
        obs, mask = torch.from_numpy(batch["obs"][:, t]), torch.from_numpy(batch["mask"][:, t])
        out = policy.act(obs, mask, (h, c))
        h, c = out.state
        with torch.no_grad():
            heads = policy._log_probs(h, mask)
        acts = torch.from_numpy(batch["actions"][:, t])
        logps.append(sum(lp.gather(-1, acts[:, i:i + 1]).squeeze(-1) for i, lp in enumerate(heads)).numpy())
        values.append(out.value.numpy())
    return {**batch, "logp": np.stack(logps, 1), "values": np.stack(values, 1)}


def test_parameters_saved_under_the_old_lstm_cell_names_still_load():
    src = make_policy(7)
    old = {k.replace("_l0", ""): v for k, v in src.tensors().items()}
    assert "lstm.weight_ih" in old
    dst = Policy(OBS, HEADS, hidden=16, encoder_layers=2, lstm=LSTM)
    dst.load_tensors(old)
    for k, v in src.tensors().items():
        np.testing.assert_array_equal(dst.tensors()[k], v)


def lstm_under_bf16_autocast(device: str):
    """(LSTM input dtypes, autocast on inside the LSTM?, log-probs) of a bf16-autocast evaluate on ``device``."""
    policy = played_policy(3, device)
    batch = played_batch(played_policy(3), S=6, T=5, seed=3, reset_prob=0.2)
    on = {k: torch.from_numpy(batch[k]).to(device) for k in ("obs", "mask", "actions", "h0", "c0", "first")}
    seen = []

    def record(module, args):
        x, (h0, c0) = args
        seen.append(((x.dtype, h0.dtype, c0.dtype), torch.is_autocast_enabled(device)))

    policy.lstm.register_forward_pre_hook(record)
    with torch.autocast(device, torch.bfloat16):
        logp, _, _ = policy.evaluate(on["obs"], on["mask"], on["actions"], on["h0"], on["c0"], on["first"])
    return seen, logp


@pytest.mark.parametrize("device", DEVICES)
def test_the_lstm_runs_in_float32_outside_bf16_autocast(device):
    seen, logp = lstm_under_bf16_autocast(device)
    assert seen == [((torch.float32,) * 3, False)]
    assert logp.dtype == torch.float32 and torch.isfinite(logp).all()


def grad_nodes(root) -> set[str]:
    """The type names of every node in the autograd graph below ``root``."""
    visited, todo = set(), [root]
    while todo:
        node = todo.pop()
        if node is not None and node not in visited:
            visited.add(node)
            todo += [next_fn for next_fn, _ in node.next_functions]
    return {type(node).__name__ for node in visited}


@pytest.mark.cuda
def test_the_learners_lstm_is_cudnns_fused_kernel_under_bf16():
    _, logp = lstm_under_bf16_autocast("cuda")
    assert "CudnnRnnBackward0" in grad_nodes(logp.sum().grad_fn)

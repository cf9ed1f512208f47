"""Issue 21, step 1: surgery's pure transforms keep the policy's function exactly (≤ 1e-5 in float32) over a
multi-step LSTM rollout, grow Adam's state with the weights, and refuse what they cannot do."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from rapid.formats.checkpoint import Checkpoint
from rapid.opt.model import Policy
from rapid.surgery.shapes import GATES, PolicyShape, SurgeryRefused, plan_growth
from rapid.surgery.transform import grow_adam, grow_policy, grow_tensors, parameter_names
from rapid.surgery.verify import TOLERANCE, compare, random_inputs

BASE = PolicyShape(obs_dim=12, action_heads=(4, 3), hidden=16, encoder_layers=2, lstm=10)


def trained_like(shape: PolicyShape, seed: int = 0) -> Policy:
    """A policy with weights far from initialization (large recurrent weights, biased logits, real normalizer
    statistics and return scale), so every path through it matters."""
    torch.manual_seed(seed)
    policy = shape.build()
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, value in policy.tensors().items():
        if name == "obs_norm.var":
            tensors[name] = rng.uniform(0.2, 3.0, value.shape)
        elif name == "obs_norm.count":
            tensors[name] = np.array(1e6)
        elif name == "return_scale":
            tensors[name] = np.array(3.0)
        else:
            tensors[name] = rng.normal(0.0, 0.6, value.shape).astype(value.dtype)
    policy.load_tensors(tensors)
    return policy.eval()


CHANGES = {
    "new observation features": dict(obs_dim=17),
    "wider encoder": dict(hidden=24),
    "larger LSTM": dict(lstm=20),
    "new action choices": dict(action_heads=(5, 4)),
    "all at once": dict(obs_dim=15, hidden=32, lstm=21, action_heads=(6, 3)),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_each_transform_keeps_log_probs_values_and_greedy_actions_over_a_rollout(change):
    old = trained_like(BASE)
    new_shape = replace(BASE, **CHANGES[change])
    new = grow_policy(old, new_shape, np.random.default_rng(1))
    assert PolicyShape.of(new) == new_shape
    inputs = random_inputs(BASE, samples=24, steps=12, rng=np.random.default_rng(2), new=new_shape)
    result = compare(old, new, inputs)
    assert result.ok(), result.line()
    assert result.max_logp_diff <= TOLERANCE and result.max_value_diff <= TOLERANCE
    assert result.greedy_same == result.greedy_total == 24 * 12 * 2
    with torch.no_grad():  # the act path, sampled actions' values in return units, too
        h0, c0 = torch.from_numpy(inputs.h0), torch.from_numpy(inputs.c0)
        pad = (0, new.lstm_size - old.lstm_size)
        state_new = (torch.nn.functional.pad(h0, pad), torch.nn.functional.pad(c0, pad))
        a = old.act(torch.from_numpy(inputs.obs_old[:, 0]), torch.from_numpy(inputs.mask_old[:, 0]), (h0, c0),
                    greedy=True)
        b = new.act(torch.from_numpy(inputs.obs_new[:, 0]), torch.from_numpy(inputs.mask_new[:, 0]), state_new,
                    greedy=True)
    assert torch.equal(a.actions, b.actions)
    assert float((a.value - b.value).abs().max()) <= TOLERANCE * 3.0  # return_scale 3
    assert torch.allclose(a.state[0], b.state[0][:, :old.lstm_size], atol=1e-6)


def test_stacked_surgeries_compose():
    old = trained_like(BASE)
    mid_shape = replace(BASE, lstm=14, obs_dim=13)
    new_shape = replace(mid_shape, hidden=20, action_heads=(4, 5))
    mid = grow_policy(old, mid_shape, np.random.default_rng(1))
    new = grow_policy(mid, new_shape, np.random.default_rng(2))
    inputs = random_inputs(BASE, samples=16, steps=10, rng=np.random.default_rng(3), new=new_shape)
    assert compare(old, new, inputs).ok()


def test_the_convolution_trunk_is_kept_while_the_layers_after_it_grow():
    shape = PolicyShape(obs_dim=3 * 4 * 2, action_heads=(4,), hidden=8, encoder_layers=1, lstm=6, grid=(3, 4, 2),
                        conv_channels=(4, 5))
    old = trained_like(shape)
    new_shape = replace(shape, hidden=16, lstm=12, action_heads=(5,))
    new = grow_policy(old, new_shape, np.random.default_rng(1))
    inputs = random_inputs(shape, samples=8, steps=6, rng=np.random.default_rng(2), new=new_shape)
    assert compare(old, new, inputs).ok()
    for grid, channels in (((3, 4, 3), (4, 5)), ((3, 4, 2), (4, 6))):
        changed = replace(shape, grid=grid, obs_dim=int(np.prod(grid)), conv_channels=channels)
        with pytest.raises(SurgeryRefused, match="convolution|grid"):
            plan_growth(shape, changed)


def test_the_plan_names_every_tensor_of_the_policy_with_its_shape():
    for shape in (BASE, replace(BASE, encoder_layers=1), PolicyShape(18, (3,), 8, 3, 5, grid=(3, 3, 2),
                                                                   conv_channels=(2,))):
        grown = replace(shape, hidden=shape.hidden + 3, lstm=shape.lstm + 2)
        old_dict, new_dict = shape.build().state_dict(), grown.build().state_dict()
        plan = plan_growth(shape, grown)
        assert len(plan) == len(old_dict) and {g.name for g in plan} == set(old_dict)
        for g in plan:
            assert g.old_shape == tuple(old_dict[g.name].shape) and g.new_shape == tuple(new_dict[g.name].shape)


def test_the_weights_from_new_units_into_old_ones_are_zero_and_the_new_units_incoming_are_random():
    old = trained_like(BASE)
    new_shape = replace(BASE, obs_dim=14, hidden=20, lstm=13, action_heads=(5, 3))
    t = grow_policy(old, new_shape, np.random.default_rng(0)).tensors()
    L_old, L_new = BASE.lstm, new_shape.lstm
    assert not t["encoder.0.weight"][:16, 12:].any()          # new features into old units
    assert not t["encoder.2.weight"][:16, 16:].any()          # new encoder units into old ones
    assert t["encoder.2.weight"][16:].std() > 0.01             # new units hear everything
    for g in range(GATES):
        rows = slice(g * L_new, g * L_new + L_old)
        assert not t["lstm.weight_ih_l0"][rows, 16:].any() and not t["lstm.weight_hh_l0"][rows, L_old:].any()
        assert t["lstm.weight_hh_l0"][g * L_new + L_old:(g + 1) * L_new].std() > 0.01
        assert not t["lstm.bias_ih_l0"][g * L_new + L_old:(g + 1) * L_new].any()
    assert not t["logits.weight"][:, L_old:].any() and not t["value_head.weight"][:, L_old:].any()
    assert not t["logits.weight"][4].any() and t["logits.bias"][4] == -30.0   # the new action of head 0
    np.testing.assert_array_equal(t["obs_norm.mean"][:12], old.tensors()["obs_norm.mean"])
    np.testing.assert_array_equal(t["obs_norm.var"][12:], 1.0)


def test_new_features_take_the_normalizer_statistics_given():
    plan = plan_growth(BASE, replace(BASE, obs_dim=14))
    old = trained_like(BASE).tensors()
    grown = grow_tensors(old, plan, np.random.default_rng(0), new_obs_mean=np.array([0.5, -1.0]),
                         new_obs_var=np.array([2.0, 0.25]))
    np.testing.assert_array_equal(grown["obs_norm.mean"][12:], [0.5, -1.0])
    np.testing.assert_array_equal(grown["obs_norm.var"][12:], [2.0, 0.25])
    assert grown["obs_norm.count"] == old["obs_norm.count"]
    with pytest.raises(ValueError, match="2 new features"):
        grow_tensors(old, plan, np.random.default_rng(0), new_obs_mean=np.zeros(3))


def test_a_new_action_is_never_chosen_and_hardly_ever_sampled():
    old = trained_like(BASE)
    new = grow_policy(old, replace(BASE, action_heads=(5, 3)), np.random.default_rng(0))
    obs = torch.randn(512, BASE.obs_dim)
    state = new.initial_state(512)
    out = new.act(obs, torch.ones(512, 8, dtype=torch.bool), state)
    assert not (out.actions[:, 0] == 4).any()
    with torch.no_grad():
        probs = new._log_probs(new._core(obs, state)[0], torch.ones(512, 8, dtype=torch.bool))[0].exp()
    assert float(probs[:, 4].max()) < 1e-9


def _naive(tensors: dict[str, np.ndarray], name: str, rows: slice, cols: slice) -> dict[str, np.ndarray]:
    """The naive transform: random weights from new units into old ones."""
    out = {k: v.copy() for k, v in tensors.items()}
    block = out[name][rows, cols]
    out[name][rows, cols] = np.random.default_rng(9).uniform(-0.3, 0.3, block.shape)
    return out


@pytest.mark.parametrize("name, rows, cols", [
    ("lstm.weight_hh_l0", slice(0, 10), slice(10, 20)),     # new LSTM units into old gates (input gate)
    ("encoder.2.weight", slice(0, 16), slice(16, 24)),      # new encoder units into old ones
    ("logits.weight", slice(0, 7), slice(10, 20)),          # new LSTM units into the policy head
])
def test_a_naive_transform_fails_the_preservation_check(name, rows, cols):
    old = trained_like(BASE)
    new_shape = replace(BASE, hidden=24, lstm=20)
    good = grow_policy(old, new_shape, np.random.default_rng(1))
    naive = new_shape.build()
    naive.load_tensors(_naive(good.tensors(), name, rows, cols))
    inputs = random_inputs(BASE, samples=16, steps=8, rng=np.random.default_rng(2), new=new_shape)
    assert compare(old, good, inputs).ok()
    result = compare(old, naive.eval(), inputs)
    assert not result.ok() and result.max_logp_diff > 1e-3, result.line()


def test_a_naive_recurrent_weight_shows_only_from_the_second_step_on():
    old = trained_like(BASE)
    new_shape = replace(BASE, lstm=20)
    naive = new_shape.build()
    naive.load_tensors(_naive(grow_policy(old, new_shape, np.random.default_rng(1)).tensors(),
                              "lstm.weight_hh_l0", slice(0, 40), slice(10, 20)))
    inputs = random_inputs(BASE, samples=16, steps=6, rng=np.random.default_rng(2), new=new_shape)
    inputs.h0[:], inputs.c0[:] = 0.0, 0.0  # new units start at zero: their weights into old units act one step late
    one_step = replace(inputs, **{k: getattr(inputs, k)[:, :1] for k in ("obs_old", "obs_new", "mask_old", "mask_new",
                                                                          "first")})
    assert compare(old, naive, one_step).ok()
    assert not compare(old, naive, inputs).ok()


def test_adam_state_follows_the_weights():
    old = trained_like(BASE)
    adam = torch.optim.Adam(old.parameters(), lr=1e-3)
    for _ in range(3):
        adam.zero_grad()
        logp, _, value = old.evaluate(torch.randn(4, 5, 12), torch.ones(4, 5, 7, dtype=torch.bool),
                                      torch.zeros(4, 5, 2, dtype=torch.int64), torch.zeros(4, 10), torch.zeros(4, 10),
                                      torch.zeros(4, 5, dtype=torch.bool))
        (logp.sum() + value.square().sum()).backward()
        adam.step()
    ckpt = Checkpoint.from_torch(3, 3, old.tensors(), adam.state_dict())
    new_shape = replace(BASE, obs_dim=14, hidden=20, lstm=13, action_heads=(5, 3))
    plan = plan_growth(BASE, new_shape)
    names = parameter_names(BASE)
    assert names == parameter_names(new_shape)
    grown = grow_adam(ckpt.adam, plan, names)
    new = grow_policy(old, new_shape, np.random.default_rng(0))
    by_name = {g.name: g for g in plan}
    for index, (name, param) in enumerate(new.named_parameters()):
        entry, before = grown["state"][index], ckpt.adam["state"][index]
        assert entry["exp_avg"].shape == entry["exp_avg_sq"].shape == tuple(param.shape)
        assert float(entry["step"]) == float(before["step"]) == 3.0
        g = by_name[name]
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(entry[key][np.ix_(*g.maps)], before[key])
            assert np.abs(entry[key]).sum() == pytest.approx(np.abs(before[key]).sum())  # zero where new
    fresh = torch.optim.Adam(new.parameters(), lr=1e-3)
    fresh.load_state_dict(Checkpoint(3, 3, new.tensors(), grown).adam_state())   # torch accepts it
    fresh.zero_grad()
    new.value_head.weight.sum().backward()
    fresh.step()
    assert grown["param_groups"] == ckpt.adam["param_groups"]


REFUSALS = {
    "observation features removed": dict(obs_dim=11),
    "encoder units removed": dict(hidden=8),
    "LSTM units removed": dict(lstm=9),
    "number of encoder layers": dict(encoder_layers=3),
    "number of action heads": dict(action_heads=(4, 3, 2)),
    "action choices removed": dict(action_heads=(3, 3)),
    "observation clip": dict(obs_clip=10.0),
}


@pytest.mark.parametrize("why", REFUSALS, ids=list(REFUSALS))
def test_unsupported_changes_are_refused_naming_what(why):
    with pytest.raises(SurgeryRefused, match=why):
        plan_growth(BASE, replace(BASE, **REFUSALS[why]))


def test_tensors_of_another_shape_are_refused():
    plan = plan_growth(BASE, replace(BASE, lstm=12))
    tensors = trained_like(replace(BASE, hidden=20)).tensors()
    with pytest.raises(ValueError, match="encoder.0.weight has shape"):
        grow_tensors(tensors, plan, np.random.default_rng(0))
